"""Mixing version 3 (sharnn.coding.bitwise): a decoder repeats its encoder bit for bit and
the binary coder spends what the bits' probabilities say; at first it codes version 2's
splits within the rounding of its units, codes version 2's split below the threshold, learns
a text better than version 2, refuses bad bytes without learning, and is pinned by a digest."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from helpers import random_log_weights, text_grid
from sharnn.coding import bitcontexts, bitwise, mixing
from sharnn.coding.binary import BinaryDecoder, BinaryEncoder
from sharnn.coding.bitwise import BitMixer
from sharnn.coding.matching import MatchMixer
from sharnn.models import exact

TEXT = b"Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do. "


def _grid(rows: int, streams: int) -> np.ndarray:
    return text_grid(TEXT, rows, streams)


def _code(mixer: BitMixer, weights: np.ndarray, coded) -> np.ndarray:
    """``mixer`` codes one position's bytes ``coded`` into a fresh encoder."""
    return mixer.code(weights, BinaryEncoder(), np.asarray(coded))


def _bits(mixer, rows: int, streams: int, weights: np.ndarray) -> np.ndarray:
    """The bits each position of the text costs ``[rows]`` (all streams), coded by ``mixer``:
    ``-log2`` of each byte's probability (version 2) or of each bit's (version 3)."""
    grid, costs, encoder = _grid(rows, streams), [], BinaryEncoder()
    for t in range(rows):
        if isinstance(mixer, BitMixer):
            mixer.code(weights[t], encoder, grid[t])
            costs.append(-np.log2(mixer.coded_probabilities / 65536).sum())
        else:
            costs.append(-np.log2(mixer.mix(weights[t])[np.arange(streams), grid[t]]).sum())
            mixer.update(grid[t])
    return np.array(costs)


def test_a_decoder_repeats_the_encoder_bit_for_bit_and_spends_what_the_bits_say():
    """Three streams, the last position two: the decoder gives back every byte with the
    same probabilities, and the coder's bytes are the bits' ideal cost (``-log2`` of each
    coded probability) within 0.1% and the 8 bits of its end."""
    rows, weights, grid = 80, random_log_weights(80, 3), _grid(80, 3)
    encoder, sent, ideal = BinaryEncoder(), BitMixer(3), 0.0
    probabilities = []
    for t in range(rows):
        sent.code(weights[t], encoder, grid[t, : 2 if t == rows - 1 else 3])
        probabilities.append(sent.coded_probabilities.copy())
        ideal -= np.log2(sent.coded_probabilities[: 2 if t == rows - 1 else 3] / 65536).sum()
    payload = encoder.finish()
    decoder, received = BinaryDecoder(payload), BitMixer(3)
    for t in range(rows):
        k = 2 if t == rows - 1 else 3
        np.testing.assert_array_equal(received.code(weights[t], decoder, k), grid[t, :k])
        np.testing.assert_array_equal(received.coded_probabilities, probabilities[t])
    assert ideal <= 8 * len(payload) <= 1.001 * ideal + 8, (8 * len(payload), ideal)


def test_the_bytes_buffer_grows_without_changing_a_bit():
    """Sized for 16 positions, the match model's buffer grows twice over 60 (the contexts
    of bits read the older bytes from it): the same bits as a mixer sized for all 60 (both
    tables the smallest, :data:`~sharnn.coding.bitwise.MIN_SLOTS`)."""
    rows, weights = 60, random_log_weights(60, 2)
    short, long = BitMixer(2, positions=16), BitMixer(2, positions=rows)
    np.testing.assert_array_equal(_bits(short, rows, 2, weights), _bits(long, rows, 2, weights))
    assert short.match[0].shape[1] == 64 and long.match[0].shape[1] == rows


