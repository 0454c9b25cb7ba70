"""Mixing version 3: version 2's distribution (:mod:`sharnn.coding.matching`) refined one
bit at a time by context models of bits, as lpaq and paq8 model a byte (docs/compression.md,
"Mixing version 3").

A byte is the path of 8 binary decisions from the root of a tree, each node named by the
bits decided so far with a leading 1 (``c0``, 1 to 255). At each node version 2's
distribution ``P`` gives the probability that the next bit is 1, and ten context models of
bits give theirs; a logistic mixer weighs them in the stretched domain::

    st(p) = ln(p / (1 - p)),  squash(x) = 1 / (1 + exp(-x))
    x_0 = st(P(bit = 1 | c0))                 version 2's, from the sums of P over the node's halves
    x_1 = 1                                   a bias
    x_{2+i} = st(p_i), x_{12+i} = p_i - 1/2   context i's probability p_i of a 1 here
    p_A = squash(sum_i a_{c0,i} x_i), p_B = squash(sum_i b_{prev,bit,i} x_i)
    p = squash(mean of both sums);  p' = (p + APM_{prev,c0}(p)) / 2
    a_i += lr (y - p_A) x_i, b_i likewise;  p_i += (y - p_i) / (n_i + 2)

``p_i`` is the probability held for context ``i`` (the last 1, 2, 3, 4, 6 and 8 bytes; the
word; the word and the previous byte; the bytes 2 and 3 back; 3 and 4 back) and node
``c0``, ``n_i`` how often it has been updated (at most :data:`COUNT_LIMIT`). Mixer A's
weight set is the node, mixer B's the previous byte and the bit's place. The APM is
version 2's kind (33 points) keyed by the previous byte and the node.

The coder codes bytes, so each position's distribution is the tree's: ``p(s)`` is the
product of the 8 refined probabilities on ``s``'s path. A node that ``P`` gives less than
``2**-THRESHOLD_BITS`` keeps ``P``'s own split below it (measured: 32 nodes per byte of
alice29 instead of 255, for 0.04% of its size). After coding, every node on the coded
byte's path learns, the streams one after the other.

Every number of the models, mixers and APMs is an integer (probabilities in units of
2**-12, the context models' in 2**-22, weights in 2**-16, stretched values in 1/256); the
split of ``P`` and the tree's products are float64 in a fixed order, exactly rounded on
every machine (no fused operations): the compiled core's rules.
"""

from __future__ import annotations

import decimal
from functools import cache

import numpy as np

from ..compiled import kernel
from . import mixing
from .matching import MatchMixer, _squash_points, _stretch

MIXING_VERSION = 3
CONTEXTS = 10  # the context models of bits (the module's docstring names them)
SLOT_BITS = 18  # each context model: 2**18 slots of 16 probabilities, one slot per context and half byte
COUNT_LIMIT = 255  # p_i moves 1/(n + 2) of the way to the bit, at least 1/257
INPUTS = 2 + 2 * CONTEXTS
SETS = 256 + 257 * 8  # mixer A's weight sets (the node), then mixer B's (the previous byte + 1, the bit's place)
LEARNING_RATE = 3  # w_i += (x_i (4096 y - 4096 p) 3) >> 14, in the units above
THRESHOLD_BITS = 8  # nodes below P's mass 2**-8 are not refined
APM_RATE = 5  # an APM point moves 1/32 of the way to its target
_APM_ROWS = 1 << 16
_MULTIPLIER = mixing._MULTIPLIER
_SLOT_MULTIPLIER = np.uint64(0x2545F4914F6CDD1D)
_ORDERS = np.array([1, 2, 3, 4, 6, 8, 0], dtype=np.int64)  # the context models of the last k bytes
_SALTS = np.array([0x1234567, 0x2234567, 0x3234567, 0x4234567], dtype=np.uint64)
_STATE = "Tuple((int32[:, :, ::1], int64[:, ::1], int64[:, ::1], uint64[:, ::1], int64[::1]))"
_CURVES = "UniTuple(int64[::1], 2)"  # stretch (4096 probabilities) and squash (4095 stretched values)


