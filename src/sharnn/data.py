"""Byte-level data: tokenizer, corpora, enwik8 preparation, batchify and BPTT windows.

A corpus is three uint8 arrays (train, valid, test) of raw bytes; token id = byte value,
vocabulary 256. Prepared corpora live in a folder with ``train.bin``, ``valid.bin``,
``test.bin`` and ``meta.json`` and are memory-mapped, never read into Python objects.
Batches are time-major: a split of ``N`` bytes becomes ``[N // B, B]``, column ``b``
being the contiguous bytes ``b * N // B ...`` (``B`` streams; docs/data.md).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .errors import DataError

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_SIZE = 100_000_000
ENWIK8_MD5 = "a1fa5ffddb56f4953e226637dabbb36a"
BUNDLED_CORPORA = {"enwik8-head": "enwik8-head.gz"}
SPLITS = ("train", "valid", "test")


class ByteTokenizer:
    """Bytes <-> token ids, vocabulary 256. Exactly invertible; decoding invalid UTF-8
    gives U+FFFD replacement characters instead of raising."""

    vocab_size = 256

    def encode(self, text: str | bytes) -> Tensor:
        """``str`` (UTF-8 encoded) or ``bytes`` -> int64 ids ``[N]``."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return torch.tensor(list(data), dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        """Token ids ``[N]`` -> text, with replacement characters for invalid UTF-8."""
        values = ids.tolist() if isinstance(ids, Tensor) else ids
        return bytes(values).decode("utf-8", errors="replace")


@dataclass
class Corpus:
    """The three splits of a byte corpus, each a 1-D uint8 array (possibly memory-mapped)."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str

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
    :func:`prepare_enwik8` or :func:`prepare_corpus` (has ``meta.json``); any file (``.gz``
    is decompressed) or folder of files (concatenated in sorted path order), split by
    position with the given fractions.

    Raises:
        DataError: if the corpus does not exist (with how to prepare it, for a path named
            like enwik8), cannot be read, or is empty.
    """
    if spec in BUNDLED_CORPORA:
        resource = resources.files("sharnn") / "corpora" / BUNDLED_CORPORA[spec]
        with resources.as_file(resource) as path:
            data = read_bytes(path)
        return Corpus(*split_by_position(data, valid_fraction, test_fraction), source=spec)
    path = Path(spec)
    if (path / "meta.json").is_file():
        splits = []
        for name in SPLITS:
            file = path / f"{name}.bin"
            if not file.is_file():
                raise DataError(f"prepared corpus {path} is missing {file.name}; prepare it again")
            splits.append(np.memmap(file, dtype=np.uint8, mode="c") if file.stat().st_size else np.zeros(0, np.uint8))
        return Corpus(*splits, source=str(path))
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
            f"'sharnn prepare', or a bundled name: {', '.join(BUNDLED_CORPORA)}{enwik8})"
        )
    if len(data) == 0:
        raise DataError(f"corpus {spec} is empty")
    return Corpus(*split_by_position(data, valid_fraction, test_fraction), source=str(path))


def read_bytes(path: str | Path) -> np.ndarray:
    """A file's bytes as a uint8 array ``[N]``: memory-mapped, or decompressed when it ends
    in .gz. Raises :class:`DataError` when the file is missing or unreadable."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return np.frombuffer(bytearray(f.read()), dtype=np.uint8)
        if path.stat().st_size == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable view, no copy
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {e}") from None


def prepare_enwik8(
    source: str,
    out: str | Path,
    *,
    expected_size: int = ENWIK8_SIZE,
    expected_md5: str = ENWIK8_MD5,
) -> Path:
    """Check and split enwik8 into a prepared corpus folder (docs/data.md, "enwik8").

    Args:
        source: ``enwik8.zip`` or the raw ``enwik8`` file, as a path or an http(s) URL.
        out: the folder to create; it must not exist yet.
        expected_size, expected_md5: of the raw file (enwik8: 100,000,000 bytes, MD5
            a1fa5ffd...). Only tests change these.

    Returns:
        ``out``, holding ``train.bin`` (first 90%), ``valid.bin`` (next 5%), ``test.bin``
        (last 5%) and ``meta.json``.

    Raises:
        DataError: missing, unreadable, truncated or corrupted source; wrong size or MD5;
            ``out`` already exists.
    """
    out = Path(out)
    _check_new_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        tmp = Path(tmp)
        local = _fetch(source, tmp) if source.startswith(("http://", "https://")) else Path(source)
        if not local.is_file():
            raise DataError(f"enwik8 source not found: {source}")
        raw = tmp / "enwik8.raw"
        size, md5 = _extract_enwik8(local, raw)
        if size != expected_size:
            raise DataError(
                f"{source}: enwik8 must be {expected_size:,} bytes, got {size:,} (truncated or wrong file)"
            )
        if md5 != expected_md5:
            raise DataError(f"{source}: MD5 {md5} does not match enwik8's {expected_md5} (corrupted file)")
        data = np.memmap(raw, dtype=np.uint8, mode="r")
        meta = {"source": str(source), "name": "enwik8", "size": size, "md5": md5}
        _write_splits(out, tmp / "splits", split_by_position(data, 0.05, 0.05), meta)
        del data
    return out


