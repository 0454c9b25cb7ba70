"""Byte data (src/sharnn/data/corpus.py, prepare.py): tokenizer, corpora, enwik8 preparation, batchify, windows
(docs/data.md)."""

import gzip
import hashlib
import json
import math
import zipfile
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
import torch

from helpers import WIKITEXT2, assert_user_error, cli
from sharnn.data.corpus import batchify, bptt_windows, get_batch, jittered_bptt, load_corpus, wikipedia_mix_weight
from sharnn.data.prepare import prepare_corpus, prepare_enwik8
from sharnn.data.tokenizer import ByteTokenizer
from sharnn.errors import DataError

ENWIK8_HEAD_BYTES = 4_154_064


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_every_byte():
    tok = ByteTokenizer()
    data = bytes(range(256)) + bytes(np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8))
    ids = tok.encode(data)
    assert ids.dtype == torch.int64
    assert ids.tolist() == list(data)
    assert bytes(ids.tolist()) == data
    assert tok.vocab_size == 256


def test_tokenizer_round_trips_utf8_text():
    tok = ByteTokenizer()
    text = "naïve café — 日本語 🙂\n<mediawiki>"
    ids = tok.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids.tolist()) == text


def test_decoding_invalid_utf8_gives_replacement_characters():
    tok = ByteTokenizer()
    assert tok.decode([0x61, 0xFF, 0x62]) == "a\ufffdb"
    assert tok.decode(torch.tensor([0xE6, 0x97])) == "\ufffd"  # truncated 3-byte sequence
    for seed in range(5):
        tok.decode(torch.from_numpy(np.random.default_rng(seed).integers(0, 256, 500)))  # never raises


# ----------------------------------------------------------------------------- batchify / get_batch


def test_batchify_is_time_major_contiguous_streams():
    data = (np.arange(103) % 256).astype(np.uint8)
    batched = batchify(data, 4)
    rows = 103 // 4
    assert batched.shape == (rows, 4)
    assert batched.dtype == torch.uint8
    for b in range(4):
        assert batched[:, b].tolist() == data[b * rows : (b + 1) * rows].tolist()
    assert 102 not in batched.flatten().tolist()  # the 3 remainder bytes are dropped


def test_batchify_shares_memory_with_a_memmap(tmp_path):
    path = tmp_path / "bytes.bin"
    payload = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8)
    payload.tofile(path)
    data = np.memmap(path, dtype=np.uint8, mode="c")
    batched = batchify(data, 8)
    assert np.shares_memory(batched.numpy(), data)
    assert batched[:, 3].tolist() == payload[3 * 125 : 4 * 125].tolist()


def test_get_batch_targets_are_inputs_shifted_by_one_row():
    batched = batchify((np.arange(200) % 256).astype(np.uint8), 4)
    inputs, targets = get_batch(batched, 10, 7)
    assert inputs.shape == targets.shape == (7, 4)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs, batched[10:17].long())
    assert torch.equal(targets, batched[11:18].long())
    assert torch.equal(targets[:-1], inputs[1:])


# ----------------------------------------------------------------------------- windows


def predicted_rows(windows):
    return [r for row, T in windows for r in range(row + 1, row + T + 1)]


def assert_contiguous_and_complete(windows, rows, start=0):
    assert windows[0][0] == start
    for (row, T), (next_row, _) in pairwise(windows):
        assert next_row == row + T
    assert predicted_rows(windows) == list(range(start + 1, rows))


def test_windows_without_rng_have_exact_length_and_last_one_is_cut():
    windows = list(bptt_windows(100, 16))
    assert windows == [(0, 16), (16, 16), (32, 16), (48, 16), (64, 16), (80, 16), (96, 3)]
    assert_contiguous_and_complete(windows, 100)
    assert list(bptt_windows(97, 16))[-1] == (80, 16)  # 96 predicted rows: no short tail


def test_windows_with_rng_are_contiguous_and_cover_every_row():
    windows = list(bptt_windows(10_000, 64, rng=np.random.default_rng(0)))
    assert_contiguous_and_complete(windows, 10_000)
    assert all(5 <= T <= 64 for _, T in windows[:-1])


