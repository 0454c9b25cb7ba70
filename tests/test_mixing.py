"""The adaptive stage (sharnn.coding.mixing): exact integer arithmetic whose results are
pinned by a digest, a first position that is the model's own distribution, context models
that learn a repeated text, and rows that a colliding context claims; its kernels give the
bits of its specification (tests/spec_mixing.py, the numpy code of format 5) at every
position, in every piece of state."""

from __future__ import annotations

import gzip
import hashlib
import math
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

import spec_mixing
from sharnn.coding import mixing
from sharnn.coding.mixing import (
    COUNT_LIMIT,
    LOG_UNIT,
    MODEL_PRIOR,
    WEIGHT_UNIT,
    AdaptiveMixer,
    ContextTables,
    fixed_log,
)
from sharnn.models import exact


def test_fixed_log_is_the_natural_log_in_units_of_a_thousandth_within_its_bound():
    values = np.array([1, 2, 3, 255, 256, 257, 4095, 65536, 123456789, 2**52], dtype=np.int64)
    got = fixed_log(values)
    for value, log in zip(values.tolist(), got.tolist()):
        assert abs(log - LOG_UNIT * math.log(value)) <= LOG_UNIT * 2.5e-4 + 1, value
    assert got[0] == 0 and got[1] == round(LOG_UNIT * math.log(2))


def _log_weights(rows: int, streams: int, seed: int = 0) -> np.ndarray:
    """Fixed model log-weights ``[rows, B, 256]`` (1/256 nat), from integers alone (numpy's
    PCG64 gives the same integers on every machine)."""
    return -np.random.default_rng(seed).integers(0, 2000, (rows, streams, 256))


def test_the_first_position_is_the_models_distribution_at_its_prior_weight():
    """Empty context models give every byte the same input, which the mix cancels: before
    any byte is coded, the mixer's probabilities are the integer step's at the weight the
    mixers start from (half: each gap of 1/256 nat halved, rounded down)."""
    assert MODEL_PRIOR == WEIGHT_UNIT // 2
    logits = torch.randn(3, 256, generator=torch.Generator().manual_seed(1)) * 3
    mixed = AdaptiveMixer(3).mix(exact.log_weights(logits).numpy())
    weights = exact.exp_table()[(-exact.log_weights(logits)) // 2]
    assert np.array_equal(mixed, (weights * weights.sum(-1, keepdim=True).reciprocal()).numpy())


def test_a_repeated_text_is_learned_whatever_the_model_says():
    """With a model that knows nothing (uniform), the context models learn a phrase: per
    byte (geometric mean), its third repetition is predicted with probability above 0.5,
    its fifth above 0.9."""
    phrase = b"the cat sat on the mat; "
    mixer, uniform = AdaptiveMixer(1), np.zeros((1, 256), dtype=np.int64)
    probability = []
    for byte in phrase * 5:
        probability.append(mixer.mix(uniform)[0, byte])
        mixer.update(np.array([byte]))
    per_repetition = np.exp(np.log(probability).reshape(5, -1).mean(1))
    assert per_repetition[0] < 0.05 and per_repetition[2] > 0.5 and per_repetition[4] > 0.9


def test_the_mixer_is_pinned_by_a_digest_of_its_probabilities():
    """Integer arithmetic gives the same bits on every machine: 300 positions of 3 streams,
    the last position coding 2 of them, hash to the value stored here."""
    rows, streams = 300, 3
    weights = _log_weights(rows, streams)
    data = np.frombuffer((b"Alice was beginning to get very tired of sitting by her sister. " * 20)[:900], np.uint8)
    grid = data.reshape(streams, rows).T
    mixer, digest = AdaptiveMixer(streams), hashlib.sha256()
    for t in range(rows):
        probs = mixer.mix(weights[t])
        digest.update(probs.tobytes())
        mixer.update(grid[t, : 2 if t == rows - 1 else streams])
    assert digest.hexdigest() == DIGEST


DIGEST = "5bbcb84e64f410c0ed35112dc24620ff88bdfc3a0e5447800f0492821aaeb304"  # made on AMD EPYC (AVX2), numpy 2.4.6


def test_a_row_claimed_by_another_context_reads_empty_and_halves_at_its_limit():
    """Three contexts of one row: the first counts; when the other two claim it at one
    position, the later stream's claim wins (the row cleared) and only it counts."""
    tables = ContextTables(1)
    rows, tags = ContextTables.place(np.array([[2**63 + 4, 2**63 + 6, 2**63 + 8]], dtype=np.uint64))
    assert len(set(rows[0].tolist())) == 1 and len(set(tags[0].tolist())) == 3  # one row, three contexts
    tables.add(rows[:, :1], tags[:, :1], np.array([7]))
    assert tables.read(rows, tags)[0, :, 7].tolist() == [1, 0, 0]
    tables.add(rows[:, 1:], tags[:, 1:], np.array([8, 9]))
    assert tables.read(rows, tags)[0][:, [7, 8, 9]].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 1]]
    for _ in range(COUNT_LIMIT + 1):
        tables.add(rows[:, 2:], tags[:, 2:], np.array([9]))
    assert COUNT_LIMIT // 2 < tables.read(rows, tags)[0, 2].sum() <= COUNT_LIMIT


