"""Preparation: enwik8, WikiText-2 and any corpus checked, tokenized and written as a
prepared corpus folder that :func:`sharnn.data.corpus.load_corpus` memory-maps.

A prepared folder holds ``train.bin``, ``valid.bin``, ``test.bin`` (token ids in the
smallest unsigned dtype that holds the vocabulary: uint8 for bytes, uint16 or uint32 for
words and bpe), ``meta.json`` and, for words and bpe, ``tokenizer.json``. Each is built in
a staging folder beside ``out`` and renamed into place, under a one-writer lock
(:mod:`sharnn.files`): a failed preparation leaves nothing behind (docs/data.md,
docs/tokenization.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..files import check_new, output_lock, parent_folders, publish, staging_folder
from . import english
from .corpus import SPLITS, bundled_wikitext2, load_corpus, read_bytes, split_by_position
from .tokenizer import ByteTokenizer, Tokenizer, check_round_trip, check_spec, make_tokenizer, save_tokenizer

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_SIZE = 100_000_000
ENWIK8_MD5 = "a1fa5ffddb56f4953e226637dabbb36a"
# WikiText-2 v1 (tokenized; Merity et al. 2016): each split's words + one <eos> per line,
# and the SHA-256 of its text (wiki.SPLIT.tokens in wikitext-2-v1.zip).
WIKITEXT2 = {
    "train": (2_088_628, "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"),
    "valid": (217_646, "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
    "test": (245_569, "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"),
}
WIKITEXT2_TYPES = 33_278  # the train split's words with <eos>; valid and test have no others


def prepare_enwik8(
    source: str,
    out: str | Path,
    *,
    expected_size: int = ENWIK8_SIZE,
    expected_md5: str = ENWIK8_MD5,
    force: bool = False,
) -> Path:
    """Check and split enwik8 into a prepared corpus folder (docs/data.md, "enwik8").

    Args:
        source: ``enwik8.zip`` or the raw ``enwik8`` file, as a path or an http(s) URL.
        out: the folder to create; it must not exist yet.
        expected_size, expected_md5: of the raw file (enwik8: 100,000,000 bytes, MD5
            a1fa5ffd...). Only tests change these.
        force: replace a symbolic link at ``out`` (the link, never its target).

    Returns:
        ``out``, holding ``train.bin`` (first 90%), ``valid.bin`` (next 5%), ``test.bin``
        (last 5%) and ``meta.json``.

    Raises:
        DataError: missing, unreadable, truncated or corrupted source; wrong size or MD5;
            ``out`` already exists, or is a symbolic link (without ``force``).
        LockError: another process is writing ``out``.
    """
    with _new_folder(out, force) as out:
        return _prepare_enwik8(source, out, expected_size, expected_md5)


def _prepare_enwik8(source: str, out: Path, expected_size: int, expected_md5: str) -> Path:
    """:func:`prepare_enwik8`, with ``out`` locked and checked, its folder made."""
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        tmp = Path(tmp)
        local = _fetch(source, tmp) if source.startswith(("http://", "https://")) else Path(source)
        if not local.is_file():
            raise DataError(f"enwik8 source not found: {source}")
        raw = tmp / "enwik8.raw"
        size, md5 = _extract_enwik8(local, raw)
        if size != expected_size:
            raise DataError(f"{source}: enwik8 must be {expected_size:,} bytes, got {size:,} (truncated or wrong file)")
        if md5 != expected_md5:
            raise DataError(f"{source}: MD5 {md5} does not match enwik8's {expected_md5} (corrupted file)")
        data = np.memmap(raw, dtype=np.uint8, mode="r")
        meta = {"source": str(source), "name": "enwik8", "size": size, "md5": md5}
        (tmp / "splits").mkdir()
        _write_splits(out, tmp / "splits", split_by_position(data, 0.05, 0.05), ByteTokenizer(), meta)
        del data
    return out


def prepare_corpus(
    source: str | Path,
    out: str | Path,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    tokenizer: str = "bytes",
    force: bool = False,
) -> Path:
    """Turn any file or folder of files into a prepared, memory-mappable corpus folder:
    its bytes split by position, then tokenized with ``tokenizer`` (``bytes`` or
    ``bpe:N``, trained on the train split; docs/tokenization.md). For bpe each cut is moved
    forward to the next character boundary of the UTF-8 text. ``bpe:N`` makes fewer than
    ``N`` ids when the train split has fewer pieces to merge: ``meta.json`` then records
    the ``tokenizer`` made (``bpe:`` and its ``vocab_size``) and the ``tokenizer_asked``.

    Raises:
        DataError: an unknown tokenizer or ``words`` (refused before the source is read);
            the source does not exist, or is too small for every split to get the 2
            tokens it needs (one prediction); text the tokenizer cannot represent exactly
            (checked by decoding every split); ``out`` already exists, or is a symbolic
            link (without ``force``: with it the link is replaced, never its target).
            Nothing is created then.
        LockError: another process is writing ``out``.
    """
    if tokenizer == "words":
        raise DataError("the words tokenizer is exact only on WikiText's format: use sharnn prepare wikitext-2")
    check_spec(tokenizer, words=False)
    with _new_folder(out, force) as out:
        return _prepare_corpus(source, out, valid_fraction, test_fraction, tokenizer)


def _prepare_corpus(source: str | Path, out: Path, valid_fraction: float, test_fraction: float, tokenizer: str) -> Path:
    """:func:`prepare_corpus`, with ``out`` locked and checked."""
    corpus = load_corpus(str(source), valid_fraction, test_fraction)
    if not corpus.tokenizer.is_bytes:
        raise DataError(f"{source} is a corpus of {corpus.tokenizer.name} tokens, not text: prepare from its text")
    texts = [bytes(corpus.split(name)) for name in SPLITS] if tokenizer != "bytes" else None
    if texts is not None:  # move each cut off a UTF-8 continuation byte
        data = b"".join(texts)
        cuts = [_character_start(data, len(texts[0])), _character_start(data, len(texts[0]) + len(texts[1]))]
        texts = [data[: cuts[0]], data[cuts[0] : cuts[1]], data[cuts[1] :]]
    sizes = {name: len(corpus.split(name)) for name in SPLITS}
    small = [f"{name} would get {size}" for name, size in sizes.items() if size < 2]
    if small:
        fractions = "smaller" if sizes["train"] < 2 else "larger"
        raise DataError(
            f"{source} is too small to split ({sum(sizes.values()):,} bytes): {', '.join(small)} "
            f"(each split needs at least 2 bytes); use a larger source or {fractions} --valid-fraction/--test-fraction"
        )
    meta = {
        "source": str(source),
        "name": Path(source).name,
        "valid_fraction": valid_fraction,
        "test_fraction": test_fraction,
        "tokenizer_asked": tokenizer,
    }
    if texts is None:
        splits, made = (corpus.train, corpus.valid, corpus.test), ByteTokenizer()
    else:
        made = make_tokenizer(tokenizer, texts[0])
        splits = tokenize_splits(made, dict(zip(SPLITS, texts)), str(source))
    _write_prepared(out, splits, made, meta)
    return out


def prepare_english(
    out: str | Path, root: str | Path = "/", exclude: Iterable[str | Path] = (), force: bool = False
) -> Path:
    """Build the corpus of English as people write it (:mod:`sharnn.data.english`) from the
    Debian packages installed under ``root``, without the documents that hold a text under
    ``exclude`` (files or folders: the benchmark texts), as a prepared folder of bytes
    whose ``meta.json`` is the manifest (sources, licences, SHA-256, overlap).

    Raises:
        DataError: a source with no file under ``root`` (its package named), an
            unreadable file, an ``exclude`` path that does not exist; ``out`` exists
            (without ``force``: a symbolic link). Nothing is created then.
        LockError: another process is writing ``out``.
    """
    excluded = english.read_excluded(exclude)
    with _new_folder(out, force) as out:
        splits, manifest = english.build(Path(root), excluded)
        small = [name for name, text in zip(SPLITS, splits) if len(text) < 2]
        if small:
            raise DataError(f"{root}: too few documents for a {small[0]} split (one in {english.HOLD_OUT} of a source)")
        arrays = [np.frombuffer(text, dtype=np.uint8) for text in splits]
        _write_prepared(out, arrays, ByteTokenizer(), {"source": str(root), "name": "english", **manifest})
        return out


def prepared_report(folder: str | Path) -> list[str]:
    """Lines describing a corpus folder made by :func:`prepare_corpus`: each split's
    tokens and bytes, what was asked when the tokenizer made differs, and the tokenizer."""
    meta = json.loads((Path(folder) / "meta.json").read_text())
    lines = [f"{name}: {meta[f'{name}_tokens']:,} tokens, {meta[f'{name}_bytes']:,} bytes" for name in SPLITS]
    made, size = meta["tokenizer"], meta["vocab_size"]
    if meta.get("tokenizer_asked", made) != made:
        lines.append(
            f"{meta['tokenizer_asked']} asked, {size:,} token ids made: the train split has too few distinct "
            f"pieces to merge further (train on it with model.vocab_size={size})"
        )
    lines.append(f"prepared {meta['source']} with {made} ({size:,} token ids) in {folder}")
    return lines


def tokenize_splits(tokenizer: Tokenizer, texts: dict[str, bytes], source: str) -> list[np.ndarray]:
    """Each split's token ids (int64 ``[N]``, in :data:`sharnn.data.corpus.SPLITS` order), after
    checking that they decode to exactly its text. Raises :class:`DataError` naming the
    split that the tokenizer cannot represent or that gets fewer than 2 tokens."""
    splits = []
    for name in SPLITS:
        try:
            ids = tokenizer.ids(texts[name])
        except DataError as e:
            raise DataError(f"{source}, {name} split: {e}") from None
        check_round_trip(tokenizer, texts[name], ids, f"{source}, {name} split")
        if len(ids) < 2:
            raise DataError(f"{source}, {name} split: {len(ids)} tokens, fewer than the 2 a prediction needs")
        splits.append(ids)
    return splits


def _character_start(data: bytes, i: int) -> int:
    """The first position at or after ``i`` that does not hold a UTF-8 continuation byte."""
    while i < len(data) and 0x80 <= data[i] < 0xC0:
        i += 1
    return i


def prepare_wikitext2(
    source: str | Path | None, out: str | Path, tokenizer: str = "words", force: bool = False
) -> Path:
    """Check and tokenize WikiText-2 (v1, tokenized) into a prepared corpus folder
    (docs/tokenization.md).

    Args:
        source: the official ``wikitext-2-v1.zip``, or a folder holding the three splits
            as ``wiki.SPLIT.tokens`` or ``SPLIT.txt`` (either may end in ``.gz``); None for
            the copy bundled with sharnn (:func:`bundled_wikitext2`), checked the same way.
        out: the folder to create; it must not exist yet.
        tokenizer: ``bytes``, ``words`` or ``bpe:N`` (trained on the train split).
        force: replace a symbolic link at ``out`` (the link, never its target).

    Returns:
        ``out``, with the splits, ``tokenizer.json`` (words, bpe) and ``meta.json``,
        which records each split's tokens, bytes and words (+ ``<eos>``).

    Raises:
        DataError: a missing split; one whose word count or SHA-256 is not WikiText-2's
            (truncated or altered); a vocabulary other than its 33,278 types; a
            tokenization that does not decode to exactly the text; ``out`` exists, or is
            a symbolic link (without ``force``). Nothing is created then.
        LockError: another process is writing ``out``.
    """
    check_spec(tokenizer)  # before the data is read
    with _new_folder(out, force) as out:
        return _prepare_wikitext2(source, out, tokenizer)


def _prepare_wikitext2(source: str | Path | None, out: Path, tokenizer: str) -> Path:
    """:func:`prepare_wikitext2`, with ``out`` locked and checked."""
    recorded = "bundled" if source is None else str(source)
    source = bundled_wikitext2() if source is None else source
    texts = _read_wikitext2(Path(source))
    words = {name: _check_wikitext2(name, text, source) for name, text in texts.items()}
    vocabulary = make_tokenizer("words", texts["train"])
    if vocabulary.vocab_size != WIKITEXT2_TYPES:
        raise DataError(
            f"{source}: the train split has {vocabulary.vocab_size:,} types with <eos>, not "
            f"WikiText-2's {WIKITEXT2_TYPES:,}"
        )
    made = vocabulary if tokenizer == "words" else make_tokenizer(tokenizer, texts["train"])
    splits = tokenize_splits(made, texts, str(source))
    meta = {"source": recorded, "name": "wikitext-2", "types": vocabulary.vocab_size}
    meta.update({f"{name}_words": count for name, count in words.items()})
    _write_prepared(out, splits, made, meta)
    return out


def _read_wikitext2(source: Path) -> dict[str, bytes]:
    """The three splits' text, from the official zip or a folder."""
    names = {split: (f"wiki.{split}.tokens", f"{split}.txt") for split in SPLITS}
    if source.is_file():
        try:
            with zipfile.ZipFile(source) as z:
                members = {Path(m).name: m for m in z.namelist()}
                missing = [names[s][0] for s in SPLITS if names[s][0] not in members]
                if missing:
                    raise DataError(f"{source}: the zip has no {', '.join(missing)}; give wikitext-2-v1.zip")
                return {s: z.read(members[names[s][0]]) for s in SPLITS}
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:
            raise DataError(f"{source}: not a readable zip ({e}); give wikitext-2-v1.zip or a folder") from None
    if not source.is_dir():
        raise DataError(f"WikiText-2 source not found: {source} (give wikitext-2-v1.zip or a folder of its splits)")
    texts = {}
    for split in SPLITS:
        tried = [source / f"{name}{gz}" for name in names[split] for gz in ("", ".gz")]
        found = next((f for f in tried if f.is_file()), None)
        if found is None:
            raise DataError(f"{source} has no {split} split (looked for {', '.join(f.name for f in tried)})")
        texts[split] = bytes(read_bytes(found))
    return texts


