"""The specification of the adaptive stage: the mixing of format 5 (``MIXING_VERSION`` 1)
as numpy computes it, the code of ``sharnn.coding.mixing`` before its numba kernels, kept
verbatim (its docstrings included) but for this paragraph and the import of ``exact``.

``tests/test_mixing.py`` holds the kernels to it bit for bit: the same float64
probabilities at every position, the same counts, tags, weights, history and word.
Nothing in the package imports this module.

The adaptive stage of the coder: the model's distribution mixed with context models that
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

Every number is an integer (numpy int64), so the same file gives the same probabilities on
every machine (as the integer step's): the logarithms in units of 2**-10 nat from a table
of ``ln(1 + j/4096)`` computed with :mod:`decimal`, the weights in units of 2**-16, the
probabilities from :func:`sharnn.models.exact.exp_weights`'s table. The ``B`` streams of a
file share the counts and the weights; all streams are predicted from the state before a
position, then all update it (:meth:`ContextTables.add` says how when they meet in a row).
"""

from __future__ import annotations

import decimal
from functools import cache

import numpy as np

from sharnn.models import exact

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


@cache
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


def _weights(logits: np.ndarray) -> np.ndarray:
    """Integer weights ``EXP_ONE exp(-gap)`` of logits ``[B, V]`` in 2**-26 nat, the gaps rounded down to 1/256 nat."""
    gaps = (logits.max(1, keepdims=True) - logits) >> 18
    return _exp_table()[np.minimum(gaps, exact.EXP_ENTRIES - 1)]


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