@pytest.mark.parametrize("streams", [1, 4])
def test_updates_may_cover_fewer_streams_than_were_mixed(streams):
    mixer = AdaptiveMixer(streams)
    mixer.mix(np.zeros((streams, 256), dtype=np.int64))
    mixer.update(np.array([65]))  # only the longest stream codes the last position
    assert mixer.history[0, 0] == 66 and (mixer.history[1:, 0] == 1).all()


CORPUS = Path(mixing.__file__).parents[1] / "corpora" / "enwik8-head.gz"


def _text(rows: int, streams: int, offset: int = 5000) -> np.ndarray:
    """``[rows, B]`` bytes of real text (Wikipedia markup of the bundled corpus), stream
    ``b`` the ``b``-th of ``B`` consecutive pieces, as ``sharnn compress`` cuts a file."""
    with gzip.open(CORPUS) as corpus:
        data = corpus.read(offset + rows * streams)[offset:]
    return np.frombuffer(data, dtype=np.uint8).reshape(streams, rows).T.astype(np.int64)


def _model_log_weights(rows: int, streams: int) -> np.ndarray:
    """The integer step's log-weights ``[rows, B, 256]`` of fixed random logits."""
    logits = torch.randn(rows, streams, 256, generator=torch.Generator().manual_seed(7)) * 4
    return exact.log_weights(logits).numpy()


def _assert_heads(tables: ContextTables, rows: np.ndarray) -> None:
    """Each row's head holds the bitmap of the bytes its counts hold, and their total."""
    counts, heads = tables.row_counts(rows).astype(np.int64), tables.heads[tables.slots[rows]]
    bits = np.unpackbits(heads[:, :4].astype("<u8").view(np.uint8), axis=1, bitorder="little").astype(bool)
    assert np.array_equal(bits, counts > 0)
    assert np.array_equal(heads[:, 4].astype(np.int64), counts.sum(1))


def _assert_same_state(kernels: AdaptiveMixer, spec: spec_mixing.AdaptiveMixer) -> None:
    """Weights, histories, words, tags, and the counts of every row the specification has
    tagged (a row whose tag is 0 was never claimed: zeros in both, the kernels' pool row 0)."""
    assert all(np.array_equal(a, b) for a, b in zip(kernels.weights, spec.weights, strict=True))
    assert np.array_equal(kernels.history, spec.history) and np.array_equal(kernels.word, spec.word)
    assert np.array_equal(kernels.tables.tags, spec.tables.tags)
    tagged = np.flatnonzero(spec.tables.tags)
    assert np.array_equal(kernels.tables.row_counts(tagged), spec.tables.counts[tagged])
    _assert_heads(kernels.tables, tagged)
    assert not kernels.tables.slots[spec.tables.tags == 0].any() and not kernels.tables.pool[0].any()
    assert not kernels.tables.heads[0].any()  # the never-claimed slot's head: no bytes, no total


def _run_both(grid: np.ndarray, weights: np.ndarray, last: int) -> tuple[AdaptiveMixer, spec_mixing.AdaptiveMixer]:
    """Code ``grid [rows, B]`` with the kernels and with the specification, the last
    position coding only ``last`` streams; asserts the same probabilities (every bit) at
    every position."""
    rows, streams = grid.shape
    kernels, spec = AdaptiveMixer(streams), spec_mixing.AdaptiveMixer(streams)
    for t in range(rows):
        probs = kernels.mix(weights[t])
        assert probs.dtype == np.float64 and np.array_equal(probs, spec.mix(weights[t])), t
        coded = grid[t, : last if t == rows - 1 else streams]
        kernels.update(coded)
        spec.update(coded)
    return kernels, spec


