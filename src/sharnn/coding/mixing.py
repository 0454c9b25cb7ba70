"""The adaptive stage of the coder: the model's distribution mixed with context models that
learn the file while it is coded (docs/compression.md, "Adapting to the file").

A pretrained model misses what is particular to one file: its names, its spelling, its
line ends. Context models learn those within a few hundred bytes (PPM, lpaq, paq8). Here
each position's distribution is a product of experts (geometric, or logistic, mixing at
the byte level; Mattern, "Mixing strategies in data compression", DCC 2012)::

    X_0(s) = ln p_model(s)                                     the integer step's
    X_k(s) = ln((64 c_k(s) + 1) / (64 N_k + 256))              context model k's counts
    X'_k(s) = X_k(s) * min(N_k, 30) / 30                       the same, by its confidence
    p_m(s) ∝ exp(sum_i w_{m,j,i} X_i(s))                       mixer m, its weight set j
    p(s) ∝ exp(mean_m sum_i w_{m,j,i} X_i(s))                  what is coded
    w_{m,j,i} += lr * (X_i(x) - sum_s p_m(s) X_i(s))           after coding x

``c_k(s)`` counts how often ``s`` followed context ``k`` in this file so far (``N_k`` =
their sum): the last 1 to 8, 10 and 12 bytes of the stream, and the letters of the
word being written. Mixer 1's weight set is the number of the byte contexts seen
before, mixer 2's the previous byte (:data:`SELECTORS`). Each update is a gradient step
on the mixer's own code length, ``-ln p_m(x)``.

Every number is an integer (int64), so the same file gives the same probabilities on
every machine (as the integer step's): the logarithms in units of 2**-10 nat from a table
of ``ln(1 + j/4096)`` computed with :mod:`decimal`, the weights in units of 2**-16, the
probabilities from :func:`sharnn.models.exact.exp_weights`'s table. The ``B`` streams of a
file share the counts and the weights; all streams are predicted from the state before a
position, then all update it (:meth:`ContextTables.add` says how when they meet in a row).

The work of a position runs in numba kernels (:mod:`sharnn.compiled`): :func:`_mix` and
:func:`_update`, about 10 µs per stream, on numpy arrays that hold the state. Their
specification is the numpy code they replaced, kept in ``tests/spec_mixing.py``; they give
its bits exactly (``tests/test_mixing.py``): the same probabilities, counts and weights.
"""

from __future__ import annotations

import decimal
import math
import mmap
from functools import cache

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from ..compiled import inline, kernel, prefetch
from ..models import exact
from ..tables import decimal_table

MIXING_VERSION = 1  # what a file records; a change to any number below makes a new version

ORDERS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)  # context models of the last k bytes, then one of the current word
TABLE_BITS = 16  # rows per context model: 2**16 rows of 256 counts, found by a hash of the context
COUNT_LIMIT = 4095  # a row whose total would pass this is halved first (older counts fade)
CONFIDENT = 30  # N_k from which X'_k = X_k
LOG_UNIT = 2**10  # X in units of 2**-10 nat
WEIGHT_UNIT = 2**16  # w in units of 2**-16
LEARNING_RATE = (25, 256)  # lr = 0.0015 per nat: 0.0015 * 2**16 / 2**10 = 25 / 256 of a weight unit per unit of X
SELECTORS = (len(ORDERS) + 1, 257)  # the mixers' weight sets: by the contexts seen; by the previous byte
MODEL_PRIOR = WEIGHT_UNIT // 2  # the weights a mixer starts from: half the model's log-probabilities ...
COUNT_PRIOR = WEIGHT_UNIT // 10  # ... and a tenth of each X_k (measured on alice29.txt: docs/compression.md)
MANTISSA_BITS = 12

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing
_TAG_MASK = np.uint64(0xFFFFFFFF)
_WORD_SALT = np.uint64(0xA5A5A5A5)
_ROW_SHIFT = np.uint64(64 - TABLE_BITS)
_LONGEST = max(ORDERS)
_MODEL_OF_ORDER = np.array([ORDERS.index(k) if k in ORDERS else -1 for k in range(_LONGEST + 1)], dtype=np.int64)


