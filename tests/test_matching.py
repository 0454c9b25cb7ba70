"""Mixing version 2 (sharnn.coding.matching): its match model finds and follows an earlier
occurrence, its probabilities are pinned by a digest, with its parts off it is version 1
bit for bit, and files of either version round-trip through the codec."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from helpers import mixer_digest, random_log_weights, text_grid
from sharnn.coding import codec, matching
from sharnn.coding.arithmetic import Arithmetic
from sharnn.coding.container import read_header
from sharnn.coding.matching import MATCH_ORDER, MatchMixer
from sharnn.coding.mixing import AdaptiveMixer
from sharnn.errors import ConfigError, DataError
from sharnn.models.build import build_model
from sharnn.models.config import SHARNNConfig

UNIFORM = np.zeros((1, 256), dtype=np.int64)


def test_the_match_model_follows_a_repeated_block_and_its_length_grows():
    """After 1 KB of random bytes, a gap, and the block again: from the repeat's
    :data:`MATCH_ORDER`-th byte the match predicts the block's next byte, its length one
    more at each position, and the mix gives that byte most of the probability."""
    rng = np.random.default_rng(5)
    block = rng.integers(0, 256, 1024)
    text = np.concatenate([block, rng.integers(0, 256, 100), block])
    mixer, start = MatchMixer(1, positions=64), 1124  # a buffer that must grow
    lengths, probability = [], []
    for t, byte in enumerate(text):
        probs = mixer.mix(UNIFORM)
        buffer, _, state, _ = mixer.match
        if t >= start + MATCH_ORDER:
            assert buffer[state[0, 0], state[0, 1]] == byte == block[t - start], t
            lengths.append(state[0, 2])
            probability.append(probs[0, byte])
        mixer.update(np.array([byte]))
    assert lengths[0] >= MATCH_ORDER and np.array_equal(np.diff(lengths), np.ones(len(lengths) - 1))
    assert np.median(probability[100:]) > 0.9


def test_a_match_found_by_a_colliding_hash_predicts_nothing():
    """Bytes that never repeat ten in a row find no match, whatever their hashes."""
    mixer = MatchMixer(2)
    text = np.random.default_rng(2).integers(0, 256, (3000, 2))
    for row in text:
        mixer.mix(np.zeros((2, 256), dtype=np.int64))
        mixer.update(row)
        assert not mixer.match[2][:, 2].any()


def _digest(mixer, rows: int, streams: int) -> str:
    text = b"Alice was beginning to get very tired of sitting by her sister on the bank. "
    return mixer_digest(mixer, text_grid(text, rows, streams), random_log_weights(rows, streams))


def test_with_its_parts_off_version_2_is_version_1_bit_for_bit():
    """No match, no APMs, no extra contexts: the match model's inputs are zeros, which neither the mix nor the
    steps see, and the match's weight sets are never chosen."""
    with mock.patch.object(matching, "PARTS", (0, 0, 0)):
        off = MatchMixer(3)
    assert _digest(off, 300, 3) == _digest(AdaptiveMixer(3), 300, 3)


def test_version_2_is_pinned_by_a_digest_of_its_probabilities():
    assert _digest(MatchMixer(3), 300, 3) == DIGEST


DIGEST = "fecda48092dcb9503ed45af9b04a433a854d8b31d0395e9bbde25998ff7fd784"  # AMD EPYC (AVX-512), numba 0.68


def _model():
    """A small SHA-RNN with fixed weights."""
    torch.manual_seed(0)
    return build_model(SHARNNConfig(d_model=32, n_layers=1, boom_dim=64, attention_span=16)).eval()


@pytest.mark.parametrize("streams", [1, 3, 8])
def test_files_of_every_mixing_round_trip_and_a_repeat_codes_smaller_with_the_match(streams):
    rng = np.random.default_rng(streams)
    data = bytes(rng.integers(0, 256, 700).astype(np.uint8)) * 3 + b"the end\n"
    model, sizes = _model(), {}
    for version in (1, 2, 3):
        blob = codec.compress(data, model, streams=streams, mixing=version)
        assert read_header(blob)[0].mixing == version
        assert codec.decompress(blob, model) == data
        sizes[version] = len(blob)
    assert sizes[2] < sizes[1], sizes


def test_an_unknown_mixing_is_refused_both_ways():
    with pytest.raises(ConfigError, match="mixing"):
        codec.compress(b"abc", _model(), mixing=4)
    header = read_header(codec.compress(b"abcdef" * 20, _model(), streams=1, mixing=2))[0]
    with pytest.raises(DataError, match="mixing version 4"):
        Arithmetic.of(5, mock.Mock(wraps=header, integer_step=header.integer_step, mixing=4, online=None))
