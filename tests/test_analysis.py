"""Tests of the tokenization analysis (src/sharnn/analysis.py, paper §6.1): per-token
scores that add up to the evaluation's total, the character and word labelling of bytes,
the naive perplexity conversion, the grouping of wordpieces into words, and the
`sharnn analyze tokenization` command."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import WIKITEXT2, assert_ok, assert_user_error, cli, shared_run
from sharnn.analysis import (
    analyze,
    frequency_table,
    label_bytes,
    naive_conversion,
    piece_table,
    piece_words,
    position_table,
    text_counts,
    token_scores,
    word_counts,
)
from sharnn.analysis_report import format_report, write_report
from sharnn.data.corpus import read_bytes
from sharnn.data.tokenizer import BPETokenizer, ByteTokenizer, WordTokenizer
from sharnn.errors import DataError
from sharnn.evaluation import evaluate
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN

TEXT = b" ab  c\n\xc3\xa9x\n"  # characters: ' ' a b ' ' ' ' c '\n' é x '\n' (é is 2 bytes)


def wikitext(split: str, size: int) -> bytes:
    """The first whole lines of a WikiText-2 split, about ``size`` bytes."""
    text = bytes(read_bytes(WIKITEXT2 / f"{split}.txt.gz")[: size + 2000])
    return text[: text.index(b"\n", size) + 1]


def tiny_model(vocab_size: int = 256, seed: int = 0) -> SHARNN:
    """A random tiny model (attention span 24 > the windows of 8: the memory is carried)."""
    torch.manual_seed(seed)
    config = SHARNNConfig(
        vocab_size=vocab_size,
        d_model=16,
        n_layers=2,
        boom_dim=32,
        attention_span=24,
        dropouti=0.0,
        dropouth=0.0,
        dropouto=0.0,
    )
    return SHARNN(config).eval()


# ----------------------------------------------------------------------------- scores


def test_token_scores_add_up_to_the_evaluation_and_align_with_the_data():
    data = np.frombuffer(wikitext("test", 3000), dtype=np.uint8).copy()
    model = tiny_model()
    streams, bptt = 3, 8
    surprisal, entropy = token_scores(model, data, streams, bptt)
    assert surprisal.shape == entropy.shape == data.shape
    rows = len(data) // streams
    unpredicted = np.isnan(surprisal)
    assert unpredicted.sum() == streams + len(data) % streams
    assert all(unpredicted[b * rows] for b in range(streams)) and unpredicted[rows * streams :].all()
    assert (np.isnan(entropy) == unpredicted).all()
    result = evaluate(model, data, streams, bptt)
    assert np.nansum(surprisal) * math.log(2) == pytest.approx(result.nats * result.tokens, rel=1e-6)
    assert ((entropy[~unpredicted] > 0) & (entropy[~unpredicted] <= 8 + 1e-9)).all()

    # Stream 1's first window, scored directly: positions rows+1 .. rows+8.
    window = torch.from_numpy(data[rows : rows + 9].astype(np.int64)).view(-1, 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(window[:-1])[0].double(), -1)[:, 0]
    expected = -logp.gather(-1, window[1:]).squeeze(-1) / math.log(2)
    np.testing.assert_allclose(surprisal[rows + 1 : rows + 9], expected.numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        entropy[rows + 1 : rows + 9], (-(logp.exp() * logp).sum(-1) / math.log(2)).numpy(), rtol=1e-5
    )


def test_token_scores_refuses_a_split_too_small_for_its_streams():
    with pytest.raises(DataError, match="too small"):
        token_scores(tiny_model(), np.zeros(5, dtype=np.uint8), 4, 8)


# ----------------------------------------------------------------------------- bytes


def test_bytes_are_labelled_by_character_and_position_in_the_word():
    labels = label_bytes(TEXT)
    assert labels.character.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9]  # é's two bytes: one character
    assert labels.start.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]
    assert labels.position.tolist() == [0, 1, 2, 0, 0, 1, 0, 1, 2, 0]
    assert labels.word.tolist() == [-1, 0, 0, -1, -1, 1, -1, 2, 2, -1]
    assert labels.word.max() + 1 == len(TEXT.split())
    long = label_bytes(b"abcdefghij\tk")
    assert long.position.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1]


def test_position_table_sums_a_characters_bytes_and_leaves_out_unpredicted_ones():
    labels = label_bytes(TEXT)
    surprisal = np.array([np.nan, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=float)  # bytes; é = 7 + 8
    entropy = surprisal / 2
    rows = {r["position"]: r for r in position_table(surprisal, entropy, labels)}
    total = np.nansum(surprisal)
    assert rows["1"]["characters"] == 3 and rows["1"]["surprisal"] == pytest.approx((1 + 5 + 15) / 3)
    assert rows["2"]["characters"] == 2 and rows["2"]["surprisal"] == pytest.approx((2 + 9) / 2)
    assert rows["2"]["entropy"] == pytest.approx((2 + 9) / 4)
    assert rows["whitespace"]["characters"] == 4  # the first space is not predicted
    assert rows["whitespace"]["surprisal"] == pytest.approx((3 + 4 + 6 + 10) / 4)
    assert rows["1"]["share"] == pytest.approx(21 / total)
    assert rows["8+"]["characters"] == 0 and rows["8+"]["surprisal"] is None
    assert sum(r["share"] or 0 for r in rows.values()) == pytest.approx(1.0)


def test_a_stray_continuation_byte_after_whitespace_is_a_word_of_its_own():
    text = b"ab \x80 ef\n"  # not UTF-8: bytes.split() sees three words, and so must the labels
    labels = label_bytes(text)
    assert labels.word.max() + 1 == len(text.split()) == 3
    rows = frequency_table(np.ones(len(text)), text, labels, word_counts(b"ab ef"))
    assert sum(r["words"] for r in rows) == 3


def test_frequency_table_bins_words_by_their_train_count():
    text = b" the cat\n the zebra\n"
    counts = word_counts(b"the the cat " * 20 + b"the " * 1000)
    assert counts[b"the"] == 1040 and counts[b"cat"] == 20 and b"zebra" not in counts
    surprisal = np.ones(len(text))
    surprisal[text.index(b"zebra")] = 5.0  # zebra: 5 + 4 bits, 5 on its first character
    rows = {r["frequency"]: r for r in frequency_table(surprisal, text, label_bytes(text), counts)}
    assert rows["1-9 (incl. unseen)"]["words"] == 1
    assert rows["1-9 (incl. unseen)"]["bits_per_word"] == 9 and rows["1-9 (incl. unseen)"][
        "first_share"
    ] == pytest.approx(5 / 9)
    assert rows["10-99"]["words"] == 1 and rows["10-99"]["first_share"] == pytest.approx(1 / 3)
    assert rows["1,000-9,999"]["words"] == 2 and rows["1,000-9,999"]["characters"] == 3
    assert rows["100-999"]["words"] == 0 and rows["100-999"]["bits_per_word"] is None


def test_naive_conversion_with_bytes_is_the_exact_word_perplexity():
    text = b"ab c\xc3\xa9\nef\n"  # 10 bytes, 9 characters; words ab, c\xc3\xa9, ef; 2 lines
    surprisal = np.full(len(text), 0.5)
    surprisal[0] = np.nan  # a stream's first byte: "ab" is not a predicted word
    counts = text_counts(text, surprisal, label_bytes(text))
    assert counts == {"bytes": 9, "characters": 8, "nonspace": 5, "words": 2, "lines": 2}
    rows = naive_conversion(4.5, counts)  # BPC 0.5, Nw = 4
    assert [r["nc"] for r in rows][:3] == ["bytes", "characters (with whitespace)", "non-whitespace characters"]
    exact = rows[-1]["perplexity"]
    assert exact == pytest.approx(2 ** (4.5 / 4))
    assert rows[0]["perplexity"] == pytest.approx(exact, rel=1e-12) and rows[0]["vs_exact"] == pytest.approx(1.0)
    assert rows[1]["perplexity"] == pytest.approx(2 ** (0.5 * 8 / 4))
    assert rows[2]["perplexity"] == pytest.approx(2 ** (0.5 * 5 / 4))
    assert rows[2]["per_word"] == pytest.approx(5 / 4)
    with pytest.raises(DataError):
        naive_conversion(1.0, {"bytes": 3, "characters": 3, "nonspace": 0, "words": 0, "lines": 0})


# ----------------------------------------------------------------------------- wordpieces


def test_pieces_are_grouped_into_words():
    token_bytes = [b" the", b" un", b"believ", b"able", b" \n", b"\n", b"x", b" @"]
    ids = np.array([0, 1, 2, 3, 4, 6, 7, 5, 6, 0])
    #      the | un believ able | \n(eos) | x | @ \n | x | the
    words = piece_words(token_bytes, ids)
    assert words.tolist() == [0, 1, 1, 1, 2, 3, 4, 4, 5, 6]
    surprisal = np.array([np.nan, 4, 2, 2, 1, 3, 1, 1, 2, 6], dtype=float)
    rows, first_share = piece_table(surprisal, words)
    rows = {r["pieces"]: r for r in rows}
    assert rows["1"]["words"] == 4  # the first "the" is not predicted
    assert rows["1"]["bits_per_word"] == pytest.approx((1 + 3 + 2 + 6) / 4) and rows["1"]["first_share"] == 1.0
    assert rows["3"]["words"] == 1 and rows["3"]["bits_per_word"] == 8 and rows["3"]["first_share"] == 0.5
    assert rows["2"]["first_share"] == 0.5 and rows["4+"]["words"] == 0
    assert first_share == pytest.approx((4 + 1 + 3 + 1 + 2 + 6) / 22)


def test_wikitext_pieces_make_its_words_and_eos():
    text = wikitext("valid", 6000)
    tokenizer = BPETokenizer.train(wikitext("train", 30_000), 300)
    words = piece_words(tokenizer.token_bytes, tokenizer.ids(text))
    assert words[-1] + 1 == len(text.split()) + text.count(b"\n")


# ----------------------------------------------------------------------------- whole analysis


def test_analysis_of_a_byte_model_reports_and_writes(tmp_path):
    text = wikitext("test", 2000)
    report = analyze(
        tiny_model(),
        ByteTokenizer(),
        np.frombuffer(text, dtype=np.uint8).copy(),
        2,
        8,
        train=np.frombuffer(wikitext("train", 20_000), dtype=np.uint8),
    )
    totals = report["totals"]
    assert totals["tokens"] == totals["bytes"] == len(text) - 2 - len(text) % 2
    assert totals["words"] == report["counts"]["words"] + report["counts"]["lines"]
    assert report["conversion"][0]["perplexity"] == pytest.approx(totals["word_perplexity"])
    assert report["first_character_share"] == report["positions"][0]["share"]
    assert sum(r["words"] for r in report["frequency"]) > 0
    report.update(data="wikitext", split="test")
    printed = format_report(report)
    assert "bits by character position in the word" in printed and "8+" in printed
    assert "2^(BPC * Nc / Nw)" in printed and "exact" in printed
    paths = write_report(report, tmp_path / "out")
    assert [p.name for p in paths] == ["tokenization-test.json", "tokenization-test-positions.png"]
    assert json.loads(paths[0].read_text())["positions"][0]["position"] == "1"
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analysis_of_wordpiece_and_word_models(tmp_path):
    train, text = wikitext("train", 20_000), wikitext("test", 1500)
    words = WordTokenizer.train(train + text)
    ids = words.ids(text)
    report = analyze(tiny_model(words.vocab_size), words, ids, 2, 8)
    totals = report["totals"]
    assert totals["words"] == totals["tokens"] and totals["bits_per_word"] == totals["bits_per_token"]
    rows, predicted = len(ids) // 2, np.ones(len(ids), dtype=bool)
    predicted[[0, rows]] = False
    predicted[2 * rows :] = False
    assert totals["bytes"] == words.byte_lengths()[ids][predicted].sum()
    assert "word perplexity" in format_report(report)

    pieces = BPETokenizer.train(train, 300)
    report = analyze(tiny_model(pieces.vocab_size), pieces, pieces.ids(text), 2, 8)
    assert [r["pieces"] for r in report["pieces"]] == ["1", "2", "3", "4+"]
    assert 0 < report["first_piece_share"] < 1
    assert "bits per word by its number of pieces" in format_report(report)
    assert [p.name for p in write_report(report, tmp_path)] == [
        "tokenization-data.json",
        "tokenization-data-pieces.png",
    ]


# ----------------------------------------------------------------------------- command line
# (the command, `sharnn analyze tokenization`, lives in src/sharnn/cli.py)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


def test_cli_prints_the_tables_and_writes_json_and_png(run, tmp_path):
    result = cli("analyze", "tokenization", run, "--max-tokens", 3000, "--out", tmp_path)
    assert_ok(result)
    assert "bits by character position in the word" in result.stdout
    assert "2^(BPC * Nc / Nw)" in result.stdout
    report = json.loads((tmp_path / "tokenization-test.json").read_text())
    assert report["tokens"] == 3000 and report["streams"] == 2 and report["kind"] == "bytes"
    assert (tmp_path / "tokenization-test-positions.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_bad_input_in_one_line(run, tmp_path):
    assert_user_error(cli("analyze", "tokenization", tmp_path / "nothing"), "no checkpoint")
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in (run / "best").iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    (broken / "tokenizer.json").write_text("not a tokenizer")
    assert_user_error(cli("analyze", "tokenization", broken, "--max-tokens", 3000), "tokenizer")