def _check_wikitext2(split: str, text: bytes, source) -> int:
    """The split's words + ``<eos>``, after refusing a split that is not WikiText-2's."""
    expected, sha256 = WIKITEXT2[split]
    try:
        count = sum(len(line.split()) + 1 for line in text.decode("utf-8").split("\n")[:-1])
    except UnicodeDecodeError:
        raise DataError(f"{source}, {split} split: not UTF-8 text, so not WikiText-2") from None
    if count != expected:
        raise DataError(
            f"{source}, {split} split: {count:,} words + <eos>, not WikiText-2's {expected:,} (truncated or altered)"
        )
    if hashlib.sha256(text).hexdigest() != sha256:
        raise DataError(f"{source}, {split} split: its SHA-256 is not WikiText-2 v1's (altered, or another release)")
    return count


@contextmanager
def _new_folder(out: str | Path, force: bool) -> Iterator[Path]:
    """``out`` as a Path, written by this process alone inside the block, after refusing
    one that exists or (without ``force``) is a symbolic link; the folders above it that
    are missing are made, and removed again if the block fails (:func:`sharnn.files.parent_folders`)."""
    out = Path(out)
    with output_lock(out):
        check_new(out, force, DataError, f"{out} already exists; choose another --out or remove it")
        with parent_folders(out):
            yield out


