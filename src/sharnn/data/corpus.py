"""Data: loading corpora, batchify and BPTT windows (preparing them: :mod:`sharnn.data.prepare`).

A corpus is three arrays (train, valid, test) of token ids and the tokenizer that made
them (:mod:`sharnn.data.tokenizer`): raw bytes (uint8, token id = byte value) unless it was
prepared with ``words`` or ``bpe:N``. Prepared corpora live in a folder with
``train.bin``, ``valid.bin``, ``test.bin`` (ids in the smallest unsigned dtype that holds
the vocabulary: uint8 for bytes, uint16 or uint32 for words and bpe), ``meta.json`` and,
for words and bpe, ``tokenizer.json``; they are memory-mapped, never read into Python
objects. Batches are time-major: a split of ``N`` tokens becomes ``[N // B, B]``, column
``b`` being the contiguous tokens ``b * N // B ...`` (``B`` streams; docs/data.md).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from .tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

SPLITS = ("train", "valid", "test")
BUNDLED_CORPORA = ("enwik8-head", "wikitext-2-bytes", "enwik8-head+wikitext-2")
"""The corpora in the package (``src/sharnn/corpora/README.md``): the first 4.15 MB of
enwik8 split 90/5/5 by position; WikiText-2's own three splits as raw bytes (its ``.txt``
files: the bytes the tokenization experiment's byte model reads); and both together, each
split the enwik8 head's then WikiText-2's. ``enwik8-head*K+wikitext-2`` (K from 2 to 9) is
the same mix with the enwik8 head's train split K times over, weighting its markup against
WikiText-2's prose (the shipped model's training text, docs/pretrained.md); its valid and
test splits are the unweighted mix's."""

_WEIGHTED_MIX = re.compile(r"enwik8-head\*([2-9])\+wikitext-2")


def wikipedia_mix_weight(spec: str) -> int | None:
    """How many times the bundled Wikipedia mix ``spec`` holds the enwik8 head's train split
    (1 for ``enwik8-head+wikitext-2``, K for ``enwik8-head*K+wikitext-2``); None when
    ``spec`` is not that mix."""
    if spec == "enwik8-head+wikitext-2":
        return 1
    match = _WEIGHTED_MIX.fullmatch(spec)
    return int(match.group(1)) if match else None


def bundled_wikitext2() -> Path:
    """The folder of the WikiText-2 v1 copy bundled with sharnn: ``{train,valid,test}.txt.gz``
    (CC BY-SA 3.0; provenance and checksums in ``src/sharnn/corpora/README.md``)."""
    return Path(str(resources.files("sharnn") / "corpora" / "wikitext-2"))


