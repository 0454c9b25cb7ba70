"""benchmarks/tokenization.py (paper §6.1's constrained experiment): its pure parts on run
folders made up here (a row per run from summary.json, metrics.jsonl, meta.json and the
analysis; mean, min and max over seeds; the Markdown; the JSON and the plot), the whole
script on made-up finished runs (nothing is run again; a run folder of another
configuration is refused), and one real run end to end: a tiny model for two seconds on
a small cut of WikiText-2 as bytes, trained, tested and analyzed by the CLI, then reused
by a second call. Speed is never asserted."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tokenization as tk  # benchmarks/tokenization.py, through pyproject's pythonpath
from helpers import SUBPROCESS_ENV, WIKITEXT2
from sharnn.analysis import byte_report, piece_table
from sharnn.config import load_config, to_yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "tokenization.py"

TINY = [
    "model.d_model=32",
    "model.boom_dim=64",
    "model.attention_span=48",
    "bptt=16",
    "train_streams=4",
    "valid_streams=4",
    "test_streams=2",
    "log_every_steps=2",
    "warmup_steps=5",
    "checkpoint_every_steps=1000",
]
VOCAB = {"bytes": 256, "bpe:1000": 1000, "words": 33278}
BYTES_PER_TOKEN = {"bytes": 1.0, "bpe:1000": 2.5, "words": 5.0}


def run(command: list, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=timeout, cwd=ROOT
    )


# ----------------------------------------------------------------------------- made-up corpora and runs


def make_meta(data: Path, tokenizer: str) -> dict:
    """A prepared corpus folder's meta.json (no split files: the script reads only this)."""
    folder = tk.corpus_folder(data, tokenizer)
    folder.mkdir(parents=True)
    per = BYTES_PER_TOKEN[tokenizer]
    meta = {
        "name": "wikitext-2",
        "tokenizer": tokenizer,
        "vocab_size": VOCAB[tokenizer],
        "types": 33278,
        "train_tokens": int(1_000_000 / per),
        "train_bytes": 1_000_000,
        "test_tokens": int(100_000 / per),
        "test_bytes": 100_000,
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


def make_analysis(tokenizer: str, tokens: int, seed: int) -> dict:
    """An analysis report with the keys `sharnn analyze tokenization` writes, from made-up bits."""
    rng = np.random.default_rng(seed)
    report = {"tokenizer": tokenizer, "tokens": tokens, "streams": 2, "bptt": 16, "split": "test", "data": "x"}
    if tokenizer == "bytes":
        text = b" the cat sat on the mat\n an apple a day\n" * 5
        surprisal = rng.uniform(0, 4, len(text))
        surprisal[0] = np.nan
        report |= {"kind": "bytes"} | byte_report(text, surprisal, rng.uniform(0, 4, len(text)), Counter())
    elif tokenizer.startswith("bpe"):
        words = np.repeat(np.arange(40), rng.integers(1, 6, 40))
        rows, first = piece_table(rng.uniform(0, 8, len(words)), words)
        report |= {"kind": "bpe", "pieces": rows, "first_piece_share": first, "totals": {}}
    else:
        report |= {"kind": "words", "totals": {"words": 100, "bits_per_word": 9.0, "word_perplexity": 512.0}}
    return report


def make_run(run_dir: Path, tokenizer: str, seed: int, config, test_bpc: float, analysis_tokens: int | None) -> dict:
    """A finished run folder: config.yaml, metrics.jsonl, summary.json and (when
    ``analysis_tokens``) analysis/tokenization-test.json. Returns its summary."""
    run_dir.mkdir(parents=True)
    if config is not None:
        (run_dir / "config.yaml").write_text(to_yaml(config))
    per = BYTES_PER_TOKEN[tokenizer]
    records = [{"split": "run", "step": 0, "command": "sharnn train ...", "processes": 1}]
    for step, rate in ((10, 1000.0 + seed), (20, 3000.0), (30, 2000.0)):
        records.append(
            {
                "split": "train",
                "step": step,
                "epoch": 0.01,
                "seconds": step / 10,
                "bpc": 8 - step / 10,
                "tokens_per_s": rate * per,
            }
        )
    records.append({"split": "valid", "step": 30, "seconds": 3.0, "bpc": test_bpc + 0.1, "nats": 1.0})
    records.append({"split": "test", "step": 30, "bpc": test_bpc, "nats": test_bpc * per * math.log(2)})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "run_dir": str(run_dir),
        "valid_bpc": test_bpc + 0.1,
        "test_bpc": test_bpc,
        "test_perplexity": 9.0,
        "test_word_perplexity": 2 ** (test_bpc * 5.6),
        "tokenizer": tokenizer,
        "best_step": 30,
        "steps": 30,
        "epochs": 0.25,
        "train_seconds": 3.1,
        "parameters": 1000 + VOCAB[tokenizer],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if analysis_tokens is not None:
        (run_dir / "analysis").mkdir()
        report = make_analysis(tokenizer, analysis_tokens, seed)
        (run_dir / "analysis" / tk.ANALYSIS_FILE).write_text(json.dumps(report))
    return summary


def made_up_experiment(tmp_path: Path, seconds: float, seeds: list[int], analyze_tokens: int) -> tuple[Path, Path]:
    """Corpora and finished, analyzed runs for bytes, bpe:1000 and words, each with the
    configuration the script plans for ``seconds`` and the tiny overrides."""
    data, runs = tmp_path / "data", tmp_path / "runs"
    for tokenizer in VOCAB:
        meta = make_meta(data, tokenizer)
        for seed in seeds:
            overrides = tk.train_overrides(tokenizer, seed, seconds, tk.corpus_folder(data, tokenizer), meta, TINY)
            config = load_config(tk.preset_for(tokenizer), overrides)
            make_run(tk.run_folder(runs, tokenizer, seed), tokenizer, seed, config, 1.5 + seed / 10, analyze_tokens)
    return data, runs


# ----------------------------------------------------------------------------- pure parts


def test_names_presets_and_overrides():
    assert tk.parse_tokenizers(tk.DEFAULT_TOKENIZERS) == ["bytes", "bpe:1000", "bpe:8000", "words"]
    for bad in ("bpe", "bpe:x", "chars", "bytes,bytes", ""):
        with pytest.raises(ValueError):
            tk.parse_tokenizers(bad)
    assert tk.parse_seeds("1, 2,3") == [1, 2, 3]
    with pytest.raises(ValueError):
        tk.parse_seeds("1,1")
    assert [tk.short_name(t) for t in ("bytes", "words", "bpe:1000", "bpe:8000", "bpe:1500")] == [
        "bytes",
        "words",
        "bpe1k",
        "bpe8k",
        "bpe1500",
    ]
    assert tk.corpus_folder(Path("data"), "bpe:8000") == Path("data/wikitext-2-bpe8k")
    assert tk.run_folder(Path("runs"), "bpe:1000", 2) == Path("runs/bpe1k-seed2")
    assert [tk.preset_for(t) for t in ("bytes", "bpe:1000", "bpe:8000", "words")] == [
        "wikitext2-bytes-tiny",
        "wikitext2-bpe8k-tiny",
        "wikitext2-bpe8k-tiny",
        "wikitext2-words-tiny",
    ]
    # the experiment's own settings come last, after the user's
    overrides = tk.train_overrides("bpe:1000", 3, 480, Path("d/wt"), {"vocab_size": 1000}, ["lr=0.001"])
    assert overrides == [
        "max_steps=0",
        "epochs=1000",
        "lr=0.001",
        "max_seconds=480",
        "seed=3",
        "data=d/wt",
        "model.vocab_size=1000",
    ]
    config = load_config("wikitext2-bpe8k-tiny", overrides)
    assert (config.model.vocab_size, config.max_seconds, config.seed, config.max_steps) == (1000, 480, 3, 0)
    assert "model.vocab_size=256" not in tk.train_overrides("bytes", 1, 60, Path("d"), {"vocab_size": 256}, [])


def test_prepared_corpus_must_be_wikitext2_with_the_tokenizer(tmp_path):
    assert tk.read_meta(tmp_path / "absent", "bytes") is None
    meta = make_meta(tmp_path, "bpe:1000")
    assert tk.read_meta(tk.corpus_folder(tmp_path, "bpe:1000"), "bpe:1000") == meta
    with pytest.raises(tk.ExperimentError, match="bpe:1000 tokenizer, not wikitext-2 with bpe:8000"):
        tk.read_meta(tk.corpus_folder(tmp_path, "bpe:1000"), "bpe:8000")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tk.ExperimentError, match=r"no readable meta\.json"):
        tk.read_meta(tmp_path / "empty", "bytes")


