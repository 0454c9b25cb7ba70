"""``sharnn prepare``: each dataset's preparation (:mod:`sharnn.data.prepare` does the
work) with the lines the command prints for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..data import english as english_corpus
from ..data.corpus import SPLITS, load_corpus
from ..data.prepare import (
    ENWIK8_URL,
    prepare_corpus,
    prepare_english,
    prepare_enwik8,
    prepare_wikitext2,
    prepared_report,
)


def enwik8(source: str | None, out: Path, force: bool = False) -> list[str]:
    """``sharnn prepare enwik8``: check enwik8 (size, MD5) from ``source`` (a path or an
    http(s) URL; None: the canonical URL) and split it into ``out``; the line it prints."""
    return [f"prepared enwik8 in {prepare_enwik8(source or ENWIK8_URL, out, force=force)}"]


def wikitext2(source: Path | None, out: Path, tokenizer: str, force: bool = False) -> list[str]:
    """``sharnn prepare wikitext-2``: check WikiText-2 (None: the bundled copy) and tokenize
    it into ``out``; the lines it prints, one per split and one for the folder."""
    corpus = load_corpus(str(prepare_wikitext2(source, out, tokenizer, force=force)))
    lengths = corpus.tokenizer.byte_lengths()
    lines = []
    for name in SPLITS:
        ids = corpus.split(name)
        lines.append(
            f"{name}: {len(ids):,} tokens, {int(lengths[ids].sum()):,} bytes, {corpus.words[name]:,} words + <eos>"
        )
    vocabulary = f"{corpus.tokenizer.vocab_size:,} token ids"
    return lines + [f"prepared WikiText-2 with {corpus.tokenizer.name} ({vocabulary}) in {out}"]


def corpus(
    source: Path, out: Path, valid_fraction: float, test_fraction: float, tokenizer: str, force: bool = False
) -> list[str]:
    """``sharnn prepare corpus``: any file or folder of files, split by position; the lines
    it prints (:func:`sharnn.data.prepare.prepared_report`)."""
    return list(prepared_report(prepare_corpus(source, out, valid_fraction, test_fraction, tokenizer, force=force)))


def english(root: Path, exclude: tuple[Path, ...], out: Path, force: bool = False) -> list[str]:
    """``sharnn prepare english``: the lines it prints, a source each, then the overlap."""
    folder = prepare_english(out, root, exclude, force=force)
    meta = json.loads((folder / "meta.json").read_text())
    return [*english_corpus.report(meta), *prepared_report(folder)]
