"""benchmarks/compressors.py runs as a real process on a few KB: every compressor's row,
round trips verified, the JSON and the plot, and the per-position section of the
inference step against its floor (speed is never asserted)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyppmd
import pytest
import torch

from helpers import SMALL, SUBPROCESS_ENV
from sharnn import SHARNN
from sharnn.coding.codec import fold_line_ends
from sharnn.coding.environment import BF16_PRODUCTS, cpu_features
from sharnn.config import load_config
from sharnn.models.step import ONEDNN
from sharnn.training.checkpoint import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TINY_ONLINE = ["model.d_model=32", "model.boom_dim=64", "model.attention_span=48", "bptt=16"]
BASELINES = {"gzip -9", "bzip2 -9", "xz -9e", "zstd -19"}

pytestmark = pytest.mark.slow  # runs the benchmark scripts as real processes


@pytest.fixture(scope="module")
def compression_run(tmp_path_factory):
    """One run of benchmarks/compressors.py on 3,000 bytes with a tiny model (d 32),
    per position at B = 1 and 8: ``(the finished process, its JSON, the plot's path)``."""
    tmp_path = tmp_path_factory.mktemp("compressors")
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
        "--batch",
        "1",
        "8",
        "--positions",
        "3",
        "--repeats",
        "2",
        "--json",
        out,
        "--plot",
        png,
        *TINY_ONLINE,
    ]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text()), png


def test_compression_benchmark_runs_and_writes_json_and_plot(compression_run):
    done, result, png = compression_run
    assert "compress B/s" in done.stdout and "bits/byte" in done.stdout
    assert "sharnn online B=8" in done.stderr  # one progress line per sharnn row

    assert result["files"] == {"enwik8-head-test": 3000}
    assert result["environment"]["device"] == "cpu"
    rows = {row["compressor"]: row for row in result["rows"]}
    model_rows = {f"sharnn B={b} {p}" for b in (1, 4) for p in ("integer", "fp32")}
    assert set(rows) == BASELINES | model_rows | {"sharnn online B=8"}
    assert len(result["rows"]) == len(rows)
    for row in rows.values():
        assert row["file"] == "enwik8-head-test" and row["bytes"] == 3000
        assert row["size"] > 0 and row["round_trip"] is True
        assert row["bits_per_byte"] == 8 * row["size"] / 3000
        assert row["compress_bytes_per_s"] > 0 and row["decompress_bytes_per_s"] > 0
    for name in BASELINES:
        assert rows[name]["repeats"] == 3
    for name in (*model_rows, "sharnn online B=8"):
        assert rows[name]["repeats"] == 1 and 0 < rows[name]["header_bytes"] < rows[name]["size"]
    sizes = {t["target"]: t for t in result["size_targets"]}
    assert set(sizes) == {f"enwik8-head-test B={b} integer <= 1.01x fp32 size" for b in (1, 4)}
    for name, target in sizes.items():
        compressor = name.split()[1] + " integer"
        ratio = rows[f"sharnn {compressor}"]["size"] / rows[f"sharnn {compressor[:-8]} fp32"]["size"]
        assert target["measured"] == ratio and target["pass"] is (ratio <= 1.01)
    assert png.stat().st_size > 0