def test_a_run_folder_becomes_a_row(tmp_path):
    meta = make_meta(tmp_path / "data", "bpe:1000")
    config = load_config("wikitext2-bpe8k-tiny", tk.train_overrides("bpe:1000", 1, 60, tmp_path, meta, []))
    run_dir = tmp_path / "run"
    make_run(run_dir, "bpe:1000", 1, config, 1.8, 5000)
    analysis = tk.read_analysis(run_dir, 5000)
    row = tk.summarize_run("bpe:1000", 1, run_dir, meta, analysis, config)
    assert row["vocabulary"] == 1000 and row["parameters"] == 2000 and row["steps"] == 30
    assert row["train_seconds"] == 3.0 and row["summary_train_seconds"] == 3.1  # not the last validation's time
    assert row["stopped_by"] == "budget"
    assert row["tokens_per_s"] == 2000 * 2.5  # the median of the three logged intervals
    assert row["train_bytes_per_token"] == 2.5
    assert row["text_epochs"] == 0.25 and row["text_bytes"] == 250_000 and row["text_tokens"] == 100_000
    assert (row["valid_bpc"], row["test_bpc"]) == (1.8 + 0.1, 1.8)
    assert row["test_word_perplexity"] == 2 ** (1.8 * 5.6)
    assert row["test_bits_per_token"] == pytest.approx(1.8 * 2.5)  # nats of the test record / ln 2
    assert row["first_share"] == analysis["first_piece_share"] and 0 < row["first_share"] < 1
    assert row["analysis_tokens"] == 5000
    assert [p["step"] for p in row["train_curve"]] == [10, 20, 30] and row["train_curve"][0]["bpc"] == 7

    # a byte model's share is on first characters; a words model has none; no analysis, no share
    meta_bytes = make_meta(tmp_path / "data", "bytes")
    make_run(tmp_path / "bytes", "bytes", 1, None, 1.4, 100)
    row = tk.summarize_run("bytes", 1, tmp_path / "bytes", meta_bytes, tk.read_analysis(tmp_path / "bytes", 100))
    assert row["first_share"] == tk.read_analysis(tmp_path / "bytes", 100)["first_character_share"]
    assert row["test_bits_per_token"] == pytest.approx(1.4) and row["stopped_by"] is None
    assert tk.summarize_run("bytes", 1, tmp_path / "bytes", meta_bytes, None)["first_share"] is None


