"""The adaptive stage (sharnn.coding.mixing): exact integer arithmetic whose results are
pinned by a digest, a first position that is the model's own distribution, context models
that learn a repeated text, and rows that a colliding context claims."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

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
