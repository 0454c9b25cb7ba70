"""Tokenizers, WikiText-2 preparation and the one metric across tokenizations
(src/sharnn/data/tokenizer.py, data.py, prepare.py, evaluate.py; docs/tokenization.md): the published
counts, exact round trips, refusals that leave nothing behind, and runs on a words corpus
whose checkpoints carry their tokenizer."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import SMALL, WIKITEXT2, assert_ok, assert_user_error, cli, write_small_corpus
from sharnn.data.corpus import load_corpus
from sharnn.data.prepare import WIKITEXT2_TYPES, prepare_corpus, prepare_wikitext2, smallest_uint
from sharnn.data.tokenizer import BPETokenizer, ByteTokenizer, WordTokenizer, load_tokenizer, make_tokenizer
from sharnn.errors import DataError
from sharnn.evaluation import evaluate
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN

COUNTS = {"train": 2_088_628, "valid": 217_646, "test": 245_569}
BYTES = {"train": 10_797_148, "valid": 1_121_681, "test": 1_256_449}


def text(split: str) -> bytes:
    return gzip.decompress((WIKITEXT2 / f"{split}.txt.gz").read_bytes())


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    """WikiText-2 prepared with the words tokenizer (once for the module)."""
    return prepare_wikitext2(WIKITEXT2, tmp_path_factory.mktemp("wt2") / "words", "words")


@pytest.fixture(scope="module")
def small_words(words, tmp_path_factory) -> Path:
    """The words corpus cut to its first 3,000 tokens per split (meta.json made to match):
    small enough to train and evaluate in seconds, with the real 33,278-word vocabulary."""
    folder = tmp_path_factory.mktemp("wt2-small") / "words"
    shutil.copytree(words, folder)
    meta = json.loads((folder / "meta.json").read_text())
    tokenizer = load_tokenizer(folder)
    for split in COUNTS:
        ids = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)[:3000]
        ids.tofile(folder / f"{split}.bin")
        meta.update(
            {
                f"{split}_tokens": 3000,
                f"{split}_words": 3000,
                f"{split}_bytes": int(tokenizer.byte_lengths()[ids].sum()),
            }
        )
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_words_reproduce_the_published_counts_and_vocabulary(words):
    corpus = load_corpus(str(words))
    assert {split: len(corpus.split(split)) for split in COUNTS} == COUNTS
    assert corpus.words == COUNTS
    assert corpus.tokenizer.vocab_size == WIKITEXT2_TYPES == 33_278
    assert corpus.train.dtype == np.uint16 and isinstance(corpus.train, np.memmap)
    meta = json.loads((words / "meta.json").read_text())
    assert {split: meta[f"{split}_bytes"] for split in COUNTS} == BYTES
    assert corpus.tokenizer.decode_bytes(corpus.test) == text("test")


def test_prepare_wikitext2_refuses_a_bad_tokenizer_before_reading_anything(tmp_path):
    for source in ([], ["--source", tmp_path / "nowhere"]):
        assert_user_error(
            cli("prepare", "wikitext-2", *source, "--tokenizer", "bpe:x", "--out", tmp_path / "w"),
            "unknown tokenizer 'bpe:x'",
        )
    assert not (tmp_path / "w").exists()


def test_prepare_wikitext2_command_uses_the_bundled_copy_and_reports_the_counts(tmp_path, words):
    result = cli("prepare", "wikitext-2", "--tokenizer", "words", "--out", tmp_path / "w")  # no --source
    assert_ok(result)
    for split, count in COUNTS.items():
        assert f"{split}: {count:,} tokens" in result.stdout
    assert "33,278 token ids" in result.stdout
    assert json.loads((tmp_path / "w" / "meta.json").read_text())["source"] == "bundled"
    bundled, given = load_corpus(str(tmp_path / "w")), load_corpus(str(words))  # words: --source WIKITEXT2
    for split in COUNTS:
        assert np.array_equal(bundled.split(split), given.split(split))


@pytest.mark.slow
def test_bpe_round_trips_every_split_and_is_deterministic(tmp_path):
    folder = prepare_wikitext2(WIKITEXT2, tmp_path / "bpe", "bpe:600")
    corpus = load_corpus(str(folder))
    assert corpus.tokenizer.name == "bpe:600" and corpus.train.dtype == np.uint16
    for split in COUNTS:
        assert corpus.tokenizer.decode_bytes(corpus.split(split)) == text(split)
    assert BPETokenizer.train(text("valid"), 600).to_json() == BPETokenizer.train(text("valid"), 600).to_json()


def test_wikitext2_from_the_official_zip_layout(tmp_path):
    archive = tmp_path / "wikitext-2-v1.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for split in COUNTS:
            z.writestr(f"wikitext-2/wiki.{split}.tokens", text(split))
    corpus = load_corpus(str(prepare_wikitext2(archive, tmp_path / "bytes", "bytes")))
    assert corpus.train.dtype == np.uint8 and bytes(corpus.valid) == text("valid")
    assert corpus.words == COUNTS


def altered(split: str, how: str) -> bytes:
    data = text(split)
    if how == "truncated":
        return data[: len(data) // 2]
    return data.replace(b" the ", b" teh ", 1)  # same word count: only the checksum can tell


@pytest.mark.parametrize(
    "how, message",
    [("truncated", "not WikiText-2's 245,569 (truncated or altered)"), ("altered", "SHA-256 is not WikiText-2 v1's")],
)
def test_a_damaged_split_is_refused_and_nothing_is_left(tmp_path, how, message):
    source = tmp_path / "src"
    source.mkdir()
    for split in COUNTS:
        (source / f"{split}.txt").write_bytes(altered(split, how) if split == "test" else text(split))
    result = cli("prepare", "wikitext-2", "--source", source, "--tokenizer", "words", "--out", tmp_path / "out")
    assert_user_error(result, "test split", message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output and no staging folder


def test_prepare_refuses_an_unknown_tokenizer_and_a_missing_split(tmp_path):
    assert_user_error(
        cli("prepare", "wikitext-2", "--source", WIKITEXT2, "--tokenizer", "sentencepiece", "--out", tmp_path / "a"),
        "unknown tokenizer 'sentencepiece'",
    )
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.txt").write_bytes(b" a \n")
    assert_user_error(
        cli("prepare", "wikitext-2", "--source", tmp_path / "half", "--out", tmp_path / "b"), "has no valid split"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half"]


def test_the_words_tokenizer_refuses_a_word_outside_its_vocabulary():
    tokenizer = WordTokenizer.train(b" the cat \n")
    with pytest.raises(DataError, match="line 2: the word 'dog' is not in the words vocabulary"):
        tokenizer.ids(b" the \n the dog \n")
    assert tokenizer.decode_bytes(tokenizer.ids(b" the cat \n \n")) == b" the cat \n \n"


def test_prepare_corpus_with_bpe_cuts_at_character_boundaries(tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(("héllo wörld ✓ " * 400 + "\n").encode() * 5)
    corpus = load_corpus(str(prepare_corpus(source, tmp_path / "bpe", 0.1, 0.1, tokenizer="bpe:300")))
    decoded = b"".join(corpus.tokenizer.decode_bytes(corpus.split(s)) for s in COUNTS)
    assert decoded == source.read_bytes()
    assert corpus.tokenizer.vocab_size <= 300


def test_smallest_uint():
    assert [smallest_uint(v).name for v in (256, 257, 65_536, 65_537)] == ["uint8", "uint16", "uint16", "uint32"]


def whole_text_bits(model: SHARNN, ids: np.ndarray) -> float:
    """The total -log2 p of every token after the first, from one forward over the whole
    sequence: the reference the windowed evaluation must match."""
    tokens = torch.from_numpy(ids.astype(np.int64)).view(-1, 1)
    with torch.no_grad():
        logits, _ = model.eval()(tokens[:-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[1:].flatten(), reduction="sum").item() / math.log(2)


@pytest.mark.slow  # a few seconds: out of the working loop
def test_one_total_gives_bits_per_byte_and_word_perplexity_for_every_tokenization():
    lines = text("test").split(b"\n")[:40]
    sample = b"\n".join(lines) + b"\n"
    tokenizers = [ByteTokenizer(), make_tokenizer("bpe:300", text("valid")[:200_000]), WordTokenizer.train(sample)]
    words_in_text = sum(len(line.split()) + 1 for line in lines)
    for tokenizer in tokenizers:
        torch.manual_seed(0)
        model = SHARNN(
            SHARNNConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, boom_dim=64, attention_span=8192)
        )
        ids = tokenizer.ids(sample)
        result = evaluate(model, ids, streams=1, bptt=64, tokenizer=tokenizer, count_words=True)
        bits = whole_text_bits(model, ids)  # the span holds the whole text: windows and memory add up to one forward
        first = tokenizer.token_bytes[ids[0]]  # the one token no one predicts
        assert result.bits == pytest.approx(bits, rel=1e-5)
        assert result.bytes == len(sample) - len(first)
        assert result.words == words_in_text - first.count(b" ") == words_in_text - 1
        assert result.bpc == pytest.approx(bits / result.bytes, rel=1e-5)
        assert result.word_perplexity == pytest.approx(2 ** (bits / result.words), rel=1e-4)
        assert result.perplexity == pytest.approx(2 ** (bits / (len(ids) - 1)), rel=1e-4)


def test_several_streams_count_the_bytes_of_exactly_the_predicted_tokens():
    tokenizer = make_tokenizer("bpe:300", text("valid")[:200_000])
    ids = tokenizer.ids(text("test")[:20_000])
    model = SHARNN(
        SHARNNConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, boom_dim=32, attention_span=32)
    )
    result = evaluate(model, ids, streams=3, bptt=16, tokenizer=tokenizer, count_words=True)
    rows = len(ids) // 3
    predicted = np.concatenate([ids[b * rows + 1 : (b + 1) * rows] for b in range(3)])
    assert result.tokens == len(predicted)
    assert result.bytes == sum(len(tokenizer.token_bytes[i]) for i in predicted)
    assert result.words == sum(tokenizer.token_bytes[i].count(b" ") for i in predicted)


WORDS_RUN = [*SMALL, "model.vocab_size=33278", "sample_bytes=5"]


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_run_on_words_reports_word_perplexity_and_carries_its_tokenizer(small_words, tmp_path):
    run = tmp_path / "run"
    result = cli(
        "train", "--preset", "wikitext2-words-tiny", "--out", run, "--quiet", f"data={small_words}", *WORDS_RUN
    )
    assert_ok(result)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tokenizer"] == "words"
    assert f"(word perplexity {summary['test_word_perplexity']:.1f})" in result.stdout
    assert load_tokenizer(run / "best").vocab_size == 33_278  # tokenizer.json in the checkpoint
    test = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert test["split"] == "test"
    assert test["word_perplexity"] == pytest.approx(test["perplexity"], rel=1e-9)  # a words model: one token, one word

    evaluated = cli("eval", run)
    assert_ok(evaluated)
    assert f"word perplexity (2,998 words + <eos>): {summary['test_word_perplexity']:.2f}" in evaluated.stdout
    assert f"bits per byte: {summary['test_bpc']:.4f}" in evaluated.stdout

    generated = cli("generate", run, "--prompt", " the game", "--max-bytes", "6", "--seed", "1")
    assert_ok(generated)
    assert generated.stdout.startswith(" the game ")

    assert_ok(cli("export", run, "--out", tmp_path / "exported"))
    assert (tmp_path / "exported" / "tokenizer.json").is_file()
    assert f"bits per byte: {summary['test_bpc']:.4f}" in cli("eval", tmp_path / "exported").stdout


def test_a_model_vocabulary_that_is_not_the_tokenizers_is_refused(small_words, tmp_path):
    result = cli(
        "train",
        "--preset",
        "wikitext2-words-tiny",
        "--out",
        tmp_path / "run",
        f"data={small_words}",
        *SMALL,
        "model.vocab_size=256",
    )
    assert_user_error(result, "the model has 256 token ids but data=", "is words (33,278); set model.vocab_size=33278")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_prompt_word_outside_the_vocabulary_is_one_line(small_words, tmp_path):
    run = tmp_path / "run"
    assert_ok(
        cli(
            "train",
            "--preset",
            "wikitext2-words-tiny",
            "--out",
            run,
            "--quiet",
            f"data={small_words}",
            *WORDS_RUN,
            "max_steps=1",
        )
    )
    assert_user_error(cli("generate", run, "--prompt", "zzyzxq"), "'zzyzxq' is not in the words vocabulary")


def test_a_corpus_prepared_before_tokenizers_still_loads_as_bytes(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    for split, data in (("train", b"abcdef"), ("valid", b"gh"), ("test", b"ij")):
        (folder / f"{split}.bin").write_bytes(data)
    (folder / "meta.json").write_text(json.dumps({"name": "x", "train_bytes": 6, "valid_bytes": 2, "test_bytes": 2}))
    corpus = load_corpus(str(folder))
    assert corpus.tokenizer.name == "bytes" and bytes(corpus.train) == b"abcdef" and corpus.words is None


def test_prepare_corpus_refuses_token_ids_and_the_words_tokenizer(small_words, tmp_path):
    assert_user_error(
        cli("prepare", "corpus", small_words, "--out", tmp_path / "a"), "is a corpus of words tokens, not text"
    )
    source = tmp_path / "t.txt"
    source.write_bytes(b" a b \n" * 100)
    assert_user_error(
        cli("prepare", "corpus", source, "--tokenizer", "words", "--out", tmp_path / "b"),
        "use sharnn prepare wikitext-2",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


@pytest.mark.parametrize(
    "meta, message",
    [
        ([1, 2], "unreadable meta.json"),
        ({"dtype": "float32"}, "must be unsigned integers"),
        ({"dtype": "uint16"}, "not whole uint16 tokens"),
    ],
)
def test_a_damaged_meta_json_is_one_line(tmp_path, meta, message):
    folder = tmp_path / "bad"
    folder.mkdir()
    for split in COUNTS:
        (folder / f"{split}.bin").write_bytes(b"abc")
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=message):
        load_corpus(str(folder))


def test_evaluate_refuses_token_ids_without_their_tokenizer():
    model = SHARNN(SHARNNConfig(vocab_size=300, d_model=16, n_layers=1, boom_dim=32, attention_span=32))
    with pytest.raises(DataError, match="pass the corpus's tokenizer"):
        evaluate(model, np.arange(200, dtype=np.uint16) % 300, streams=2, bptt=8)


@pytest.fixture(scope="module")
def words_run(small_words, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("words-run") / "run"
    assert_ok(
        cli(
            "train",
            "--preset",
            "wikitext2-words-tiny",
            "--out",
            run,
            "--quiet",
            f"data={small_words}",
            *WORDS_RUN,
            "max_steps=2",
        )
    )
    return run


@pytest.mark.slow
def test_a_words_model_saved_without_its_tokenizer_is_refused_until_it_is_beside_it(words_run, tmp_path):
    from sharnn.training.checkpoint import load_model

    plain = tmp_path / "plain"
    load_model(words_run)[0].save_pretrained(plain)
    for args in (("generate", plain, "--prompt", " the"), ("eval", plain, "--file", WIKITEXT2 / "test.txt.gz")):
        assert_user_error(cli(*args), "the model has 33,278 token ids but its tokenizer (no tokenizer.json, so bytes)")
    shutil.copy(words_run / "best" / "tokenizer.json", plain)
    assert_ok(cli("generate", plain, "--prompt", " the", "--max-bytes", "3", "--seed", "1"))


@pytest.mark.slow
def test_a_whitespace_prompt_starts_a_words_model_after_a_line(words_run):
    result = cli("generate", words_run, "--prompt", "  ", "--max-bytes", "3", "--seed", "1")
    assert_ok(result)
    assert len(result.stdout) > 3  # the prompt, then three words


@pytest.mark.slow
def test_resume_and_init_from_refuse_a_corpus_with_another_tokenizer(small_words, words_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(small_words, other)
    vocab = json.loads((other / "tokenizer.json").read_text())["vocab"]
    vocab[0], vocab[1] = vocab[1], vocab[0]  # the same size, other words behind two ids
    (other / "tokenizer.json").write_text(json.dumps({"type": "words", "vocab": vocab}))
    assert_user_error(
        cli(
            "train",
            "--preset",
            "wikitext2-words-tiny",
            "--out",
            tmp_path / "init",
            f"data={other}",
            *WORDS_RUN,
            "--init-from",
            words_run,
        ),
        "not with the model's tokenizer (words)",
    )
    run = tmp_path / "run"
    assert_ok(
        cli(
            "train",
            "--preset",
            "wikitext2-words-tiny",
            "--out",
            run,
            "--quiet",
            f"data={other}",
            *WORDS_RUN,
            "max_steps=4",
            "checkpoint_every_steps=2",
            "sample_bytes=0",
        )
    )
    shutil.copy(small_words / "tokenizer.json", other)  # the corpus is prepared again, differently
    assert_user_error(cli("train", "--resume", run, "max_steps=6"), "not with the model's tokenizer")


@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails the test: a refusal must come first."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(SHARNN, "__init__", refuse)


@pytest.mark.parametrize("kind", ["file", "bundled", "prepared"])
def test_a_words_model_on_a_bytes_corpus_is_refused_before_anything_starts(kind, tmp_path, no_model):
    source = write_small_corpus(tmp_path / "small.txt")
    data = {"file": source, "bundled": "enwik8-head", "prepared": tmp_path / "prepared"}[kind]
    if kind == "prepared":
        prepare_corpus(source, data)
    run = tmp_path / "run"
    line = assert_user_error(
        cli("train", "--preset", "wikitext2-words-tiny", "--out", run, f"data={data}"),
        f"the model has 33,278 token ids but data={data} is bytes (256); set model.vocab_size=256",
    )
    assert line.endswith("or give a corpus of 33,278 token ids")
    assert not run.exists()


def test_a_bpe_corpus_of_fewer_ids_than_asked_says_so_and_asks_for_its_real_size(tmp_path, no_model):
    folder = tmp_path / "bpe"
    result = cli(
        "prepare", "corpus", write_small_corpus(tmp_path / "small.txt"), "--tokenizer", "bpe:8000", "--out", folder
    )
    assert_ok(result)
    corpus = load_corpus(str(folder))
    made = corpus.tokenizer
    assert made.vocab_size < 8000 and made.name == f"bpe:{made.vocab_size}"
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"], meta["tokenizer_asked"]) == (made.name, made.vocab_size, "bpe:8000")
    assert (
        f"bpe:8000 asked, {made.vocab_size:,} token ids made: the train split has too few distinct pieces"
        in result.stdout
    )
    for split in COUNTS:
        ids = corpus.split(split)
        assert f"{split}: {len(ids):,} tokens, {len(made.decode_bytes(ids)):,} bytes" in result.stdout
    run = tmp_path / "run"
    assert_user_error(
        cli("train", "--preset", "wikitext2-bpe8k-tiny", "--out", run, f"data={folder}"),
        f"the model has 8,000 token ids but data={folder} is {made.name} ({made.vocab_size:,}); "
        f"set model.vocab_size={made.vocab_size}",
    )
    assert not run.exists()


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_trained_words_model_refuses_a_bytes_corpus_in_every_command(small_words, tmp_path, monkeypatch):
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(small_words, data)
    assert_ok(
        cli(
            "train",
            "--preset",
            "wikitext2-words-tiny",
            "--out",
            run,
            "--quiet",
            f"data={data}",
            *WORDS_RUN,
            "max_steps=2",
        )
    )
    shutil.rmtree(data)
    prepare_corpus(write_small_corpus(tmp_path / "small.txt"), data)  # the run's corpus, prepared again as bytes
    before = files(run)
    refused = (
        f"the model has 33,278 token ids but data={data} is bytes (256); "
        f"give a corpus tokenized with the model's own tokenizer (words)"
    )
    init = (
        "train",
        "--preset",
        "wikitext2-words-tiny",
        "--init-from",
        run,
        "--out",
        tmp_path / "init",
        f"data={data}",
        *SMALL,
    )
    with monkeypatch.context() as patch:
        patch.setattr(SHARNN, "__init__", lambda *a, **k: pytest.fail("a model was built"))
        for args in (("train", "--resume", run, "max_steps=4"), init):
            assert_user_error(cli(*args), refused)
    for args in (("eval", run), ("analyze", "tokenization", run)):
        assert_user_error(cli(*args), refused)
    for checkpoint_tokenizer in run.glob("checkpoints/*/tokenizer.json"):  # as a run made before the check
        checkpoint_tokenizer.unlink()
    for args in (
        ("generate", run),
        ("eval", run),
        ("analyze", "tokenization", run),
        ("train", "--resume", run, "max_steps=4"),
    ):
        assert_user_error(
            cli(*args), "the model has 33,278 token ids but its tokenizer (no tokenizer.json, so bytes) has 256"
        )
    assert files(run) == {k: v for k, v in before.items() if not k.endswith("tokenizer.json")}
    assert not (tmp_path / "init").exists()
