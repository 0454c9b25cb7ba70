"""`sharnn prepare english` on a small fixture: a root laid out as the Debian packages
install their files, each source's documents held out whole, the manifest, and the
overlap check that drops a document holding an excluded text (sharnn.data.english)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_ok, assert_user_error, cli
from sharnn.data import english
from sharnn.data.corpus import load_corpus

BENCHMARK = (
    b"So she was considering in her own mind (as well as she could, for the hot day made her feel very "
    b"sleepy and stupid), whether the pleasure of making a daisy-chain would be worth the trouble.\n"
)


def _document(source: english.Source, number: int) -> bytes:
    return f"{source.name} document {number}: {source.register}, written for this test alone.\n".encode() * 3


@pytest.fixture
def root(tmp_path) -> Path:
    """Three documents of every source where its package installs them; the second of
    python-docs quotes the benchmark text."""
    root = tmp_path / "root"
    for source in english.SOURCES:
        pattern = source.patterns[0]
        base = pattern.split("*")[0]  # ".../html/_sources/", ".../html/", ".../man/de/man"
        folder = root / (base + "1" if base.endswith("man") else base + "sub" if "**" in pattern else base)
        folder.mkdir(parents=True)
        suffix = pattern.rsplit("*", 1)[1]
        for number in range(3):
            text = _document(source, number) + (BENCHMARK if source.name == "python-docs" and number == 1 else b"")
            (folder / f"page{number}{suffix}").write_bytes(gzip.compress(text) if suffix == ".gz" else text)
    (root / "usr/share/doc/python3.11/html/_sources/empty.rst.txt").write_bytes(b"")
    return root


def test_prepare_english_holds_out_documents_and_writes_the_manifest(root, tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "alice.txt").write_bytes(BENCHMARK)
    out = tmp_path / "english"
    result = cli("prepare", "english", "--source", root, "--exclude", tmp_path / "benchmarks", "--out", out)
    assert_ok(result)
    assert "dropped 1 documents that hold an excluded text" in result.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert [s["name"] for s in meta["sources"]] == [s.name for s in english.SOURCES]
    assert meta["dropped"] == [
        {"path": "usr/share/doc/python3.11/html/_sources/sub/page1.rst.txt", "excluded_windows": len(BENCHMARK) - 31}
    ]
    (excluded,) = meta["excluded"]
    assert excluded["found"] == 0 and excluded["windows"] > 100 and excluded["share"] == 0.0
    assert excluded["sha256"] == hashlib.sha256(BENCHMARK).hexdigest()
    corpus = load_corpus(str(out))
    splits = {name: bytes(corpus.split(name)) for name in ("train", "valid", "test")}
    for source, described in zip(english.SOURCES, meta["sources"]):
        kept = [n for n in range(3) if not (source.name == "python-docs" and n == 1)]
        texts = [_document(source, n) for n in kept]
        assert described["licence"] == source.licence and source.package in described["where"]
        assert described["documents"] == len(kept) and described["bytes"] == sum(map(len, texts))
        assert described["sha256"] == hashlib.sha256(b"".join(texts)).hexdigest()
        for text in texts:  # each document whole in exactly one split
            assert sum(split.count(text) for split in splits.values()) == 1
        assert described["valid_documents"] == described["test_documents"] == 1
    assert BENCHMARK not in b"".join(splits.values())


def test_the_split_of_a_document_is_its_path_s_alone():
    source = english.SOURCES[0]
    docs = [english.Document(source, f"a/{i}.txt", b"x") for i in range(100)]
    first, again = english.split_documents(docs), english.split_documents(docs[::-1])
    assert {k: [d.path for d in v] for k, v in first.items()} == {k: [d.path for d in v] for k, v in again.items()}
    assert [len(first[k]) for k in ("train", "valid", "test")] == [94, 3, 3]


def test_a_source_that_is_not_installed_is_one_line_naming_its_package(root, tmp_path):
    for file in (root / "usr/share/man/ru").rglob("*.gz"):
        file.unlink()
    out = tmp_path / "english"
    line = assert_user_error(cli("prepare", "english", "--source", root, "--out", out), "has no file of manpages-ru")
    assert "apt install manpages-ru" in line and not out.exists()
    assert_user_error(
        cli("prepare", "english", "--source", root, "--exclude", tmp_path / "nowhere", "--out", out), "cannot read"
    )
    assert not out.exists()


def test_every_split_is_bytes_of_the_documents(root, tmp_path):
    out = tmp_path / "english"
    assert_ok(cli("prepare", "english", "--source", root, "--out", out))
    corpus = load_corpus(str(out))
    total = sum(len(corpus.split(name)) for name in ("train", "valid", "test"))
    assert corpus.tokenizer.is_bytes and corpus.train.dtype == np.uint8
    assert total == sum(len(_document(s, n)) for s in english.SOURCES for n in range(3)) + len(BENCHMARK)