def test_positions_coded_in_one_call_are_those_coded_one_by_one():
    """A walk without the model (log-weights 0): 50 positions of 2 streams in calls of 1,
    7 and 42 positions (a match buffer sized for 4 grows to fit) write the bytes and leave
    the tables that 50 calls of one position do; the decoder gives them back in two calls."""
    rows, zeros, grid = 50, np.zeros((2, 256), np.int64), _grid(50, 2)
    one, many = (BinaryEncoder(), BitMixer(2, positions=4)), (BinaryEncoder(), BitMixer(2, positions=4))
    for t in range(rows):
        one[1].code(zeros, one[0], grid[t])
    for start, stop in ((0, 1), (1, 8), (8, rows)):
        np.testing.assert_array_equal(many[1].code_positions(zeros, many[0], grid[start:stop]), grid[start:stop])
    np.testing.assert_array_equal(many[1].coded_probabilities, one[1].coded_probabilities)
    assert all(np.array_equal(a, b) for a, b in zip(one[1].bits, many[1].bits)) and many[1].position == rows
    payload = one[0].finish()
    assert many[0].finish() == payload and many[1].match[0].shape[1] >= rows
    decoder, received = BinaryDecoder(payload), BitMixer(2, positions=4)
    decoded = [received.code_positions(zeros, decoder, (n, 2)) for n in (30, 20)]
    np.testing.assert_array_equal(np.concatenate(decoded), grid)


def test_positions_with_a_bad_byte_are_refused_and_nothing_is_learnt():
    mixer, zeros, encoder = BitMixer(2), np.zeros((2, 256), np.int64), BinaryEncoder()
    for coded in (np.array([[1, 2], [3, 256]]), np.array([[1, 2, 3]]), np.array([1, 2])):
        with pytest.raises(ValueError, match="coded must be"):
            mixer.code_positions(zeros, encoder, coded)
    assert mixer.position == 0 and not mixer.bits[0].any() and encoder.bits == 0


def test_a_decoder_that_reads_past_the_end_refuses():
    encoder, mixer = BinaryEncoder(), BitMixer(1)
    for byte in b"abc":
        mixer.code(np.zeros((1, 256), np.int64), encoder, [byte])
    decoder, mixer = BinaryDecoder(encoder.finish()[:1]), BitMixer(1)
    with pytest.raises(ValueError, match="out of data"):
        for _ in range(40):
            mixer.code(np.zeros((1, 256), np.int64), decoder, 1)


def test_at_first_it_codes_version_2s_distribution_within_its_units():
    """Every weight but version 2's input is 0, the context models hold 1/2, the APM is the
    identity: each split is version 2's, rounded to 2**-12 and through the stretch and
    squash tables, so the first stream's likeliest byte keeps its probability within a few
    percent (the second stream's bits read what the first's have learned)."""
    weights = random_log_weights(1, 2)[0]
    byte_probs, mixer = MatchMixer(2).mix(weights), BitMixer(2)
    _code(mixer, weights, byte_probs.argmax(axis=1))
    assert abs((mixer.coded_probabilities[0] / 65536).prod() / byte_probs[0].max() - 1) < 0.05