def test_jittered_window_lengths_are_mostly_near_bptt():
    bptt = 128
    lengths = [T for _, T in bptt_windows(3000 * bptt, bptt, rng=np.random.default_rng(1))][:-1]
    n = len(lengths)
    assert n > 2500
    near_full = sum(1 for T in lengths if T >= bptt - 30) / n
    near_half = sum(1 for T in lengths if abs(T - bptt // 2) <= 30) / n
    assert near_full + near_half == 1.0
    assert near_half == pytest.approx(0.05, abs=0.015)
    assert sum(1 for T in lengths if T == bptt) / n == pytest.approx(0.475, abs=0.04)


def test_same_seed_gives_same_windows():
    a = list(bptt_windows(5000, 32, rng=np.random.default_rng(7)))
    b = list(bptt_windows(5000, 32, rng=np.random.default_rng(7)))
    c = list(bptt_windows(5000, 32, rng=np.random.default_rng(8)))
    assert a == b
    assert a != c


def test_resuming_from_row_and_rng_state_continues_the_same_walk():
    rows, bptt = 5000, 32
    full = list(bptt_windows(rows, bptt, rng=np.random.default_rng(3)))
    rng = np.random.default_rng(3)
    walk = bptt_windows(rows, bptt, rng=rng)
    first = [next(walk) for _ in range(40)]
    row, T = first[-1]
    saved = rng.bit_generator.state  # what a checkpoint would store
    resumed_rng = np.random.default_rng()
    resumed_rng.bit_generator.state = saved
    rest = list(bptt_windows(rows, bptt, start=row + T, rng=resumed_rng))
    assert first + rest == full


def expected_jitter_pmf(bptt: int, sigma: float = 5.0) -> dict[int, float]:
    """§5.1: base = bptt (p 0.95) or bptt/2; T = int(N(base, sigma^2)) clipped to [5, bptt]."""

    def cdf(x, mu):
        return 0.5 * (1 + math.erf((x - mu) / (sigma * math.sqrt(2))))

    pmf = {}
    for T in range(5, bptt + 1):
        p = 0.0
        for weight, base in ((0.95, bptt), (0.05, bptt / 2)):
            low = -math.inf if T == 5 else T  # int() truncates: int(x) == T for x in [T, T+1)
            high = math.inf if T == bptt else T + 1
            p += weight * (cdf(high, base) - cdf(low, base))
        pmf[T] = p
    return pmf


@pytest.mark.parametrize("bptt", [64, 16])
def test_jittered_bptt_matches_the_reference_distribution(bptt):
    rng = np.random.default_rng(11)
    n = 20_000
    counts = Counter(jittered_bptt(bptt, rng) for _ in range(n))
    expected = expected_jitter_pmf(bptt)
    assert sum(expected.values()) == pytest.approx(1.0)
    assert set(counts) <= set(expected)
    for T, p in expected.items():
        assert counts[T] / n == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n) + 1e-3), T


# ----------------------------------------------------------------------------- corpora


def test_bundled_enwik8_head_loads_and_splits_90_5_5():
    corpus = load_corpus("enwik8-head")
    sizes = [len(corpus.train), len(corpus.valid), len(corpus.test)]
    assert sum(sizes) == ENWIK8_HEAD_BYTES
    assert sizes[1] == sizes[2] == int(ENWIK8_HEAD_BYTES * 0.05)
    assert bytes(corpus.train[:10]) == b"<mediawiki"
    assert corpus.train.dtype == np.uint8


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def assert_split_by_position(corpus, data: bytes):
    n = len(data)
    n_valid = n_test = int(n * 0.05)
    n_train = n - n_valid - n_test
    assert bytes(corpus.train) == data[:n_train]
    assert bytes(corpus.valid) == data[n_train : n_train + n_valid]
    assert bytes(corpus.test) == data[n_train + n_valid :]


def test_plain_file_corpus_is_split_by_position(tmp_path):
    data = random_bytes(3001)
    (tmp_path / "text.bin").write_bytes(data)
    assert_split_by_position(load_corpus(str(tmp_path / "text.bin")), data)


def test_gzip_file_corpus_is_decompressed(tmp_path):
    data = random_bytes(2000, seed=1)
    (tmp_path / "text.gz").write_bytes(gzip.compress(data))
    assert_split_by_position(load_corpus(str(tmp_path / "text.gz")), data)