@decimal_table
def _log_mantissas() -> np.ndarray:
    """``round(2**10 ln(1 + j / 4096))`` for ``j = 0 .. 4095`` (:mod:`decimal`): int64."""
    with decimal.localcontext() as context:
        context.prec = 30
        values = [
            int((LOG_UNIT * (1 + decimal.Decimal(j) / 2**MANTISSA_BITS).ln()).to_integral_value())
            for j in range(2**MANTISSA_BITS)
        ]
    return np.array(values, dtype=np.int64)


@cache
def _ln2() -> int:
    """``ln 2`` in units of 2**-30 nat (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        return int((LOG_UNIT * 2 ** (30 - 10) * decimal.Decimal(2).ln()).to_integral_value())  # in 2**-30


@cache
def _exp_table() -> np.ndarray:
    """:func:`sharnn.models.exact.exp_table` as int64."""
    return exact.exp_table().numpy().astype(np.int64)


def fixed_log(values: np.ndarray) -> np.ndarray:
    """``ln(values)`` in units of 2**-10 nat (int64) for integers ``values`` in [1, 2**52]:
    ``e ln 2 + ln(m)`` with ``m``'s first 12 bits after the point (within 2.5e-4 nat)."""
    mantissa, exponent = np.frexp(values.astype(np.float64))  # values = mantissa * 2**exponent, exactly
    fraction = np.floor((mantissa * 2 - 1) * 2**MANTISSA_BITS).astype(np.int64)
    whole = ((exponent.astype(np.int64) - 1) * _ln2() + 2**19) >> 20  # 2**-30 -> 2**-10, rounded
    return whole + _log_mantissas()[fraction]


@cache
def _count_logs() -> np.ndarray:
    """``fixed_log(64 c + 1)`` for every count ``c`` a row holds (0 to :data:`COUNT_LIMIT`)."""
    return fixed_log(64 * np.arange(COUNT_LIMIT + 1, dtype=np.int64) + 1)


@cache
def _total_logs() -> np.ndarray:
    """``fixed_log(64 N + 256)`` for every total ``N`` of a row (0 to :data:`COUNT_LIMIT`)."""
    return fixed_log(64 * np.arange(COUNT_LIMIT + 1, dtype=np.int64) + 256)


# The kernels (sharnn.compiled's rules: integers, no libm, one thread). Shapes: M context
# models, B streams, I = 1 + 2 M inputs, 256 bytes; a row index counts all models' rows.
# Their arguments, in numba's notation (``::1``: a contiguous axis), grouped in tuples:
_TOTAL = 4  # the place of a pool row's total in its head (ContextTables.heads), after its bitmap
_TABLES = "Tuple((uint64[::1], int32[::1], uint16[:, ::1], int64[::1], uint64[:, ::1]))"  # ContextTables.arrays
_PLACES = "Tuple((int64[:, ::1], uint64[:, ::1]))"  # a position's rows and tags [M, B]
_STREAM = "Tuple((int64[::1], int64[:, ::1], int64[:, ::1], int64[::1]))"  # a stream's base, symbols, deltas, present
_INPUTS = "Tuple((int64[:, ::1], int64[:, :, ::1], int64[:, :, ::1], int64[:, ::1]))"  # the same of every stream
_MIXERS = "Tuple((int64[:, ::1], int64[::1], int64[:, ::1], int64[:, :, ::1]))"  # weights, offsets, chosen, q
_LOGS = "UniTuple(int64[::1], 3)"  # the tables of count logs, total logs, exp weights