def _fetch(url: str, folder: Path) -> Path:
    """Download ``url`` into ``folder`` under its last path segment, with a progress bar
    in bytes. Raises :class:`DataError` when the download fails."""
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
        with ExitStack() as stack:
            if zipfile.is_zipfile(source):
                z = stack.enter_context(zipfile.ZipFile(source))
                if "enwik8" not in z.namelist():
                    raise DataError(f"{source}: zip has no member named 'enwik8'")
                stream = stack.enter_context(z.open("enwik8"))
            else:
                stream = stack.enter_context(open(source, "rb"))
            f = stack.enter_context(open(raw, "wb"))
            while chunk := stream.read(1 << 22):
                md5.update(chunk)
                size += len(chunk)
                f.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error) as e:
        raise DataError(f"{source}: cannot read ({e}); the file is truncated or corrupted") from None
    return size, md5.hexdigest()


def _write_prepared(out: Path, splits, tokenizer: Tokenizer, meta: dict) -> None:
    """Create ``out`` with the three splits (token ids in the smallest unsigned dtype that
    holds the vocabulary), ``meta.json`` and the tokenizer, through a staging folder."""
    with staging_folder(out) as staging:
        save_tokenizer(tokenizer, staging)
        _write_splits(out, staging, splits, tokenizer, meta)