def test_an_analysis_is_reused_only_when_fresh_and_of_the_same_length(tmp_path):
    make_run(tmp_path / "run", "bytes", 1, None, 1.4, 100)
    assert tk.read_analysis(tmp_path / "run", 100)["tokens"] == 100
    assert tk.read_analysis(tmp_path / "run", 200) is None  # another --analyze-tokens
    summary = tmp_path / "run" / "summary.json"
    later = (tmp_path / "run" / "analysis" / tk.ANALYSIS_FILE).stat().st_mtime + 10
    os.utime(summary, (later, later))  # the run went on after the analysis
    assert tk.read_analysis(tmp_path / "run", 100) is None
    assert tk.read_analysis(tmp_path / "absent", 100) is None


def test_seeds_give_mean_min_and_max_per_tokenizer_and_markdown():
    rows = [
        {"tokenizer": t, "seed": s, "vocabulary": VOCAB[t], **{k: None for k in tk.NUMBERS}}
        for t in ("bytes", "words")
        for s in (1, 2, 3)
    ]
    for i, row in enumerate(rows):
        row |= {
            "test_bpc": 1.0 + i / 10,
            "valid_bpc": 2.0,
            "steps": 100 * (i + 1),
            "text_bytes": 1e6 * (i + 1),
            "first_share": 0.5 if row["tokenizer"] == "bytes" else None,
        }
    rows.append({"tokenizer": "bpe:1000", "seed": 1, "error": "exit status 1"})  # failed runs are left out
    groups = tk.aggregate(rows)
    assert [g["tokenizer"] for g in groups] == ["bytes", "words"]
    bytes_, words = groups
    assert bytes_["seeds"] == [1, 2, 3] and bytes_["runs"] == 3
    assert bytes_["test_bpc"] == pytest.approx(1.1) and (bytes_["test_bpc_min"], bytes_["test_bpc_max"]) == (1.0, 1.2)
    assert words["steps"] == 500 and (words["steps_min"], words["steps_max"]) == (400, 600)
    assert words["first_share"] is None and words["first_share_min"] is None

    markdown = tk.markdown_table(groups).splitlines()
    assert len(markdown) == 4
    header = [c.strip() for c in markdown[0].strip("|").split("|")]
    assert header[:2] == ["tokenization", "seeds"] and "test BPC" in header and "test word ppl" in header
    cells = dict(zip(header, (c.strip() for c in markdown[2].strip("|").split("|"))))
    assert cells["tokenization"] == "bytes" and cells["seeds"] == "3" and cells["vocabulary"] == "256"
    assert cells["test BPC"] == "1.1000 (1.0000-1.2000)"
    assert cells["text seen (MB)"] == "2.00 (1.00-3.00)"
    assert cells["bits on first char/piece"] == "50.0 (50.0-50.0)%"
    assert cells["test word ppl"] == "-"
    words_cells = dict(zip(header, (c.strip() for c in markdown[3].strip("|").split("|"))))
    assert words_cells["bits on first char/piece"] == "-"

    one = tk.aggregate(rows[:1])  # one seed: plain values
    assert tk.spread(one[0], "test_bpc", ".3f") == "1.000"