class ContextTables:
    """The context models: per model ``2**TABLE_BITS`` rows of 256 counts (uint16), each row
    with the tag of the context it holds. A context's row is found by its 64-bit hash; a
    row held by another context (another tag) reads as empty.

    An update of one position (:meth:`add`), for each model: a row named with another tag
    than its own is claimed (cleared, its tag set) by the last stream that names it so;
    a row whose total would pass :data:`COUNT_LIMIT` with this position's counts is halved
    (rounding up); then each stream whose context holds its row counts its byte there.
    """

    def __init__(self, models: int):
        self.counts = np.zeros((models * 2**TABLE_BITS, 256), dtype=np.uint16)  # model m's rows from m * 2**16
        self.tags = np.zeros(models * 2**TABLE_BITS, dtype=np.uint64)

    @staticmethod
    def place(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row (among all models' rows) and tag (never 0, so that an empty row matches
        nothing) of each hash ``[M, B]``, model ``m``'s in row ``m``."""
        offsets = (np.arange(len(hashes), dtype=np.int64) << TABLE_BITS)[:, None]
        return (hashes >> np.uint64(64 - TABLE_BITS)).astype(np.int64) + offsets, (hashes & _TAG_MASK) | np.uint64(1)

    def read(self, rows: np.ndarray, tags: np.ndarray) -> np.ndarray:
        """The counts ``[M, B, 256]`` (int64) of the contexts at ``rows`` with ``tags``
        ``[M, B]``; zeros where another context holds the row."""
        counts = self.counts[rows].astype(np.int64)
        counts[self.tags[rows] != tags] = 0
        return counts

    def add(self, rows: np.ndarray, tags: np.ndarray, symbols: np.ndarray) -> None:
        """Count ``symbols [k]`` after the contexts at ``rows`` with ``tags`` (``[M, k]``)."""
        rows, tags = rows.ravel(), tags.ravel()
        symbols = np.broadcast_to(symbols, (len(rows) // len(symbols), len(symbols))).ravel()
        claims = np.flatnonzero(self.tags[rows] != tags)
        if len(claims):  # the last claim of a row wins: np.unique of the reversed claims finds it
            _, last = np.unique(rows[claims[::-1]], return_index=True)
            winners = claims[::-1][last]
            self.tags[rows[winners]] = tags[winners]
            self.counts[rows[winners]] = 0
        counted = self.tags[rows] == tags
        rows, symbols = rows[counted], symbols[counted]
        unique, adds = np.unique(rows, return_counts=True)
        full = unique[self.counts[unique].sum(1, dtype=np.int64) + adds > COUNT_LIMIT]
        self.counts[full] = (self.counts[full] + 1) >> 1
        np.add.at(self.counts, (rows, symbols), 1)


class AdaptiveMixer:
    """The adaptive stage for ``streams`` streams: :meth:`mix` the model's log-weights into
    the coder's probabilities, then :meth:`update` with the bytes coded.

    Example::

        mixer = AdaptiveMixer(streams=8)
        probs = mixer.mix(step.log_weights(logits))   # [B, 256] float64, sum 1
        mixer.update(coded)                            # coded [B] int: the bytes
    """

    def __init__(self, streams: int):
        self.streams = streams
        self.tables = ContextTables(len(ORDERS) + 1)  # the orders, then the word
        self.history = np.zeros((streams, max(ORDERS)), dtype=np.uint64)  # the last bytes, newest first
        self.word = np.zeros(streams, dtype=np.uint64)  # the current word's hash (0: none)
        inputs = 1 + 2 * (len(ORDERS) + 1)
        self.weights = [np.zeros((sets, inputs), dtype=np.int64) for sets in SELECTORS]  # one mixer per selector
        for weights in self.weights:
            weights[:, 0] = MODEL_PRIOR
            weights[:, 1::2] = COUNT_PRIOR
        self._pending = None

    def _contexts(self) -> tuple[np.ndarray, np.ndarray]:
        """Row and tag ``[M, B]`` of every stream's context in every context model."""
        hashes, value = [], np.zeros(self.streams, dtype=np.uint64)
        for k in range(1, max(ORDERS) + 1):
            value = (value ^ self.history[:, k - 1]) * _MULTIPLIER + np.uint64(k)
            if k in ORDERS:
                hashes.append(value)
        hashes.append((self.word ^ np.uint64(0xA5A5A5A5)) * _MULTIPLIER)
        return ContextTables.place(np.stack(hashes))

    def mix(self, model_log_weights: np.ndarray) -> np.ndarray:
        """``model_log_weights [B, 256]`` (integers, ``ln p_model`` up to a constant per row,
        in 1/256 nat: :func:`sharnn.models.exact.log_weights`) -> the mixed probabilities
        ``[B, 256]`` float64."""
        places = self._contexts()
        counts = self.tables.read(*places)  # [M, B, 256]
        total = counts.sum(2, keepdims=True)
        x = _count_logs()[counts] - _total_logs()[total]  # X_k
        confident = x * np.minimum(total, CONFIDENT) // CONFIDENT  # X'_k
        model = model_log_weights.astype(np.int64)[None] * (LOG_UNIT // exact.EXP_RESOLUTION)
        inputs = np.concatenate([model, np.stack([x, confident], 1).reshape(-1, *x.shape[1:])]).transpose(1, 0, 2)
        seen = (total[: len(ORDERS), :, 0] > 0).sum(0)  # [B]: the byte contexts seen before
        chosen = [seen, self.history[:, 0].astype(np.int64)]  # each mixer's weight set
        logits = [np.einsum("bi,bis->bs", w[j], inputs) for w, j in zip(self.weights, chosen)]  # 2**-26 nat
        q = [_weights(x) for x in logits]
        final = _weights(sum(logits) // len(logits))  # the mixers' mean
        self._pending = (places, inputs, chosen, q)
        return final * (1.0 / final.sum(1, keepdims=True))

    def update(self, coded: np.ndarray) -> None:
        """Learn from the bytes ``coded [B]`` just coded at the position :meth:`mix` predicted."""
        places, inputs, chosen, qs = self._pending
        coded = np.asarray(coded, dtype=np.int64)  # [k]: the last position codes the k longest streams only
        k = len(coded)
        steps = []
        for q in qs:
            total = q[:k].sum(1)  # [k]
            expected = np.einsum("bs,bis->bi", q[:k], inputs[:k])  # [k, I]
            gradient = inputs[np.arange(k), :, coded] * total[:, None] - expected
            steps.append(gradient * LEARNING_RATE[0] // (total[:, None] * LEARNING_RATE[1]))
        for weights, j, step in zip(self.weights, chosen, steps):
            np.add.at(weights, j[:k], step)  # integers: the same sums in any order
        self.tables.add(places[0][:, :k], places[1][:, :k], coded)
        self._advance(np.pad(coded, (0, self.streams - k)))

    def _advance(self, coded: np.ndarray) -> None:
        """Shift every stream's ``coded [B]`` byte into its history and its word."""
        symbols = coded.astype(np.uint64)
        self.history[:, 1:] = self.history[:, :-1].copy()
        self.history[:, 0] = symbols + np.uint64(1)
        letter = ((coded >= 65) & (coded <= 90)) | ((coded >= 97) & (coded <= 122))
        lower = symbols | np.uint64(32)
        self.word = np.where(letter, (self.word + lower) * _MULTIPLIER, np.uint64(0))
