"""How much of a text the benchmarks measure a training corpus holds: the share of the
text's 32-byte shingles (every window of 32 consecutive bytes) found anywhere in the
corpus, window for window, within one document of the corpus at a time (docs/data.md,
"Overlap with the benchmarks").

A corpus that holds a benchmark text, or a long passage of it, shows it at once: *Alice*
copied whole is 1.0, a quoted paragraph a few thousandths, while unrelated English of the
same language meets a 32-byte window of it only by chance (a common phrase, a licence's
boilerplate; near zero). The check compares bytes exactly: a copy with other line ends or
another encoding is another text, which is why the corpus is built from named sources and
this check is run on what it holds, not on its file names.

A window of fewer than :data:`MIN_DISTINCT` distinct bytes (a run of spaces, a rule of
dashes, zeros of an object file, a table's padding) says nothing of where a text came
from, and every corpus has them: such windows are left out of both counts.

Windows are compared by a 64-bit hash of their 32 bytes (:func:`shingle_hashes`): with a
benchmark text's ``n`` windows and a corpus of ``N``, a false match is expected about
``n N / 2**64`` times (1e-5 for 3 MB against 100 MB), far below what is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

SHINGLE = 32  # bytes in a window
MIN_DISTINCT = 8  # a window of fewer distinct bytes is not counted (runs, rules, padding)
CHUNK = 1 << 22  # corpus bytes hashed at a time (a document is cut, its windows overlapping)
_WORD = 8
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Overlap:
    """One benchmark text against a corpus: ``found`` of its ``windows`` 32-byte shingles
    (those of at least :data:`MIN_DISTINCT` distinct bytes) occur in the corpus (``share``,
    between 0 and 1)."""

    windows: int
    found: int

    @property
    def share(self) -> float:
        return self.found / self.windows if self.windows else 0.0


def shingle_hashes(data: bytes) -> np.ndarray:
    """The 64-bit hash of each of ``data``'s ``len(data) - 31`` windows of 32 bytes, in
    order (none for data shorter than 32 bytes): the window's four little-endian 8-byte
    words, each mixed by splitmix64's finaliser, combined in order. Returns uint64, shape
    ``[len(data) - 31]``."""
    count = len(data) - SHINGLE + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    words = np.zeros(len(data) - _WORD + 1, dtype=np.uint64)  # the 8 bytes from each position
    for k in range(_WORD):
        words |= raw[k : k + len(words)] << np.uint64(8 * k)
    mixed = _mix(words)
    hashes = np.zeros(count, dtype=np.uint64)
    for k in range(0, SHINGLE, _WORD):
        hashes = (hashes ^ mixed[k : k + count]) * _GOLDEN
    return hashes


def informative(data: bytes) -> np.ndarray:
    """For each 32-byte window of ``data`` (as :func:`shingle_hashes`), whether it holds at
    least :data:`MIN_DISTINCT` distinct bytes. Returns bool, shape ``[len(data) - 31]``."""
    count = len(data) - SHINGLE + 1
    if count <= 0:
        return np.zeros(0, dtype=bool)
    raw = np.frombuffer(data, dtype=np.uint8)
    distinct = np.zeros(count, dtype=np.int32)
    for value in np.unique(raw):
        seen = np.concatenate([[0], np.cumsum(raw == value, dtype=np.int64)])
        distinct += seen[SHINGLE:] > seen[:count]
    return distinct >= MIN_DISTINCT


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element by element (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class ShingleSet:
    """The 32-byte shingles of some texts (the benchmark texts), asked which windows of
    another text are among them. Memory: 8 bytes a window of ``texts``."""

    def __init__(self, texts: Iterable[bytes]):
        kept = [shingle_hashes(text)[informative(text)] for text in texts]
        self.hashes = np.unique(np.concatenate([np.zeros(1, dtype=np.uint64), *kept]))

    def where(self, hashes: np.ndarray) -> np.ndarray:
        """For each hash, its index in :attr:`hashes` where it is one of them, else -1."""
        where = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.where(self.hashes[where] == hashes, where, -1)

    def found_in(self, document: bytes) -> int:
        """How many of ``document``'s windows are shingles of the set's texts."""
        return sum(int((self.where(hashes) >= 0).sum()) for hashes in _chunk_hashes(document))


def _chunk_hashes(document: bytes):
    """:func:`shingle_hashes` of ``document``, :data:`CHUNK` windows at a time."""
    for start in range(0, max(len(document) - SHINGLE + 1, 0), CHUNK):
        yield shingle_hashes(document[start : start + CHUNK + SHINGLE - 1])


def overlap(benchmarks: Mapping[str, bytes], corpus: Iterable[bytes]) -> dict[str, Overlap]:
    """For each benchmark text (name -> bytes), how many of its 32-byte shingles occur in
    ``corpus``, an iterable of documents (bytes; a window never spans two documents). Read
    once, a chunk at a time: memory grows with the benchmark texts, not the corpus.

    Returns:
        name -> :class:`Overlap`, in the order of ``benchmarks``.
    """
    shingles = ShingleSet(benchmarks.values())
    seen = np.zeros(len(shingles.hashes), dtype=bool)
    for document in corpus:
        for hashes in _chunk_hashes(document):
            where = shingles.where(hashes)
            seen[where[where >= 0]] = True
    found = {}
    for name, text in benchmarks.items():
        hashes = shingle_hashes(text)[informative(text)]
        found[name] = Overlap(len(hashes), int(seen[shingles.where(hashes)].sum()))
    return found
