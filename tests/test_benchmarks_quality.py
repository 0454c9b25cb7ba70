"""benchmarks/check_fast_path.py and benchmarks/quality_at_budget.py run as real processes
on CPU at tiny sizes: exit status, table header and the JSON's structure (speed is never
asserted). The fast-path check must also fail, with exit status 1, when the attention
mask is the wrong one."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SUBPROCESS_ENV, write_small_corpus

pytestmark = pytest.mark.slow  # runs the benchmark scripts as real processes

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TINY_MODEL = ["model.d_model=32", "model.boom_dim=64", "model.attention_span=48"]
CHECK_ARGS = ["--device", "cpu", "--no-compile", "--windows", "4", "--streams", "2", "--bptt", "16", *TINY_MODEL]

# Runs check_fast_path.py with the fast path's bottom-right causal mask replaced by the
# top-left one (what is_causal=True gives when the keys outnumber the queries).
BROKEN_MASK = """
import runpy, sys
from torch.nn.attention.bias import causal_upper_left
import sharnn.models.sharnn
sharnn.models.sharnn.causal_lower_right = causal_upper_left
sys.path.insert(0, {benchmarks!r})
sys.argv = ["check_fast_path.py", *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def run(command: list, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=timeout
    )


def test_check_fast_path_passes_and_writes_json(tmp_path):
    out = tmp_path / "check.json"
    done = run([sys.executable, BENCHMARKS / "check_fast_path.py", *CHECK_ARGS, "--steps", "30", "--json", out])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attn row" in done.stdout and "grad median" in done.stdout and "fast - eager" in done.stdout
    assert "(a) outputs and gradients: PASS" in done.stdout and "(b) training: PASS" in done.stdout

    result = json.loads(out.read_text())
    assert result["passed"] is True and result["compile"] is False
    assert result["streams"] == 2 and result["bptt"] == 16
    windows = result["outputs"]["windows"]
    assert [w["window"] for w in windows] == [1, 2, 3, 4]
    assert [w["memory_read"] for w in windows] == [0, 16, 32, 32]  # span 48 - bptt 16 = 32: full, then cut
    for w in windows:
        assert w["passed"] and w["failed"] == []
        for key, limit in result["thresholds"].items():
            if key in w:
                assert 0 < w[key] <= limit, (key, w[key])  # > 0: the two paths really differ
        assert set(w["grad_rel_err"]) and w["grad_worst_param"] in w["grad_rel_err"]
    training = result["training"]
    assert training["steps"] == 30 and training["passed"] and training["all_finite"]
    for path in ("eager", "fast"):
        assert len(training[path]["loss_nats"]) == 30
        assert len(training[path]["block_mean_bpc"]) == 2  # steps 1-25 and 26-30
        assert all(math.isfinite(x) for x in training[path]["loss_nats"])
    assert abs(training["final_diff_nats"]) <= training["final_tolerance_nats"]


def test_check_fast_path_fails_with_a_top_left_mask(tmp_path):
    out = tmp_path / "check.json"
    code = BROKEN_MASK.format(benchmarks=str(BENCHMARKS), script=str(BENCHMARKS / "check_fast_path.py"))
    done = run([sys.executable, "-c", code, *CHECK_ARGS, "--steps", "2", "--json", out])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(a) outputs and gradients: FAIL" in done.stdout
    windows = json.loads(out.read_text())["outputs"]["windows"]
    assert windows[0]["passed"]  # no memory yet: top-left and bottom-right are the same mask
    assert all("attention_row_rel_err" in w["failed"] for w in windows[1:])


def test_check_fast_path_fails_when_training_diverges(tmp_path):
    out = tmp_path / "check.json"
    done = run(
        [
            sys.executable,
            BENCHMARKS / "check_fast_path.py",
            *CHECK_ARGS,
            "--steps",
            "3",
            "--json",
            out,
            "lr=1e38",
            "warmup_steps=0",
        ]
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "(b) training: FAIL" in done.stdout
    training = json.loads(out.read_text())["training"]
    assert training["all_finite"] is False and training["passed"] is False


def test_quality_at_budget_runs_each_setting_for_the_budget(tmp_path):
    data = write_small_corpus(tmp_path / "small.txt")
    out, result_file = tmp_path / "runs", tmp_path / "quality.json"
    command = [
        sys.executable,
        BENCHMARKS / "quality_at_budget.py",
        "--device",
        "cpu",
        "--minutes",
        "0.04",
        "--valid-every",
        "5",
        "--data",
        data,
        "--out",
        out,
        "--json",
        result_file,
        "--set",
        "lr=0.002",
        "--set",
        "lr=0.003",
        *TINY_MODEL,
        "bptt=16",
        "train_streams=4",
        "valid_streams=4",
        "test_streams=2",
        "log_every_steps=2",
        "warmup_steps=5",
    ]
    done = run(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final valid BPC" in done.stdout and "test BPC" in done.stdout and "validation curves" in done.stdout

    result = json.loads(result_file.read_text())
    assert result["minutes"] == 0.04 and result["out"] == str(out)
    runs = result["runs"]
    assert [(r["name"], r["settings"]) for r in runs] == [("01-tiny", "lr=0.002"), ("02-tiny", "lr=0.003")]
    for r in runs:
        assert (Path(r["run_dir"]) / "summary.json").is_file()
        assert r["budget_seconds"] == 2.4 and r["stopped_by"] == "budget" and r["train_seconds"] >= 2.4
        assert r["steps"] > 0 and r["tokens_per_s"] > 0 and r["valid_every_steps"] == 5
        assert all(math.isfinite(r[k]) for k in ("final_valid_bpc", "best_valid_bpc", "test_bpc"))
        curve = r["valid_curve"]
        assert curve and curve[-1]["bpc"] == r["final_valid_bpc"] and curve[-1]["step"] == r["steps"]
        assert [p["seconds"] for p in curve] == sorted(p["seconds"] for p in curve)
        assert min(p["bpc"] for p in curve) == r["best_valid_bpc"]

    again = run(command)  # never into an existing folder
    assert again.returncode == 2 and "exists" in again.stderr
