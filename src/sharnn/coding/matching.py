"""Mixing version 2: version 1's adaptive stage (:mod:`sharnn.coding.mixing`) with a match
model, three more context models, and secondary estimation (docs/compression.md, "Mixing
version 2").

The match model (lpaq's, at the level of bytes) finds the longest earlier occurrence of a
stream's last bytes in any stream coded so far and predicts the byte that followed it::

    x^     = the byte after the earlier occurrence, L its length (0: no match)
    r_L    = (2 h_L + 1) / (2 n_L + 2)                    how often a match of L's bucket was right
    X_M(s) = ln r_L if s = x^, else ln((1 - r_L) / 255)   a model's input, as the context models'
    X'_M(s) = 1 nat if s = x^, else 0                     a bias each weight set learns

Mixer 1's weight set is the contexts seen and the match's length (none, < 16, < 32,
longer). The context models add the last two words, the bytes 2 to 4 back and the last
three words. The mixers' mean logit then goes through three APMs (paq's adaptive
probability maps) on the event "the most likely byte is coded", keyed by the previous
byte, by the previous two and by the match (its length's bucket, whether it predicts the
most likely byte)::

    p = the most likely byte's probability, st = ln(p / (1 - p))
    a_c = interpolation of table_c at st (33 points)      per context c
    p' = (a_1 + 2 a_2 + a_3) / 4; the other bytes scaled by (1 - p') / (1 - p)

Every number but the last scaling is an integer, as in version 1; the scaling is float64
products and one division, exactly rounded on every machine (no fused operations). The
match finds its candidates by a hash of the last :data:`MATCH_ORDER` bytes and checks
them byte by byte, so a hash collision predicts nothing. :data:`PARTS` switches each part
off, for measurements only (``benchmarks/adaptive_mixing.py``).
"""

from __future__ import annotations

import decimal
from functools import cache

import numpy as np

from ..compiled import kernel
from ..models import exact
from ..tables import decimal_table
from . import mixing
from .mixing import (
    _INPUTS,
    _LOGS,
    _MIXERS,
    _PLACES,
    _STREAM,
    _TABLES,
    ORDERS,
    AdaptiveMixer,
    _advance,
    _codable,
    _count,
    _count_inputs,
    _exp_weights,
    _hash_contexts,
    _learn_all,
    _logits,
    _place,
    fixed_log,
)

MIXING_VERSION = 2
MATCH_ORDER = 10  # a candidate is found by a hash of the last 6 bytes
MATCH_BITS = 20  # 2**20 candidates
LONGEST_CHECK = 32  # a new match's length is counted back at most this far
BUCKETS = 20  # lengths 1 .. 15, 16-23, 24-31, 32-63, 64-127, 128+ (bucket 0: no match)
HIT_LIMIT = 1023  # a bucket's counts are halved past this many tries
APM_POINTS = 33  # each APM row: 33 points of st from -2048 to 2048 (1/256 nat)
APM_RATE = 4  # an APM point moves 1/64 of the way to its target
APM_ORDER2_BITS = 16
APM_SHARES = (0, 1, 2, 1)  # p' = (a_1 + 2 a_2 + a_3) / 4
APM_ROWS = 3
_APM_MATCH_ROWS = 257 + (1 << APM_ORDER2_BITS)  # the APM rows: the last byte's, the last two's, the match's
PARTS = (1, 1, 1)  # whether the match model, the APMs, the extra contexts run (0: off, to measure what each gives)
# The mixers' weight sets: by the contexts seen and the match's length (none, < 16, < 32, longer); by the previous byte
SELECTORS = (4 * (len(ORDERS) + 1), 257)
EXTRA = 3  # context models besides version 1's: the last two words; bytes 2 to 4 back; the last three words
_SALT = np.uint64(0x51ED2701)