@kernel("void(uint64[:, ::1], uint64[::1], uint64[:, ::1])")
def _hash_contexts(history, word, hashes):
    """The 64-bit hash ``hashes [M, B]`` of every stream's contexts: of its last ``k``
    bytes (``history [B, 12]``, newest first, each byte + 1) for each ``k`` in
    :data:`ORDERS`, then of its word (``word [B]``). Wraps around as uint64."""
    for b in range(len(word)):
        value = np.uint64(0)
        for k in range(1, _LONGEST + 1):
            value = (value ^ history[b, k - 1]) * _MULTIPLIER + np.uint64(k)
            if _MODEL_OF_ORDER[k] >= 0:
                hashes[_MODEL_OF_ORDER[k], b] = value
        hashes[len(ORDERS), b] = (word[b] ^ _WORD_SALT) * _MULTIPLIER


@kernel(f"void(uint64[:, ::1], {_PLACES})")
def _place(hashes, places):
    """Row and tag (never 0) ``places`` (``[M, B]`` each) of each hash ``[M, B]``, model
    ``m``'s: its top :data:`TABLE_BITS` bits among model ``m``'s rows, its low 32 bits."""
    rows, tags = places
    for m in range(hashes.shape[0]):
        for b in range(hashes.shape[1]):
            rows[m, b] = np.int64(hashes[m, b] >> _ROW_SHIFT) + (m << TABLE_BITS)
            tags[m, b] = (hashes[m, b] & _TAG_MASK) | np.uint64(1)


@kernel(f"void({_TABLES}, {_PLACES})")
def _fetch_rows(tables, places):
    """Ask the memory early for every row a position reads (``places``, ``[M, B]``), all at
    once: each row's tag and place in the pool, then its counts in the pool (a row's place
    is read first: that waits for the first requests, all in flight together). A hint to
    the CPU (:func:`~sharnn.compiled.prefetch`): no number changes."""
    (table_tags, slots, pool, _, heads), rows = tables, places[0]
    for m in range(rows.shape[0]):
        for b in range(rows.shape[1]):
            prefetch(table_tags, rows[m, b])
            prefetch(slots, rows[m, b])
    for m in range(rows.shape[0]):
        for b in range(rows.shape[1]):
            prefetch(heads, np.int64(slots[rows[m, b]]) * heads.shape[1])
            start = np.int64(slots[rows[m, b]]) * pool.shape[1]
            for line in range(0, pool.shape[1], 32):  # 32 counts of 2 bytes: a cache line
                prefetch(pool, start + line)


@kernel(f"int64({_TABLES}, {_PLACES}, int64, {_LOGS}, {_STREAM})")
def _count_inputs(tables, places, b, logs, inputs):
    """Stream ``b``'s inputs from the counts, sparse (a row holds few bytes), into
    ``inputs = (base [I], symbols [M, 256], deltas [I, 256], present [M])``: ``X_m`` and
    ``X'_m`` (2**-10 nat) of a byte its context has not counted into ``base[1 + 2m]`` and
    ``base[2 + 2m]``; the ``present[m]`` bytes it has counted into ``symbols[m]``, their
    inputs minus the base into ``deltas[1 + 2m]`` and ``deltas[2 + 2m]``. A row another
    context holds reads as zeros. Returns how many byte contexts (not the word) have counts."""
    (table_tags, slots, pool, _, heads), (rows, tags), (count_logs, total_logs, _) = tables, places, logs
    base, symbols, deltas, present = inputs
    seen = 0
    for m in range(rows.shape[0]):
        slot = slots[rows[m, b]]
        counts, total, found = pool[slot], 0, 0  # slot 0, if never claimed: zeros
        if table_tags[rows[m, b]] == tags[m, b]:
            total = np.int64(heads[slot, _TOTAL])
            for word in range(4):  # the bytes counted, in order, from the row's bitmap
                bits = heads[slot, word]
                while bits != 0:
                    symbols[m, found] = 64 * word + np.int64(trailing_zeros(bits))
                    found += 1
                    bits &= bits - np.uint64(1)
        total_log, confidence = total_logs[total], min(total, CONFIDENT)
        unseen = count_logs[0] - total_log
        base[1 + 2 * m], base[2 + 2 * m] = unseen, unseen * confidence // CONFIDENT  # floors, as numpy's //
        for j in range(found):
            x = count_logs[counts[symbols[m, j]]] - total_log
            deltas[1 + 2 * m, j] = x - base[1 + 2 * m]
            deltas[2 + 2 * m, j] = x * confidence // CONFIDENT - base[2 + 2 * m]
        present[m] = found
        if m < len(ORDERS) and total > 0:
            seen += 1
    return seen


