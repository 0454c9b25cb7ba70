"""The overlap check between a training corpus and the benchmark texts (sharnn.data.overlap),
against its literal definition: the share of a text's 32-byte windows found, byte for
byte, within one document of the corpus."""

from __future__ import annotations

import numpy as np
import pytest

import sharnn.data.overlap as overlap_module
from sharnn.data.overlap import MIN_DISTINCT, SHINGLE, Overlap, ShingleSet, informative, overlap, shingle_hashes

ALICE = (
    b"Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    b"nothing to do: once or twice she had peeped into the book her sister was reading, but it had "
    b"no pictures or conversations in it, 'and what is the use of a book,' thought Alice 'without "
    b"pictures or conversations?'\n"
)


def _literal(text: bytes, corpus: list[bytes]) -> tuple[int, int]:
    """The definition: ``text``'s windows of at least MIN_DISTINCT distinct bytes, and
    those of them that are a window of some document."""
    windows = {d[i : i + SHINGLE] for d in corpus for i in range(len(d) - SHINGLE + 1)}
    every = (text[i : i + SHINGLE] for i in range(len(text) - SHINGLE + 1))
    counted = [w for w in every if len(set(w)) >= MIN_DISTINCT]
    return len(counted), sum(w in windows for w in counted)


def test_a_copy_is_all_found_and_other_text_none():
    other = b"It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 3
    found = overlap({"alice": ALICE, "short": b"too short"}, [other, ALICE])
    assert found["alice"] == Overlap(len(ALICE) - SHINGLE + 1, len(ALICE) - SHINGLE + 1)
    assert found["alice"].share == 1.0 and found["short"] == Overlap(0, 0) and found["short"].share == 0.0
    assert overlap({"alice": ALICE}, [other])["alice"].found == 0
    assert overlap({"alice": ALICE}, [])["alice"].found == 0


def test_a_quoted_passage_counts_its_windows_and_no_window_spans_two_documents():
    quote = ALICE[40:140]  # 100 bytes: 69 windows
    assert overlap({"alice": ALICE}, [b"as the book says, " + quote + b" and so on"])["alice"].found == 69
    halves = [ALICE[:100], ALICE[100:]]
    assert overlap({"alice": ALICE}, halves)["alice"].found == len(ALICE) - SHINGLE + 1 - (SHINGLE - 1)


@pytest.mark.parametrize("seed", range(4))
def test_the_count_is_the_literal_definition_s_on_random_texts(seed):
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefgh \n", dtype=np.uint8)  # windows of 6 to 10 distinct bytes
    skewed = np.array([20, 20, 20, 10, 10, 5, 5, 4, 4, 2]) / 100
    text = letters[rng.choice(10, 600, p=skewed)].tobytes()
    corpus = [letters[rng.choice(10, int(n), p=skewed)].tobytes() for n in rng.integers(0, 400, 6)]
    corpus += [text[int(a) : int(a) + 80] for a in rng.integers(0, 520, 3)]
    windows, found = _literal(text, corpus)
    assert 0 < windows < len(text) - SHINGLE + 1 and found > 0
    assert overlap({"t": text}, corpus)["t"] == Overlap(windows, found)


def test_a_document_longer_than_a_chunk_is_read_in_overlapping_chunks(monkeypatch):
    monkeypatch.setattr(overlap_module, "CHUNK", 50)  # windows across every chunk's edge
    document = b"x" * 7 + ALICE + b"y" * 13
    assert overlap({"alice": ALICE}, [document])["alice"].found == len(ALICE) - SHINGLE + 1


def test_hashes_are_of_the_window_s_bytes_alone():
    hashes = shingle_hashes(ALICE + ALICE)
    assert hashes.dtype == np.uint64 and len(hashes) == 2 * len(ALICE) - SHINGLE + 1
    assert hashes[0] == hashes[len(ALICE)] and len(set(hashes[: len(ALICE) - SHINGLE + 1].tolist())) > 200
    assert len(shingle_hashes(b"x" * (SHINGLE - 1))) == 0 and len(shingle_hashes(b"x" * SHINGLE)) == 1


def test_runs_rules_and_padding_are_not_counted():
    ruled = b"-" * 40 + b"\n" + b" " * 40 + ALICE[:60] + b"\x00" * 64
    flags = informative(ruled)
    literal = [len(set(ruled[i : i + SHINGLE])) >= MIN_DISTINCT for i in range(len(ruled) - SHINGLE + 1)]
    assert flags.tolist() == literal and not flags[:50].any() and flags.sum() > 50
    text = b"=" * 100 + b"\n"
    assert overlap({"ruled": text}, [text])["ruled"] == Overlap(0, 0)  # nothing to count
    assert ShingleSet([b"=" * 100]).found_in(b"=" * 500) == 0
    assert ShingleSet([ALICE]).found_in(b"=" * 50 + ALICE + b"=" * 50) == len(ALICE) - SHINGLE + 1