@dataclass
class Corpus:
    """The three splits of a corpus, each a 1-D array of token ids (possibly
    memory-mapped), and the tokenizer that made them. ``words``: each split's number of
    words with one ``<eos>`` per line, for corpora that count them (WikiText-2), else None."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str
    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)
    words: dict[str, int] | None = None

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        return getattr(self, name)


def split_by_position(data: np.ndarray, valid_fraction: float, test_fraction: float):
    """Split bytes by position: train first, then valid, then test (enwik8: 90M/5M/5M)."""
    n = len(data)
    n_valid, n_test = int(n * valid_fraction), int(n * test_fraction)
    n_train = n - n_valid - n_test
    return data[:n_train], data[n_train : n_train + n_valid], data[n_train + n_valid :]


def load_corpus(spec: str, valid_fraction: float = 0.05, test_fraction: float = 0.05) -> Corpus:
    """Open a corpus by name or path.

    ``spec`` is one of: a bundled corpus name (``enwik8-head``); a folder made by
    ``sharnn prepare`` (:mod:`sharnn.data.prepare`; has ``meta.json``), its splits in the dtype
    it names; any file (``.gz`` is decompressed) or folder of files (concatenated in sorted
    path order), as uint8 bytes split by position with the given fractions.

    Raises:
        DataError: if the corpus does not exist (with how to prepare it, for a path named
            like enwik8), cannot be read, or is empty.
    """
    if spec in BUNDLED_CORPORA or wikipedia_mix_weight(spec):
        return _load_bundled(spec, valid_fraction, test_fraction)
    path = Path(spec)
    if (path / "meta.json").is_file():
        return _load_prepared(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"corpus folder {path} has no files")
        data = np.concatenate([read_bytes(f) for f in files])
    elif path.is_file():
        data = read_bytes(path)
    else:
        enwik8 = f"; for enwik8 run: sharnn prepare enwik8 --out {spec}" if path.name.startswith("enwik8") else ""
        raise DataError(
            f"corpus not found: {spec!r} (give a file, a folder of files, a prepared corpus folder made by "
            f"'sharnn prepare', or a bundled name: {', '.join(BUNDLED_CORPORA)} (weighted: "
            f"enwik8-head*K+wikitext-2, K from 2 to 9){enwik8})"
        )
    if len(data) == 0:
        raise DataError(f"corpus {spec} is empty")
    return Corpus(*split_by_position(data, valid_fraction, test_fraction), source=str(path))


def _load_bundled(name: str, valid_fraction: float, test_fraction: float) -> Corpus:
    """One of :data:`BUNDLED_CORPORA` or a weighted mix; the enwik8 head is split by the
    given fractions, WikiText-2 keeps its own splits."""
    splits = []
    if name != "wikitext-2-bytes":
        with resources.as_file(resources.files("sharnn") / "corpora" / "enwik8-head.gz") as path:
            train, valid, test = split_by_position(read_bytes(path), valid_fraction, test_fraction)
        splits.append((np.tile(train, wikipedia_mix_weight(name) or 1), valid, test))
    if name != "enwik8-head":
        splits.append([read_bytes(bundled_wikitext2() / f"{split}.txt.gz") for split in SPLITS])
    return Corpus(*(np.concatenate(parts) for parts in zip(*splits)), source=name)


def _load_prepared(path: Path) -> Corpus:
    """A folder made by ``sharnn prepare``: its splits memory-mapped in the dtype and with
    the tokenizer its ``meta.json`` names (uint8 bytes for folders that name none)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        dtype = np.dtype(meta.get("dtype", "uint8"))
        if dtype.kind != "u":
            raise ValueError(f"token ids must be unsigned integers, not {dtype}")
    except (OSError, ValueError, TypeError, AttributeError) as e:  # AttributeError: not a JSON object
        raise DataError(f"prepared corpus {path}: unreadable meta.json ({e}); prepare it again") from None
    tokenizer = load_tokenizer(path)
    if tokenizer.name != meta.get("tokenizer", "bytes"):
        raise DataError(
            f"prepared corpus {path}: meta.json names the {meta.get('tokenizer')} tokenizer but "
            f"tokenizer.json holds {tokenizer.name}; prepare it again"
        )
    splits = []
    for name in SPLITS:
        file = path / f"{name}.bin"
        if not file.is_file():
            raise DataError(f"prepared corpus {path} is missing {file.name}; prepare it again")
        size, expected = file.stat().st_size, meta.get(f"{name}_tokens", meta.get(f"{name}_bytes"))
        if size % dtype.itemsize or (expected is not None and size // dtype.itemsize != expected):
            recorded = f"the {expected:,}" if expected is not None else "whole"
            raise DataError(
                f"prepared corpus {path}: {file.name} has {size:,} bytes, not {recorded} "
                f"{dtype} tokens meta.json records; prepare it again"
            )
        splits.append(np.memmap(file, dtype=dtype, mode="c") if size else np.zeros(0, dtype))
    words = {name: meta[f"{name}_words"] for name in SPLITS} if all(f"{s}_words" in meta for s in SPLITS) else None
    return Corpus(*splits, source=str(path), tokenizer=tokenizer, words=words)


# A .gz is decompressed into memory: at most this many bytes (larger text is read from a
# plain file, memory-mapped), so that a small file that inflates without end (a gzip bomb)
# is refused before it exhausts memory.
MAX_GZIP_BYTES = 2**30


def read_bytes(path: str | Path) -> np.ndarray:
    """A file's bytes as a uint8 array ``[N]``: memory-mapped, or decompressed when it ends
    in .gz (at most :data:`MAX_GZIP_BYTES`). Raises :class:`DataError` when the file is
    missing or unreadable, or decompresses to more than that."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            return _gunzip(path)
        if path.stat().st_size == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable view, no copy
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {e}") from None


def _gunzip(path: Path) -> np.ndarray:
    """The decompressed bytes of ``path``, read in chunks and refused (:class:`DataError`)
    once past :data:`MAX_GZIP_BYTES` or past the memory this process may hold."""
    data = bytearray()
    try:
        with gzip.open(path, "rb") as f:
            while len(data) <= MAX_GZIP_BYTES and (chunk := f.read(min(1 << 24, MAX_GZIP_BYTES + 1 - len(data)))):
                data += chunk
    except MemoryError:
        raise DataError(f"{path} decompresses to more bytes than this process has memory for") from None
    if len(data) > MAX_GZIP_BYTES:
        raise DataError(
            f"{path} decompresses to more than {MAX_GZIP_BYTES:,} bytes, the most sharnn reads from a .gz (it holds "
            "them in memory): decompress it and give the plain file, which is read from disk"
        )
    return np.frombuffer(data, dtype=np.uint8)


def batchify(data: np.ndarray, streams: int) -> Tensor:
    """Lay out token ids as ``streams`` contiguous streams, time-major (docs/data.md, "Streams").

    Args:
        data: 1-D token ids ``[N]`` in an unsigned dtype (uint8 bytes; uint16 or uint32
            word or wordpiece ids); may be memory-mapped; nothing is copied.
        streams: number of streams ``B``.

    Returns:
        tensor ``[N // B, B]`` of ``data``'s dtype; column ``b`` holds tokens
        ``b*(N//B) ... (b+1)*(N//B)-1``. The last ``N mod B`` tokens are dropped.
    """
    rows = len(data) // streams
    flat = torch.from_numpy(np.asarray(data[: rows * streams]))
    return flat.view(streams, rows).t()


def get_batch(batched: Tensor, row: int, length: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Inputs ``[T, B]`` = rows ``row .. row+T-1`` and targets ``[T, B]`` = rows
    ``row+1 .. row+T``, as int64 on ``device``. To CUDA, the ``[T + 1, B]`` token ids go through
    pinned memory and are copied asynchronously: the host never waits for the GPU here."""
    window = batched[
        row : row + length + 1
    ].contiguous()  # a small copy: pinning a strided view would pin its whole span
    if torch.device(device).type == "cuda":
        window = window.pin_memory().to(device, non_blocking=True)
    window = window.to(device).long()
    return window[:-1], window[1:]


def jittered_bptt(bptt: int, rng: np.random.Generator) -> int:
    """The original code's random window length (docs/data.md, "Windows"): base ``bptt``
    with probability 0.95, else ``bptt / 2``; ``T = int(N(base, 5^2))`` clipped to ``[5, bptt]``."""
    base = bptt if rng.random() < 0.95 else bptt / 2
    return min(max(5, int(rng.normal(base, 5))), bptt)


def window_length(row: int, rows: int, bptt: int, rng: np.random.Generator | None = None) -> int:
    """Length ``T`` of the window that starts at ``row`` of a batchified split of ``rows``
    rows: :func:`jittered_bptt` with ``rng`` (training), else ``bptt`` (evaluation), cut
    so that its targets stay inside the split. Draws one length from ``rng`` per window,
    so its state after a window is a valid resume point."""
    length = bptt if rng is None else jittered_bptt(bptt, rng)
    return min(length, rows - 1 - row)


def bptt_windows(
    rows: int, bptt: int, start: int = 0, rng: np.random.Generator | None = None
) -> Iterator[tuple[int, int]]:
    """Yield ``(row, T)`` windows walking a batchified split of ``rows`` rows from ``start``.

    Windows are contiguous; each predicts rows ``row+1 .. row+T``, so together they
    predict every row after the first exactly once. Lengths as :func:`window_length`,
    drawn lazily, one window at a time.
    """
    row = start
    while row < rows - 1:
        length = window_length(row, rows, bptt, rng)
        yield row, length
        row += length


def split_prefix(corpus, split: str, max_bytes: int) -> tuple[np.ndarray, int | None]:
    """``(ids, bytes)``: the longest prefix of a split whose text is at most ``max_bytes``
    bytes (whole tokens: for a byte corpus, ``max_bytes`` of them) and the bytes of its
    text; the whole split and None when ``max_bytes`` is 0 or the split is no longer."""
    ids = corpus.split(split)
    if max_bytes <= 0:
        return ids, None
    if corpus.tokenizer.is_bytes:
        count = min(max_bytes, len(ids))
        size = count
    else:
        ends = np.cumsum(corpus.tokenizer.byte_lengths()[ids])  # where each token's text ends
        count = int(np.searchsorted(ends, max_bytes, side="right"))
        size = int(ends[count - 1]) if count else 0
    return (ids, None) if count == len(ids) else (ids[:count], size)


def mean_bytes_per_token(corpus) -> float:
    """The train split's bytes per token (1 for bytes): training logs its loss in bits
    per token over this, an estimate of its bits per byte (evaluations count exactly)."""
    if corpus.tokenizer.is_bytes:
        return 1.0
    counts = np.bincount(corpus.train, minlength=corpus.tokenizer.vocab_size)  # no int64 copy of the split
    return float(counts @ corpus.tokenizer.byte_lengths() / len(corpus.train))
