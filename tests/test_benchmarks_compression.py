"""benchmarks/compressors.py runs as a real process on a few KB: every compressor's row,
round trips verified, the JSON and the plot (speed is never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import SMALL, SUBPROCESS_ENV
from sharnn import SHARNN
from sharnn.checkpoint import write_checkpoint
from sharnn.config import load_config

ROOT = Path(__file__).resolve().parent.parent
TINY_ONLINE = ["model.d_model=32", "model.boom_dim=64", "model.attention_span=48", "bptt=16"]
BASELINES = {"gzip -9", "bzip2 -9", "xz -9e", "zstd -19"}

pytestmark = pytest.mark.slow  # runs the benchmark scripts as real processes


def test_compression_benchmark_runs_and_writes_json_and_plot(tmp_path):
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    checkpoint = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out, png = tmp_path / "result.json", tmp_path / "result.png"
    command = [
        sys.executable,
        ROOT / "benchmarks" / "compressors.py",
        "--files",
        "enwik8-head-test",
        "--limit",
        "3000",
        "--model",
        checkpoint,
        "--streams",
        "1",
        "4",
        "--json",
        out,
        "--plot",
        png,
        *TINY_ONLINE,
    ]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "compress B/s" in done.stdout and "bits/byte" in done.stdout
    assert "sharnn online B=8" in done.stderr  # one progress line per sharnn row

    result = json.loads(out.read_text())
    assert result["files"] == {"enwik8-head-test": 3000}
    assert result["environment"]["device"] == "cpu"
    rows = {row["compressor"]: row for row in result["rows"]}
    assert set(rows) == BASELINES | {"sharnn B=1", "sharnn B=4", "sharnn online B=8"}
    assert len(result["rows"]) == len(rows)
    for row in rows.values():
        assert row["file"] == "enwik8-head-test" and row["bytes"] == 3000
        assert row["size"] > 0 and row["round_trip"] is True
        assert row["bits_per_byte"] == 8 * row["size"] / 3000
        assert row["compress_bytes_per_s"] > 0 and row["decompress_bytes_per_s"] > 0
    for name in BASELINES:
        assert rows[name]["repeats"] == 3
    for name in ("sharnn B=1", "sharnn B=4", "sharnn online B=8"):
        assert rows[name]["repeats"] == 1 and 0 < rows[name]["header_bytes"] < rows[name]["size"]
    assert png.stat().st_size > 0


def test_online_settings_benchmark_reports_each_setting_against_xz(tmp_path):
    out = tmp_path / "result.json"
    settings = [" ".join(["2", *TINY_ONLINE]), " ".join(["1", *TINY_ONLINE, "lr=0.001"])]
    command = [sys.executable, ROOT / "benchmarks" / "online_settings.py", "--bytes", "1500", "--json", out, *settings]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["streams"] for row in rows] == [None, 2, 1]
    assert rows[0]["settings"] == "xz -9e" and rows[2]["settings"].endswith("lr=0.001")
    assert all(row["bits_per_byte"] > 0 for row in rows)
    assert all(row["bytes_per_s"] > 0 for row in rows[1:])