def test_per_position_section_times_every_path_against_the_floor(compression_run):
    done, result, _ = compression_run
    bf16 = bool(set(BF16_PRODUCTS) & set(cpu_features()))
    paths = ["floor", *["floor onednn"] * ONEDNN, "forward", "step fp32", "step integer"]
    paths += [*["step bf16"] * bf16, "generate"]
    table = re.findall(r"^(\d+) +(\w+(?: \w+)?) +([\d.]+) +([\d,]+) +([\d.]+)$", done.stdout, re.MULTILINE)
    assert [(int(b), path) for b, path, *_ in table] == [(b, path) for b in (1, 8) for path in paths]
    assert ("no step bf16 rows" in done.stdout) is not bf16
    assert "per position: B=8 ..." in done.stderr

    section = result["per_position"]
    assert section.keys() == {
        "environment", "model", "batch", "positions", "repeats", "warmup", "bf16_skipped", "rows", "targets"
    }  # fmt: skip
    assert section["environment"]["threads"] == 1 and section["environment"]["cpu_features"] == cpu_features()
    assert section["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert section["model"]["d_model"] == 32 and section["model"]["n_layers"] == 2
    assert (section["batch"], section["positions"], section["repeats"]) == ([1, 8], 3, 2)
    assert section["warmup"] == 49 and (section["bf16_skipped"] is None) is bf16
    assert [(row["batch"], row["path"]) for row in section["rows"]] == [(b, path) for b in (1, 8) for path in paths]
    for row in section["rows"]:
        assert row["ms_per_position"] > 0 and row["floor_ratio"] > 0
        assert row["bytes_per_s"] == pytest.approx(1000 * row["batch"] / row["ms_per_position"])
        assert row["path"] != "floor" or row["floor_ratio"] == 1

    targets = {t["target"]: t for t in section["targets"]}
    assert set(targets) == {
        "step fp32 B=8 <= 0.8x fp32 floor",
        "generate B=1 <= 1.1x step fp32",
        "generate B=8 <= 1.1x step fp32",
        "step integer B=8 <= 1.0x step fp32",
    }
    for name, target in targets.items():
        assert target["measured"] > 0 and target["pass"] is (target["measured"] <= float(name.split("<= ")[1][:3]))
        assert re.search(rf"^  {re.escape(name)} +measured +[\d.]+ x  (PASS|FAIL)$", done.stdout, re.MULTILINE)


def test_per_position_section_skips_bf16_with_a_note_on_a_cpu_without_it(monkeypatch, capsys):
    import compressors

    monkeypatch.setattr(compressors, "cpu_features", lambda: ["avx2", "avx512f"])
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    section = compressors.measure_positions(SHARNN(config.model), [32], positions=2, repeats=1)
    compressors.print_positions(section)
    out = capsys.readouterr().out
    note = "this CPU has no bf16 instructions (avx512_bf16 or amx_bf16; it has avx2 avx512f)"
    assert section["bf16_skipped"] == note and f"note: {note}: no step bf16 rows" in out
    assert [row["path"] for row in section["rows"]] == [
        "floor", *["floor onednn"] * ONEDNN, "forward", "step fp32", "step integer", "generate"
    ]  # fmt: skip
    assert [t["target"] for t in section["targets"]] == [
        "step fp32 B=32 <= 1.2x fp32 floor",
        "generate B=32 <= 1.1x step fp32",
        "step integer B=32 <= 1.0x step fp32",
    ]


def test_online_settings_benchmark_reports_each_setting_against_xz_and_resumes(tmp_path):
    out, results = tmp_path / "result.json", tmp_path / "results.jsonl"
    settings = [" ".join(["2", *TINY_ONLINE]), " ".join(["1", *TINY_ONLINE, "lr=0.001"])]
    script = ROOT / "benchmarks" / "online_settings.py"

    def run(*settings: str) -> list[dict]:
        command = [sys.executable, script, "--bytes", "600", "--results", results, "--json", out, *settings]
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=99)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(out.read_text())["rows"]

    rows = run(*settings)
    assert [row["streams"] for row in rows] == [None, 2, 1]
    assert rows[0]["setting"] == "xz -9e" and rows[2]["setting"].endswith("lr=0.001")
    assert all(row["bits_per_byte"] > 0 for row in rows)
    assert all(row["compress_bytes_per_s"] > 0 and row["decompress_bytes_per_s"] > 0 for row in rows[1:])
    assert all(row["file"] == "enwik8-head-test" and row["bytes"] == 600 for row in rows[1:])
    # a second search with one more setting runs only that one: the others are read back
    third = " ".join(["1", *TINY_ONLINE, "bptt=8"])
    again = run(*settings, third)
    assert again[:3] == rows and again[3]["setting"] == third
    assert [json.loads(line)["setting"] for line in results.read_text().splitlines()] == [*settings, third]


@pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear")
def test_the_onednn_floor_computes_what_the_floor_computes():
    import compressors

    torch.manual_seed(0)
    model = SHARNN(load_config("tiny", SMALL).model)
    floor, onednn = (compressors.floor_position(model, 4, onednn=flag) for flag in (False, True))
    tokens = torch.zeros(4, dtype=torch.int64)
    for _ in range(3):  # the LSTM state carried from call to call
        expected, got = floor(tokens), onednn(tokens)
    assert got.shape == (4, 256)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_coding_threads_benchmark_times_each_thread_count_quiet_and_beside_a_neighbour(tmp_path):
    out = tmp_path / "threads.json"
    script = ROOT / "benchmarks" / "coding_threads.py"
    command = [sys.executable, script, "--batch", "2", "--threads", "1", "2", "--positions", "2", "--repeats", "1"]
    done = subprocess.run(
        [str(c) for c in [*command, "--json", out]], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    rows = [(row["condition"], row["batch"], row["threads"]) for row in result["rows"]]
    assert rows == [("quiet", 2, 1), ("quiet", 2, 2), ("neighbour", 2, 1), ("neighbour", 2, 2)]
    for row in result["rows"]:
        assert row["ms_per_position"] > 0 and row["bytes_per_s"] == pytest.approx(2000 / row["ms_per_position"])
        assert row["threads"] != 1 or row["vs_first"] == 1
    assert re.search(r"^neighbour +2 +2 +[\d.]+ +[\d,]+ +[\d.]+$", done.stdout, re.MULTILINE)


def test_integer_formats_benchmark_costs_each_piece_against_the_integer_step(tmp_path):
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    checkpoint = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out = tmp_path / "formats.json"
    script = ROOT / "benchmarks" / "integer_formats.py"
    command = [sys.executable, script, "--model", checkpoint, "--bytes", "300", "--streams", "3", "--json", out]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["variant"]: row for row in json.loads(out.read_text())["rows"]}
    pieces = ["products", "layer norms", "tables", "attention", "output softmax"]
    assert list(rows) == ["fp32 step", "integer step", *(f"integer, {piece} in float" for piece in pieces)]
    integer = rows["integer step"]["bits_per_byte"]
    assert 0 < integer < 12 and abs(integer - rows["fp32 step"]["bits_per_byte"]) < 0.05
    for piece in pieces:
        row = rows[f"integer, {piece} in float"]
        assert row["cost_of_the_piece"] == pytest.approx(integer - row["bits_per_byte"])
    assert rows["fp32 step"]["cost_of_the_piece"] is None and "cost of the piece" in done.stdout