@kernel(f"void(int64[::1], int64[::1], {_STREAM}, int64[::1])")
def _logits(w, model, inputs, logits):
    """One mixer's ``logits [256] = sum_i w_i X_i`` (2**-26 nat) with weights ``w [I]``,
    ``X_0 = model [256]`` and the rest as :func:`_count_inputs` leaves them in ``inputs``:
    integers, so the sparse sum is the dense one exactly."""
    base, symbols, deltas, present = inputs
    constant = 0
    for i in range(1, len(w)):
        constant += w[i] * base[i]
    for s in range(256):
        logits[s] = w[0] * model[s] + constant
    for m in range(len(present)):
        for j in range(present[m]):
            logits[symbols[m, j]] += w[1 + 2 * m] * deltas[1 + 2 * m, j] + w[2 + 2 * m] * deltas[2 + 2 * m, j]


@kernel("void(int64[::1], int64[::1], int64[::1])", allocates=True)
def _exp_weights(logits, exp, weights):
    """``weights [256] = exp[min((max(logits) - logits) >> 18, len(exp) - 1)]``: the integer
    weights of ``logits [256]`` (2**-26 nat), their gaps rounded down to 1/256 nat."""
    top = logits.max()
    for s in range(256):
        weights[s] = exp[min((top - logits[s]) >> 18, len(exp) - 1)]


@kernel(
    f"void({_TABLES}, {_PLACES}, uint64[:, ::1], int64[:, ::1], {_INPUTS}, {_MIXERS}, {_LOGS}, float64[:, ::1])",
    allocates=True,
)
def _mix(tables, places, history, model, inputs, mixers, logs, probs):
    """One position's mixing of the ``B`` streams (:meth:`AdaptiveMixer.mix`) of
    ``model [B, 256] = X_0``: each stream's ``inputs`` (:func:`_count_inputs`, each array
    with a first axis of ``B``); in ``mixers = (weights, offsets, chosen, q)``, the weight
    set each mixer ``m`` uses (``chosen [mixers, B]``: the contexts seen; the previous byte
    + 1; its sets are ``weights``' rows from ``offsets[m]``) and its weights ``q [mixers,
    B, 256]``; and ``probs [B, 256]``, the weights of the mixers' mean logit (floored) over
    their sum."""
    (weights, offsets, chosen, q), exp = mixers, logs[2]
    logits, mean = np.zeros((len(offsets), 256), np.int64), np.zeros(256, np.int64)
    _fetch_rows(tables, places)
    for b in range(model.shape[0]):
        stream = (inputs[0][b], inputs[1][b], inputs[2][b], inputs[3][b])
        seen = _count_inputs(tables, places, b, logs, stream)
        for m in range(len(offsets)):
            chosen[m, b] = seen if m == 0 else np.int64(history[b, 0])
            _logits(weights[offsets[m] + chosen[m, b]], model[b], stream, logits[m])
            _exp_weights(logits[m], exp, q[m, b])
        for s in range(256):  # floored; by two a shift, which LLVM makes of no division by a variable
            mean[s] = (logits[0, s] + logits[1, s]) >> 1 if len(offsets) == 2 else logits[:, s].sum() // len(offsets)
        _exp_weights(mean, exp, mean)
        scale = 1.0 / mean.sum()
        for s in range(256):
            probs[b, s] = mean[s] * scale


