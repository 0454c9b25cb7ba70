"""benchmarks/train_throughput.py and benchmarks/inference_throughput.py run on CPU at tiny
sizes, print their tables and write their JSON; their bookkeeping (OOM rows, targets) is
checked on hand-made rows. Speed itself is never asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import SUBPROCESS_ENV

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TINY = ["model.d_model=32", "model.boom_dim=64", "bptt=16", "model.attention_span=48"]


def run_script(name: str, *args: str) -> str:
    command = [sys.executable, str(BENCHMARKS / name), "--device", "cpu", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture()
def benchmark_modules(monkeypatch):
    """The scripts as modules (they import ``common`` from their own folder)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import common
    import inference_throughput
    import train_throughput

    return common, train_throughput, inference_throughput


def check_rows(rows: list[dict], rate: str, repeats: int) -> None:
    for row in rows:
        assert row["status"] == "ok", row
        assert len(row["seconds"]) == repeats and min(row["seconds"]) > 0
        assert row[rate] > 0


@pytest.mark.slow
@pytest.mark.parametrize("paths", [["fast-nocompile", "eager"], ["fast-recompute"]], ids=["uncompiled", "compiled"])
def test_train_throughput_runs_and_writes_json(tmp_path, paths):
    out = tmp_path / "train.json"
    stdout = run_script(
        "train_throughput.py",
        "--presets",
        "tiny",
        "--streams",
        "2",
        "--steps",
        "1",
        "--repeats",
        "2",
        "--json",
        str(out),
        "--paths",
        *paths,
        *TINY,  # overrides may follow a list option
    )
    assert "preset  streams" in stdout and "tokens/s" in stdout and "model/floor" in stdout
    assert "targets not judged" in stdout  # overrides change the presets
    result = json.loads(out.read_text())
    assert result["environment"]["device"] == "cpu"
    assert result["args"]["overrides"] == TINY and result["targets"] == []
    rows = result["rows"]
    assert [(r["preset"], r["streams"], r["path"]) for r in rows] == [("tiny", 2, p) for p in ["floor", *paths]]
    check_rows(rows, "tokens_per_s", repeats=2)
    for row in rows[1:]:
        assert row["floor_ratio"] > 0 and row["last_loss"] > 0
        assert ("speedup_vs_eager" in row) == (row["path"] != "eager" and "eager" in paths)


@pytest.mark.slow
def test_inference_throughput_runs_and_writes_json(tmp_path):
    out = tmp_path / "inference.json"
    stdout = run_script(
        "inference_throughput.py",
        "--preset",
        "tiny",
        "--eval-streams",
        "2",
        "--gen-streams",
        "1",
        "2",
        "--gen-bytes",
        "3",
        "--steps",
        "1",
        "--repeats",
        "2",
        "--json",
        str(out),
        "--paths",
        "fast-nocompile",
        "eager",
        *TINY,
    )
    assert stdout.count("\nstreams  ") == 2 and "tokens/s" in stdout and "bytes/s/stream" in stdout  # both tables
    result = json.loads(out.read_text())
    assert result["args"]["gen_bytes"] == 3 and result["targets"] == []
    assert [(r["streams"], r["path"]) for r in result["eval"]] == [(2, "fast-nocompile"), (2, "eager")]
    assert [(r["streams"], r["path"]) for r in result["generation"]] == [
        (b, p) for b in (1, 2) for p in ("fast-nocompile", "eager")
    ]
    check_rows(result["eval"], "tokens_per_s", repeats=2)
    check_rows(result["generation"], "bytes_per_s", repeats=2)
    for row in result["generation"]:
        assert row["bytes_per_s_per_stream"] == pytest.approx(row["bytes_per_s"] / row["streams"])


def test_out_of_memory_is_recorded_and_the_run_goes_on(benchmark_modules):
    common, _, _ = benchmark_modules

    def runs_out():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    assert common.measure_or_oom(runs_out, torch.device("cpu")) == {"status": "OOM"}
    assert common.measure_or_oom(lambda: {"seconds": [1.0]}, torch.device("cpu")) == {"status": "ok", "seconds": [1.0]}


def test_targets_are_judged_only_for_rows_that_exist(benchmark_modules):
    _, train, inference = benchmark_modules
    rows = [
        {
            "preset": "enwik8-paper",
            "streams": 16,
            "path": "fast",
            "tokens_per_s": 200_000.0,
            "floor_ratio": 1.6,
            "speedup_vs_eager": 5.0,
        },
        {"preset": "enwik8-paper", "streams": 16, "path": "eager", "tokens_per_s": 40_000.0, "floor_ratio": 8.0},
        {"preset": "enwik8-paper", "streams": 64, "path": "fast", "status": "OOM"},
    ]
    verdicts = {t["target"]: t["pass"] for t in train.judge_targets(rows)}
    assert verdicts == {
        "enwik8-paper 16 streams fast >= 150,000 tokens/s": True,
        "enwik8-paper 16 streams fast model/floor <= 1.5": False,
        "enwik8-paper 64 streams fast >= 400,000 tokens/s": None,  # OOM: not measured
        "enwik8-paper 16 streams fast >= 4x eager": True,
    }
    gen_rows = [
        {"streams": 1, "path": "fast", "bytes_per_s": 2_500.0},
        {"streams": 1, "path": "eager", "bytes_per_s": 300.0},
        {"streams": 64, "path": "fast-nocompile", "bytes_per_s": 40_000.0},
    ]
    verdicts = {t["target"]: t["pass"] for t in inference.judge_targets(gen_rows)}
    assert verdicts == {
        "generation fast 1 stream >= 2,000 bytes/s": True,
        "generation fast-nocompile 64 streams >= 50,000 bytes/s": False,
    }


@pytest.mark.slow
def test_lstm_cells_times_both_cells_and_the_products_floor_against_pytorchs_lstm(tmp_path):
    out = tmp_path / "cells.json"
    command = [sys.executable, str(BENCHMARKS / "lstm_cells.py"), "--window", "4", "--batch", "2", "--d-model", "8"]
    done = subprocess.run(
        [*command, "--repeats", "2", "--json", str(out)], capture_output=True, text=True, env=SUBPROCESS_ENV, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert [row["cell"] for row in result["rows"]] == ["lstm", "ln_lstm", "recurrent products alone"]
    for row in result["rows"]:
        for name in ("forward", "forward+backward"):
            assert row[f"{name}_ms"] > 0
            assert row[f"{name}_vs_lstm"] == pytest.approx(row[f"{name}_ms"] / result["rows"][0][f"{name}_ms"])
    assert result["lstm_kernel"].endswith("Backward0") and (result["window"], result["d_model"]) == (4, 8)
    refused = subprocess.run([*command, "--repeats", "0"], capture_output=True, text=True, env=SUBPROCESS_ENV)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].endswith("must be at least 1")