def test_integer_products_benchmark_checks_the_kernels_agree_and_times_each(tmp_path):
    out = tmp_path / "products.json"
    script = ROOT / "benchmarks" / "integer_products.py"
    command = [sys.executable, script, "--streams", "2", "--calls", "1", "--repeats", "1", "--json", out]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["product"] for row in rows] == [
        "lstm gates [2048, 1024]",
        "boom [2048, 512]",
        "query [512, 512]",
        "output [256, 512]",
    ]
    for row in rows:
        assert row["streams"] == 2 and row["int8_vs_fp32"] == pytest.approx(row["int8_us"] / row["fp32_us"])


def test_integer_step_speed_benchmark_times_every_contender(tmp_path):
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    checkpoint = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out = tmp_path / "speed.json"
    script = ROOT / "benchmarks" / "integer_step_speed.py"
    options = ["--model", checkpoint, "--streams", "1", "3", "--positions", "2", "--repeats", "1", "--warmup", "2"]
    command = [sys.executable, script, *options, "--json", out]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert [row["streams"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        for name in ("spec", "integer", "fp32 products", "integer products", "cold products"):
            assert row[f"{name}_ms"] > 0 and row[f"{name}_vs_fp32"] == pytest.approx(row[f"{name}_ms"] / row["fp32_ms"])
        assert row["cold_vs_warm"] == pytest.approx(row["cold products_ms"] / row["integer products_ms"])
    assert result["kernels_compile_or_load_s"] >= 0 and "integer/fp32" in done.stdout


def test_adaptive_mixing_benchmark_gives_every_variant_and_ppmd(tmp_path):
    config = load_config("tiny", SMALL)
    torch.manual_seed(0)
    checkpoint = write_checkpoint(tmp_path / "ckpt", config, {"model": SHARNN(config.model).state_dict()})
    out, table = tmp_path / "mixing.json", tmp_path / "mixing.md"
    script = ROOT / "benchmarks" / "adaptive_mixing.py"
    command = [sys.executable, script, "--model", checkpoint, "--limit", "800", "--json", out, "--markdown", table]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    alice = fold_line_ends((ROOT / "benchmarks" / "data" / "canterbury" / "alice29.txt").read_bytes())[0][:800]
    assert row["file"] == "alice29" and row["bytes"] == 800
    assert row["PPMd"] == 8 * len(pyppmd.compress(alice, variant="H", max_order=8, mem_size=16 << 20)) / 800
    variants = [
        "one mixer, model start",
        "two mixers, model start",
        "mixing 1",
        "+ match",
        "+ APMs",
        "mixing 2",
        "mixing 3",
        "mixing 3, 8 slots a byte",
        "mixing 3, the whole table",
    ]
    assert all(0 < row[v] < row["model alone"] for v in variants)  # an untrained model: the counts help at once
    assert "| alice29 | 800 |" in table.read_text()


def test_mixing_speed_benchmark_times_the_kernels_and_numpy_alike(tmp_path):
    out = tmp_path / "mixing.json"
    script = ROOT / "benchmarks" / "mixing_speed.py"
    command = [sys.executable, script, "--streams", "1", "3", "--positions", "40", "--repeats", "1", "--json", out]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["streams"], row["positions"]) for row in rows] == [(1, 40), (3, 40)]
    for row, run in [(row, run) for row in rows for run in ("first", "again")]:
        assert row[f"speedup_{run}"] == pytest.approx(row[f"numpy_{run}_us"] / row[f"kernels_{run}_us"])
    assert "kernels again" in done.stdout


def test_mixing_speed_benchmark_refuses_kernels_of_other_bits(monkeypatch, capsys):
    import mixing_speed

    class Rounded(mixing_speed.mixing.AdaptiveMixer):
        def mix(self, model_log_weights):
            return super().mix(model_log_weights).astype(np.float32).astype(np.float64)

    monkeypatch.setitem(mixing_speed.IMPLEMENTATIONS, "kernels", Rounded)
    with pytest.raises(SystemExit) as stopped:
        mixing_speed.measure(streams=2, rows=5, repeats=1)
    assert stopped.value.code == 1 and "differ" in capsys.readouterr().err