def test_below_the_threshold_version_2s_split_is_coded():
    """A model sure of one byte: the root's split is surer than 2**-12 can say and every
    node under the first bit 1 holds less than 2**-8 of version 2's mass, so each bit of a
    byte there is coded with version 2's own split, in 2**-16."""
    weights = np.zeros((1, 256), np.int64)
    weights[0, ord("e")] = 40 * exact.EXP_RESOLUTION  # e**40 times the others
    byte_probs, mixer, byte = MatchMixer(1).mix(weights)[0], BitMixer(1), 200
    assert byte_probs[ord("e")] > 0.99 and byte_probs[128:].sum() < 2.0**-bitwise.THRESHOLD_BITS
    _code(mixer, weights, [byte])
    for depth in range(8):
        node = (byte | 256) >> (8 - depth)  # c0: the bits decided so far with a leading 1
        width = 1 << (8 - depth)
        low = (node - (1 << depth)) * width
        total, one = byte_probs[low : low + width].sum(), byte_probs[low + width // 2 : low + width].sum()
        split = min(max(int(one / total * 65536), 1), 65535)
        expected = split if (byte >> (7 - depth)) & 1 else 65536 - split
        assert abs(int(mixer.coded_probabilities[0, depth]) - expected) <= 1, depth


def test_the_bits_learn_a_text_better_than_version_2():
    """A sentence repeated, two streams: version 3 spends fewer bits than version 2 on the
    last third, where both have seen it often."""
    rows, weights = 600, random_log_weights(600, 2, scale=1.0)
    version_2, version_3 = _bits(MatchMixer(2), rows, 2, weights), _bits(BitMixer(2), rows, 2, weights)
    assert version_3[400:].sum() < version_2[400:].sum(), (version_3[400:].sum(), version_2[400:].sum())


def test_bad_bytes_are_refused_and_nothing_is_learnt():
    mixer, weights, encoder = BitMixer(2), random_log_weights(2, 2), BinaryEncoder()
    state = [array.copy() for array in mixer.bits]
    for coded in (np.array([1, 256]), np.array([1, 2, 3]), np.array([[1, 2]])):
        with pytest.raises(ValueError, match="coded must be"):
            mixer.code(weights[0], encoder, coded)
    with pytest.raises(ValueError, match="model log-weights of shape"):
        mixer.code(weights[0][:1], encoder, np.array([1]))
    assert all(np.array_equal(a, b) for a, b in zip(state, mixer.bits)) and encoder.bits == 0
    assert mixer.position == 0 and not mixer.history.any()
    with pytest.raises(TypeError, match="bit by bit"):
        mixer.mix(weights[0])
    with pytest.raises(TypeError, match="learns as it codes"):
        mixer.update(np.array([1]))


def test_the_lines_and_the_indirect_table_follow_the_text():
    """After "ab\ncb\nef cd ": the current line starts at byte 6, the one before at 3 (the
    byte above a position is read there); the bytes that followed "b\n" are c, then e; and
    the word that followed "ef" is "cd" (by 16 bits of "ef"'s hash)."""
    mixer, encoder = BitMixer(1), BinaryEncoder()
    for byte in b"ab\ncb\nef cd ":
        mixer.code(np.zeros((1, 256), np.int64), encoder, [byte])
    assert mixer.lines[0].tolist() == [6, 3]
    pair = ((ord("\n") + 1) * 257 + ord("b") + 1) & 0xFFFF  # the last two bytes, each + 1
    assert mixer.indirect[pair] == (ord("c") << 8) | ord("e")
    cd, ef = (int(word) for word in mixer.previous)  # the last word's hash, the one before's
    assert mixer.indirect[bitcontexts.FOLLOWED + (ef >> 48)] == cd >> 1


def test_each_weight_set_counts_what_it_learned():
    """One byte learned: mixer A's set of each node on its path, and mixer B's of each node
    on its path after the previous byte, have learned once; mixer C's one set, chosen by the
    last 3 bytes before it, 8 times (once a bit); no other set."""
    mixer, byte = BitMixer(1), ord("e")
    _code(mixer, np.zeros((1, 256), np.int64), [byte])
    counts = mixer.bits[1][:, bitwise.INPUTS]
    path = [(byte | 256) >> (8 - depth) for depth in range(8)]  # c0 of each node: 1, then the bits with a leading 1
    previous = int(mixer.history[0, 1])  # the byte before, + 1 (the start byte's)
    learned = path + [256 + previous * 256 + c0 for c0 in path]
    (third,) = np.flatnonzero(counts[bitwise._C :]) + bitwise._C
    assert sorted(np.flatnonzero(counts).tolist()) == sorted([*learned, third])
    assert (counts[learned] == 1).all() and counts[third] == 8


def test_a_new_weight_set_learns_faster_than_a_settled_one():
    """The same first byte moves the root's weights of a new set ``(lr + boost) / lr`` times
    as far as those of a set that has learned ``2**20`` times (up to integer rounding)."""
    moves = []
    for count in (0, 1 << 20):
        mixer = BitMixer(1)
        mixer.bits[1][:, bitwise.INPUTS] = count
        before = mixer.bits[1][1, : bitwise.INPUTS].copy()  # mixer A's set of the root (c0 = 1)
        _code(mixer, np.zeros((1, 256), np.int64), [ord("e")])
        moves.append(np.abs(mixer.bits[1][1, : bitwise.INPUTS] - before).sum())
    expected = (bitwise.LEARNING_RATE + bitwise.BOOST) / bitwise.LEARNING_RATE
    assert moves[1] > 0 and 0.9 * expected < moves[0] / moves[1] < 1.1 * expected, moves


def _same_group(i: int, count: int, slots: int) -> tuple[int, list[int]]:
    """The first slot of a group of :data:`~sharnn.coding.bitwise.WAYS` and ``count``
    contexts of model ``i`` whose first half bytes hash to it in a table of ``slots``,
    computed as the docstring says (the hash scaled to the table), by a search over context
    hashes 0, 1, 2, ..."""
    found, start = [], 0
    while len(found) < count:
        contexts = np.arange(start, start + 1_000_000, dtype=np.uint64)
        with np.errstate(over="ignore"):
            values = (contexts + np.uint64(i) * bitwise._CONTEXT_MULTIPLIER) * bitwise._MULTIPLIER
        values ^= values >> np.uint64(29)
        groups = (((values >> np.uint64(32)) * np.uint64(slots)) >> np.uint64(32)).astype(np.int64)
        groups &= ~(bitwise.WAYS - 1)
        if start == 0:
            group = groups[0]
        found += contexts[groups == group].tolist()
        start += len(contexts)
    return group, found[:count]


def test_the_context_models_table_is_sized_to_the_bytes_to_code():
    """SLOTS_PER_BYTE slots for each byte the streams may code (streams x positions), a
    multiple of WAYS, within MIN_SLOTS .. SLOTS, and the empty slot after them."""
    for size in (1, 4_000, 70_288, 152_089, 481_861, 10**7):
        slots = bitwise.slots_for(size)
        assert slots % bitwise.WAYS == 0 and bitwise.MIN_SLOTS <= slots <= bitwise.SLOTS
        assert slots >= min(bitwise.SLOTS_PER_BYTE * size, bitwise.SLOTS)
        assert slots < max(bitwise.SLOTS_PER_BYTE * size + bitwise.WAYS, bitwise.MIN_SLOTS + 1)
    assert bitwise.slots_for(10**7) == bitwise.SLOTS
    assert len(BitMixer(3, positions=50_000).bits[0]) == bitwise.slots_for(150_000) + 1


def test_a_context_not_seen_reads_as_new_and_takes_the_place_that_learned_least():
    """Contexts of one model whose half bytes hash to the same group of slots: the first
    WAYS claimed are found again, each in its own place; one more is not found (it reads
    the empty slot, not another context's counts) and, claimed, takes the place whose first
    node has learned least, emptied; the others keep their counts. Another model's context
    of the same hash lives elsewhere in the one table."""
    assert bitwise.WAYS == 4
    slots = bitwise.slots_for(100_000)
    table = np.zeros((slots + 1, 16), np.int32)
    first, contexts = _same_group(5, bitwise.WAYS + 1, slots)
    *held, new = contexts
    assert all(bitwise._slot(np.uint64(c), 5, 0, slots)[0] == first for c in contexts)
    learned = (3, 1, 4, 2)  # how often each held context's nodes have learned (as the coder learns after each claim)
    places = []
    for context, n in zip(held, learned):
        places.append(bitwise._find(table, np.uint64(context), 5, 0, True))
        table[places[-1], 1:] = 5 << 10 | n
    assert places == [first, first + 1, first + 2, first + 3]
    assert [bitwise._find(table, np.uint64(c), 5, 0, False) for c in held] == places
    assert bitwise._find(table, np.uint64(new), 5, 0, False) == slots and not table[slots].any()  # the empty slot
    assert bitwise._find(table, np.uint64(new), 5, 0, True) == places[1] and not table[places[1], 1:].any()
    assert bitwise._find(table, np.uint64(held[1]), 5, 0, False) == slots
    for context, place, n in zip(held, places, learned):
        if place != places[1]:
            assert bitwise._find(table, np.uint64(context), 5, 0, False) == place
            assert (table[place, 1:] == 5 << 10 | n).all()
    assert bitwise._slot(np.uint64(held[0]), 6, 0, slots)[0] != first  # model 6's context of the same hash


def test_a_contexts_second_input_is_its_stretched_probability_as_sure_as_its_count():
    """x_{2+i} = st(p_i) and x_{25+i} = st(p_i) n_i / (n_i + CONFIDENCE), within a unit of
    1/256: a context seen often says what it says; one seen once, a little of it; one not
    seen before, nothing (p_i = 1/2)."""
    mixer = BitMixer(1)
    bitcontexts.hash_contexts(mixer.history, mixer.word, 0, mixer.bits[3], mixer.text)  # the first position's contexts
    tables, contexts = mixer.bits[0], mixer.bits[3]
    stretch = mixer._curves[0]
    cases = {0: (1, 3), 1: (2_900_000, 1), 2: (200_000, 40), 3: (4_000_000, 255)}  # context: (p_i in 2**-22, n_i)
    for i, (p, n) in cases.items():
        slot = bitwise._find(tables, contexts[0, i], i, 0, True)
        tables[slot, 1] = (p - (1 << 21)) << 10 | n  # the root's entry (c0 = 1: half byte 0, node 1)
    mixer._work[2][:] = False  # the slots are looked up again (context 4's: claimed, empty)
    bitwise._slots(tables, contexts, 0, 1, 0, mixer._work)
    bitwise._node(mixer.bits, mixer._curves, 0, 1, mixer._cums[0], mixer._work)
    x = mixer._work[0]
    for i, (p, n) in cases.items():
        st = int(stretch[p >> 10])  # p_i in the stretch table's units, 2**-12
        assert abs(x[2 + i] - st) <= 1 and abs(x[2 + bitwise.CONTEXTS + i] - st * n / (n + bitwise.CONFIDENCE)) <= 1
    assert x[2 + 4] == x[2 + bitwise.CONTEXTS + 4] == 0  # context 4 not seen: p = 1/2, n = 0


def test_a_contexts_probability_moves_one_over_its_count_and_a_half_towards_each_bit():
    """p_i += (y - p_i) / (n_i + 3/2): from 1/2 a first 0 makes it 1/6 and a first 1 5/6
    (within the table's 2**-16), and the count is 1, in every context seen for the first time."""
    mixer, byte = BitMixer(1), ord("e")  # 0b01100101: the root's bit is 0, the next node's 1
    _code(mixer, np.zeros((1, 256), np.int64), [byte])
    tables, contexts = mixer.bits[0], mixer.bits[3]
    for i in range(bitwise.CONTEXTS):
        slot = bitwise._find(tables, contexts[0, i], i, 0, False)
        assert slot != len(tables) - 1  # not the empty slot
        for within, expected in ((1, 1 / 6), (2, 5 / 6)):  # the root (c0 = 1), then c0 = 2 (after the 0)
            entry = int(tables[slot, within])
            assert entry & 1023 == 1 and abs(((entry >> 10) + (1 << 21)) / 2**22 - expected) < 2**-16, (i, within)


@pytest.mark.parametrize("model", ["random", "zeros", "constant"])
def test_the_running_sums_are_those_of_the_two_distributions_in_order(model):
    """``cums [B, 2, 257]``: version 2's distribution and the model's own weights (a mixer's
    at weight 1, :func:`sharnn.coding.mixing._exp_weights`) summed in order, flat rows (a
    model not consulted, as for a binary) included."""
    rng, exp = np.random.default_rng(7), mixing._exp_table()
    rows = {"random": random_log_weights(1, 3)[0], "zeros": np.zeros((3, 256)), "constant": np.full((3, 256), -9)}
    logs = np.ascontiguousarray(rows[model] * 4, dtype=np.int64)  # the model's inputs, 2**-10 nat
    byte_probs, cums = rng.dirichlet(np.ones(256), 3), np.full((3, 2, 257), np.nan)
    bitwise._byte_sums(byte_probs, cums)
    bitwise._model_sums(logs, exp, cums)
    for b in range(3):
        weights = np.empty(256, np.int64)
        mixing._exp_weights(logs[b] * mixing.WEIGHT_UNIT, exp, weights)
        np.testing.assert_array_equal(cums[b, 0], np.concatenate([[0.0], np.cumsum(byte_probs[b])]))
        np.testing.assert_array_equal(cums[b, 1], np.concatenate([[0.0], np.cumsum(weights.astype(np.float64))]))


def test_version_3_is_pinned_by_a_digest_of_its_probabilities_and_its_bytes():
    """Every bit's coded probability and the coder's bytes, walking 300 positions of 3
    streams (the last position 2)."""
    rows, weights, grid = 300, random_log_weights(300, 3), _grid(300, 3)
    mixer, encoder, digest = BitMixer(3), BinaryEncoder(), hashlib.sha256()
    for t in range(rows):
        k = 2 if t == rows - 1 else 3
        mixer.code(weights[t], encoder, grid[t, :k])
        digest.update(mixer.coded_probabilities[:k].tobytes())
    digest.update(encoder.finish())
    assert digest.hexdigest() == DIGEST


DIGEST = "323cb46e7ca2d6fe20193af1fbe865214b4330f37099c0468ae2d057531f9300"  # AMD EPYC (AVX-512), numba 0.68
