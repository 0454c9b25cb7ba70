"""Mixing version 3: version 2's distribution (:mod:`sharnn.coding.matching`) refined one
bit at a time by context models of bits, as lpaq and paq8 model a byte (docs/compression.md,
"Mixing version 3").

A byte is the path of 8 binary decisions from the root of a tree, each node named by the
bits decided so far with a leading 1 (``c0``, 1 to 255). At each node version 2's
distribution ``P`` gives the probability that the next bit is 1, and 23 context models of
bits give theirs; three logistic mixers weigh them in the stretched domain, a fourth mixes
the three, and three APMs refine the result::

    st(p) = ln(p / (1 - p)),  squash(x) = 1 / (1 + exp(-x))
    x_0 = st(P(bit = 1 | c0))                 version 2's, from the sums of P over the node's halves
    x_1 = 1                                   a bias
    x_{2+i} = st(p_i)                         context i's probability p_i of a 1 here ...
    x_{25+i} = st(p_i) n_i / (n_i + 64)       ... and the same, as sure as its count n_i
    x_48 = st(Q(bit = 1 | c0))                the model's own split, Q its distribution alone
    s_A = sum_i a_{c0,i} x_i, s_B = sum_i b_{prev,c0,i} x_i, s_C = sum_i c_{hash(last 3 bytes),i} x_i
    p = squash(f_{c0,A} s_A + f_{c0,B} s_B + f_{c0,C} s_C)
    p' = (APM1_{prev,c0}(p) + APM2_{hash(last 2 bytes),c0}(p) + 2 APM3_{hash(last 4 bytes),c0}(p)) / 4
    the bit y is coded with p' (:mod:`sharnn.coding.binary`), then every model learns it:
    a_i += r(n_A) (y - squash(s_A)) x_i, b_i and c_i likewise;  f_m += lr_f (y - p) s_m
    r(n) = lr + boost h / (n + h)             n: how often the weight set has learned
    p_i += (y - p_i) / (n_i + 3/2)

``p_i`` is the probability held for context ``i`` and node ``c0``, ``n_i`` how often it has
been updated (at most :data:`COUNT_LIMIT`); both are 0 (``p_i = 1/2``) where the context has
not been seen before. A context's 15 nodes of a half byte share a slot (a cache line), in
one table for all 23 models (what a model leaves unused, another takes) sized to the bytes
to code (:func:`slots_for`), in one of four neighbouring places found by its hash and told
apart by a 16-bit check; a new one takes the place whose half byte has learned least
(lpaq's hash table). A weight set learns fast while it is new and settles to ``lr``
(:data:`LEARNING_RATE`, :data:`BOOST`, :data:`HALF`). The contexts:
:mod:`sharnn.coding.bitcontexts`. Mixer A's weight set is the node, mixer B's the previous
byte and the node, mixer C's 16 bits of the hash of the last 3 bytes (one set for all 8
bits of a byte), the final mixer's the node.

A position codes each stream's byte bit by bit, stream after stream: each node on the
byte's path is predicted, its bit coded, and the node learns it before the next is
predicted (so a stream's bits read what the streams before it learned at this position).
A node to which ``P`` gives less than ``2**-THRESHOLD_BITS`` of its mass, and every node
under it, or one that ``P`` splits beyond 1/4096 of 0 or 1, is coded with ``P``'s own
split instead of ``p'`` (in 2**-16); every node on the path learns.

Every number of the models, mixers and APMs is an integer (probabilities in units of 2**-12,
the context models' in 2**-22, weights in 2**-16, stretched values in 1/256); ``P``'s
running sums and splits are float64 in a fixed order, exactly rounded on every machine (no
fused operations): the compiled core's rules. The APMs' points (0 .. 65535, and an update
only moves a point towards 0 or 65535) are kept as uint16 and the stretch and squash tables
(within ±2047 and 1 .. 4095) as int16, all read into int64: a quarter of the memory, the
same numbers (measured: the mix 12% faster). A stream's first half byte's rows are asked
from the memory before any stream is coded, the second's once its first 4 bits are known,
and each node's two children's weight sets and APM rows before the node is computed
(:func:`~sharnn.compiled.prefetch`, a hint: no number changes); the node and its helpers are
compiled into the kernel that calls them (:func:`sharnn.compiled.inline`).
"""

