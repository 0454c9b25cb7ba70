"""benchmarks/ablations.py (docs/ablations.md): its statistics, the grid's checks and the
bundled grid and presets, then the real script on tiny grids (a model of width 16 for a
second or a few, on a small cut of the enwik8 head): a grid run to the end and reported,
a row's test BPC reproduced by its own command, a harness killed with -9 in the middle
and run again, and two harnesses started together on one grid. Speed is never asserted."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import ablations as ab  # benchmarks/ablations.py, through pyproject's pythonpath
from helpers import SUBPROCESS_ENV, assert_ok, cli, metrics, wait_for, write_small_corpus
from sharnn.config import TrainConfig, load_config
from sharnn.models.build import parameter_count

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ablations.py"

TINY_PRESET = {
    "model": {"d_model": 16, "n_layers": 2, "boom_dim": 32, "attention_span": 32},
    "bptt": 16,
    "train_streams": 4,
    "valid_streams": 4,
    "test_streams": 2,
    "epochs": 100,
    "warmup_steps": 5,
    "lr_halve_epochs": [],
    "valid_every_steps": 10,
    "checkpoint_every_steps": 10,
    "log_every_steps": 5,
    "sample_bytes": 0,
}


def tiny_grid(tmp_path: Path, seconds: float, seeds: list[int], variants: list[dict] | None = None) -> Path:
    """A grid file of the tiny preset (written beside it) on a small corpus."""
    corpus = write_small_corpus(tmp_path / "small.txt", 30_000)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(TINY_PRESET | {"data": str(corpus)}))
    if variants is None:
        variants = [
            {"name": "single-head", "overrides": []},
            {"name": "no-attention", "overrides": ["model.attention=none"]},
        ]
    grid = {"preset": str(preset), "seconds": seconds, "threads": 1, "seeds": seeds, "baseline": "single-head"}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid | {"variants": variants}))
    return path


def harness(*args) -> list[str]:
    return [sys.executable, SCRIPT, *[str(a) for a in args]]


def run(command: list, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=timeout
    )


def started(stderr: str) -> list[str]:
    """The runs a harness started or resumed, from its progress lines."""
    return [
        line.split("] ", 1)[1].split(":")[0]
        for line in stderr.splitlines()
        if ": starting in" in line or ": resuming" in line
    ]


# ----------------------------------------------------------------------------- pure parts


def test_intervals_are_students_and_welchs():
    mean, half = ab.mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)  # t(0.975, 2) * s / sqrt(n)
    assert ab.mean_interval([1.5]) == (1.5, None)
    # Welch: squared standard errors 1/3 and 2/2; Welch-Satterthwaite df = (4/3)^2 / ((1/3)^2/2 + 1^2/1)
    from scipy import stats

    difference, half = ab.difference_interval([1.0, 2.0, 3.0], [4.0, 6.0])
    df = (4 / 3) ** 2 / ((1 / 3) ** 2 / 2 + 1)
    assert difference == -3.0 and half == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(4 / 3))
    assert ab.difference_interval([1.0, 1.0], [2.0, 2.0]) == (-1.0, 0.0)
    assert ab.difference_interval([1.0], [2.0, 3.0]) == (-1.5, None)


def test_paired_intervals_take_differences_seed_by_seed_and_say_the_seeds_a_target_needs():
    from scipy import stats

    a, b = {1: 2.0, 2: 2.5, 3: 2.4, 4: 9.0}, {1: 1.9, 2: 2.3, 3: 2.4, 5: 0.0}  # seeds 4 and 5 unpaired
    difference, half = ab.paired_interval(a, b)  # differences 0.1, 0.2, 0.0
    assert difference == pytest.approx(0.1) and half == pytest.approx(stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3))
    assert ab.paired_interval({1: 2.0}, {1: 1.5}) == (0.5, None)
    assert ab.paired_interval({1: 2.0}, {2: 1.0}) == (None, None)
    n = ab.seeds_for(a, b, half_width=0.05)  # the spread of the differences is 0.1

    def half_width(seeds):
        return stats.t.ppf(0.975, seeds - 1) * 0.1 / math.sqrt(seeds)

    assert half_width(n) <= 0.05 < half_width(n - 1) and n == 18
    assert ab.seeds_for(a, b) > n  # the default target, ±0.03, asks for more
    assert ab.seeds_for({1: 2.0, 2: 3.0}, {1: 1.0, 2: 2.0}) == 2  # no spread
    assert ab.seeds_for({1: 2.0}, {1: 1.0}) is None


def test_the_final_slope_is_the_last_thirds_least_squares_line_in_bpc_per_100_s():
    falling = [[s, 3.0 - 0.001 * s, step] for step, s in enumerate(range(0, 901, 100))]
    assert ab.final_slope(falling) == pytest.approx(-0.1)  # 0.001 BPC/s
    bent = falling[:6] + [[600.0 + s, 2.4 - 0.0002 * s, 0] for s in (100, 200, 300)]  # flatter from 600 s
    assert ab.final_slope(bent) == pytest.approx(-0.02)  # the points at 600 s and after: the last third
    assert ab.final_slope(falling[:2]) is None and ab.final_slope([]) is None
    rows = [
        {"variant": "v", "seed": seed, "group": None, "test_bpc": 1.0, "valid_bpc": 1.0, "curve": curve}
        | {"parameters": 1, "steps": 1, "tokens_per_second": 1.0}
        for seed, curve in ((1, falling), (2, bent), (3, falling[:2]))
    ]
    (variant,) = ab.per_variant(rows, "v")
    assert variant["slope"] == pytest.approx(-0.06)  # seeds 1 and 2; seed 3 has too few points
    assert ab.markdown([variant], "v").splitlines()[-1].endswith("| -0.0600 |")


def test_valid_at_interpolates_between_validations_and_stops_at_the_last():
    curve = [[10.0, 3.0, 100], [20.0, 2.0, 200], [25.0, 1.8, 250]]
    assert ab.valid_at(curve, 150) == pytest.approx(2.5) and ab.valid_at(curve, 240) == pytest.approx(1.84)
    assert ab.valid_at(curve, 100) == 3.0 and ab.valid_at(curve, 250) == 1.8
    assert ab.valid_at(curve, 99) is None and ab.valid_at(curve, 251) is None and ab.valid_at([], 1) is None
    assert ab.valid_at([[5.0, 2.0, 7]], 7) == 2.0


def test_equal_compute_compares_each_variant_at_the_steps_its_quiet_speed_buys(tmp_path):
    def row(variant, seed, last, slope):  # valid BPC 4 - slope * step / 100, validated every 100 steps and at the end
        steps = [*range(100, last, 100), last]
        curve = [[float(s), 4 - slope * s / 100, s] for s in steps]
        return {"variant": variant, "seed": seed, "test_bpc": 1.0, "curve": curve, "preset": "ablation-small"} | {
            "overrides": ["bptt=64", f"seed={seed}"]
        }

    rows = [row("base", 1, 1000, 0.1), row("base", 2, 1200, 0.1), row("fast", 1, 1800, 0.05)]
    rows += [row("fast", 2, 1500, 0.06), row("slow", 1, 450, 0.2), row("slow", 2, 500, 0.2)]
    rows.append(row("base", 3, 1100, 0.1) | {"test_bpc": None})  # diverged: not scored
    speeds = {"base": 100.0, "fast": 150.0, "slow": 50.0, "other": 7.0}
    compared = ab.equal_compute(rows, "base", speeds)
    # in baseline steps the runs reach 1000, 1200; 1800 / 1.5, 1500 / 1.5; 450 / 0.5, 500 / 0.5: at most 900 for all
    assert compared["budget_steps"] == 900
    streams = load_config("ablation-small").train_streams
    assert compared["budget_seconds"] == pytest.approx(900 * 64 * streams / 100)  # tokens a step, over tokens/s
    entries = {v["variant"]: v for v in compared["variants"]}
    assert (entries["fast"]["steps"], entries["slow"]["steps"]) == (1350, 450) and entries["fast"]["speed"] == 1.5
    assert entries["base"]["valid_bpc"] == pytest.approx(3.1) and entries["base"]["paired_difference"] is None
    assert entries["fast"]["valid_bpc"] == pytest.approx(4 - (0.675 + 0.81) / 2)  # seeds 1 and 2 at step 1350
    assert entries["fast"]["paired_difference"] == pytest.approx((0.225 + 0.09) / 2)  # against 3.1 each
    assert entries["slow"]["paired_difference"] == pytest.approx(0.0) and entries["slow"]["paired_ci"] == 0.0
    table = ab.equal_compute_markdown(compared, "base")
    assert table.startswith(f"At equal compute: 900 steps of base (about {576 * streams:,} s at its quiet speed)")
    assert "| fast | 150 | 1.500 | 1,350 | 3.2575 | +0.1575 ± " in table and "| base | 100 | 1.000 | 900 |" in table
    assert ab.equal_compute([rows[-1]], "base", speeds) is None

    path = tmp_path / "speeds.json"
    path.write_text(json.dumps({"variants": [{"variant": k, "tokens_per_second": v} for k, v in speeds.items()]}))
    assert ab.read_speeds(path, ["base", "fast"]) == speeds
    with pytest.raises(ab.GridError, match="has no speed for missing"):
        ab.read_speeds(path, ["base", "missing"])
    path.write_text("{}")
    with pytest.raises(ab.GridError, match="not a result of benchmarks/variant_speeds"):
        ab.read_speeds(path, ["base"])


def test_report_rows_per_variant_with_the_best_of_a_sweep():
    def row(variant, seed, test, valid, group=None, curve=()):
        return {"variant": variant, "seed": seed, "group": group, "test_bpc": test, "valid_bpc": valid, "curve": curve}

    rows = [
        row("base", 1, 1.0, 1.1, curve=[[9.0, 2.0, ab.AT_STEP]])
        | {"parameters": 10, "steps": 5, "tokens_per_second": 100.0},
        row("base", 2, 1.2, 1.3, curve=[[8.0, 2.5, ab.AT_STEP], [9.0, 2.4, ab.AT_STEP + 1]])
        | {"parameters": 10, "steps": 7, "tokens_per_second": None},
        row("lr-a", 1, 1.5, 1.4, "sweep", curve=[[9.5, 2.3, ab.AT_STEP]])
        | {"parameters": 8, "steps": 4, "tokens_per_second": 50.0},
        row("lr-b", 1, 1.6, 1.2, "sweep") | {"parameters": 8, "steps": 4, "tokens_per_second": 50.0},
    ]
    variants = {v["variant"]: v for v in ab.per_variant(rows, "base")}
    assert variants["base"]["test_bpc"] == pytest.approx(1.1) and variants["base"]["difference"] is None
    assert variants["base"]["steps"] == 6 and variants["base"]["tokens_per_second"] == 100.0
    assert variants["lr-a"]["difference"] == pytest.approx(0.4) and variants["lr-a"]["difference_ci"] is None
    assert variants["lr-b"]["best_of"] == "sweep" and variants["lr-a"]["best_of"] is None
    text = ab.markdown(list(variants.values()), "base")
    assert variants["base"]["valid_at_step"] == pytest.approx(2.25) and variants["lr-b"]["valid_at_step"] is None
    assert variants["lr-a"]["step_difference"] == pytest.approx(0.3) and variants["lr-b"]["step_difference"] is None
    later = {v["variant"]: v for v in ab.per_variant(rows, "base", at_step=ab.AT_STEP + 1)}
    assert later["base"]["valid_at_step"] is None and later["lr-a"]["step_difference"] is None  # seed 1 never got there
    assert "| valid BPC at step 301 | at step 301, paired (95% CI) |" in ab.markdown(list(later.values()), "base")
    assert (
        "| base | 2 | 1.1000 ± 1.2706 | baseline | baseline | 1.2000 | 2.2500 | baseline | 10 | 6 | 100 | - | - | - |"
        in text
    )
    assert "| lr-a (sweep) | 1 | 1.5000 | +0.4000 | +0.5000 | 1.4000 | 2.3000 | +0.3000 |" in text  # paired: seed 1
    assert "The lr sweep sweep: best by mean valid BPC is lr-b (1.2000)." in text


def test_the_bundled_grid_and_presets():
    grid = ab.read_grid(ab.GRID)
    assert grid.seconds == 300 and grid.threads == 1 and grid.baseline == "single-head"
    variants = list(dict.fromkeys(r.variant for r in grid.runs))
    assert variants[:9] == [
        "single-head",
        "no-attention",
        "every-block",
        "ln-lstm",
        "vector-gate",
        "mlp",
        "no-min-trust",
        "adamw",
        "transformer",
    ]
    sweep = [r for r in grid.runs if r.group == "transformer-lr"]
    assert len({r.variant for r in sweep}) == 3 and {r.preset for r in sweep} == {"ablation-transformer"}
    for r in sweep:
        config = load_config(r.preset, list(r.overrides))
        assert config.min_lr == pytest.approx(config.lr / 10)
    ungrouped = {r.variant for r in grid.runs if r.group is None}
    assert {r.seed for r in grid.runs} == {1, 2, 3} and len(grid.runs) == 3 * len(ungrouped) + len(sweep)
    assert [r.seed for r in grid.runs[:12]] == [1] * 12, "round by round: every variant's seed 1 first"
    baseline = load_config("ablation-small", ["seed=1"])
    assert baseline.model.to_dict() == load_config("ablation-small").model.to_dict()
    assert load_config("ablation-transformer").model.architecture == "transformer"


@pytest.mark.slow  # a few seconds: out of the working loop
def test_the_paper_scale_grid_loads_with_the_same_variants():
    """benchmarks/ablations-paper.yaml (docs/ablations.md) plans the small grid's variants
    at the paper's sizes, its Transformer within 3% of the SHA-RNN's parameters."""
    small, paper = ab.read_grid(ab.GRID), ab.read_grid(ab.GRID.with_name("ablations-paper.yaml"))
    ungrouped = {r.variant for r in small.runs if r.group is None}
    assert {r.variant for r in paper.runs} == ungrouped
    models = {r.variant: ab.planned_config(r, paper.seconds).model for r in paper.runs}
    sha_rnn, transformer = parameter_count(models["single-head"]), parameter_count(models["transformer"])
    assert models["single-head"].d_model == 1024 and abs(transformer / sha_rnn - 1) < 0.03
    defaults = dataclasses.asdict(TrainConfig())
    for name in ("ablation-small", "ablation-transformer"):  # presets state only their differences
        mapping = yaml.safe_load((ROOT / "src" / "sharnn" / "presets" / f"{name}.yaml").read_text())
        repeated = [k for k, v in mapping.items() if k != "model" and defaults[k] == v]
        repeated += [k for k, v in mapping["model"].items() if defaults["model"][k] == v]
        assert not repeated, (name, repeated)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"colour": "red"}, "unknown keys ['colour']"),
        ({"baseline": "nothing"}, "the baseline 'nothing' is not a variant"),
        ({"seeds": [1, 1]}, "seeds must be a list of distinct integers"),
        (
            {"variants": [{"name": "single-head", "overrides": ["seed=3"]}]},
            "single-head: seed is set by the grid's seeds",
        ),
        (
            {"variants": [{"name": "single-head", "overrides": ["model.d_model=-1"]}]},
            "single-head-seed1: model.d_model",
        ),
        ({"variants": [{"name": "a/b"}]}, "needs a name of letters"),
    ],
)
def test_a_bad_grid_is_one_line_error(tmp_path, capsys, change, fragment):
    path = tiny_grid(tmp_path, 1, [1])
    grid = yaml.safe_load(path.read_text()) | change
    path.write_text(yaml.safe_dump(grid))
    assert ab.main(["--grid", str(path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and fragment in line, line
    assert not (tmp_path / "out").exists()


def test_bad_selections_are_one_line_errors(tmp_path, capsys):
    path = tiny_grid(tmp_path, 1, [1])
    for options, fragment in (
        (["--only", "nope"], "--only names no variant"),
        (["--seeds", "7"], "no run of the grid"),
    ):
        assert ab.main(["--grid", str(path), "--out", str(tmp_path / "out"), *options]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("error: ") and fragment in line, line


# ----------------------------------------------------------------------------- the real script


@pytest.mark.slow
def test_a_grid_runs_to_the_end_reports_and_each_row_reproduces(tmp_path, capsys):
    grid, out = tiny_grid(tmp_path, 1, [1, 2]), tmp_path / "out"
    markdown, result, png = tmp_path / "table.md", tmp_path / "ablations.json", tmp_path / "ablations.png"
    done = run(harness("--grid", grid, "--out", out, "--markdown", markdown, "--json", result, "--plot", png))
    assert done.returncode == 0, done.stderr
    assert sorted(started(done.stderr)) == sorted(
        f"{v}-seed{s}" for v in ("single-head", "no-attention") for s in (1, 2)
    )
    assert "[4/4 runs done, ~0:00 left]" in done.stderr and "test BPC ± 95% CI" in done.stdout
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["variant"], r["seed"]) for r in rows] == [  # round by round
        ("single-head", 1),
        ("no-attention", 1),
        ("single-head", 2),
        ("no-attention", 2),
    ]
    for r in rows:
        assert r["preset"] == str(tmp_path / "tiny.yaml") and r["overrides"][-1] == f"seed={r['seed']}"
        assert r["steps"] > 0 and r["train_seconds"] >= 1 and r["threads"] == 1 and r["tokens_per_second"] > 0
        assert r["parameters"] > 0 and math.isfinite(r["valid_bpc"]) and math.isfinite(r["test_bpc"])
        assert (
            r["curve"] and r["curve"][-1][1] >= r["valid_bpc"] and all(s <= r["train_seconds"] for s, *_ in r["curve"])
        )
    assert "model.attention=none" in rows[1]["overrides"]
    table = markdown.read_text().splitlines()
    assert table[0] == (
        "| variant | seeds | test BPC (95% CI) | vs single-head (95% CI) | paired by seed (95% CI) | valid BPC "
        "| valid BPC at step 300 | at step 300, paired (95% CI) | parameters | steps | tokens/s | seeds for ±0.03 "
        "| the same at step 300 | BPC per 100 s, last third |"
    )
    no_attention = table[3].split(" | ")
    assert no_attention[0] == "| no-attention" and " ± " in no_attention[2] and no_attention[3].startswith(("+", "-"))
    published = json.loads(result.read_text())  # --json: what results/ablations.json holds, without local folders
    assert published["runs"] == [{k: v for k, v in r.items() if k != "run_dir"} for r in rows]
    assert published["grid"] == "grid.yaml" and png.stat().st_size > 0

    capsys.readouterr()
    again = tmp_path / "again.json"  # --report: from the finished runs alone, nothing runs
    assert (
        ab.main(["--grid", str(grid), "--out", str(out), "--report", "--only", "no-attention", "--json", str(again)])
        == 0
    )
    assert started(capsys.readouterr().err) == []
    no_attention_rows = [{k: v for k, v in r.items() if k != "run_dir"} for r in rows[1::2]]
    assert json.loads(again.read_text())["runs"] == no_attention_rows

    speeds = tmp_path / "speeds.json"  # each variant's speed, quiet, then the runs compared at equal compute
    script = ROOT / "benchmarks" / "variant_speeds.py"
    measured = run([sys.executable, script, "--grid", grid, "--steps", "1", "--repeats", "2", "--json", speeds])
    assert measured.returncode == 0, measured.stderr
    speed_rows = json.loads(speeds.read_text())["variants"]
    assert [r["variant"] for r in speed_rows] == ["single-head", "no-attention"] and speed_rows[0]["vs_baseline"] == 1
    assert all(len(r["samples"]) == 2 and r["tokens_per_second"] > 0 for r in speed_rows)
    table, figure = tmp_path / "equal.md", tmp_path / "equal.png"
    options = ["--speeds", speeds, "--markdown", table, "--plot", figure]
    assert ab.main(["--grid", str(grid), "--out", str(out), "--report", *map(str, options)]) == 0
    assert "| variant | quiet tokens/s | speed vs single-head | steps | valid BPC |" in table.read_text()
    assert figure.stat().st_size > 0  # the curves against the seconds at each variant's quiet speed
    assert ab.main(["--grid", str(grid), "--out", str(out), "--report", "--speeds", str(grid)]) == 2  # not speeds

    row = rows[0]  # its own command gives its test BPC again
    reproduced = cli(
        "train", "--preset", row["preset"], *row["overrides"], f"max_steps={row['steps']}", "max_seconds=0",
        "--out", tmp_path / "again", "--quiet",
    )  # fmt: skip
    assert_ok(reproduced)
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["steps"] == row["steps"] and round(summary["test_bpc"], 4) == round(row["test_bpc"], 4)


@pytest.mark.slow
def test_killed_with_9_in_the_middle_a_rerun_skips_finished_runs_and_resumes(tmp_path):
    grid, out = tiny_grid(tmp_path, 2, [1, 2], [{"name": "single-head", "overrides": []}]), tmp_path / "out"
    first, second = out / "single-head-seed1", out / "single-head-seed2"
    process = subprocess.Popen(
        [str(c) for c in harness("--grid", grid, "--out", out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    try:
        assert wait_for(lambda: (second / "latest").exists(), process)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    assert (first / "summary.json").is_file()
    finished = (first / "summary.json").stat().st_mtime_ns, (first / "metrics.jsonl").read_text()

    done = run(harness("--grid", grid, "--out", out))
    assert done.returncode == 0, done.stderr
    assert started(done.stderr) == ["single-head-seed2"] and "single-head-seed2: resuming" in done.stderr
    assert ((first / "summary.json").stat().st_mtime_ns, (first / "metrics.jsonl").read_text()) == finished
    records = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    commands = [r["command"] for r in records if r["split"] == "run"]
    assert len(commands) == 2 and "--resume" in commands[1]
    steps = [r["step"] for r in metrics(second) if r["split"] == "train"]
    assert steps == sorted(set(steps)), "the resumed run went on from its checkpoint"
    assert [r["variant"] for r in json.loads((out / "results.json").read_text())["runs"]] == ["single-head"] * 2


@pytest.mark.slow
def test_two_harnesses_on_one_grid_split_it(tmp_path):
    grid, out = tiny_grid(tmp_path, 1, [1, 2, 3], [{"name": "single-head", "overrides": []}]), tmp_path / "out"
    command = [str(c) for c in harness("--grid", grid, "--out", out)]
    processes = [
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[1] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    taken = [started(err) for err in outputs]
    grid_runs = {f"single-head-seed{s}" for s in (1, 2, 3)}
    assert not set(taken[0]) & set(taken[1]) and set(taken[0]) | set(taken[1]) == grid_runs, taken
    for name in grid_runs:  # each started once, never resumed
        records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["split"] for r in records].count("run") == 1 and (out / name / "summary.json").is_file()
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 3


@pytest.mark.slow
def test_a_diverged_run_is_a_result_reported_and_never_retried(tmp_path):
    """A run that diverges (sharnn train's "training diverged") is over: its row says so,
    without scores; the report counts it per variant; a rerun does not start it again."""
    variants = [
        {"name": "single-head", "overrides": []},
        {"name": "blowup", "overrides": ["lr=1000", "clip=0", "warmup_steps=0"]},
    ]
    grid, out = tiny_grid(tmp_path, 2, [1], variants), tmp_path / "out"
    first = run(harness("--grid", grid, "--out", out))
    assert first.returncode == 0, first.stderr
    assert "blowup-seed1: diverged" in first.stderr
    rows = {r["variant"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert rows["blowup"]["diverged"].startswith("error: training diverged")
    assert rows["blowup"]["test_bpc"] is None and rows["blowup"]["steps"] > 0
    assert rows["single-head"]["test_bpc"] > 0 and "diverged" not in rows["single-head"]
    assert "| blowup | 0 (1 diverged) | - |" in first.stdout
    again = run(harness("--grid", grid, "--out", out))
    assert again.returncode == 0 and started(again.stderr) == []


def test_the_span_1024_grid_plans_five_seeds_of_each_variant_at_that_span():
    """benchmarks/ablations-span1024.yaml (docs/ablations.md): the unresolved claims at a span
    of 1,024 (896 positions of memory in front of each window), and the first grid's span of
    256 beside them, five seeds of 900 s, round by round; seven for the paper's model, the
    vector gate and the LN-LSTM."""
    grid = ab.read_grid(ab.GRID.with_name("ablations-span1024.yaml"))
    variants = {r.variant for r in grid.runs}
    assert variants == {"single-head", "no-attention", "every-block", "vector-gate", "ln-lstm", "span-256"}
    assert len(grid.runs) == 36 and grid.seconds == 900
    assert [r.name for r in grid.runs[30:]] == [
        f"{v}-seed{s}" for s in (6, 7) for v in ("single-head", "vector-gate", "ln-lstm")
    ]
    assert [r.variant for r in grid.runs[:6]] == [
        "single-head",
        "no-attention",
        "every-block",
        "vector-gate",
        "ln-lstm",
        "span-256",
    ]
    for run in grid.runs:
        config = ab.planned_config(run, grid.seconds)
        span = 256 if run.variant == "span-256" else 1024
        assert config.model.attention_span == span and config.bptt == 128 and config.max_seconds == 900
