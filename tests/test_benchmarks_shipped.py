"""benchmarks/shipped_model.py, attention_span.py and train_contention.py run as real processes at
toy sizes: every row present, round trips checked, the classical compressors' sizes as
their libraries give them, the JSON and the Markdown (speed is never asserted)."""

from __future__ import annotations

import bz2
import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import SMALL, SUBPROCESS_ENV
from sharnn import SHARNN, load_corpus
from sharnn.config import load_config
from sharnn.evaluation import evaluate
from sharnn.training.checkpoint import load_model, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CANTERBURY = ROOT / "benchmarks" / "data" / "canterbury"

pytestmark = pytest.mark.slow  # runs the benchmark scripts as real processes


def run(*args) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_canterbury_texts_are_the_published_files():
    sums = dict(line.split()[::-1] for line in (CANTERBURY / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == ["alice29.txt", "asyoulik.txt", "lcet10.txt", "plrabn12.txt"]
    for name, digest in sums.items():
        assert hashlib.sha256((CANTERBURY / name).read_bytes()).hexdigest() == digest, name


def test_shipped_model_benchmark_codes_every_file_and_checks_the_round_trips(tmp_path):
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    model = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out, table = tmp_path / "result.json", tmp_path / "table.md"
    args = ["--model", model, "--files", "enwik8-head-test", "alice29", "--limit", "800", "--no-splits"]
    done = run(ROOT / "benchmarks" / "shipped_model.py", *args, "--json", out, "--markdown", table)
    result = json.loads(out.read_text())
    assert [row["file"] for row in result["files"]] == ["enwik8-head-test", "alice29"]
    alice = (CANTERBURY / "alice29.txt").read_bytes()[:800]
    row = result["files"][1]
    assert row["bytes"] == 800
    assert row["xz -9e"] == 8 * len(lzma.compress(alice, preset=9 | lzma.PRESET_EXTREME)) / 800
    assert row["bzip2 -9"] == 8 * len(bz2.compress(alice, 9)) / 800
    assert set(row) >= {"sharnn", "zstd --ultra -22", "PPMd"} and row["sharnn"] > 0
    assert result["splits"] == []
    assert "| alice29 | 800 |" in table.read_text() and "alice29" in done.stdout


def test_train_contention_benchmark_measures_each_setting_quiet_and_busy(tmp_path):
    out = tmp_path / "result.json"
    args = ["--seconds", "0.5", "--warmup", "1", "--json", out, *SMALL[:6]]
    run(ROOT / "benchmarks" / "train_contention.py", *args)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["setting"], r["busy"]) for r in rows] == [
        (setting, busy) for busy in (0, 1) for setting in ("spin", "passive", "1-thread")
    ]
    assert all(r["tokens_per_s"] > 0 and r["steps"] >= 1 for r in rows)
    assert [r["threads"] for r in rows if r["setting"] == "1-thread"] == [1, 1]


def test_attention_span_benchmark_scores_each_span_and_resumes(tmp_path):
    """benchmarks/attention_span.py: one row per span, each the BPC of the model set to that
    span (the window cut to it where shorter); a rerun adds only the spans it lacks."""
    text = tmp_path / "text.txt"
    text.write_bytes((CANTERBURY / "alice29.txt").read_bytes()[:20000])
    config = load_config("tiny", SMALL + [f"data={text}", "test_max_bytes=600"])
    torch.manual_seed(0)
    model = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out, figure = tmp_path / "spans.json", tmp_path / "spans.png"
    script = ROOT / "benchmarks" / "attention_span.py"
    run(script, "--models", model, "--multiples", "0.25", "1", "--json", out)
    done = run(script, "--models", model, "--multiples", "0.25", "1", "4", "--json", out, "--plot", figure)
    assert done.stderr.count(" BPC in ") == 1  # only the new span was scored
    rows = {r["multiple"]: r for r in json.loads(out.read_text())["rows"]}
    assert [(rows[m]["span"], rows[m]["window"]) for m in (0.25, 1, 4)] == [(12, 12), (48, 16), (192, 16)]
    data = load_corpus(str(text)).test[:600]
    for row in rows.values():
        trained, _ = load_model(model)
        expected = evaluate(trained.set_attention_span(row["span"]), data, config.test_streams, row["window"])
        assert row["bpc"] == pytest.approx(expected.bpc, abs=1e-9) and row["bytes"] == expected.bytes == 598
    assert figure.stat().st_size > 0 and "192" in done.stdout