@kernel(f"void(int64[::1], int64[::1], int64[::1], {_STREAM}, int64)")
def _learn(w, q, model, inputs, coded):
    """One mixer's gradient step on its weights ``w [I]`` (the set it used) for one stream
    that coded ``coded``: ``w_i += floor(25 (X_i(coded) N - sum_s q_s X_i(s)) / (256 N))``,
    ``N`` the sum of its weights ``q [256]``, the inputs as in :func:`_logits`."""
    base, symbols, deltas, present = inputs
    total, expected = q.sum(), 0
    for s in range(256):
        expected += q[s] * model[s]
    w[0] += (model[coded] * total - expected) * LEARNING_RATE[0] // (total * LEARNING_RATE[1])
    for m in range(len(present)):
        for i in (1 + 2 * m, 2 + 2 * m):
            expected, value = base[i] * total, base[i]
            for j in range(present[m]):
                expected += q[symbols[m, j]] * deltas[i, j]
                if symbols[m, j] == coded:
                    value += deltas[i, j]
            w[i] += (value * total - expected) * LEARNING_RATE[0] // (total * LEARNING_RATE[1])


@kernel(f"void({_TABLES}, {_PLACES}, int64[::1])", allocates=True)
def _count(tables, places, symbols):
    """:meth:`ContextTables.add` of ``symbols [k]`` after the contexts at ``places`` (rows
    and tags ``[M, >= k]``, the first ``k`` columns): per model, the claims (against the
    tags before this position; the last one of a row wins), then per row counted, halving
    when its total plus its adds passes :data:`COUNT_LIMIT`, then the adds."""
    (table_tags, slots, pool, used, heads), (rows, tags), k = tables, places, len(symbols)
    claims = np.zeros(k, np.bool_)
    for m in range(rows.shape[0]):
        for b in range(k):
            claims[b] = table_tags[rows[m, b]] != tags[m, b]
        for b in range(k):  # in order: the last claim of a row is the one that stays
            if claims[b]:
                table_tags[rows[m, b]] = tags[m, b]
                if slots[rows[m, b]] == 0:  # the row's first claim: the next slot, zeros
                    used[0] += 1
                    slots[rows[m, b]] = used[0]
                pool[slots[rows[m, b]]] = 0
                heads[slots[rows[m, b]]] = 0
        for b in range(k):
            row = rows[m, b]
            if table_tags[row] != tags[m, b]:
                continue
            counts, head = pool[slots[row]], heads[slots[row]]
            first, adds = True, 0
            for other in range(k):
                if rows[m, other] == row and table_tags[row] == tags[m, other]:
                    first = first and other >= b
                    adds += 1
            if first and np.int64(head[_TOTAL]) + adds > COUNT_LIMIT:
                total = 0
                for s in range(256):  # a count never halves to 0: the bitmap stays
                    counts[s] = (counts[s] + 1) >> 1
                    total += counts[s]
                head[_TOTAL] = total
            counts[symbols[b]] += 1
            head[_TOTAL] += np.uint64(1)
            head[symbols[b] >> 6] |= np.uint64(1) << np.uint64(symbols[b] & 63)


@inline
def _letter(byte):
    """Whether ``byte`` is an ASCII letter, a word's (its hash: :func:`_advance`)."""
    return 65 <= byte <= 90 or 97 <= byte <= 122


@kernel("void(uint64[:, ::1], uint64[::1], int64[::1])")
def _advance(history, word, coded):
    """Shift each stream's byte into its ``history [B, 12]`` (as byte + 1) and ``word
    [B]`` (the hash of its letters, lower case; 0 after a non-letter): ``coded [k]``
    for the first ``k`` streams, 0 for the rest."""
    for b in range(len(word)):
        byte = coded[b] if b < len(coded) else 0
        for j in range(history.shape[1] - 1, 0, -1):
            history[b, j] = history[b, j - 1]
        history[b, 0] = np.uint64(byte) + np.uint64(1)
        word[b] = (word[b] + (np.uint64(byte) | np.uint64(32))) * _MULTIPLIER if _letter(byte) else np.uint64(0)