_MATCH = "Tuple((uint8[:, ::1], int64[::1], int64[:, ::1], int64[:, ::1]))"  # buffer, candidates, state, hits
# the APMs' tables and state, the stretch table, the hit logs, the PARTS
_APM = "Tuple((int64[:, ::1], int64[:, ::1], int64[::1], int64[::1], int64[::1]))"
# a position's arrays (MatchMixer.position_arrays): the tables, the places, the histories, the words, the last two
# words, the hashes, the model's inputs, the inputs, the mixers, the logarithms, the match model, the APMs
_MIXER = (
    f"Tuple(({_TABLES}, {_PLACES}, uint64[:, ::1], uint64[::1], uint64[::1], uint64[:, ::1], int64[:, ::1],"
    f" {_INPUTS}, {_MIXERS}, {_LOGS}, {_MATCH}, {_APM}))"
)


@decimal_table
def _stretch() -> np.ndarray:
    """``round(256 ln(p / (1 - p)))`` of ``p = (j + 1/2) / 4096``, within -2047 .. 2047 (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        values = []
        for j in range(4096):
            p = (decimal.Decimal(j) + decimal.Decimal("0.5")) / 4096
            values.append(max(-2047, min(2047, int((256 * (p / (1 - p)).ln()).to_integral_value()))))
    return np.array(values, dtype=np.int64)


@cache
def _squash_points() -> np.ndarray:
    """``round(65536 / (1 + exp(-st / 256)))`` at the APM's points ``st = -2048 + 128 j`` (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        points = [decimal.Decimal(-2048 + 128 * j) / 256 for j in range(APM_POINTS)]
        values = [int((65536 / (1 + (-x).exp())).to_integral_value()) for x in points]
    return np.array([min(65535, max(1, v)) for v in values], dtype=np.int64)


@cache
def _hit_logs() -> np.ndarray:
    """``ln(v)`` (2**-10 nat) of ``v = 1 .. 2 HIT_LIMIT + 4`` at index ``v``; index 0: ``ln 255``."""
    values = np.arange(2 * HIT_LIMIT + 5, dtype=np.int64)
    values[0] = 255
    return fixed_log(values)


@kernel("void(uint64[:, ::1], uint64[::1], uint64[::1], uint64[:, ::1])")
def _hash_more(history, word, previous, hashes):
    """The hashes of the extra contexts, after version 1's (:func:`sharnn.coding.mixing._hash_contexts`) in
    ``hashes``: the current and the previous word (``previous [2B]``: each stream's last
    word, then the one before) and, between words, the last byte; the bytes 2 to 4 back;
    the first of these with the word before the previous one."""
    if hashes.shape[0] < len(ORDERS) + 1 + EXTRA:
        return
    for b in range(len(word)):
        value = ((word[b] ^ _SALT) * mixing._MULTIPLIER ^ previous[b]) * mixing._MULTIPLIER + np.uint64(1)
        if word[b] == np.uint64(0):
            value = (value ^ history[b, 0]) * mixing._MULTIPLIER
        hashes[len(ORDERS) + 1, b] = value
        value = _SALT + np.uint64(2)
        for j in range(1, 4):
            value = (value ^ history[b, j]) * mixing._MULTIPLIER + np.uint64(j)
        hashes[len(ORDERS) + 2, b] = value
        if EXTRA > 2:
            value = hashes[len(ORDERS) + 1, b] ^ (previous[len(word) + b] + np.uint64(3)) * mixing._MULTIPLIER
            hashes[len(ORDERS) + 3, b] = value * mixing._MULTIPLIER


@kernel("void(uint64[::1], uint64[::1], int64[::1])")
def _remember(word, previous, coded):
    """A word that ``coded [k]`` ends (a letter's word, then another byte) becomes its
    stream's previous one (``previous [2B]``), which moves to the one before."""
    for b in range(len(coded)):
        if word[b] != np.uint64(0) and not mixing._letter(coded[b]):
            previous[len(word) + b] = previous[b]
            previous[b] = word[b]


@kernel("int64(int64)")
def _bucket(length):
    """A match length's bucket: 0 for none, the length up to 15, then 16 .. 19 by octave."""
    if length < 16:
        return length
    if length < 24:
        return 16
    if length < 32:
        return 17
    return min(18 + (length >= 64) + (length >= 128), BUCKETS - 1)