def test_folder_corpus_concatenates_files_in_sorted_path_order(tmp_path):
    parts = {"b.txt": random_bytes(700, 2), "a.txt": random_bytes(500, 3), "c/d.txt": random_bytes(300, 4)}
    for name, content in parts.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(content)
    expected = parts["a.txt"] + parts["b.txt"] + parts["c/d.txt"]
    assert_split_by_position(load_corpus(str(tmp_path)), expected)


def test_the_bundled_wikipedia_corpora_keep_each_texts_own_held_out_splits():
    """``wikitext-2-bytes`` is WikiText-2's three files as bytes; ``enwik8-head+wikitext-2``
    is, split by split, the enwik8 head's then WikiText-2's: nothing of either's valid or
    test text is in its train split."""
    head, wikitext, both = (load_corpus(n) for n in ("enwik8-head", "wikitext-2-bytes", "enwik8-head+wikitext-2"))
    for split in ("train", "valid", "test"):
        text = gzip.decompress((WIKITEXT2 / f"{split}.txt.gz").read_bytes())
        assert wikitext.split(split).tobytes() == text
        assert both.split(split).tobytes() == head.split(split).tobytes() + text
    assert (len(both.train), len(both.valid), len(both.test)) == (14_535_806, 1_329_384, 1_464_152)


def test_the_weighted_wikipedia_mix_repeats_only_the_enwik8_heads_train_split():
    """``enwik8-head*3+wikitext-2`` trains on the enwik8 head's train split three times
    over, then WikiText-2's; its held-out splits are the unweighted mix's, and weights
    outside 2 to 9 are not corpora."""
    head, both, weighted = (
        load_corpus(n) for n in ("enwik8-head", "enwik8-head+wikitext-2", "enwik8-head*3+wikitext-2")
    )
    assert weighted.train.tobytes() == head.train.tobytes() * 3 + both.train[len(head.train) :].tobytes()
    assert weighted.valid.tobytes() == both.valid.tobytes() and weighted.test.tobytes() == both.test.tobytes()
    assert [wikipedia_mix_weight(s) for s in ("enwik8-head+wikitext-2", "enwik8-head*3+wikitext-2", "enwik8-head")] == [
        1,
        3,
        None,
    ]
    for spec in ("enwik8-head*1+wikitext-2", "enwik8-head*10+wikitext-2"):
        with pytest.raises(DataError, match="corpus not found"):
            load_corpus(spec)


def test_missing_corpus_raises_data_error(tmp_path):
    with pytest.raises(DataError):
        load_corpus(str(tmp_path / "nope.txt"))


def test_missing_corpus_says_what_may_be_given_and_how_to_prepare_enwik8(tmp_path):
    with pytest.raises(DataError) as error:
        load_corpus(str(tmp_path / "notes.txt"))
    message = str(error.value)
    assert message == (
        f"corpus not found: {str(tmp_path / 'notes.txt')!r} (give a file, a folder of files, a prepared "
        "corpus folder made by 'sharnn prepare', or a bundled name: enwik8-head, wikitext-2-bytes, "
        "enwik8-head+wikitext-2 (weighted: enwik8-head*K+wikitext-2, K from 2 to 9))"
    )
    assert "\n" not in message and "sharnn prepare enwik8" not in message
    enwik8 = str(tmp_path / "data" / "enwik8")
    with pytest.raises(DataError) as error:
        load_corpus(enwik8)
    assert str(error.value) == (
        f"corpus not found: {enwik8!r} (give a file, a folder of files, a prepared corpus "
        "folder made by 'sharnn prepare', or a bundled name: enwik8-head, wikitext-2-bytes, "
        "enwik8-head+wikitext-2 (weighted: enwik8-head*K+wikitext-2, K from 2 to 9); "
        f"for enwik8 run: sharnn prepare enwik8 --out {enwik8})"
    )


def test_empty_corpus_raises_data_error(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError):
        load_corpus(str(tmp_path / "empty.txt"))


def test_truncated_gzip_corpus_raises_data_error(tmp_path):
    compressed = gzip.compress(b"the quick brown fox " * 500)
    (tmp_path / "cut.gz").write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(DataError):
        load_corpus(str(tmp_path / "cut.gz"))