@pytest.mark.parametrize("streams", [1, 3, 8])
def test_the_kernels_give_the_bits_of_the_specification_on_real_text(streams):
    rows = 400
    grid, weights = _text(rows, streams), _model_log_weights(rows, streams)
    kernels, spec = _run_both(grid, weights, last=max(1, streams - 2))
    _assert_same_state(kernels, spec)
    assert kernels.tables.used[0] > rows  # the contexts counted


def test_streams_that_meet_in_every_row_give_the_bits_of_the_specification():
    """Seven streams of one text name the same rows at every position: all claim them at
    once, all count in each; a text of one byte fills its rows past the limit (7 adds per
    position, to an odd total), which halves them."""
    rows, streams = 700, 7
    text = np.frombuffer(b"abracadabra, " * 10 + b"a" * (rows - 130), dtype=np.uint8).astype(np.int64)
    grid = np.repeat(text[:, None], streams, axis=1)
    kernels, spec = _run_both(grid, _model_log_weights(rows, streams), last=5)
    _assert_same_state(kernels, spec)
    assert (spec.tables.counts[:, ord("a")] % 7 != 0).any()  # halved: not only whole positions' adds


def test_table_updates_with_claims_collisions_and_halving_match_the_specification():
    """Eight streams onto one row of model 0 and two of model 1: most positions one
    context per row, which fills past the limit and halves; every thousandth position
    three contexts claim the rows at once, the last claim of a row winning."""
    rng = np.random.default_rng(3)
    kernels, spec = ContextTables(2), spec_mixing.ContextTables(2)
    watched = np.array([0, 2**16, 2**16 + 2**15])  # the rows: the hash's top bit, in model 1
    halved = claimed = False
    for t in range(3000):
        hashes = (rng.integers(0, 2, (2, 8)) << 63).astype(np.uint64) * np.array([[0], [1]], dtype=np.uint64)
        if t % 1000 == 999:  # contexts that differ in their tags
            hashes |= rng.integers(1, 4, (2, 8)).astype(np.uint64) * 2
        places = ContextTables.place(hashes)
        assert all(np.array_equal(a, b) for a, b in zip(places, spec_mixing.ContextTables.place(hashes)))
        k, before, tags = int(rng.integers(1, 9)), spec.counts[watched].sum(1), spec.tags[watched].copy()
        symbols = rng.integers(0, 4, k)
        kernels.add(places[0][:, :k], places[1][:, :k], symbols)
        spec.add(places[0][:, :k], places[1][:, :k], symbols)
        assert np.array_equal(kernels.tags, spec.tags)
        assert np.array_equal(kernels.row_counts(watched), spec.counts[watched])
        _assert_heads(kernels, watched)
        kept = spec.tags[watched] == tags
        halved |= bool((spec.counts[watched].sum(1) < before)[kept].any())
        claimed |= len(set(places[1][:, :k].ravel().tolist())) > 2 and not kept.all()
    assert halved and claimed


def test_one_mixer_as_the_ablation_runs_it_gives_the_bits_of_the_specification():
    """benchmarks/adaptive_mixing.py changes the module's constants for a variant: one mixer."""
    rows, streams = 200, 2
    constants = {"SELECTORS": mixing.SELECTORS[:1], "MODEL_PRIOR": WEIGHT_UNIT, "COUNT_PRIOR": 0}
    with mock.patch.multiple(mixing, **constants), mock.patch.multiple(spec_mixing, **constants):
        kernels, spec = _run_both(_text(rows, streams), _model_log_weights(rows, streams), last=1)
    assert len(kernels.weights) == 1
    _assert_same_state(kernels, spec)


def test_wrong_calls_raise_and_change_nothing():
    mixer = AdaptiveMixer(2)
    with pytest.raises(RuntimeError, match="mix"):
        mixer.update(np.array([1, 2]))
    with pytest.raises(ValueError, match="shape"):
        mixer.mix(np.zeros((3, 256), dtype=np.int64))
    mixer.mix(np.zeros((2, 256), dtype=np.int64))
    for coded in ([1, 2, 3], [1, 256], [-1], [[1, 2]]):
        with pytest.raises(ValueError, match="bytes"):
            mixer.update(np.array(coded))
    assert not mixer.history.any() and (mixer.weights[0][:, 0] == MODEL_PRIOR).all()
    tables = ContextTables(1)
    with pytest.raises(ValueError, match="rows outside"):
        tables.add(np.array([[2**16]]), np.array([[3]], dtype=np.uint64), np.array([1]))
    with pytest.raises(ValueError, match="symbols outside"):
        tables.add(np.array([[0]]), np.array([[3]], dtype=np.uint64), np.array([256]))
    assert not tables.tags.any()
