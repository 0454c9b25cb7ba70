"""The 23 contexts of mixing 3's context models of bits (:mod:`sharnn.coding.bitwise`;
docs/compression.md, "Mixing version 3"): each a 64-bit hash of what precedes a stream's
byte, computed once a position.

The contexts: the last 1, 2, 3, 4, 5, 6, 8, 12 and 16 bytes; the word; the word and the
previous byte; the bytes 2 and 3 back; the word and the previous word; the previous word and
the byte; the word and the one before the previous; the last three words; the byte above
(the same column of the previous line) with the previous byte, and with the column; the
classes of the last six bytes (letter, capital, digit, space, line end, or the byte); the
word that followed the previous word when it was last seen, with the word so far and the
previous byte, and the last two bytes that followed the previous two (indirect contexts);
the column (up to 63) with the last two bytes, and with the word.

What they read besides the byte-level state of :mod:`sharnn.coding.mixing` (the history
and the word) travels as :data:`TEXT`: the last two words' hashes (:mod:`sharnn.coding.matching`'s),
the streams' bytes so far, the position, the indirect table (:data:`INDIRECT` entries) and
each stream's lines' starts. Integers only, under the compiled core's rules.
"""

from __future__ import annotations

import numpy as np

from ..compiled import inline, kernel
from . import mixing

CONTEXTS = 23  # the module's docstring names them, in order
ORDERS = np.array([1, 2, 3, 4, 5, 6, 8, 12, 16], dtype=np.int64)  # the context models of the last k bytes ...
ORDER_CONTEXTS = np.array([0, 1, 2, 3, 9, 4, 5, 14, 15], dtype=np.int64)  # ... and their places among the contexts
FOLLOWED = 1 << 16  # the indirect table: the bytes that followed each hash of the last two, then from here ...
INDIRECT = 2 * FOLLOWED  # ... the word that followed each previous word (16 bits of each hash: followed)
TEXT = "Tuple((uint64[::1], uint8[:, ::1], int64, int64[::1], int64[:, ::1]))"  # words, buffer, t, indirect, lines
_MULTIPLIER = mixing._MULTIPLIER


@inline
def _mixed(value, salt):
    """A hash of ``value`` with ``salt``."""
    return (value + salt) * _MULTIPLIER


@inline
def _class(byte):
    """A byte's class for the context of the last six: lower, upper, digit, space, LF, none, or itself."""
    if 97 <= byte <= 122:
        return np.uint64(1)
    if 65 <= byte <= 90:
        return np.uint64(2)
    if 48 <= byte <= 57:
        return np.uint64(3)
    if byte == 32 or byte == 10 or byte < 0:
        return np.uint64(4 + (byte == 10) + 2 * (byte < 0))
    return np.uint64(7 + byte)


@inline
def followed(word):
    """The place in the indirect table of the word that followed the word of hash ``word``."""
    return FOLLOWED + np.int64(word >> np.uint64(48))


@kernel("void(uint64[:, ::1], uint64[::1], int64, uint64[:, ::1], " + TEXT + ")")
def hash_contexts(history, word, b, contexts, text):
    """Stream ``b``'s context hashes into ``contexts [B, CONTEXTS]`` from its ``history
    [B, 12]`` (each byte + 1, newest first) and ``word [B]`` (:mod:`sharnn.coding.mixing`'s),
    and ``text``: the last two words ``[2B]`` (:mod:`sharnn.coding.matching`'s), the
    streams' bytes ``[B, >t]``, the position ``t``, the indirect table, the lines' starts ``[B, 2]``."""
    words, buffer, t, indirect, lines = text
    value, k = np.uint64(0), 0
    for j in range(16):
        byte = history[b, j] if j < 12 else np.uint64(buffer[b, t - j - 1] + 1 if t - j - 1 >= 0 else 0)
        value = (value ^ byte) * _MULTIPLIER + np.uint64(j + 1)
        if ORDERS[k] == j + 1:
            contexts[b, ORDER_CONTEXTS[k]] = value
            k = min(k + 1, len(ORDERS) - 1)
    previous, before = words[b], words[len(word) + b]
    contexts[b, 6], contexts[b, 7] = (
        _mixed(word[b], np.uint64(77)),
        (word[b] ^ (history[b, 0] << np.uint64(40))) * _MULTIPLIER,
    )
    contexts[b, 8] = _mixed((history[b, 1] << np.uint64(16)) + (history[b, 2] << np.uint64(8)), np.uint64(1))
    contexts[b, 10] = (_mixed(word[b], np.uint64(5)) ^ previous) * _MULTIPLIER
    column, above = t - lines[b, 0], np.uint64(0)
    if lines[b, 1] >= 0 and lines[b, 1] + column < lines[b, 0] - 1:
        above = np.uint64(buffer[b, lines[b, 1] + column]) + np.uint64(1)
    contexts[b, 11] = _mixed((above << np.uint64(9)) + history[b, 0], np.uint64(0x777))
    contexts[b, 12] = _mixed((above << np.uint64(12)) + np.uint64(min(column, 255)), np.uint64(0x999))
    contexts[b, 13] = (contexts[b, 10] ^ (before + np.uint64(11))) * _MULTIPLIER
    classes = np.uint64(0)
    for j in range(6):
        classes = classes * np.uint64(263) + _class(np.int64(history[b, j]) - 1)
    contexts[b, 16] = _mixed(classes, np.uint64(0x31337))
    after = np.uint64(indirect[followed(previous)])  # the word that followed the previous one
    contexts[b, 17] = _mixed((after * np.uint64(31)) ^ word[b] ^ (history[b, 0] << np.uint64(56)), np.uint64(0xF012))
    pair = np.int64(history[b, 0] * np.uint64(257) + history[b, 1])
    second = np.uint64(indirect[pair & 0xFFFF])
    contexts[b, 18] = _mixed(second * np.uint64(70000) + np.uint64(pair), np.uint64(0x5555))
    contexts[b, 19] = (_mixed(previous, np.uint64(0x6666)) + history[b, 0]) * _MULTIPLIER
    contexts[b, 20] = (_mixed(word[b], np.uint64(0x7777)) ^ before) * _MULTIPLIER
    near = np.uint64(min(column, 63))  # the place in the line: verse, tables, indented code
    contexts[b, 21] = _mixed(
        (history[b, 0] << np.uint64(9)) + history[b, 1] + (near << np.uint64(20)), np.uint64(0xDEF)
    )
    contexts[b, 22] = _mixed((word[b] ^ near) * _MULTIPLIER, np.uint64(0xDE1))
