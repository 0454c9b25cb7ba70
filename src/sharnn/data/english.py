"""The corpus of English as people write it (docs/data.md, "English"): named sources, each
the files of one Debian package, read where the package installs them (under ``root``,
``/`` by default: ``apt install`` the packages :data:`SOURCES` names), each file one
document.

Documents are held out whole, source by source: ordered by the SHA-256 of their path, one
in :data:`HOLD_OUT` goes to the valid split and the next to the test split, so every
register of the corpus is in each split and no document is cut between two. A document
that holds text the benchmarks measure (``exclude``: :class:`~sharnn.data.overlap.ShingleSet`,
at least :data:`DROP_WINDOWS` of its 32-byte windows found there) is dropped, and the
overlap of what is kept with each excluded text is measured and recorded. ``meta.json``
is the manifest: each source's licence, where a user gets it, its documents, bytes and
SHA-256; what was dropped and why; the overlap.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .overlap import ShingleSet, overlap

HOLD_OUT = 40  # one document in 40 to the valid split, one to the test split, per source
DROP_WINDOWS = 64  # a document with this many windows of an excluded text is dropped


@dataclass(frozen=True)
class Source:
    """Files of one Debian package (``patterns``: globs under the root it installs into),
    of one ``register``, under one ``licence`` (an SPDX identifier)."""

    name: str
    register: str
    licence: str
    package: str
    version: str  # the Debian bookworm version the corpus was built with
    patterns: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"Debian bookworm: apt install {self.package} (version {self.version})"


SOURCES = (
    Source(
        "python-docs", "technical documentation", "PSF-2.0", "python3.11-doc", "3.11.2-6+deb12u8",
        ("usr/share/doc/python3.11/html/_sources/**/*.rst.txt",),
    ),
    Source(
        "linux-docs", "technical documentation", "GPL-2.0-only", "linux-doc-6.1", "6.1.176-1",
        ("usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt",),
    ),
    Source(
        "postgresql-docs", "markup (HTML)", "PostgreSQL", "postgresql-doc-15", "15.18-0+deb12u1",
        ("usr/share/doc/postgresql-doc-15/html/*.html",),
    ),
    *(
        Source(f"manpages-{code}", f"manual pages in {language}", "GPL-3.0-or-later", f"manpages-{code}", "4.18.1-1",
               (f"usr/share/man/{code}/man*/*.gz",))
        for code, language in (("de", "German"), ("fr", "French"), ("ru", "Russian"))
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Document:
    """One file of a source: its path under the root, and its bytes (a ``.gz`` file's
    decompressed)."""

    source: Source
    path: str
    text: bytes


def documents(source: Source, root: Path) -> list[Document]:
    """``source``'s non-empty files under ``root``, in sorted path order.

    Raises:
        DataError: none of its files is there (the package to install named), or one
            cannot be read.
    """
    paths = sorted({p for pattern in source.patterns for p in root.glob(pattern) if p.is_file()})
    if not paths:
        raise DataError(f"{root} has no file of {source.name} ({source.where}; or give --source)")
    found = [Document(source, str(p.relative_to(root)), _read(p)) for p in paths]
    return [d for d in found if d.text]


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if path.suffix == ".gz" else data
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"cannot read {path}: {e}") from None


def split_documents(found: list[Document]) -> dict[str, list[Document]]:
    """One source's documents by split: ordered by the SHA-256 of their path, the ``i``-th
    to valid when ``i % HOLD_OUT == 0``, to test when it is 1, else to train; then each
    split in path order."""
    ranked = sorted(found, key=lambda d: hashlib.sha256(d.path.encode()).hexdigest())
    splits = {"train": [], "valid": [], "test": []}
    for i, document in enumerate(ranked):
        splits[{0: "valid", 1: "test"}.get(i % HOLD_OUT, "train")].append(document)
    return {name: sorted(docs, key=lambda d: d.path) for name, docs in splits.items()}


def read_excluded(paths: Iterable[Path]) -> dict[str, bytes]:
    """The texts under each of ``paths`` (a file, or every file under a folder; ``.gz``
    decompressed), by path. Raises :class:`DataError`: a path that does not exist."""
    texts = {}
    for path in map(Path, paths):
        if not path.exists():
            raise DataError(f"cannot read {path}: No such file or directory")
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                texts[str(file)] = _read(file)
    return texts


def build(root: Path, excluded: dict[str, bytes], sources: Iterable[Source] = SOURCES) -> tuple[list, dict]:
    """The corpus's three splits (bytes, in ``train``, ``valid``, ``test`` order) and its
    manifest, from ``sources`` under ``root``, without the documents that hold an
    ``excluded`` text. Raises :class:`DataError` as :func:`documents`."""
    shingles = ShingleSet(excluded.values())
    texts, manifest = {"train": [], "valid": [], "test": []}, {"corpus": "english", "sources": [], "dropped": []}
    for source in sources:
        kept = []
        for document in documents(source, root):
            found = shingles.found_in(document.text) if excluded else 0
            if found >= DROP_WINDOWS:
                manifest["dropped"].append({"path": document.path, "excluded_windows": found})
            else:
                kept.append(document)
        digest = hashlib.sha256()
        for document in kept:
            digest.update(document.text)
        splits = split_documents(kept)
        for name, docs in splits.items():
            texts[name] += [d.text for d in docs]
        manifest["sources"].append(_described(source, kept, digest.hexdigest(), splits))
    kept_texts = [text for name in texts for text in texts[name]]
    manifest["excluded"] = [
        {"path": path, "bytes": len(excluded[path]), "sha256": hashlib.sha256(excluded[path]).hexdigest(),
         "windows": found.windows, "found": found.found, "share": found.share}
        for path, found in overlap(excluded, kept_texts).items()
    ]  # fmt: skip
    return [b"".join(texts[name]) for name in ("train", "valid", "test")], manifest


def _described(source: Source, kept: list[Document], sha256: str, splits: dict[str, list[Document]]) -> dict:
    return {
        "name": source.name,
        "register": source.register,
        "licence": source.licence,
        "where": source.where,
        "documents": len(kept),
        "bytes": sum(len(d.text) for d in kept),
        "sha256": sha256,
        **{f"{name}_documents": len(docs) for name, docs in splits.items()},
    }


def report(meta: dict) -> Iterator[str]:
    """The lines ``sharnn prepare english`` prints from its manifest."""
    for source in meta["sources"]:
        yield (
            f"{source['name']}: {source['documents']:,} documents, {source['bytes']:,} bytes ({source['licence']}; "
            f"valid {source['valid_documents']}, test {source['test_documents']} documents)"
        )
    if meta["dropped"]:
        yield f"dropped {len(meta['dropped']):,} documents that hold an excluded text"
    for excluded in meta["excluded"]:
        yield f"overlap with {excluded['path']}: {excluded['found']:,} of {excluded['windows']:,} 32-byte windows"