@kernel("boolean(int64[::1], int64)", allocates=True)
def _codable(coded, streams):
    """Whether ``coded [k]`` holds at most ``streams`` bytes, each within 0 .. 255."""
    return len(coded) <= streams and (len(coded) == 0 or (coded.min() >= 0 and coded.max() <= 255))


@kernel(f"void(int64[:, ::1], {_INPUTS}, {_MIXERS}, int64[::1])")
def _learn_all(model, inputs, mixers, coded):
    """Every mixer's step (:func:`_learn`) for each of the first ``k`` streams, which coded ``coded [k]``."""
    weights, offsets, chosen, q = mixers
    for b in range(len(coded)):
        stream = (inputs[0][b], inputs[1][b], inputs[2][b], inputs[3][b])
        for m in range(len(offsets)):
            _learn(weights[offsets[m] + chosen[m, b]], q[m, b], model[b], stream, coded[b])


@kernel(
    f"boolean({_TABLES}, {_PLACES}, uint64[:, ::1], uint64[::1], int64[:, ::1], {_INPUTS}, {_MIXERS}, int64[::1])",
    allocates=True,
)
def _update(tables, places, history, word, model, inputs, mixers, coded):
    """One position's learning (:meth:`AdaptiveMixer.update`) from the bytes ``coded [k]``
    of the first ``k`` streams, from what :func:`_mix` left (the same arguments): every
    mixer's step (:func:`_learn`; integers, the same sums in any order), the counts
    (:func:`_count`), the histories (:func:`_advance`). Returns False, and changes
    nothing, when ``coded`` holds more bytes than streams or a byte outside 0 .. 255."""
    if not _codable(coded, len(word)):
        return False
    _learn_all(model, inputs, mixers, coded)
    _count(tables, places, coded)
    _advance(history, word, coded)
    return True


def _small_page_zeros(shape: tuple[int, ...], dtype, touched: bool = False) -> np.ndarray:
    """Zeros of ``shape`` in fresh private memory, which Linux maps a small page at a time
    as it is first touched. (numpy asks Linux for huge pages for its large arrays,
    ``madvise(MADV_HUGEPAGE)``; a first write into one may then stall while the kernel
    compacts memory: measured, 50 to 180 ms per position for the first positions of a
    file, as the tables are first written a row here, a row there.) With ``touched``, every
    page is touched here, once, in order: for an array that the coding reads all over at
    random, where a page's first touch in the middle of a node cost more (mixing 3's
    tables: docs/compression.md, "Measured: the bits stage's memory touched at the start").
    Elsewhere, numpy's."""
    if not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, math.prod(shape) * np.dtype(dtype).itemsize, flags=mmap.MAP_PRIVATE)
    memory.madvise(mmap.MADV_NOHUGEPAGE)
    if touched:
        np.frombuffer(memory, dtype=np.uint8)[:: mmap.PAGESIZE] = 0
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