from __future__ import annotations

import decimal

import numpy as np

from ..compiled import inline, kernel, prefetch
from ..tables import decimal_table
from . import binary, matching, mixing
from .binary import BinaryDecoder, BinaryEncoder
from .bitcontexts import CONTEXTS, INDIRECT, TEXT, followed, hash_contexts
from .matching import MatchMixer, _squash_points, _stretch

MIXING_VERSION = 3
SLOTS = CONTEXTS * 3 << 17  # one table for all contexts, at most (552 MiB): 1.5 * 2**18 slots of 16 int32 per context
SLOTS_PER_BYTE = 32  # a shorter input gets this many a byte to code (at least MIN_SLOTS): measured, no larger
MIN_SLOTS = 1 << 18  # 16 MiB: a 1 KB file came out 2 bytes larger in 2**16
WAYS = 4  # the places of a context's half byte: 4 neighbouring slots (a group), told apart by a check
COUNT_LIMIT = 255  # p_i moves 1/(n + 3/2) of the way to the bit, at least 1/256.5
CONFIDENCE = 64  # the second input of a context, st(p_i) n_i / (n_i + CONFIDENCE): p_i as sure as its count
INPUTS = 3 + 2 * CONTEXTS  # x_0, the bias, both of each context, the model's split
_FINAL = 256 + 257 * 256  # the weight sets: mixer A's (the node), mixer B's (previous byte + 1, node); the final's
_C = _FINAL + 256  # mixer C's (16 bits of the hash of the last 3 bytes)
SETS = _C + (1 << 16)
LEARNING_RATE = 32  # in 1/16: w_i += (x_i (((4096 y - 4096 p) r) >> 4)) >> 14, r = this + BOOST HALF // (n + HALF)
BOOST = 384  # in 1/16: a new weight set learns at 26 (LEARNING_RATE + BOOST), after HALF updates at 14
HALF = 512
FINAL_RATE = 2  # the same for the final mixer's weights
THRESHOLD_BITS = 8  # nodes below P's mass 2**-8 are not refined
APM_RATE = 5  # an APM point moves 1/32 of the way to its target
APM_SHARES = (1, 1, 2)  # p' = (a_1 + a_2 + 2 a_3) / 4
_APM_ROWS = 1 << 16  # per APM
_APM_ORDERS = (2, 4)  # the hashed APMs' contexts: the last 2 bytes, the last 4 (contexts 1 and 3)
_MULTIPLIER = mixing._MULTIPLIER
_SLOT_MULTIPLIER = np.uint64(0x2545F4914F6CDD1D)
_CONTEXT_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # sets the contexts' slots apart in the one table
_STATE = "Tuple((int32[:, ::1], int64[:, ::1], uint16[:, ::1], uint64[:, ::1], int64[::1]))"
_CURVES = "UniTuple(int16[::1], 2)"  # stretch (4096 probabilities) and squash (4095 stretched values)
_WORK = "Tuple((int64[::1], int64[:, ::1], boolean[::1], int64[::1]))"  # inputs, slots, slots found, sums


@decimal_table
def _squash_table() -> np.ndarray:
    """``round(4096 / (1 + exp(-x / 256)))`` for ``x = -2047 .. 2047``, within 1 .. 4095 (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        values = [int((4096 / (1 + (-decimal.Decimal(x) / 256).exp())).to_integral_value()) for x in range(-2047, 2048)]
    return np.array([min(4095, max(1, v)) for v in values], dtype=np.int64)


@inline
def _squash(x, table):
    """``squash(x)`` of a stretched value ``x`` (1/256) in units of 2**-12, from ``table``."""
    return table[min(max(x, -2047), 2047) + 2047]


@inline
def _clip(x):
    """A mixer's sum (2**-16 of 1/256) as a stretched value within -2047 .. 2047."""
    return min(max(x >> 16, -2047), 2047)