def prepare_corpus(source: str | Path, out: str | Path, valid_fraction: float = 0.05, test_fraction: float = 0.05) -> Path:
    """Turn any file or folder of files into a prepared, memory-mappable corpus folder.

    Raises:
        DataError: the source does not exist, or is too small for every split to get the
            2 bytes it needs (one prediction); ``out`` already exists. Nothing is created then.
    """
    out = Path(out)
    _check_new_folder(out)
    corpus = load_corpus(str(source), valid_fraction, test_fraction)
    sizes = {name: len(corpus.split(name)) for name in SPLITS}
    small = [f"{name} would get {size}" for name, size in sizes.items() if size < 2]
    if small:
        fractions = "smaller" if sizes["train"] < 2 else "larger"
        raise DataError(
            f"{source} is too small to split ({sum(sizes.values()):,} bytes): {', '.join(small)} "
            f"(each split needs at least 2 bytes); use a larger source or {fractions} --valid-fraction/--test-fraction"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        meta = {"source": str(source), "name": Path(source).name, "valid_fraction": valid_fraction, "test_fraction": test_fraction}
        _write_splits(out, Path(tmp) / "splits", (corpus.train, corpus.valid, corpus.test), meta)
    return out


def _check_new_folder(out: Path) -> None:
    if out.exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")


def _fetch(url: str, folder: Path) -> Path:
    from tqdm import tqdm

    target = folder / Path(url).name
    try:
        with urllib.request.urlopen(url) as response, open(target, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {target.name}") as bar:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:
        raise DataError(f"cannot download {url}: {e}") from None
    return target


def _extract_enwik8(source: Path, raw: Path) -> tuple[int, str]:
    """Copy the enwik8 bytes (from a zip's ``enwik8`` member, or a raw file) to ``raw``,
    returning their size and MD5."""
    md5, size = hashlib.md5(), 0
    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as z:
                if "enwik8" not in z.namelist():
                    raise DataError(f"{source}: zip has no member named 'enwik8'")
                stream = z.open("enwik8")
        else:
            stream = open(source, "rb")
        with stream, open(raw, "wb") as f:
            while chunk := stream.read(1 << 22):
                md5.update(chunk)
                size += len(chunk)
                f.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error) as e:
        raise DataError(f"{source}: cannot read ({e}); the file is truncated or corrupted") from None
    return size, md5.hexdigest()


def _write_splits(out: Path, staging: Path, splits, meta: dict) -> None:
    """Write the three splits and meta.json into ``staging``, then rename it to ``out``."""
    staging.mkdir()
    meta = dict(meta)
    for name, data in zip(SPLITS, splits):
        with open(staging / f"{name}.bin", "wb") as f:
            np.asarray(data).tofile(f)
            f.flush()
            os.fsync(f.fileno())
        meta[f"{name}_bytes"] = int(len(data))
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(staging, out)


def batchify(data: np.ndarray, streams: int) -> Tensor:
    """Lay out bytes as ``streams`` contiguous streams, time-major (docs/data.md, "Streams").

    Args:
        data: 1-D uint8 bytes ``[N]`` (may be memory-mapped; nothing is copied).
        streams: number of streams ``B``.

    Returns:
        uint8 tensor ``[N // B, B]``; column ``b`` holds bytes ``b*(N//B) ... (b+1)*(N//B)-1``.
        The last ``N mod B`` bytes are dropped.
    """
    rows = len(data) // streams
    flat = torch.from_numpy(np.asarray(data[: rows * streams]))
    return flat.view(streams, rows).t()


def get_batch(batched: Tensor, row: int, length: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Inputs ``[T, B]`` = rows ``row .. row+T-1`` and targets ``[T, B]`` = rows
    ``row+1 .. row+T``, as int64 on ``device``. To CUDA, the ``[T + 1, B]`` bytes go through
    pinned memory and are copied asynchronously: the host never waits for the GPU here."""
    window = batched[row : row + length + 1].contiguous()  # a small copy: pinning a strided view would pin its whole span
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


def bptt_windows(rows: int, bptt: int, start: int = 0, rng: np.random.Generator | None = None) -> Iterator[tuple[int, int]]:
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