@cache
def _squash_table() -> np.ndarray:
    """``round(4096 / (1 + exp(-x / 256)))`` for ``x = -2047 .. 2047``, within 1 .. 4095 (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        values = [int((4096 / (1 + (-decimal.Decimal(x) / 256).exp())).to_integral_value()) for x in range(-2047, 2048)]
    return np.array([min(4095, max(1, v)) for v in values], dtype=np.int64)


@kernel("int64(int64, int64[::1])")
def _squash(x, table):
    """``squash(x)`` of a stretched value ``x`` (1/256) in units of 2**-12, from ``table``."""
    return table[min(max(x, -2047), 2047) + 2047]


@kernel("int64(int64)")
def _depth(c0):
    """How many bits node ``c0`` has decided (0 .. 7)."""
    depth = 0
    while (c0 >> (depth + 1)) > 0:
        depth += 1
    return depth


@kernel("void(uint64[:, ::1], uint64[::1], int64, uint64[:, ::1])")
def _hash_contexts(history, word, b, contexts):
    """Stream ``b``'s ten context hashes into ``contexts [B, CONTEXTS]`` from its ``history
    [B, 12]`` (each byte + 1, newest first) and ``word [B]`` (:mod:`sharnn.coding.mixing`'s)."""
    value, k = np.uint64(0), 0
    for j in range(8):
        value = (value ^ history[b, j]) * _MULTIPLIER + np.uint64(j + 1)
        if _ORDERS[k] == j + 1:
            contexts[b, k] = value
            k += 1
    contexts[b, 6] = (word[b] + np.uint64(77)) * _MULTIPLIER
    contexts[b, 7] = (word[b] ^ ((history[b, 0] << np.uint64(40)) + np.uint64(99))) * _MULTIPLIER
    for i in range(2):
        sparse = (history[b, 1 + i] << np.uint64(16)) + (history[b, 2 + i] << np.uint64(8)) + _SALTS[i]
        contexts[b, 8 + i] = sparse * _MULTIPLIER


@kernel("int64(uint64, int64, int64)")
def _place(context, c0, depth):
    """Where a context's probability for node ``c0`` lies in its table: a slot of 16 per
    half byte (found by a hash of the context and, past the fourth bit, the first half),
    then the node within the half (1 .. 15)."""
    half = np.uint64(0 if depth < 4 else c0 >> (depth - 4))
    value = (context + half * _SLOT_MULTIPLIER) * _MULTIPLIER
    slot = np.int64((value ^ (value >> np.uint64(29))) >> np.uint64(64 - SLOT_BITS))
    within = c0 if depth < 4 else (1 << (depth - 4)) | (c0 & ((1 << (depth - 4)) - 1))
    return slot * 16 + within


@kernel("int64(float64[::1], int64, int64)")
def _split(cum, c0, depth):
    """``P(bit = 1 | c0)`` in units of 2**-12 (1 .. 4095) from ``cum [257]``, the running sums of ``P``."""
    width = 1 << (8 - depth)
    low = (c0 - (1 << depth)) * width
    total, one = cum[low + width] - cum[low], cum[low + width] - cum[low + width // 2]
    return min(max(np.int64(one / total * 4096), 1), 4095) if total > 0 else 2048


@kernel(f"int64({_STATE}, {_CURVES}, int64, int64, float64[::1], int64[::1], int64[::1], int64[::1])")
def _node(state, curves, b, c0, cum, x, places, out):
    """Stream ``b``'s node ``c0``: its inputs ``x [INPUTS]``, where its context models'
    probabilities lie (``places [CONTEXTS]``, in each table's flat order), ``out = (sum
    of mixer A, of mixer B, p, APM row, st(p) + 2048)``; returns the refined probability
    of a 1 (2**-12). Reads the state, changes nothing."""
    tables, weights, apm, contexts, previous = state
    stretch, squash = curves
    depth = _depth(c0)
    x[0], x[1] = stretch[_split(cum, c0, depth)], 256
    for i in range(CONTEXTS):
        places[i] = _place(contexts[b, i], c0, depth)
        p = ((np.int64(tables[i, places[i] >> 4, places[i] & 15]) >> 10) + (1 << 21)) >> 10
        x[2 + i], x[2 + CONTEXTS + i] = stretch[p], (p - 2048) >> 2
    a, other = weights[c0], weights[256 + previous[b] * 8 + depth]
    out[0], out[1] = 0, 0
    for i in range(INPUTS):
        out[0] += a[i] * x[i]
        out[1] += other[i] * x[i]
    out[2] = _squash((out[0] + out[1]) >> 17, squash)
    out[3], out[4] = (c0 | (previous[b] << 8)) & (_APM_ROWS - 1), stretch[out[2]] + 2048
    row, point, fraction = out[3], out[4] >> 7, out[4] & 127
    refined = (apm[row, point] * (128 - fraction) + apm[row, point + 1] * fraction) >> 11  # 2**-16 -> 2**-12
    return min(max((out[2] + refined) >> 1, 1), 4095)


@kernel("void(float64[::1], float64[::1])")
def _running_sums(probs, cum):
    """``cum [257]``: the sums of ``probs [256]`` before each byte, in order."""
    cum[0] = 0.0
    for s in range(256):
        cum[s + 1] = cum[s] + probs[s]


@kernel(f"void({_STATE}, {_CURVES}, uint64[:, ::1], uint64[::1], float64[:, ::1], float64[:, ::1])")
def _mix(state, curves, history, word, byte_probs, probs):
    """Every stream's distribution ``probs [B, 256]``: the tree of refined splits over
    ``byte_probs [B, 256]`` (version 2's), a node under ``P``'s mass ``2**-THRESHOLD_BITS``
    keeping ``P``'s split below it; leaves each stream's contexts and previous byte in ``state``."""
    contexts, previous = state[3], state[4]
    cum, mass = np.zeros(257), np.zeros(512)  # mass: the tree's probability of each node (leaves from 256)
    x, places, out = np.zeros(INPUTS, np.int64), np.zeros(CONTEXTS, np.int64), np.zeros(5, np.int64)
    threshold = 2.0**-THRESHOLD_BITS
    for b in range(byte_probs.shape[0]):
        _hash_contexts(history, word, b, contexts)
        previous[b] = np.int64(history[b, 0])
        _running_sums(byte_probs[b], cum)
        mass[1] = 1.0
        for c0 in range(1, 256):  # parents before children
            if mass[c0] < 0:  # below a node kept as P splits it
                mass[2 * c0], mass[2 * c0 + 1] = -1.0, -1.0
                continue
            depth = _depth(c0)
            width = 1 << (8 - depth)
            low = (c0 - (1 << depth)) * width
            total = cum[low + width] - cum[low]
            if total < threshold:
                for s in range(low, low + width):
                    probs[b, s] = mass[c0] * (byte_probs[b, s] / total)
                mass[2 * c0], mass[2 * c0 + 1] = -1.0, -1.0
                continue
            one = cum[low + width] - cum[low + width // 2]
            if one * 4096 < total or one * 4096 > total * 4095:  # P surer than the units of 2**-12 can say
                mass[2 * c0 + 1] = mass[c0] * (one / total)
                mass[2 * c0] = mass[c0] * ((total - one) / total)
                continue
            p = _node(state, curves, b, c0, cum, x, places, out)
            mass[2 * c0 + 1] = mass[c0] * (p / 4096.0)
            mass[2 * c0] = mass[c0] * ((4096 - p) / 4096.0)
        for s in range(256):
            if mass[256 + s] >= 0:
                probs[b, s] = mass[256 + s]


@kernel(f"void({_STATE}, {_CURVES}, float64[:, ::1], int64[::1])")
def _learn(state, curves, byte_probs, coded):
    """Every node on the path of each of the first ``k`` streams' bytes ``coded [k]``
    learns, stream after stream: both mixers' weight sets, the APM's two points, the
    context models' probabilities and counts."""
    tables, weights, apm, _, previous = state
    squash = curves[1]
    cum = np.zeros(257)
    x, places, out = np.zeros(INPUTS, np.int64), np.zeros(CONTEXTS, np.int64), np.zeros(5, np.int64)
    for b in range(len(coded)):
        _running_sums(byte_probs[b], cum)
        c0 = 1
        for depth in range(8):
            y = (coded[b] >> (7 - depth)) & 1
            _node(state, curves, b, c0, cum, x, places, out)
            for m, w in ((0, weights[c0]), (1, weights[256 + previous[b] * 8 + depth])):
                error = ((y << 12) - _squash(out[m] >> 16, squash)) * LEARNING_RATE
                for i in range(INPUTS):
                    w[i] += (x[i] * error) >> 14
            row, point, fraction, target = out[3], out[4] >> 7, out[4] & 127, 65535 * y
            apm[row, point] += ((target - apm[row, point]) * (128 - fraction)) >> (7 + APM_RATE)
            apm[row, point + 1] += ((target - apm[row, point + 1]) * fraction) >> (7 + APM_RATE)
            for i in range(CONTEXTS):
                slot, node = places[i] >> 4, places[i] & 15
                p, n = (np.int64(tables[i, slot, node]) >> 10) + (1 << 21), np.int64(tables[i, slot, node]) & 1023
                p += ((y << 22) - p) // (n + 2)
                tables[i, slot, node] = ((p - (1 << 21)) << 10) | min(n + 1, COUNT_LIMIT)
            c0 = 2 * c0 + y


class BitMixer(MatchMixer):
    """Mixing version 3 for ``streams`` streams, used as :class:`~sharnn.coding.mixing.AdaptiveMixer`:
    :meth:`mix`, then :meth:`update`. Besides version 2's state: the context models of
    bits (``[CONTEXTS, 2**SLOT_BITS, 16]`` int32: each probability and count), both
    mixers' weights, the APM, and version 2's distribution of the position."""

    def __init__(self, streams: int, positions: int = 4096):
        super().__init__(streams, positions)
        tables = mixing._small_page_zeros((CONTEXTS, 2**SLOT_BITS, 16), np.int32)  # zero: p = 1/2, n = 0
        weights = np.zeros((SETS, INPUTS), np.int64)
        weights[:, 0] = mixing.WEIGHT_UNIT  # at first each mixer is version 2 alone
        apm = np.repeat(_squash_points()[None], _APM_ROWS, axis=0)
        contexts, previous = np.zeros((streams, CONTEXTS), np.uint64), np.zeros(streams, np.int64)
        self.bits = (tables, weights, apm, contexts, previous)
        self._curves = (_stretch(), _squash_table())
        self._byte_probs = np.zeros((streams, 256), np.float64)

    def mix(self, model_log_weights: np.ndarray) -> np.ndarray:
        self._byte_probs[...] = super().mix(model_log_weights)
        probs = np.empty((self.streams, 256), dtype=np.float64)
        _mix(self.bits, self._curves, self.history, self.word, self._byte_probs, probs)
        return probs

    def update(self, coded: np.ndarray) -> None:
        coded = np.ascontiguousarray(coded, dtype=np.int64)
        if self._mixed and coded.ndim == 1 and mixing._codable(coded, self.streams):
            _learn(self.bits, self._curves, self._byte_probs, coded)
        super().update(coded)  # raises for what the bits did not learn from