_DEPTHS = np.array([0] + [j.bit_length() - 1 for j in range(1, 256)], dtype=np.int64)  # bits node c0 has decided
_RATES = np.array([2**17 // (2 * n + 3) for n in range(COUNT_LIMIT + 1)], dtype=np.int64)  # 1 / (n + 3/2) in 2**-16
_SURE = np.array([(n << 12) // (n + CONFIDENCE) for n in range(COUNT_LIMIT + 1)], dtype=np.int64)  # in 2**-12


@inline
def _half(c0, depth):
    """Node ``c0``'s half byte (0: the first; 1 + h: the second after first half ``h``) and
    its place among the half's 15 nodes (1 .. 15)."""
    if depth < 4:
        return 0, c0
    return 1 + (c0 >> (depth - 4)) - 16, (1 << (depth - 4)) | (c0 & ((1 << (depth - 4)) - 1))


@inline
def _slots(tables, contexts, b, c0, depth, work):
    """The slots of stream ``b``'s contexts for node ``c0``'s half byte, into ``work``'s
    ``slots [CONTEXTS, 17]`` (column 0: the first half; 1 + h: the second after first half
    ``h``), unless found already (:func:`_find`; a slot claimed for a context not seen)."""
    slots, found, half = work[1], work[2], _half(c0, depth)[0]
    if found[half]:
        return
    for i in range(CONTEXTS):
        slots[i, half] = _find(tables, contexts[b, i], i, half, True)
    found[half] = True


@inline
def _slot(context, i, half, slots):
    """The first of the :data:`WAYS` slots (0 .. ``slots`` - 1, a multiple of WAYS) where
    context model ``i``'s context of hash ``context`` may keep half byte ``half``
    (:func:`_half`), and the check (1 .. 2**16 - 1) that tells it from the others there."""
    value = (context + np.uint64(half) * _SLOT_MULTIPLIER + np.uint64(i) * _CONTEXT_MULTIPLIER) * _MULTIPLIER
    value ^= value >> np.uint64(29)
    check = ((value >> np.uint64(24)) & np.uint64(0xFFFF)) | np.uint64(1)
    group = ((value >> np.uint64(32)) * np.uint64(slots)) >> np.uint64(32)  # 32 bits of the hash scaled to slots
    return np.int64(group) & ~(WAYS - 1), np.int32(check)


@inline
def _find(table, context, i, half, claim):
    """The slot of ``table [slots + 1, 16]`` that holds context model ``i``'s context of
    hash ``context``, half byte ``half``: the one of its :data:`WAYS` whose entry 0 holds
    its check. Not there: the last slot (``slots``, never claimed: all zeros, what a
    context not seen before reads), or with ``claim`` the way whose half byte's first
    node has learned least (its count), emptied and given the check (lpaq's replacement)."""
    first, check = _slot(context, i, half, len(table) - 1)
    for k in range(WAYS):
        if table[first + k, 0] == check:
            return first + k
    if not claim:
        return len(table) - 1
    slot = first
    for k in range(1, WAYS):
        if table[first + k, 1] & 1023 < table[slot, 1] & 1023:
            slot = first + k
    table[slot, :] = 0
    table[slot, 0] = check
    return slot


@inline
def _masses(cum, c0, depth):
    """Node ``c0``'s bytes, ``low .. low + width - 1``, and ``P``'s mass over them and over
    their upper half (the bit 1): ``(low, width, total, one)`` from ``cum [257]``, the running sums of ``P``."""
    width = 1 << (8 - depth)
    low = (c0 - (1 << depth)) * width
    return low, width, cum[low + width] - cum[low], cum[low + width] - cum[low + width // 2]


@inline
def _split(cum, c0, depth):
    """``P(bit = 1 | c0)`` in units of 2**-12 (1 .. 4095) from ``cum [257]``, the running sums of ``P``."""
    _, _, total, one = _masses(cum, c0, depth)
    return min(max(np.int64(one / total * 4096), 1), 4095) if total > 0 else 2048


@inline
def _node(state, curves, b, c0, cums, work):
    """Stream ``b``'s node ``c0`` (``cums [2, 257]``: the running sums of version 2's
    distribution and of the model's), from its half byte's slots that :func:`_slots` left
    in ``work``: into ``work``, its inputs ``x [INPUTS]`` and ``sums [11] = (s_A, s_B,
    s_C, p, st(p) + 2048, the three APMs' rows, mixers A's, B's and C's weight sets)``;
    returns the refined probability of a 1 (2**-12). Reads the state, changes nothing."""
    tables, weights, apm, contexts, previous = state
    stretch, squash = curves
    x, slots, _, sums = work
    depth = _DEPTHS[c0]
    half, within = _half(c0, depth)
    x[0], x[1], x[INPUTS - 1] = stretch[_split(cums[0], c0, depth)], 256, stretch[_split(cums[1], c0, depth)]
    for i in range(CONTEXTS):
        entry = np.int64(tables[slots[i, half], within])
        st = stretch[((entry >> 10) + (1 << 21)) >> 10]
        x[2 + i], x[2 + CONTEXTS + i] = st, (st * _SURE[entry & 1023]) >> 12
    sums[8], sums[9] = c0, _set_b(previous, b, c0)  # mixer A's weight set, mixer B's ...
    sums[10] = _set_c(contexts, b)  # ... and C's
    final, mixed = weights[_FINAL + c0], 0
    for m in range(3):
        w, total = weights[sums[8 + m]], mixing.WEIGHT_UNIT * x[0]  # version 2's weight starts at 1 (BitMixer)
        for i in range(INPUTS):
            total += w[i] * x[i]
        sums[m] = total  # summed in a register: a sum kept in the array is stored at every step
        mixed += final[m] * _clip(total)
    sums[3] = _squash(mixed >> 16, squash)
    sums[4] = stretch[sums[3]] + 2048
    for j in range(3):
        sums[5 + j] = _apm_row(contexts, previous, b, c0, j)
    point, fraction, p = sums[4] >> 7, sums[4] & 127, 0
    for j in range(3):
        row = sums[5 + j]
        p += APM_SHARES[j] * ((apm[row, point] * (128 - fraction) + apm[row, point + 1] * fraction) >> 11)
    return min(max(p >> 2, 1), 4095)


@kernel("void(int64[:, ::1], int64[::1], float64[:, :, ::1])", allocates=True)
def _model_sums(model, exp, cums):
    """``cums [B, 2, 257]``'s second row: the sums before each byte, in order, of the model's
    own integer weights, those of :func:`sharnn.coding.mixing._exp_weights` for ``model
    [B, 256]`` (version 2's log-weights, 2**-10 nat) as a mixer's logits at weight 1."""
    weights = np.empty(256, np.int64)
    for b in range(model.shape[0]):
        for s in range(256):
            weights[s] = model[b, s] * mixing.WEIGHT_UNIT
        mixing._exp_weights(weights, exp, weights)
        cums[b, 1, 0] = 0.0
        for s in range(256):
            cums[b, 1, s + 1] = cums[b, 1, s] + weights[s]  # exact: integers below 2**33


@inline
def _byte_sums(byte_probs, cums):
    """``cums [B, 2, 257]``'s first row: the sums before each byte, in order, of version 2's
    ``byte_probs [B, 256]``."""
    for b in range(byte_probs.shape[0]):
        cums[b, 0, 0] = 0.0
        for s in range(256):
            cums[b, 0, s + 1] = cums[b, 0, s] + byte_probs[b, s]


@inline
def _fetch_slots(state, b, half):
    """Ask the memory early for the slots stream ``b``'s context models may hold for half
    byte ``half`` (:func:`_half`). A hint to the CPU (:func:`~sharnn.compiled.prefetch`): no
    number changes."""
    tables, _, _, contexts, _ = state
    for i in range(CONTEXTS):
        first = _slot(contexts[b, i], i, half, len(tables) - 1)[0]
        for k in range(WAYS):
            prefetch(tables, (first + k) * tables.shape[1])


@inline
def _fetch_apms(state, b, c0):
    """Ask the memory early for stream ``b``'s rows of the three APMs at node ``c0`` (a
    hint, as :func:`_fetch_slots`)."""
    _, _, apm, contexts, previous = state
    for j in range(3):
        row = _apm_row(contexts, previous, b, c0, j)
        prefetch(apm, row * apm.shape[1])
        prefetch(apm, row * apm.shape[1] + apm.shape[1] - 1)


@inline
def _set_b(previous, b, c0):
    """Stream ``b``'s weight set of mixer B at node ``c0``: its previous byte and the node."""
    return 256 + previous[b] * 256 + c0


@inline
def _set_c(contexts, b):
    """Stream ``b``'s weight set of mixer C: 16 bits of the hash of its last 3 bytes."""
    return _C + np.int64(contexts[b, 2] >> np.uint64(48))


@inline
def _fetch_set(weights, row):
    """Ask the memory early for weight set ``row`` of ``weights`` (a hint, as :func:`_fetch_slots`)."""
    for line in range(0, INPUTS + 1, 8):
        prefetch(weights, row * weights.shape[1] + line)
    prefetch(weights, row * weights.shape[1] + INPUTS)  # its last line, where a set does not start on one


@inline
def _apm_row(contexts, previous, b, c0, j):
    """Stream ``b``'s row of APM ``j`` at node ``c0``: 0, by the previous byte; 1 and 2,
    hashed, by the last 2 bytes and by the last 4."""
    if j == 0:
        return (c0 | (previous[b] << 8)) & (_APM_ROWS - 1)
    hashed = (contexts[b, _APM_ORDERS[j - 1] - 1] + np.uint64(c0) * _SLOT_MULTIPLIER) * _MULTIPLIER
    return j * _APM_ROWS + np.int64(hashed >> np.uint64(48))


@inline
def _coded_probability(cum, c0, depth, p, under):
    """The probability of a 1 (2**-16) that node ``c0``'s bit is coded with, and whether
    the node lies under one to which ``P`` gives less than ``2**-THRESHOLD_BITS`` (``under``:
    its parent does): there, or where ``P`` is surer than 2**-12 can say, ``P``'s own split
    (``cum [257]``: the running sums of ``P``); elsewhere the refined ``p`` (2**-12)."""
    total, one = _masses(cum, c0, depth)[2:]
    under = under or total < 2.0**-THRESHOLD_BITS
    if under or one * 4096 < total or one * 4096 > total * 4095:
        split = np.int64(one / total * 65536) if total > 0 else 32768
        return min(max(split, 1), 65535), under
    return p << 4, under


@inline
def _learn_node(state, curves, b, c0, depth, y, work):
    """Stream ``b``'s node ``c0`` learns its bit ``y`` from what :func:`_node` left in
    ``work``: mixers A's, B's and C's weight sets and the final one, the APMs' points, the
    context models' probabilities and counts."""
    tables, weights, apm, _, _ = state
    squash = curves[1]
    x, slots, _, sums = work
    final = weights[_FINAL + c0]
    error = ((y << 12) - sums[3]) * FINAL_RATE
    for m in range(3):
        final[m] += (_clip(sums[m]) * error) >> 14
    for m in range(3):
        w = weights[sums[8 + m]]
        rate = LEARNING_RATE + BOOST * HALF // (w[INPUTS] + HALF)
        w[INPUTS] = min(w[INPUTS] + 1, 1 << 20)
        error = (((y << 12) - _squash(sums[m] >> 16, squash)) * rate) >> 4
        for i in range(INPUTS):
            w[i] += (x[i] * error) >> 14
    point, fraction, target = sums[4] >> 7, sums[4] & 127, 65535 * y
    for j in range(3):
        row = sums[5 + j]
        apm[row, point] += ((target - apm[row, point]) * (128 - fraction)) >> (7 + APM_RATE)
        apm[row, point + 1] += ((target - apm[row, point + 1]) * fraction) >> (7 + APM_RATE)
    half, within = _half(c0, depth)
    for i in range(CONTEXTS):
        entry = np.int64(tables[slots[i, half], within])
        p, n = (entry >> 10) + (1 << 21), entry & 1023
        p += (((y << 22) - p) * _RATES[n]) >> 16
        tables[slots[i, half], within] = ((p - (1 << 21)) << 10) | min(n + 1, COUNT_LIMIT)


_ARRAYS = "float64[:, ::1], float64[:, :, ::1]"  # version 2's distribution, the running sums
_CODER = "int64[::1], uint8[::1], int64[::1], int64[:, ::1], boolean"  # state, buffer, bytes, probabilities, decode
_CODER_ROWS = "int64[::1], uint8[::1], int64[:, ::1], int64[:, ::1], boolean"  # the same with n positions' bytes [n, k]


@kernel(f"void({_STATE}, {_CURVES}, uint64[:, ::1], uint64[::1], {TEXT}, {_ARRAYS}, {_WORK}, {_CODER})")
def _code(state, curves, history, word, text, byte_probs, cums, work, coder, buffer, coded, probabilities, decode):
    """Code the bytes ``coded [k]`` of the first ``k`` streams (or, with ``decode``, decode
    them into it) bit by bit, stream after stream, through the binary coder ``coder
    [4]``, ``buffer`` (:mod:`sharnn.coding.binary`): each bit's node refines version 2's
    ``byte_probs [B, 256]`` (:func:`_node`; ``cums [B, 2, 257]``, the running sums), is
    coded with :func:`_coded_probability`, recorded in ``probabilities [B, 8]`` (2**-16,
    of the bit coded), and learns it (:func:`_learn_node`); then the indirect table (the
    word ``word [B]`` that a byte ends follows the previous one) and the lines' starts
    (``text``) learn the byte."""
    tables, weights, _, contexts, previous = state
    words, _, t, indirect, lines = text
    for b in range(len(coded)):  # every stream's first rows asked for before any is read
        hash_contexts(history, word, b, contexts, text)
        previous[b] = np.int64(history[b, 0])
        _fetch_slots(state, b, 0)
        _fetch_apms(state, b, 1)
        for row in (1, _set_b(previous, b, 1), _set_c(contexts, b)):
            _fetch_set(weights, row)  # the root's weight sets: mixer A's, B's, and C's for the whole byte
    for b in range(len(coded)):
        work[2][:] = False
        c0, under = 1, False
        for depth in range(8):
            if depth < 7:  # both children's weight sets and APM rows asked for
                for child in range(2 * c0, 2 * c0 + 2):
                    _fetch_set(weights, child)
                    _fetch_set(weights, _set_b(previous, b, child))
                    _fetch_apms(state, b, child)
            _slots(tables, contexts, b, c0, depth, work)  # claimed where a context is new
            p, under = _coded_probability(cums[b, 0], c0, depth, _node(state, curves, b, c0, cums[b], work), under)
            if decode:
                y = binary.decode_bit(coder, buffer, p)
            else:
                y = (coded[b] >> (7 - depth)) & 1
                binary.encode_bit(coder, buffer, y, p)
            probabilities[b, depth] = p if y else 65536 - p
            _learn_node(state, curves, b, c0, depth, y, work)
            c0 = 2 * c0 + y
            if depth == 3:
                _fetch_slots(state, b, _half(c0, 4)[0])  # its APM rows were asked for as a child
        coded[b] = c0 - 256
        pair = np.int64(history[b, 0] * np.uint64(257) + history[b, 1]) & 0xFFFF
        indirect[pair] = ((indirect[pair] << 8) | coded[b]) & 0xFFFF
        if word[b] != np.uint64(0) and not mixing._letter(coded[b]):  # a word ends: it followed the previous one
            indirect[followed(words[b])] = np.int64(word[b] >> np.uint64(1))
        if coded[b] == 10:
            lines[b, 0], lines[b, 1] = t + 1, lines[b, 0]


@kernel(f"void({matching._MIXER}, {_STATE}, {_CURVES}, {TEXT}, int64[:, ::1], {_ARRAYS}, {_WORK}, {_CODER_ROWS})")
def _positions(
    mixer, state, curves, text, log_weights, byte_probs, cums, work, coder, buffer, rows, probabilities, decode
):
    """Positions ``t .. t + n - 1`` of mixing 3 in one call (:meth:`BitMixer.code_positions`;
    ``t``: ``text``'s), each with the model's ``log_weights [B, 256]``: version 2's prediction
    (:func:`sharnn.coding.matching._predict`) into ``byte_probs [B, 256]``, the running sums
    (the model's once, :func:`_model_sums`; version 2's, :func:`_byte_sums`), the bits of
    ``rows [n, k]`` coded (:func:`_code`; with ``decode``, decoded into ``rows``), then
    version 2's update (``k`` at most ``B`` bytes, and room in the match model's buffer, as
    the caller checks)."""
    _, _, history, word, _, _, model, _, _, logs, _, _ = mixer
    words, match, t, indirect, lines = text
    for i in range(rows.shape[0]):
        matching._predict(mixer, log_weights, byte_probs)
        if i == 0:  # the model's running sums: its log-weights are the call's
            _model_sums(model, logs[2], cums)
        _byte_sums(byte_probs, cums)
        here = (words, match, t + i, indirect, lines)
        _code(state, curves, history, word, here, byte_probs, cums, work, coder, buffer, rows[i], probabilities, decode)
        matching._update(mixer, t + i, rows[i])


def slots_for(size: int) -> int:
    """The context models' slots for ``size`` bytes to code: :data:`SLOTS_PER_BYTE` a byte
    (a byte claims 10 to 13, measured; at 16 a byte files came out up to 0.02% larger),
    within :data:`MIN_SLOTS` .. :data:`SLOTS`, a multiple of :data:`WAYS`. A short input
    touches less memory, and less often a new page (docs/compression.md, "Mixing version 3")."""
    return min(SLOTS, max(MIN_SLOTS, -(-SLOTS_PER_BYTE * size // WAYS) * WAYS))


class BitMixer(MatchMixer):
    """Mixing version 3 for ``streams`` streams: :meth:`code` codes a position's bytes bit
    by bit through a binary coder (:mod:`sharnn.coding.binary`), one kernel call a
    position (:func:`_position`). Besides version 2's state (whose prediction and update it
    runs inside :meth:`code`): :attr:`bits`, the context models of bits (``[slots_for(streams
    * positions) + 1, 16]`` int32, one table for all, sized to the bytes to code,
    ``positions`` per stream at most: each slot a check, then each node's probability and
    count; the last slot stays empty), the mixers' weights, the APMs, each stream's contexts
    and previous byte; :attr:`text`'s indirect table and lines' starts;
    :attr:`coded_probabilities` ``[B, 8]``, the probability (2**-16) each bit of the last
    position's bytes was coded with."""

    def __init__(self, streams: int, positions: int = 4096):
        super().__init__(streams, positions)
        # zero: p = 1/2, n = 0; every page touched now, not in the middle of a node
        tables = mixing._small_page_zeros((slots_for(streams * positions) + 1, 16), np.int32, touched=True)
        # the last column: how often the set has learned. At first each mixer is version 2
        # alone, its weight 1: a set of A, B or C holds each weight less its start (all 0,
        # 53 MiB, touched now as the table is), and the final mixer the mean.
        weights = mixing._small_page_zeros((SETS, INPUTS + 1), np.int64, touched=True)
        weights[_FINAL:_C, :3] = mixing.WEIGHT_UNIT // 3
        apm = np.repeat(_squash_points().astype(np.uint16)[None], 3 * _APM_ROWS, axis=0)
        contexts, previous = np.zeros((streams, CONTEXTS), np.uint64), np.zeros(streams, np.int64)
        self.bits = (tables, weights, apm, contexts, previous)
        self.indirect, self.lines = np.zeros(INDIRECT, np.int64), np.zeros((streams, 2), np.int64)
        self.lines[:, 1] = -1  # no line before the first
        self.coded_probabilities = np.zeros((streams, 8), np.int64)
        self._curves = (_stretch().astype(np.int16), _squash_table().astype(np.int16))
        self._byte_probs = np.zeros((streams, 256), np.float64)  # the position's distribution from version 2 ...
        self._cums = np.zeros((streams, 2, 257), np.float64)  # ... its running sums, and the model's
        inputs, slots = np.zeros(INPUTS, np.int64), np.zeros((CONTEXTS, 17), np.int64)
        self._work = (inputs, slots, np.zeros(17, np.bool_), np.zeros(11, np.int64))  # a node's scratch: _WORK

    @property
    def text(self) -> tuple:
        """What the contexts of text read (:data:`~sharnn.coding.bitcontexts.TEXT`)."""
        return self.previous, self.match[0], self.position, self.indirect, self.lines

    def code(
        self, model_log_weights: np.ndarray, coder: BinaryEncoder | BinaryDecoder, coded: np.ndarray | int
    ) -> np.ndarray:
        """Code a position: the bytes ``coded [k]`` of the first ``k`` streams into the
        ``coder`` (a :class:`~sharnn.coding.binary.BinaryEncoder`), or ``k`` bytes out of
        it (a :class:`~sharnn.coding.binary.BinaryDecoder`), with the model's
        ``model_log_weights [B, 256]`` (as :meth:`~sharnn.coding.mixing.AdaptiveMixer.mix`
        takes them); every model learns them.

        Returns:
            The ``k`` bytes coded, int64.

        Raises:
            ValueError: as :meth:`code_positions`.
        """
        decode = isinstance(coder, BinaryDecoder)
        return self.code_positions(model_log_weights, coder, (1, int(coded)) if decode else np.asarray(coded)[None])[0]

    def code_positions(
        self, model_log_weights: np.ndarray, coder: BinaryEncoder | BinaryDecoder, coded: np.ndarray | tuple[int, int]
    ) -> np.ndarray:
        """Code ``n`` positions in one kernel call, each with the same ``model_log_weights
        [B, 256]`` (a walk without the model: zeros, :class:`~sharnn.coding.arithmetic.MixedPredictor`):
        the bytes ``coded [n, k]`` of the first ``k`` streams into a
        :class:`~sharnn.coding.binary.BinaryEncoder`, or, given ``(n, k)``, ``n`` positions
        of ``k`` bytes out of a :class:`~sharnn.coding.binary.BinaryDecoder`. The same
        bits as :meth:`code` position by position; :attr:`coded_probabilities` holds the
        last position's.

        Returns:
            The bytes coded ``[n, k]``, int64.

        Raises:
            ValueError: ``model_log_weights`` not ``[B, 256]``; ``coded`` not ``[n, k <= B]``
                bytes (nothing is coded or learned); from a decoder, bits that run past
                its end.
        """
        if np.shape(model_log_weights) != self._model.shape:
            raise ValueError(f"model log-weights of shape {np.shape(model_log_weights)}, not {self._model.shape}")
        decode = isinstance(coder, BinaryDecoder)
        if decode:
            rows = np.zeros((coded[0], min(coded[1], self.streams)), np.int64)
        else:
            rows = np.array(coded, dtype=np.int64)
            if rows.ndim != 2 or not (rows.shape[1] <= self.streams and mixing._codable(rows.reshape(-1), rows.size)):
                raise ValueError(f"coded must be [n, k <= {self.streams}] bytes, not {coded!r}")
            coder.reserve(8 * rows.size)
        mixer, weights = self.position_arrays(len(rows)), np.ascontiguousarray(model_log_weights, dtype=np.int64)
        arrays = (self.bits, self._curves, self.text, weights, self._byte_probs, self._cums, self._work)
        _positions(mixer, *arrays, coder.state, coder.buffer, rows, self.coded_probabilities, decode)
        self.position += len(rows)
        return rows

    def mix(self, model_log_weights: np.ndarray) -> np.ndarray:
        """Not a distribution of bytes: mixing 3 codes bits (:meth:`code`).

        Raises:
            TypeError: always.
        """
        raise TypeError("mixing 3 codes a byte bit by bit: BitMixer.code(), not mix()")

    def update(self, coded: np.ndarray) -> None:
        """:meth:`code` learns as it codes.

        Raises:
            TypeError: always.
        """
        raise TypeError("mixing 3 learns as it codes: BitMixer.code(), not update()")
