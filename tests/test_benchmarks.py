"""The benchmark scripts run and write their JSON (speed itself is never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a real process

ROOT = Path(__file__).resolve().parent.parent


def test_train_throughput_cpu_runs_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "train_throughput_cpu.py"),
        "--steps",
        "1",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--json",
        str(out),
        "model.d_model=32",
        "model.boom_dim=64",
        "train_streams=2",
        "bptt=16",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ratio sharnn / bare" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["median_tokens_per_s"]) == {"sharnn", "bare"}
    assert all(len(rates) == 2 and min(rates) > 0 for rates in result["tokens_per_s"].values())
    assert result["ratio"] == result["median_tokens_per_s"]["sharnn"] / result["median_tokens_per_s"]["bare"]
    # the bare stack holds the same big layers, without LayerNorms, gates and the value-gate network
    assert result["parameters"]["bare"] < result["parameters"]["sharnn"]