# ----------------------------------------------------------------------------- the whole script


@pytest.mark.slow
def test_script_reuses_finished_runs_and_reports_them(tmp_path):
    data, runs = made_up_experiment(tmp_path, 30, [1, 2], analyze_tokens=500)
    result_file, png = tmp_path / "result.json", tmp_path / "result.png"
    done = run(
        [
            sys.executable,
            SCRIPT,
            "--data",
            data,
            "--runs",
            runs,
            "--tokenizers",
            "bytes,bpe:1000,words",
            "--seeds",
            "1,2",
            "--seconds",
            "30",
            "--analyze-tokens",
            "500",
            "--json",
            result_file,
            "--plot",
            png,
            *TINY,
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "$ " not in out and "reusing the finished run" in out and "reusing the analysis" in out
    assert "test word ppl" in out and "per tokenizer over seeds" in out and "Markdown" in out
    assert "bits by character position" in out and "bits per word by number of pieces" in out
    assert "| tokenization | seeds |" in out

    result = json.loads(result_file.read_text())
    assert result["commands"] == [] and result["seconds"] == 30 and result["seeds"] == [1, 2]
    assert result["environment"]["cpu_count"] == os.cpu_count() and result["environment"]["torch"]
    assert result["environment"]["date"]
    assert [(r["tokenizer"], r["seed"]) for r in result["runs"]] == [
        ("bytes", 1),
        ("bytes", 2),
        ("bpe:1000", 1),
        ("bpe:1000", 2),
        ("words", 1),
        ("words", 2),
    ]
    for r in result["runs"]:
        assert r["test_bpc"] == pytest.approx(1.5 + r["seed"] / 10) and r["analysis"]["tokens"] == 500
        assert r["preset"] == tk.preset_for(r["tokenizer"]) and f"seed={r['seed']}" in r["overrides"]
    groups = {g["tokenizer"]: g for g in result["tokenizers"]}
    assert groups["bpe:1000"]["test_bpc"] == pytest.approx(1.65)
    assert groups["bytes"]["first_share"] is not None and groups["words"]["first_share"] is None
    assert png.stat().st_size > 0


@pytest.mark.slow
def test_script_refuses_runs_of_another_configuration(tmp_path):
    data, runs = made_up_experiment(tmp_path, 30, [1], analyze_tokens=500)
    result_file = tmp_path / "result.json"
    done = run(
        [
            sys.executable,
            SCRIPT,
            "--data",
            data,
            "--runs",
            runs,
            "--tokenizers",
            "bytes",
            "--seconds",
            "60",
            "--json",
            result_file,
            *TINY,
        ]
    )
    assert done.returncode == 2 and "another configuration" in done.stderr and "max_seconds" in done.stderr
    assert "Traceback" not in done.stderr and not result_file.exists()

    done = run([sys.executable, SCRIPT, "--data", data, "--tokenizers", "bpe:1000", "seed=3"])
    assert done.returncode == 2 and "--seeds" in done.stderr


def small_bytes_corpus(data: Path) -> Path:
    """WikiText-2 as bytes, cut to whole lines (train 12,000 bytes, valid and test 3,000),
    laid out as `sharnn prepare wikitext-2 --tokenizer bytes` lays it out."""
    folder = tk.corpus_folder(data, "bytes")
    folder.mkdir(parents=True)
    meta = {
        "source": str(WIKITEXT2),
        "name": "wikitext-2",
        "types": 33278,
        "tokenizer": "bytes",
        "vocab_size": 256,
        "dtype": "uint8",
    }
    for split, size in (("train", 12_000), ("valid", 3_000), ("test", 3_000)):
        text = gzip.decompress((WIKITEXT2 / f"{split}.txt.gz").read_bytes())[:size]
        text = text[: text.rindex(b"\n") + 1]
        (folder / f"{split}.bin").write_bytes(text)
        meta |= {
            f"{split}_words": len(text.split()) + text.count(b"\n"),
            f"{split}_tokens": len(text),
            f"{split}_bytes": len(text),
        }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.slow
def test_a_tiny_byte_run_end_to_end_then_reused(tmp_path):
    data, runs, result_file = tmp_path / "data", tmp_path / "runs", tmp_path / "result.json"
    small_bytes_corpus(data)
    command = [
        sys.executable,
        SCRIPT,
        "--data",
        data,
        "--runs",
        runs,
        "--tokenizers",
        "bytes",
        "--seconds",
        "2",
        "--analyze-tokens",
        "1000",
        "--json",
        result_file,
        *TINY,
    ]
    done = run(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reusing the prepared corpus" in done.stdout
    assert "$ " in done.stdout and " -m sharnn train --preset wikitext2-bytes-tiny" in done.stdout
    assert " -m sharnn analyze tokenization" in done.stdout and "--max-tokens 1000" in done.stdout

    result = json.loads(result_file.read_text())
    assert [c["returncode"] for c in result["commands"]] == [0, 0]
    assert "max_seconds=2 seed=1" in result["commands"][0]["command"]
    (row,) = result["runs"]
    # The budget counts validations: one at an epoch's end can carry the clock past 2 s after the
    # last step, so the step's clock (train_seconds) may read less; the run's whole clock may not.
    assert row["stopped_by"] == "budget" and row["summary_train_seconds"] >= 2 and row["steps"] > 0, row
    assert 0 < row["train_seconds"] <= row["summary_train_seconds"]
    assert row["vocabulary"] == 256 and row["train_bytes_per_token"] == 1 and row["tokens_per_s"] > 0
    train_bytes = json.loads((tk.corpus_folder(data, "bytes") / "meta.json").read_text())["train_bytes"]
    assert 0 < row["text_epochs"] < 1000 and row["text_bytes"] == row["text_epochs"] * train_bytes
    assert all(math.isfinite(row[k]) for k in ("valid_bpc", "test_bpc", "test_word_perplexity", "test_bits_per_token"))
    assert row["test_bits_per_token"] == pytest.approx(row["test_bpc"])  # bytes: a token is a byte
    assert row["analysis"]["tokens"] == 1000 and row["analysis"]["kind"] == "bytes"
    assert row["first_share"] == row["analysis"]["first_character_share"]
    assert row["train_curve"] and all(p["bpc"] > 0 for p in row["train_curve"])

    again = run(command)  # finished and analyzed: nothing runs again, the same numbers
    assert again.returncode == 0, again.stdout + again.stderr
    result_again = json.loads(result_file.read_text())
    assert result_again["commands"] == [] and "reusing the finished run" in again.stdout
    assert result_again["runs"][0]["test_bpc"] == row["test_bpc"]
    assert result_again["runs"][0]["train_commands"] == row["train_commands"]
    (train_command,) = row["train_commands"]  # the run's own record of the command that made it
    assert train_command.startswith("sharnn train --preset wikitext2-bytes-tiny") and "max_seconds=2" in train_command


def test_the_plan_prepares_trains_resumes_analyzes_and_goes_on_after_a_failure(tmp_path, monkeypatch, capsys):
    """In-process, with the CLI replaced by a stand-in that makes what each command would
    make: the commands of each case, in order, and what a failure or an interrupt does."""
    data, runs = tmp_path / "data", tmp_path / "runs"
    make_meta(data, "bytes")  # prepared; bpe:1000 and words are not
    unfinished = tk.run_folder(runs, "bytes", 1)
    unfinished.mkdir(parents=True)
    overrides = tk.train_overrides("bytes", 1, 30, tk.corpus_folder(data, "bytes"), {"vocab_size": 256}, TINY)
    (unfinished / "config.yaml").write_text(to_yaml(load_config("wikitext2-bytes-tiny", overrides)))
    commands, fail = [], {}

    def stand_in(args, log):
        args = [str(a) for a in args]
        commands.append(args[:3])
        log.append({"command": " ".join(args), "returncode": 0, "seconds": 0.0})
        if args[0] == "prepare":
            make_meta(data, args[args.index("--tokenizer") + 1])
        elif args[0] == "train":
            run_dir = Path(args[2] if args[1] == "--resume" else args[args.index("--out") + 1])
            tokenizer = "bytes" if "bytes" in run_dir.name else "bpe:1000" if "bpe" in run_dir.name else "words"
            if tokenizer in fail:
                raise tk.Step(" ".join(args), fail[tokenizer])
            if args[1] == "--resume":
                config = load_config(str(run_dir))
                (run_dir / "config.yaml").unlink()
                run_dir.rmdir()
            else:
                config = load_config(args[2], args[args.index("--quiet") + 1 :])
            make_run(run_dir, tokenizer, 1, config, 1.5, None)
        else:
            run_dir = Path(args[2])
            tokenizer = json.loads((run_dir / "summary.json").read_text())["tokenizer"]
            (run_dir / "analysis").mkdir()
            report = make_analysis(tokenizer, int(args[args.index("--max-tokens") + 1]), 1)
            (run_dir / "analysis" / tk.ANALYSIS_FILE).write_text(json.dumps(report))

    monkeypatch.setattr(tk, "run_command", stand_in)
    argv = [
        "--data",
        str(data),
        "--runs",
        str(runs),
        "--tokenizers",
        "bytes,bpe:1000,words",
        "--seconds",
        "30",
        "--analyze-tokens",
        "300",
        "--json",
        str(tmp_path / "r.json"),
        *TINY,
    ]
    fail["bpe:1000"] = 1
    assert tk.main(argv) == 1  # a failed step: the others still run
    assert commands == [
        ["train", "--resume", str(unfinished)],
        ["analyze", "tokenization", str(unfinished)],
        ["prepare", "wikitext-2", "--tokenizer"],
        ["train", "--preset", "wikitext2-bpe8k-tiny"],
        ["prepare", "wikitext-2", "--tokenizer"],
        ["train", "--preset", "wikitext2-words-tiny"],
        ["analyze", "tokenization", str(tk.run_folder(runs, "words", 1))],
    ]
    result = json.loads((tmp_path / "r.json").read_text())
    assert [("error" in r) for r in result["runs"]] == [False, True, False]
    assert [g["tokenizer"] for g in result["tokenizers"]] == ["bytes", "words"]
    assert len(result["commands"]) == 7

    commands.clear()
    fail["bpe:1000"] = 130  # interrupted: stop there; the same command goes on later
    assert tk.main(argv) == 130
    assert commands == [["train", "--preset", "wikitext2-bpe8k-tiny"]]  # bytes and the prepared corpora reused
    assert "run the same command again" in capsys.readouterr().err

    commands.clear()
    del fail["bpe:1000"]
    assert tk.main(argv) == 0
    assert commands == [
        ["train", "--preset", "wikitext2-bpe8k-tiny"],
        ["analyze", "tokenization", str(tk.run_folder(runs, "bpe:1000", 1))],
    ]