class ContextTables:
    """The context models: per model ``2**TABLE_BITS`` rows of 256 counts (uint16), each row
    with the tag of the context it holds. A context's row is found by its 64-bit hash; a
    row held by another context (another tag) reads as empty.

    An update of one position (:meth:`add`), for each model: a row named with another tag
    than its own is claimed (cleared, its tag set) by the last stream that names it so;
    a row whose total would pass :data:`COUNT_LIMIT` with this position's counts is halved
    (rounding up); then each stream whose context holds its row counts its byte there.

    The counts of the rows lie in a pool in the order the rows are first claimed (each
    row's place: :attr:`slots`), so that the memory a file touches grows with the rows
    it claims, 8 to a page of 4 KiB, not with their spread over the tables. Each row has a
    head (:attr:`heads`, a cache line): the bitmap of the bytes it has counted and their
    total, kept with the counts, so that reading a row's inputs does not sum and scan its
    256 counts (docs/compression.md, "Measured: the rows' heads").
    """

    def __init__(self, models: int):
        rows = models * 2**TABLE_BITS  # model m's rows from m * 2**16
        self.tags = _small_page_zeros((rows,), np.uint64)  # the context each row holds (0: none yet)
        self.slots = _small_page_zeros((rows,), np.int32)  # where its counts lie in the pool (0: never claimed)
        self.pool = _small_page_zeros((rows + 1, 256), np.uint16)  # a row of zeros, then the rows' counts
        self.used = np.zeros(1, dtype=np.int64)  # the pool's rows in use after the first
        # each pool row's head, a cache line: the bitmap of the bytes it has counted (4
        # words), then their total (_TOTAL); read instead of the 512 bytes of counts
        self.heads = _small_page_zeros((rows + 1, 8), np.uint64)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(tags, slots, pool, used, heads)``, as the kernels take them."""
        return self.tags, self.slots, self.pool, self.used, self.heads

    def row_counts(self, rows: np.ndarray) -> np.ndarray:
        """The counts ``[..., 256]`` (uint16) in ``rows [...]``, whatever context holds each."""
        return self.pool[self.slots[rows]]

    @staticmethod
    def place(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row (among all models' rows) and tag (never 0, so that an empty row matches
        nothing) of each hash ``[M, B]``, model ``m``'s in row ``m``."""
        hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        rows, tags = np.empty(hashes.shape, np.int64), np.empty(hashes.shape, np.uint64)
        _place(hashes, (rows, tags))
        return rows, tags

    def read(self, rows: np.ndarray, tags: np.ndarray) -> np.ndarray:
        """The counts ``[M, B, 256]`` (int64) of the contexts at ``rows`` with ``tags``
        ``[M, B]``; zeros where another context holds the row."""
        counts = self.row_counts(rows).astype(np.int64)
        counts[self.tags[rows] != tags] = 0
        return counts

    def add(self, rows: np.ndarray, tags: np.ndarray, symbols: np.ndarray) -> None:
        """Count ``symbols [k]`` after the contexts at ``rows`` with ``tags`` (``[M, k]``).

        Raises:
            ValueError: shapes that do not match, a row outside the tables or a symbol
                outside 0 .. 255.
        """
        rows, tags = np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(tags, np.uint64)
        symbols = np.ascontiguousarray(symbols, np.int64)
        if rows.ndim != 2 or tags.shape != rows.shape or symbols.shape != rows.shape[1:]:
            raise ValueError(f"rows {rows.shape}, tags {tags.shape} and symbols {symbols.shape}: not [M, k] and [k]")
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.tags)):
            raise ValueError(f"rows outside 0 .. {len(self.tags) - 1}")
        if symbols.size and (symbols.min() < 0 or symbols.max() > 255):
            raise ValueError("symbols outside 0 .. 255")
        _count(self.arrays, (rows, tags), symbols)