def test_corrupted_gzip_corpus_raises_data_error(tmp_path):
    compressed = bytearray(gzip.compress(b"the quick brown fox " * 500))
    compressed[10] = 0xFF  # first deflate byte after the 10-byte header: reserved block type
    (tmp_path / "bad.gz").write_bytes(bytes(compressed))
    with pytest.raises(DataError):
        load_corpus(str(tmp_path / "bad.gz"))


def test_prepared_corpus_round_trips_and_is_memory_mapped(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "one.txt").write_bytes(random_bytes(1500, 5))
    (source / "two.txt").write_bytes(random_bytes(900, 6))
    out = prepare_corpus(source, tmp_path / "prepared")
    assert (out / "meta.json").is_file()
    original, prepared = load_corpus(str(source)), load_corpus(str(out))
    for name in ("train", "valid", "test"):
        assert isinstance(prepared.split(name), np.memmap)
        assert bytes(prepared.split(name)) == bytes(original.split(name))


@pytest.mark.parametrize(
    "size, fractions, message",
    [
        (
            3,
            (0.05, 0.05),
            "valid would get 0, test would get 0 (each split needs at least 2 bytes); "
            "use a larger source or larger --valid-fraction/--test-fraction",
        ),
        (
            39,
            (0.05, 0.05),
            "valid would get 1, test would get 1 (each split needs at least 2 bytes); "
            "use a larger source or larger --valid-fraction/--test-fraction",
        ),
        (
            5,
            (0.45, 0.45),
            "train would get 1 (each split needs at least 2 bytes); "
            "use a larger source or smaller --valid-fraction/--test-fraction",
        ),
    ],
)
def test_prepare_corpus_refuses_a_source_too_small_for_every_split(tmp_path, size, fractions, message):
    source = tmp_path / "tiny.txt"
    source.write_bytes(random_bytes(size))
    out = tmp_path / "new" / "out"
    with pytest.raises(DataError) as error:
        prepare_corpus(source, out, *fractions)
    assert str(error.value) == f"{source} is too small to split ({size} bytes): {message}"
    assert "\n" not in str(error.value)
    assert not out.exists() and not out.parent.exists()


def test_prepare_corpus_accepts_the_smallest_source_that_gives_every_split_2_bytes(tmp_path):
    (tmp_path / "small.txt").write_bytes(random_bytes(40))
    out = prepare_corpus(tmp_path / "small.txt", tmp_path / "out")
    assert [len(load_corpus(str(out)).split(name)) for name in ("train", "valid", "test")] == [36, 2, 2]


# ----------------------------------------------------------------------------- enwik8 preparation


@pytest.fixture
def synthetic_enwik8(tmp_path):
    """20,000 random bytes laid out like enwik8: a raw file and a zip with an 'enwik8' member."""
    data = random_bytes(20_000, seed=8)
    raw = tmp_path / "enwik8"
    raw.write_bytes(data)
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", data)
    return data, raw, archive


def prepare(source, out, data):
    return prepare_enwik8(str(source), out, expected_size=len(data), expected_md5=hashlib.md5(data).hexdigest())