@kernel(f"void({_MATCH}, {_APM}, int64, {_STREAM})")
def _match_inputs(match, apm, b, inputs):
    """Stream ``b``'s match inputs into ``inputs`` (:func:`sharnn.coding.mixing._count_inputs`'s
    layout), the last model's: none when it has no match."""
    buffer, _, state, hits = match
    logs, parts = apm[3], apm[4]
    base, symbols, deltas, present = inputs
    last = len(present) - 1
    i = 1 + 2 * last
    base[i], base[i + 1], present[last] = 0, 0, 0
    if state[b, 2] == 0 or parts[0] == 0:
        return
    right, tries = hits[_bucket(state[b, 2]), 0], hits[_bucket(state[b, 2]), 1]
    total = logs[2 * tries + 2]
    hit, miss = logs[2 * right + 1] - total, logs[2 * (tries - right) + 1] - total - logs[0]
    symbols[last, 0], present[last] = buffer[state[b, 0], state[b, 1]], 1
    base[i], deltas[i, 0], deltas[i + 1, 0] = miss, hit - miss, mixing.LOG_UNIT


@kernel(f"void(int64[::1], int64, uint64[:, ::1], {_MATCH}, {_APM}, float64[::1])")
def _refine(weights, b, history, match, apm, probs):
    """The APMs on integer ``weights [256]`` of stream ``b`` into ``probs [256]``; leaves
    the most likely byte, the point and the rows in ``apm``'s state for :func:`_apm_learn`."""
    tables, state, stretch, _, parts = apm
    total, top = weights.sum(), np.argmax(weights)
    if parts[1] == 0:
        scale = 1.0 / total
        for s in range(256):
            probs[s] = weights[s] * scale
        return
    rest = total - weights[top]
    st = stretch[min(weights[top] * 4096 // total, 4095)] + 2048
    point, fraction = st >> 7, st & 127
    order2 = np.int64(
        ((history[b, 0] * np.uint64(257) + history[b, 1]) * mixing._MULTIPLIER) >> np.uint64(64 - APM_ORDER2_BITS)
    )
    state[b, 0], state[b, 1], state[b, 2] = top, point, fraction
    state[b, 3], state[b, 4] = np.int64(history[b, 0]), 257 + order2
    length = match[2][b, 2] if parts[0] else 0
    guess = match[0][match[2][b, 0], match[2][b, 1]] if length > 0 else -1
    state[b, 5] = _APM_MATCH_ROWS + 2 * _bucket(length) + (guess == top)
    p = APM_SHARES[0] * (weights[top] * 65536 // total)
    for j in range(APM_ROWS):
        row = state[b, 3 + j]
        p += APM_SHARES[1 + j] * ((tables[row, point] * (128 - fraction) + tables[row, point + 1] * fraction) >> 7)
    p = min(max(p >> 2, 64), 65536 - 64)
    scale = (65536 - p) / 65536 / rest  # rest >= 255: every weight is at least 1
    for s in range(256):
        probs[s] = weights[s] * scale
    probs[top] = p / 65536


@kernel(f"void({_APM}, int64, int64)")
def _apm_learn(apm, b, coded):
    """Move stream ``b``'s two APM rows' points (from :func:`_refine`) toward what was coded."""
    tables, state, _, _, parts = apm
    if parts[1] == 0:
        return
    target, point, fraction = 65535 if coded == state[b, 0] else 0, state[b, 1], state[b, 2]
    for j in range(APM_ROWS):
        row = state[b, 3 + j]
        tables[row, point] += ((target - tables[row, point]) * (128 - fraction)) >> (7 + APM_RATE)
        tables[row, point + 1] += ((target - tables[row, point + 1]) * fraction) >> (7 + APM_RATE)


@kernel(
    f"void({_TABLES}, {_PLACES}, uint64[:, ::1], int64[:, ::1], {_INPUTS}, {_MIXERS}, {_LOGS}, {_MATCH}, {_APM},"
    " float64[:, ::1])",
    allocates=True,
)
def _mix(tables, places, history, model, inputs, mixers, logs, match, apm, probs):
    """Version 1's mix (:func:`sharnn.coding.mixing._mix`) with the match model's inputs,
    the third mixer (its set: the match's length bucket) and the APMs."""
    (weights, offsets, chosen, q), exp = mixers, logs[2]
    logits, mean = np.zeros((len(offsets), 256), np.int64), np.zeros(256, np.int64)
    mixing._fetch_rows(tables, places)
    for b in range(model.shape[0]):
        stream = (inputs[0][b], inputs[1][b], inputs[2][b], inputs[3][b])
        seen = _count_inputs(tables, places, b, logs, stream)
        _match_inputs(match, apm, b, stream)
        length = match[2][b, 2] if apm[4][0] else 0
        coarse = (length > 0) + (length >= 16) + (length >= 32)
        for m in range(len(offsets)):
            chosen[m, b] = seen + (len(ORDERS) + 1) * coarse if m == 0 else np.int64(history[b, 0])
            _logits(weights[offsets[m] + chosen[m, b]], model[b], stream, logits[m])
            _exp_weights(logits[m], exp, q[m, b])
        for s in range(256):
            mean[s] = (logits[0, s] + logits[1, s]) >> 1
        _exp_weights(mean, exp, mean)
        _refine(mean, b, history, match, apm, probs[b])


@kernel(f"void({_MIXER}, int64[:, ::1], float64[:, ::1])", allocates=True)
def _predict(mixer, model_log_weights, probs):
    """A position's prediction (:meth:`MatchMixer.mix`) in one call: ``model_log_weights
    [B, 256]`` (1/256 nat: :func:`sharnn.models.exact.log_weights`) into the model's inputs
    (2**-10 nat), the contexts hashed and placed, then :func:`_mix` into ``probs [B, 256]``."""
    tables, places, history, word, previous, hashes, model, inputs, mixers, logs, match, apm = mixer
    for b in range(model.shape[0]):
        for s in range(256):
            model[b, s] = model_log_weights[b, s] * (mixing.LOG_UNIT // exact.EXP_RESOLUTION)
    _hash_contexts(history, word, hashes)
    _hash_more(history, word, previous, hashes)
    _place(hashes, places)
    _mix(tables, places, history, model, inputs, mixers, logs, match, apm, probs)


@kernel(f"void({_MATCH}, uint64[:, ::1], int64, int64[::1])", allocates=True)
def _follow(match, history, t, coded):
    """The match model's step after position ``t`` coded ``coded [k]`` (its bytes already in
    the buffer, the histories advanced): each match that predicted right grows, one that
    did not ends; a stream without a match looks one up and counts its length back; then
    each stream's last bytes name its next position as a candidate (the last stream wins)."""
    buffer, candidates, state, hits = match
    k = len(coded)
    keys = np.zeros(k, np.int64)
    for b in range(k):
        if state[b, 2] > 0:
            bucket, right = _bucket(state[b, 2]), buffer[state[b, 0], state[b, 1]] == coded[b]
            hits[bucket, 0] += right
            hits[bucket, 1] += 1
            if hits[bucket, 1] > HIT_LIMIT:
                hits[bucket, 0], hits[bucket, 1] = hits[bucket, 0] >> 1, hits[bucket, 1] >> 1
            state[b, 1] += 1
            state[b, 2] = state[b, 2] + 1 if right else 0
        value = _SALT
        for j in range(MATCH_ORDER):
            value = (value ^ history[b, j]) * mixing._MULTIPLIER
        keys[b] = np.int64(value >> np.uint64(64 - MATCH_BITS))
        if state[b, 2] == 0 and t + 1 >= MATCH_ORDER and candidates[keys[b]] > 0:
            other, at = (candidates[keys[b]] - 1) >> 32, (candidates[keys[b]] - 1) & 0xFFFFFFFF
            length = 0
            while length < LONGEST_CHECK and at - 1 - length >= 0 and t - length >= 0:
                if buffer[other, at - 1 - length] != buffer[b, t - length]:
                    break
                length += 1
            if length >= MATCH_ORDER:
                state[b, 0], state[b, 1], state[b, 2] = other, at, length
    for b in range(k):
        candidates[keys[b]] = (b << 32) + t + 2  # stream b's position t + 1, plus one


@kernel(f"boolean({_MIXER}, int64, int64[::1])", allocates=True)
def _update(mixer, t, coded):
    """Version 1's update (:func:`sharnn.coding.mixing._update`), the APMs' and the match
    model's, after position ``t``."""
    tables, places, history, word, previous, _, model, inputs, mixers, _, match, apm = mixer
    if t >= match[0].shape[1] or not _codable(coded, len(word)):
        return False
    _learn_all(model, inputs, mixers, coded)
    for b in range(len(coded)):
        _apm_learn(apm, b, coded[b])
        match[0][b, t] = coded[b]
    _count(tables, places, coded)
    _remember(word, previous, coded)
    _advance(history, word, coded)
    _follow(match, history, t, coded)
    return True


class MatchMixer(AdaptiveMixer):
    """Mixing version 2 for ``streams`` streams, used as :class:`~sharnn.coding.mixing.AdaptiveMixer`:
    :meth:`mix`, then :meth:`update`. Besides its state: the match model's (each stream's
    bytes so far, the candidates, each stream's match, the hit counts per length bucket)
    and the APMs' tables."""

    def __init__(self, streams: int, positions: int = 4096):
        super().__init__(streams)
        contexts = len(ORDERS) + 1 + EXTRA * PARTS[2]
        self.tables = mixing.ContextTables(contexts)  # version 1's, then the extra contexts
        self._hashes = np.zeros((contexts, streams), dtype=np.uint64)
        self._places = (np.zeros((contexts, streams), np.int64), np.zeros((contexts, streams), np.uint64))
        self.previous = np.zeros(2 * streams, dtype=np.uint64)  # the last two words' hashes (0: none yet)
        buffer = np.zeros((streams, max(positions, 1)), np.uint8)
        state = np.zeros((streams, 3), np.int64)  # the match's stream, position of its next byte, length
        self.match = (buffer, np.zeros(2**MATCH_BITS, np.int64), state, np.zeros((BUCKETS, 2), np.int64))
        rows = _APM_MATCH_ROWS + 2 * BUCKETS
        tables = np.repeat(_squash_points()[None], rows, axis=0)
        self.apm = (tables, np.zeros((streams, 6), np.int64), _stretch(), _hit_logs(), np.array(PARTS, np.int64))
        self.position = 0

    def _layout(self) -> tuple[int, tuple[int, ...]]:
        return len(ORDERS) + 1 + EXTRA * PARTS[2] + 1, SELECTORS

    def position_arrays(self, positions: int = 1) -> tuple:
        """What a position's kernels take (:data:`_MIXER`), with room in the match model's
        buffer for the bytes of the next ``positions`` (it grows to twice as long, or to
        fit, when they outgrow it)."""
        buffer = self.match[0]
        if self.position + positions > buffer.shape[1]:
            room = max(2 * buffer.shape[1], self.position + positions) - buffer.shape[1]
            self.match = (np.concatenate([buffer, np.zeros((len(buffer), room), np.uint8)], axis=1), *self.match[1:])
        state = (self.history, self.word, self.previous, self._hashes, self._model, self._inputs, self._mixers)
        return (self.tables.arrays, self._places, *state, self._logs, self.match, self.apm)

    def mix(self, model_log_weights: np.ndarray) -> np.ndarray:
        if np.shape(model_log_weights) != self._model.shape:
            raise ValueError(f"model log-weights of shape {np.shape(model_log_weights)}, not {self._model.shape}")
        probs = np.empty((self.streams, 256), dtype=np.float64)
        _predict(self.position_arrays(), np.ascontiguousarray(model_log_weights, dtype=np.int64), probs)
        self._mixed = True
        return probs

    def update(self, coded: np.ndarray) -> None:
        coded = np.ascontiguousarray(coded, dtype=np.int64)
        if not self._mixed:
            raise RuntimeError("update() needs a mix() of the position first")
        if not (coded.ndim == 1 and _update(self.position_arrays(), self.position, coded)):
            raise ValueError(f"coded must be [k <= {self.streams}] bytes, not {coded!r}")
        self.position += 1
        self._mixed = False