class AdaptiveMixer:
    """The adaptive stage for ``streams`` streams: :meth:`mix` the model's log-weights into
    the coder's probabilities, then :meth:`update` with the bytes coded.

    Example::

        mixer = AdaptiveMixer(streams=8)
        probs = mixer.mix(step.log_weights(logits))   # [B, 256] float64, sum 1
        mixer.update(coded)                            # coded [B] int: the bytes

    The state is numpy arrays that the kernels change in place: :attr:`tables`,
    :attr:`history` ``[B, 12]``, :attr:`word` ``[B]``, :attr:`weights` (one ``[sets, I]``
    int64 view per mixer of one array); and what :meth:`mix` leaves for :meth:`update`.
    """

    def __init__(self, streams: int):
        self.streams = streams
        self.tables = ContextTables(len(ORDERS) + 1)  # the orders, then the word
        self.history = np.zeros((streams, max(ORDERS)), dtype=np.uint64)  # the last bytes, newest first
        self.word = np.zeros(streams, dtype=np.uint64)  # the current word's hash (0: none)
        contexts, (models, selectors) = len(ORDERS) + 1, self._layout()
        inputs, mixers = 1 + 2 * models, len(selectors)
        self._weights = np.zeros((sum(selectors), inputs), dtype=np.int64)  # every mixer's weight sets
        self._weights[:, 0] = MODEL_PRIOR
        self._weights[:, 1::2] = COUNT_PRIOR
        self._offsets = np.cumsum([0, *selectors[:-1]]).astype(np.int64)
        self.weights = [self._weights[o : o + n] for o, n in zip(self._offsets, selectors)]  # one mixer per selector
        # What mix leaves for update: the contexts, the inputs (_count_inputs), each mixer's weight set and weights.
        self._hashes = np.zeros((contexts, streams), dtype=np.uint64)
        self._places = (np.zeros((contexts, streams), np.int64), np.zeros((contexts, streams), np.uint64))
        self._model = np.zeros((streams, 256), dtype=np.int64)
        shapes = [(streams, inputs), (streams, models, 256), (streams, inputs, 256), (streams, models)]
        self._inputs = tuple(np.zeros(shape, dtype=np.int64) for shape in shapes)  # base, symbols, deltas, present
        chosen, q = np.zeros((mixers, streams), np.int64), np.zeros((mixers, streams, 256), np.int64)
        self._mixers = (self._weights, self._offsets, chosen, q)
        self._logs = (_count_logs(), _total_logs(), _exp_table())
        self._mixed = False

    def _layout(self) -> tuple[int, tuple[int, ...]]:
        """The models whose inputs the mixers take (the context models) and the mixers' weight sets."""
        return len(ORDERS) + 1, SELECTORS

    def mix(self, model_log_weights: np.ndarray) -> np.ndarray:
        """``model_log_weights [B, 256]`` (integers, ``ln p_model`` up to a constant per row,
        in 1/256 nat: :func:`sharnn.models.exact.log_weights`) -> the mixed probabilities
        ``[B, 256]`` float64.

        Raises:
            ValueError: ``model_log_weights`` not of shape ``[B, 256]``.
        """
        if np.shape(model_log_weights) != self._model.shape:
            raise ValueError(f"model log-weights of shape {np.shape(model_log_weights)}, not {self._model.shape}")
        self._model[...] = model_log_weights  # as int64, then in 2**-10 nat
        self._model *= LOG_UNIT // exact.EXP_RESOLUTION
        _hash_contexts(self.history, self.word, self._hashes)
        _place(self._hashes, self._places)
        probs = np.empty((self.streams, 256), dtype=np.float64)
        _mix(self.tables.arrays, self._places, self.history, self._model, self._inputs, self._mixers, self._logs, probs)
        self._mixed = True
        return probs

    def update(self, coded: np.ndarray) -> None:
        """Learn from the bytes ``coded [B]`` just coded at the position :meth:`mix` predicted.

        Raises:
            RuntimeError: no :meth:`mix` since the last update.
            ValueError: more bytes than streams, or a byte outside 0 .. 255.
        """
        coded = np.ascontiguousarray(coded, dtype=np.int64)  # [k]: the last position codes the k longest streams only
        if not self._mixed:
            raise RuntimeError("update() needs a mix() of the position first")
        tables, places, state = self.tables.arrays, self._places, (self.history, self.word)
        learnt = coded.ndim == 1 and _update(tables, places, *state, self._model, self._inputs, self._mixers, coded)
        if not learnt:
            raise ValueError(f"coded must be [k <= {self.streams}] bytes, not {coded!r}")
        self._mixed = False