def assert_prepared_splits(out, data):
    assert (out / "train.bin").read_bytes() == data[:18_000]
    assert (out / "valid.bin").read_bytes() == data[18_000:19_000]
    assert (out / "test.bin").read_bytes() == data[19_000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["md5"] == hashlib.md5(data).hexdigest()
    assert meta["size"] == len(data)


@pytest.mark.parametrize("kind", ["zip", "raw"])
def test_prepare_enwik8_splits_90_5_5(synthetic_enwik8, tmp_path, kind):
    data, raw, archive = synthetic_enwik8
    out = prepare(archive if kind == "zip" else raw, tmp_path / "out", data)
    assert_prepared_splits(out, data)
    assert_split_by_position(load_corpus(str(out)), data)


def assert_refused_cleanly(tmp_path, source, data, match):
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(DataError, match=match):
        prepare(source, tmp_path / "out", data)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary folder left


def test_prepare_enwik8_refuses_wrong_md5(synthetic_enwik8, tmp_path):
    data, raw, _ = synthetic_enwik8
    corrupted = bytearray(data)
    corrupted[12_345] ^= 0x01
    raw.write_bytes(bytes(corrupted))
    assert_refused_cleanly(tmp_path, raw, data, "MD5")


def test_prepare_enwik8_refuses_truncated_raw_file(synthetic_enwik8, tmp_path):
    data, raw, _ = synthetic_enwik8
    raw.write_bytes(data[:15_000])
    assert_refused_cleanly(tmp_path, raw, data, "15,000")


def test_prepare_enwik8_refuses_truncated_zip(synthetic_enwik8, tmp_path):
    data, _, archive = synthetic_enwik8
    content = archive.read_bytes()
    archive.write_bytes(content[: len(content) // 2])
    assert_refused_cleanly(tmp_path, archive, data, "truncated|corrupted")


def test_prepare_enwik8_refuses_zip_with_corrupted_member(synthetic_enwik8, tmp_path):
    data, _, archive = synthetic_enwik8
    content = bytearray(archive.read_bytes())
    content[len(content) // 2] ^= 0xFF  # inside the compressed member: CRC or inflate error
    archive.write_bytes(bytes(content))
    assert_refused_cleanly(tmp_path, archive, data, "truncated|corrupted")


def test_prepare_enwik8_refuses_zip_with_corrupted_deflate_stream(tmp_path):
    """Compressible text (like real enwik8), so the member is really deflated; its first
    deflate byte set to 0xFF declares the reserved block type 3, which zlib rejects."""
    rng = np.random.default_rng(9)
    words = [b"<page>", b"the", b"of", b"[[wiki]]", b"</page>\n", b"and", b"&quot;"]
    data = b" ".join(words[i] for i in rng.integers(0, len(words), 6000))[:20_000]
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", data)
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("enwik8")
    assert info.compress_size < len(data) // 2
    content = bytearray(archive.read_bytes())
    header = info.header_offset
    name_len, extra_len = (int.from_bytes(content[header + k : header + k + 2], "little") for k in (26, 28))
    content[header + 30 + name_len + extra_len] = 0xFF
    archive.write_bytes(bytes(content))
    assert_refused_cleanly(tmp_path, archive, data, "truncated|corrupted")


def test_prepare_enwik8_refuses_zip_without_enwik8_member(synthetic_enwik8, tmp_path):
    data, _, archive = synthetic_enwik8
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("enwik9", data)
    assert_refused_cleanly(tmp_path, archive, data, "enwik8")


def test_prepare_enwik8_refuses_missing_source(synthetic_enwik8, tmp_path):
    data, _, _ = synthetic_enwik8
    assert_refused_cleanly(tmp_path, tmp_path / "missing.zip", data, "not found")


def test_prepare_enwik8_leaves_an_existing_output_folder_untouched(synthetic_enwik8, tmp_path):
    data, raw, _ = synthetic_enwik8
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="exists"):
        prepare(raw, out, data)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bpe:0", "unknown tokenizer 'bpe:0': choose bytes or bpe:N"),
        ("bpe:x", "unknown tokenizer 'bpe:x'"),
        ("bpe:", "unknown tokenizer 'bpe:'"),
        ("foo", "unknown tokenizer 'foo'"),
        ("bpe:256", "N from 257"),
        ("words", "use sharnn prepare wikitext-2"),
    ],
)
def test_prepare_corpus_refuses_a_bad_tokenizer_before_reading_the_source(tmp_path, spec, message):
    result = cli("prepare", "corpus", tmp_path / "missing.txt", "--tokenizer", spec, "--out", tmp_path / "out")
    assert_user_error(result, message)  # not "corpus not found": the tokenizer is checked first
    assert list(tmp_path.iterdir()) == []


def test_prepare_corpus_prints_each_splits_tokens_and_bytes(tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(bytes(range(256)) * 40)
    result = cli(
        "prepare", "corpus", source, "--out", tmp_path / "out", "--valid-fraction", "0.1", "--test-fraction", "0.2"
    )
    assert result.exit_code == 0, result.output
    sizes = {name: len(load_corpus(str(tmp_path / "out")).split(name)) for name in ("train", "valid", "test")}
    assert sizes == {"train": 7168, "valid": 1024, "test": 2048}
    assert result.stdout.splitlines() == [
        *(f"{name}: {size:,} tokens, {size:,} bytes" for name, size in sizes.items()),
        f"prepared {source} with bytes (256 token ids) in {tmp_path / 'out'}",
    ]