def smallest_uint(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids ``0 .. vocab_size - 1``."""
    return np.dtype(next(t for t in (np.uint8, np.uint16, np.uint32) if vocab_size - 1 <= np.iinfo(t).max))


def _write_splits(out: Path, staging: Path, splits, tokenizer: Tokenizer, meta: dict) -> None:
    """Write the three splits and meta.json into ``staging`` (which exists), then rename
    it to ``out``. ``meta`` gains the tokenizer, the dtype and each split's token count
    and byte count (of the text its ids stand for); a symbolic link at ``out`` is replaced
    (:func:`sharnn.files.publish`)."""
    dtype = smallest_uint(tokenizer.vocab_size)
    meta = dict(meta, tokenizer=tokenizer.name, vocab_size=tokenizer.vocab_size, dtype=dtype.name)
    lengths = tokenizer.byte_lengths()
    for name, data in zip(SPLITS, splits):
        with open(staging / f"{name}.bin", "wb") as f:
            np.asarray(data).astype(dtype, copy=False).tofile(f)
            f.flush()
            os.fsync(f.fileno())
        meta[f"{name}_tokens"] = len(data)
        meta[f"{name}_bytes"] = len(data) if tokenizer.is_bytes else int(lengths[np.asarray(data)].sum())
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    publish(staging, out)
