"""The paper's argument, measured (docs/ablations.md): a named grid of variants (a YAML file,
by default benchmarks/ablations.yaml) times seeds, every run the same wall-clock training
budget on the same machine, through the command line, one ``sharnn train`` subprocess per
run.

The grid: ``preset`` (of a variant that names none: a bundled name or a YAML file),
``seconds`` (every run's budget: ``max_seconds=``), ``threads`` (torch threads of every
run: the child's ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``), ``seeds``, ``baseline``
(the variant the differences are taken against) and ``variants``: each a ``name``,
``overrides`` (``key=value``), optional ``preset``, ``seeds`` and ``group`` (the members of
one group are an lr sweep: the report names the best by mean validation BPC).

Run ``NAME-seedS`` is ``sharnn train --preset P OVERRIDES seed=S max_seconds=SECONDS
--out OUT/NAME-seedS``, its output appended to ``OUT/NAME-seedS.log``:

- finished runs (``summary.json``) are skipped, and so are diverged ones (their log ends
  with ``sharnn train``'s "training diverged": a result, which a retry would repeat); an
  unfinished folder is continued with ``sharnn train --resume``, which resumes exactly
  from its last checkpoint; a folder started with another configuration is refused
  (choose another ``--out``);
- a run is claimed first: an OS lock (flock, released by the kernel when the process
  ends, ``kill -9`` too) on ``OUT/NAME-seedS.claim``, taken without waiting, so that
  several harnesses started on one grid, on one machine or on several sharing a file
  system (a SLURM job array), split it: each run is taken by exactly one of them, and a
  run another holds is left to it. The child is told to stop (SIGTERM: it saves) when its
  harness dies, and a resume waits for a stopping child to let go of its folder;
- Ctrl-C or SIGTERM stops the child (SIGTERM: it saves ``latest``) and then the harness
  (exit status 130 or 143); the same command resumes.

Progress for the whole grid goes to stderr (``[k/N runs done, ~H:MM left]``, the time
left for one process at the mean wall time of the runs it ran, else the budget).
``OUT/results.json`` is rewritten after every run (atomically, under a lock): one row per
finished run with ``variant``, ``seed``, ``preset``, ``overrides`` (``seed=S`` included),
``steps``, ``valid_bpc`` (best), ``test_bpc`` (of the best checkpoint), ``parameters``,
``train_seconds`` (summary.json's: the budget's clock, validations included), ``threads``,
``tokens_per_second`` (the tokens trained on, ``epochs`` times the train split, over
``train_seconds``) and ``curve`` (``[seconds, valid BPC]`` of every validation); the row
of a diverged run has ``diverged`` (the error line), its last logged step and no scores
(None). A finished run's row is such that
``sharnn train --preset PRESET OVERRIDES max_steps=STEPS max_seconds=0`` gives the row's
test BPC again on a CPU with the same thread count. Then a table per variant: mean test
BPC with its 95% confidence interval over seeds (Student's t), the difference from the
baseline with its 95% interval (Welch), parameters, steps and tokens/s; its Markdown
(``--markdown``), the JSON (``--json``: the format of results/ablations.json) and a figure
(``--plot``: validation BPC against training seconds, one line per variant, the mean over
seeds with a min-max band). With ``--speeds FILE`` (each variant's training tokens/s,
measured quiet in one run by ``benchmarks/variant_speeds.py``) the report also compares
the variants at equal compute: each run's validation BPC at the step its variant reaches
in the baseline's time at those speeds, paired by seed (:func:`equal_compute`), which
takes the machine's day out of a wall-clock budget.

    python benchmarks/ablations.py                       # the whole grid, resumable
    python benchmarks/ablations.py --only single-head,no-attention --seeds 1
    python benchmarks/ablations.py --report --markdown table.md \\
        --json results/ablations.json --plot results/ablations.png
    python benchmarks/variant_speeds.py --json speeds.json   # then:
    python benchmarks/ablations.py --report --speeds speeds.json

Outputs are checked before any work: ``--out`` must be a folder or not exist yet,
``--json``, ``--markdown`` and ``--plot`` must name files in existing folders, and
``--speeds`` a speeds file with every selected variant's speed.

Exit status 0; 1 when a run failed (the others still run); 2 for a bad grid or option, or
a missing dependency (scipy: ``pip install -e ".[bench]"``); 130 or 143 when interrupted.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml
from filelock import FileLock

from common import environment, missing_extra, print_table
from sharnn.config import config_changes, load_config
from sharnn.data.corpus import load_corpus
from sharnn.errors import SharnnError
from sharnn.files import Lock, LockError, Terminated, sigterm_raises, write_atomically
from sharnn.models.build import parameter_count
from sharnn.training.metrics import read_records
from sharnn.training.run_folder import LOCK_FILE, read_summary

try:
    from scipy import stats
except ModuleNotFoundError as e:  # not a dependency of sharnn itself: the extra "bench" installs it
    missing_extra(e, __name__)

GRID = Path(__file__).resolve().parent / "ablations.yaml"
AT_STEP = 300  # the report's per-step comparison: every variant of the bundled grid gets past it
TARGET_HALF_WIDTH = 0.03  # BPC: the 95% half-width a verdict asks for (docs/ablations.md)
SHARNN = [sys.executable, "-m", "sharnn"]
GRID_KEYS = {"preset", "seconds", "threads", "seeds", "baseline", "variants"}
VARIANT_KEYS = {"name", "overrides", "preset", "seeds", "group"}
HARNESS_KEYS = {"seed": "seeds", "max_seconds": "seconds"}  # set by the grid, refused as overrides
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class GridError(SharnnError):
    """A grid file, an option or a run folder that is not what the grid plans."""


class Stopped(Exception):
    """Ctrl-C or SIGTERM stopped the harness (``code``: its exit status)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


# ----------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Run:
    """One run of the grid: a variant with one seed."""

    variant: str
    seed: int
    preset: str
    overrides: tuple[str, ...]  # the variant's, then seed=S
    group: str | None

    @property
    def name(self) -> str:
        return f"{self.variant}-seed{self.seed}"


@dataclass(frozen=True)
class Grid:
    seconds: float
    threads: int
    baseline: str
    runs: list[Run]  # every run, in the grid's order


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise GridError(f"{where}: {message}")


def _seeds(value, where: str) -> list[int]:
    ok = isinstance(value, list) and value and all(type(s) is int and s >= 0 for s in value)
    _require(
        ok and len(set(value)) == len(value), where, f"seeds must be a list of distinct integers >= 0, not {value}"
    )
    return value


def _variant_runs(variant, index: int, grid: dict, where: str) -> list[Run]:
    """The runs of one entry of ``variants`` (checked)."""
    _require(isinstance(variant, dict), where, f"variant {index + 1} must be a mapping")
    unknown = sorted(set(variant) - VARIANT_KEYS)
    _require(not unknown, where, f"variant {index + 1} has unknown keys {unknown} (keys: {sorted(VARIANT_KEYS)})")
    name = variant.get("name")
    _require(
        isinstance(name, str) and NAME.fullmatch(name),
        where,
        f"variant {index + 1} needs a name of letters, digits, . _ -",
    )
    overrides = variant.get("overrides", [])
    _require(isinstance(overrides, list), where, f"{name}: overrides must be a list of key=value")
    for item in overrides:
        _require(isinstance(item, str) and "=" in item, where, f"{name}: override {item!r} must look like key=value")
        key = item.split("=", 1)[0]
        _require(key not in HARNESS_KEYS, where, f"{name}: {key} is set by the grid's {HARNESS_KEYS.get(key)}")
    preset = variant.get("preset", grid["preset"])
    _require(isinstance(preset, str) and preset, where, f"{name}: preset must be a preset name or a YAML file")
    group = variant.get("group")
    _require(group is None or isinstance(group, str), where, f"{name}: group must be a name")
    seeds = _seeds(variant.get("seeds", grid["seeds"]), f"{where}, {name}")
    return [Run(name, seed, preset, (*overrides, f"seed={seed}"), group) for seed in seeds]


def read_grid(path: Path) -> Grid:
    """The grid in the YAML file ``path``, checked (every run's configuration loads).

    Raises:
        GridError: a missing or invalid file, key or value; ConfigError: a run's settings.
    """
    try:
        grid = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise GridError(f"cannot read the grid {path}: {' '.join(str(e).split())}") from None
    where = str(path)
    _require(isinstance(grid, dict), where, "a grid must be a mapping")
    unknown = sorted(set(grid) - GRID_KEYS)
    _require(not unknown, where, f"unknown keys {unknown} (keys: {sorted(GRID_KEYS)})")
    missing = sorted(GRID_KEYS - set(grid))
    _require(not missing, where, f"missing keys {missing}")
    seconds, threads = grid["seconds"], grid["threads"]
    _require(type(seconds) in (int, float) and seconds > 0, where, f"seconds must be > 0, not {seconds!r}")
    _require(type(threads) is int and threads >= 1, where, f"threads must be an integer >= 1, not {threads!r}")
    _seeds(grid["seeds"], where)
    variants = grid["variants"]
    _require(isinstance(variants, list) and variants, where, "variants must be a non-empty list")
    per_variant = [_variant_runs(v, i, grid, where) for i, v in enumerate(variants)]
    # round by round (every variant's first seed, then every variant's second...): a grid
    # stopped early, or the load of a shared machine, touches every variant alike
    runs = [runs[k] for k in range(max(map(len, per_variant))) for runs in per_variant if k < len(runs)]
    names = [v["name"] for v in variants]
    twice = sorted({n for n in names if names.count(n) > 1})
    _require(not twice, where, f"variant names given twice: {twice}")
    _require(grid["baseline"] in names, where, f"the baseline {grid['baseline']!r} is not a variant")
    for run in runs:
        planned_config(run, seconds)
    return Grid(float(seconds), threads, grid["baseline"], runs)


def select(runs: list[Run], only: str | None, seeds: str | None) -> list[Run]:
    """The runs of the variants in ``only`` (``a,b``) and the seeds in ``seeds`` (``1,2``)."""
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {r.variant for r in runs})
        if unknown:
            raise GridError(f"--only names no variant of the grid: {', '.join(unknown)}")
        runs = [r for r in runs if r.variant in wanted]
    if seeds:
        try:
            wanted_seeds = {int(s) for s in seeds.split(",") if s.strip()}
        except ValueError:
            raise GridError(f"--seeds must be a comma list of integers, not {seeds!r}") from None
        runs = [r for r in runs if r.seed in wanted_seeds]
    if not runs:
        raise GridError("no run of the grid is selected by --only and --seeds")
    return runs


def planned_config(run: Run, seconds: float):
    """The TrainConfig the run trains with (raises ConfigError, naming the run)."""
    try:
        return load_config(run.preset, train_overrides(run, seconds))
    except SharnnError as e:
        raise GridError(f"{run.name}: {e}") from None


def train_overrides(run: Run, seconds: float) -> list[str]:
    return [*run.overrides, f"max_seconds={seconds:g}"]


def check_folder(run: Run, run_dir: Path, seconds: float) -> None:
    """Refuse a run folder whose configuration is not the planned one (or cannot be read)."""
    try:
        existing = load_config(str(run_dir))
    except SharnnError as e:
        raise GridError(
            f"{run_dir} exists but its config cannot be read ({e}): remove it or choose another --out"
        ) from None
    changes = config_changes(existing, planned_config(run, seconds))
    if changes:
        listed = ", ".join(f"{k} {old} (run) vs {new} (grid)" for k, (old, new) in list(changes.items())[:4])
        raise GridError(f"{run_dir} was started with another configuration ({listed}): choose another --out")


# ----------------------------------------------------------------------------- rows and statistics


_TRAIN_TOKENS: dict[tuple, int] = {}


def train_tokens(config) -> int:
    """Tokens in one epoch of the config's train split (its streams' whole rows)."""
    key = (config.data, config.valid_fraction, config.test_fraction, config.train_streams)
    if key not in _TRAIN_TOKENS:
        train = load_corpus(config.data, config.valid_fraction, config.test_fraction).train
        _TRAIN_TOKENS[key] = len(train) // config.train_streams * config.train_streams
    return _TRAIN_TOKENS[key]


def run_row(run: Run, run_dir: Path, threads: int) -> dict:
    """The row of a finished run (keys: module docstring), or of a diverged one: its
    ``diverged`` (the error line), ``steps`` (the last logged step), no scores."""
    summary, metrics = read_summary(run_dir), read_records(run_dir)
    valids = [r for r in metrics if r.get("split") == "valid" and "seconds" in r]
    row = {
        "variant": run.variant,
        "seed": run.seed,
        "group": run.group,
        "preset": run.preset,
        "overrides": list(run.overrides),
        "threads": threads,
        "curve": [[r["seconds"], r["bpc"], r["step"]] for r in valids],
        "run_dir": str(run_dir),
    }
    if summary is None:
        config = load_config(str(run_dir))
        steps = [r["step"] for r in metrics if "step" in r]
        return row | {
            "diverged": diverged(run_dir),
            "steps": max(steps, default=0),
            "valid_bpc": None,
            "test_bpc": None,
            "parameters": parameter_count(config.model),
            "train_seconds": None,
            "tokens_per_second": None,
        }
    tokens = summary["epochs"] * train_tokens(load_config(str(run_dir)))
    return row | {
        "steps": summary["steps"],
        "valid_bpc": summary["valid_bpc"],
        "test_bpc": summary["test_bpc"],
        "parameters": summary["parameters"],
        "train_seconds": summary["train_seconds"],
        "tokens_per_second": tokens / summary["train_seconds"] if summary["train_seconds"] > 0 else None,
    }


def diverged(run_dir: Path) -> str | None:
    """The error line of a run that stopped because it diverged (``sharnn train``'s
    "training diverged: ..."), read from its log, else None. A diverged run is a result,
    not a failure: it is reported, and never retried (it would diverge again)."""
    log = run_dir.parent / f"{run_dir.name}.log"
    if read_summary(run_dir) is not None or not log.is_file():
        return None
    last = last_error(log)
    return last if last.startswith("error: training diverged") else None


def done(run_dir: Path) -> bool:
    """Whether the run is over: finished, or diverged."""
    return read_summary(run_dir) is not None or diverged(run_dir) is not None


def finished_rows(runs: list[Run], out: Path, threads: int) -> list[dict]:
    """The rows of the runs of ``runs`` that are over (finished or diverged), in the grid's order."""
    return [run_row(r, out / r.name, threads) for r in runs if done(out / r.name)]


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """The mean and the half-width of its 95% confidence interval (Student's t; None for
    fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    n = len(values)
    return mean, float(stats.t.ppf(0.975, n - 1)) * statistics.stdev(values) / math.sqrt(n)


def difference_interval(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """mean(a) - mean(b) and the half-width of its 95% interval (Welch's t; None when
    either has fewer than two values; 0 when both are constant)."""
    difference = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return difference, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return difference, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return difference, float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb)


def paired_differences(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """``a[seed] - b[seed]`` for each seed both ran, in seed order."""
    return [a[seed] - b[seed] for seed in sorted(a.keys() & b.keys())]


def paired_interval(a: dict[int, float], b: dict[int, float]) -> tuple[float | None, float | None]:
    """The mean of :func:`paired_differences` and the half-width of its 95% interval
    (Student's t; None for fewer than two): each seed's runs share its data order, and a
    grid runs them round by round, so that pairing takes out what a seed, a session or a
    machine's speed adds to both. (None, None) when no seed ran in both."""
    differences = paired_differences(a, b)
    return mean_interval(differences) if differences else (None, None)


def seeds_for(a: dict[int, float], b: dict[int, float], half_width: float = TARGET_HALF_WIDTH) -> int | None:
    """The seeds that would bring :func:`paired_interval`'s half-width to ``half_width`` or
    less, were the paired differences' spread what the seeds so far measure: the least n
    with ``t(0.975, n - 1) * s / sqrt(n) <= half_width``; None for fewer than two pairs."""
    differences = paired_differences(a, b)
    if len(differences) < 2:
        return None
    spread, n = statistics.stdev(differences), 2
    while float(stats.t.ppf(0.975, n - 1)) * spread / math.sqrt(n) > half_width:
        n += 1
    return n


def final_slope(curve: list[list[float]]) -> float | None:
    """How fast a run was still learning when its budget ran out: the least-squares slope
    of validation BPC against training seconds over the curve's last third (its points at
    or after two thirds of its last validation's seconds), in BPC per 100 s (negative:
    still falling); None for fewer than three points there."""
    if not curve:
        return None
    end = curve[-1][0]
    points = [(seconds, bpc) for seconds, bpc, *_ in curve if seconds >= end * 2 / 3]
    if len(points) < 3:
        return None
    return 100 * float(stats.linregress(*zip(*points)).slope)


def group_by_variant(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` by their variant, each variant's in their order."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["variant"], []).append(row)
    return groups


def tokens_per_step(row: dict) -> int:
    """The tokens one optimizer step of the row's run trains on (``bptt x train_streams``)."""
    config = load_config(row["preset"], row["overrides"])
    return config.bptt * config.train_streams


def per_variant(rows: list[dict], baseline: str, at_step: int = AT_STEP) -> list[dict]:
    """One entry per variant with rows (in their order): seeds, test BPC mean and 95% CI,
    the differences from ``baseline`` (:func:`versus_baseline`; None for the baseline itself
    and without baseline rows), mean valid BPC, the mean valid BPC at step ``at_step``
    (None unless every seed validated there: what a variant learns per step, its speed
    aside), parameters, steps and tokens/s (means), ``slope`` (the mean of the seeds'
    :func:`final_slope`; None if no seed has one), and ``best_of`` (the group it is the
    best of by mean valid BPC, else None)."""
    by_variant = group_by_variant(rows)
    base = [r for r in by_variant.get(baseline, []) if r["test_bpc"] is not None]
    result = []
    for variant, every in by_variant.items():
        runs = [r for r in every if r["test_bpc"] is not None]
        if not runs:  # every seed diverged
            result.append(_all_diverged(variant, every, at_step))
            continue
        compared = bool(base) and variant != baseline
        differences = versus_baseline(runs, base, at_step) if compared else dict.fromkeys(DIFFERENCE_KEYS)
        mean, half = mean_interval([r["test_bpc"] for r in runs])
        at_step_by_seed = valid_by_seed(runs, at_step)
        every_validated = len(at_step_by_seed) == len(runs)
        speeds = [r["tokens_per_second"] for r in runs if r["tokens_per_second"] is not None]
        slopes = [s for s in map(final_slope, (r["curve"] for r in runs)) if s is not None]
        result.append(
            {
                "variant": variant,
                "group": runs[0]["group"],
                "seeds": len(runs),
                "diverged": len(every) - len(runs),
                "test_bpc": mean,
                "test_bpc_ci": half,
                **differences,
                "valid_bpc": statistics.fmean(r["valid_bpc"] for r in runs),
                "at_step": at_step,
                "valid_at_step": statistics.fmean(at_step_by_seed.values()) if every_validated else None,
                "parameters": statistics.fmean(r["parameters"] for r in runs),
                "steps": statistics.fmean(r["steps"] for r in runs),
                "tokens_per_second": statistics.fmean(speeds) if speeds else None,
                "slope": statistics.fmean(slopes) if slopes else None,
                "best_of": None,
            }
        )
    for group in {v["group"] for v in result if v["group"]}:
        scored = [v for v in result if v["group"] == group and v["valid_bpc"] is not None]
        if scored:
            min(scored, key=lambda v: v["valid_bpc"])["best_of"] = group
    return result


DIFFERENCE_KEYS = (
    *("difference", "difference_ci", "paired_difference", "paired_ci", "seeds_needed"),
    *("step_difference", "step_difference_ci", "step_seeds_needed"),
)


def versus_baseline(runs: list[dict], base: list[dict], at_step: int) -> dict:
    """A variant's scored ``runs`` against the baseline's (:data:`DIFFERENCE_KEYS`): the
    difference in mean test BPC and its 95% CI (Welch's), the same paired by seed
    (:func:`paired_interval`), the seeds that CI would need to be ±:data:`TARGET_HALF_WIDTH`
    (:func:`seeds_for`), and the difference in valid BPC at step ``at_step``, paired, with
    the seeds its CI would need."""
    test = {r["seed"]: r["test_bpc"] for r in runs}
    base_test = {r["seed"]: r["test_bpc"] for r in base}
    welch = difference_interval(list(test.values()), list(base_test.values()))
    paired = paired_interval(test, base_test)
    valid, base_valid = valid_by_seed(runs, at_step), valid_by_seed(base, at_step)
    per_step = (*paired_interval(valid, base_valid), seeds_for(valid, base_valid))
    return dict(zip(DIFFERENCE_KEYS, (*welch, *paired, seeds_for(test, base_test), *per_step), strict=True))


def valid_by_seed(rows: list[dict], step: int) -> dict[int, float]:
    """The validation BPC at ``step`` of each row's seed, for the rows that validated there."""
    return {row["seed"]: bpc for row in rows for _, bpc, at in row["curve"] if at == step}


def _all_diverged(variant: str, rows: list[dict], at_step: int) -> dict:
    """The per-variant entry of a variant whose every seed diverged: no scores."""
    return dict.fromkeys(DIFFERENCE_KEYS) | {
        "variant": variant,
        "group": rows[0]["group"],
        "seeds": 0,
        "diverged": len(rows),
        "test_bpc": None,
        "test_bpc_ci": None,
        "valid_bpc": None,
        "at_step": at_step,
        "valid_at_step": None,
        "parameters": statistics.fmean(r["parameters"] for r in rows),
        "steps": statistics.fmean(r["steps"] for r in rows),
        "tokens_per_second": None,
        "slope": None,
        "best_of": None,
    }


# ----------------------------------------------------------------------------- equal compute


def read_speeds(path: Path, variants: list[str]) -> dict[str, float]:
    """Each variant's quiet training tokens/s, from a ``benchmarks/variant_speeds.py`` result.

    Raises:
        GridError: the file cannot be read as one, or has no speed for one of ``variants``.
    """
    try:
        rows = json.loads(path.read_text())["variants"]
        speeds = {row["variant"]: float(row["tokens_per_second"]) for row in rows}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GridError(f"--speeds {path}: not a result of benchmarks/variant_speeds.py ({e})") from None
    missing = [v for v in variants if not speeds.get(v, 0) > 0]
    if missing:
        raise GridError(f"--speeds {path} has no speed for {', '.join(missing)}: measure this grid's variants")
    return speeds


def valid_at(curve: list[list[float]], step: float) -> float | None:
    """The validation BPC of a run's ``curve`` at ``step``: linear between the validations on
    either side of it (every ``valid_every_steps`` and at the run's end); None past its last."""
    for (_, before, first), (_, after, last) in itertools.pairwise(curve):
        if first <= step <= last and last > first:
            return before + (after - before) * (step - first) / (last - first)
    return next((bpc for _, bpc, at in curve if at == step), None)


def equal_compute(rows: list[dict], baseline: str, speeds: dict[str, float]) -> dict | None:
    """The variants at equal compute, their speeds measured quiet instead of on the day
    (docs/ablations.md, "Three ways to compare"). The baseline's budget, ``budget_steps``, is the
    most steps every scored run reaches at its variant's speed: the least, over runs, of the
    run's last step x speed(baseline) / speed(variant). In that time a variant trains
    ``budget_steps x speed(variant) / speed(baseline)`` steps; its runs' validation BPC there
    (:func:`valid_at`) is compared with the baseline's at ``budget_steps``, paired by seed
    (:func:`paired_interval`, :func:`seeds_for`); a run with no validation by then is left
    out. None without scored runs."""
    scored = [r for r in rows if r["test_bpc"] is not None and r["curve"]]
    if not scored:
        return None
    speed = {r["variant"]: speeds[r["variant"]] / speeds[baseline] for r in scored}
    budget = int(min(r["curve"][-1][2] / speed[r["variant"]] for r in scored))
    by_variant = group_by_variant(scored)
    base = {r["seed"]: valid_at(r["curve"], budget) for r in by_variant.get(baseline, [])}
    base = {seed: bpc for seed, bpc in base.items() if bpc is not None}
    entries = []
    for variant, runs in by_variant.items():
        steps = round(budget * speed[variant])
        at_steps = {r["seed"]: valid_at(r["curve"], steps) for r in runs}
        valid = {seed: bpc for seed, bpc in at_steps.items() if bpc is not None}  # validated by then
        compared = bool(base) and variant != baseline
        difference, half = paired_interval(valid, base) if compared else (None, None)
        entries.append(
            {
                "variant": variant,
                "tokens_per_second": speeds[variant],
                "speed": speed[variant],
                "steps": steps,
                "valid_bpc": statistics.fmean(valid.values()) if valid else None,
                "paired_difference": difference,
                "paired_ci": half,
                "seeds_needed": seeds_for(valid, base) if compared else None,
            }
        )
    seconds = budget * tokens_per_step(by_variant.get(baseline, scored)[0]) / speeds[baseline]
    return {"budget_steps": budget, "budget_seconds": seconds, "variants": entries}


# ----------------------------------------------------------------------------- output


def _plus_minus(value: float | None, half: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:+.4f}" if signed else f"{value:.4f}"
    return text if half is None else f"{text} ± {half:.4f}"


def seeds_text(variant: dict) -> str:
    """The seeds scored, and how many diverged: ``3``, ``1 (2 diverged)``."""
    return f"{variant['seeds']}" + (f" ({variant['diverged']} diverged)" if variant["diverged"] else "")


DIFFERENCES = {  # the report's differences from the baseline: (value, half-width) keys
    "welch": ("difference", "difference_ci"),  # test BPC, unpaired
    "paired": ("paired_difference", "paired_ci"),  # test BPC, paired by seed
    "step": ("step_difference", "step_difference_ci"),  # valid BPC at the report's step, paired
}


def versus(variant: dict, baseline: str, kind: str = "welch") -> str:
    """A difference from the baseline (:data:`DIFFERENCES`), ``± half-width``; ``baseline``
    for itself."""
    if variant["variant"] == baseline:
        return "baseline"
    return _plus_minus(*(variant[key] for key in DIFFERENCES[kind]), signed=True)


def markdown(variants: list[dict], baseline: str) -> str:
    """The per-variant table in Markdown, with a line per lr sweep naming its best."""
    at_step = variants[0]["at_step"] if variants else AT_STEP
    lines = [
        f"| variant | seeds | test BPC (95% CI) | vs {baseline} (95% CI) | paired by seed (95% CI) | valid BPC "
        f"| valid BPC at step {at_step} | at step {at_step}, paired (95% CI) | parameters | steps | tokens/s "
        f"| seeds for ±{TARGET_HALF_WIDTH} | the same at step {at_step} | BPC per 100 s, last third |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in variants:
        name = v["variant"] + (f" ({v['group']})" if v["group"] else "")
        speed = "-" if v["tokens_per_second"] is None else f"{v['tokens_per_second']:,.0f}"
        valid, valid_at = (_plus_minus(v[key], None) for key in ("valid_bpc", "valid_at_step"))
        needed, step_needed = ("-" if v[k] is None else f"{v[k]:,}" for k in ("seeds_needed", "step_seeds_needed"))
        slope = _plus_minus(v["slope"], None, signed=True)
        lines.append(
            f"| {name} | {seeds_text(v)} | {_plus_minus(v['test_bpc'], v['test_bpc_ci'])} | "
            f"{versus(v, baseline)} | {versus(v, baseline, 'paired')} | {valid} | {valid_at} | "
            f"{versus(v, baseline, 'step')} | {v['parameters']:,.0f} | {v['steps']:,.0f} | {speed} | "
            f"{needed} | {step_needed} | {slope} |"
        )
    for v in variants:
        if v["best_of"]:
            lines.append(
                f"\nThe lr sweep {v['best_of']}: best by mean valid BPC is {v['variant']} ({v['valid_bpc']:.4f})."
            )
    return "\n".join(lines)


def equal_compute_markdown(compared: dict, baseline: str) -> str:
    """:func:`equal_compute`'s table in Markdown, under a line that gives the budget."""
    lines = [
        f"At equal compute: {compared['budget_steps']:,} steps of {baseline} (about "
        f"{compared['budget_seconds']:,.0f} s at its quiet speed), and of each variant the steps it trains in "
        "that time at its quiet speed:",
        "",
        f"| variant | quiet tokens/s | speed vs {baseline} | steps | valid BPC | paired by seed (95% CI) "
        f"| seeds for ±{TARGET_HALF_WIDTH} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in compared["variants"]:
        difference = "baseline" if v["variant"] == baseline else versus(v, baseline, "paired")
        needed = "-" if v["seeds_needed"] is None else f"{v['seeds_needed']:,}"
        lines.append(
            f"| {v['variant']} | {v['tokens_per_second']:,.0f} | {v['speed']:.3f} | {v['steps']:,} | "
            f"{_plus_minus(v['valid_bpc'], None)} | {difference} | {needed} |"
        )
    return "\n".join(lines)


def print_report(variants: list[dict], baseline: str) -> None:
    at_step = variants[0]["at_step"] if variants else AT_STEP
    rows = [
        v
        | {
            "test": _plus_minus(v["test_bpc"], v["test_bpc_ci"]),
            "diff": versus(v, baseline),
            "paired": versus(v, baseline, "paired"),
            "step": versus(v, baseline, "step"),
            "seeds": seeds_text(v),
        }
        for v in variants
    ]
    print_table(
        rows,
        [
            ("variant", "variant", ""),
            ("seeds", "seeds", ""),
            ("test", "test BPC ± 95% CI", ""),
            ("diff", f"vs {baseline} ± 95% CI", ""),
            ("paired", "paired by seed", ""),
            ("valid_bpc", "valid BPC", ".4f"),
            ("valid_at_step", f"valid at step {at_step}", ".4f"),
            ("step", "paired", ""),
            ("parameters", "parameters", ",.0f"),
            ("steps", "steps", ",.0f"),
            ("tokens_per_second", "tokens/s", ",.0f"),
            ("seeds_needed", f"seeds for ±{TARGET_HALF_WIDTH}", ""),
            ("step_seeds_needed", "at step", ""),
            ("slope", "BPC/100 s, last third", "+.4f"),
            ("best_of", "best of sweep", ""),
        ],
    )


def plot(rows: list[dict], path: Path, speeds: dict[str, float] | None = None) -> None:
    """Valid BPC against training seconds: per variant the mean over seeds on a common time
    grid (up to the shortest seed's last validation) and a band from min to max. With
    ``speeds``, against the seconds each validation's steps take at the variant's quiet
    speed (``step x bptt x train_streams / tokens/s``: equal compute), not as they ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    curves: dict[str, list[list]] = {}
    for row in rows:
        if row["curve"]:
            curve = row["curve"]
            if speeds:
                per_step = tokens_per_step(row) / speeds[row["variant"]]
                curve = [[at * per_step, bpc, at] for _, bpc, at in curve]
            curves.setdefault(row["variant"], []).append(curve)
    fig, ax = plt.subplots(figsize=(9, 6))
    for i, (variant, seeds) in enumerate(curves.items()):
        end = min(c[-1][0] for c in seeds)
        start = max(c[0][0] for c in seeds)
        grid = np.linspace(start, end, 50) if end > start else np.array([end])
        values = np.array([np.interp(grid, [p[0] for p in c], [p[1] for p in c]) for c in seeds])
        style = ("-", "--", ":")[i // 10 % 3]  # ten colours, then the same colours dashed
        ax.plot(grid, values.mean(axis=0), f"C{i % 10}", linestyle=style, label=f"{variant} ({len(seeds)} seeds)")
        ax.fill_between(grid, values.min(axis=0), values.max(axis=0), color=f"C{i % 10}", alpha=0.2)
    ax.set_xlabel("training seconds at the variant's quiet speed" if speeds else "training seconds")
    ax.set_ylabel("validation bits per byte")
    title = "at equal compute" if speeds else "against training time"
    ax.set_title(f"Validation BPC {title} (mean over seeds, band: min-max)")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def results(
    grid: Grid, grid_path: Path, rows: list[dict], at_step: int = AT_STEP, speeds: dict[str, float] | None = None
) -> dict:
    """What OUT/results.json and --json hold: the grid, the machine and the rows; with
    ``speeds``, the variants at equal compute (:func:`equal_compute`)."""
    env = environment(torch.device("cpu")) | {
        "cpu_threads": grid.threads,
        "cpu_count": os.cpu_count(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return {
        "grid": str(grid_path),
        "seconds": grid.seconds,
        "threads": grid.threads,
        "baseline": grid.baseline,
        "environment": env,
        "variants": per_variant(rows, grid.baseline, at_step),
        **({"equal_compute": equal_compute(rows, grid.baseline, speeds)} if speeds else {}),
        "runs": rows,
    }


def portable(results: dict) -> dict:
    """``results`` as ``--json`` publishes them (results/ablations.json): without the rows'
    ``run_dir`` (this machine's folders) and with the grid's path inside the repository
    relative to it, so that the file reads the same wherever it is run."""
    grid = Path(results["grid"]).resolve()
    inside = grid.is_relative_to(GRID.parent.parent)
    return results | {
        "grid": str(grid.relative_to(GRID.parent.parent)) if inside else grid.name,
        "runs": [{k: v for k, v in row.items() if k != "run_dir"} for row in results["runs"]],
    }


def write_results(grid: Grid, grid_path: Path, runs: list[Run], out: Path) -> list[dict]:
    """Rewrite OUT/results.json from the run folders, under a lock (several harnesses
    share it); returns the rows."""
    with FileLock(out / ".results.lock"):
        rows = finished_rows(runs, out, grid.threads)
        write_atomically(out / "results.json", json.dumps(results(grid, grid_path, rows), indent=2) + "\n")
    return rows


def report(grid: Grid, grid_path: Path, rows: list[dict], args, speeds: dict[str, float] | None) -> None:
    """The table on stdout and the outputs the options ask for; with ``speeds``, the
    variants at equal compute too."""
    variants = per_variant(rows, grid.baseline, args.at_step)
    print(f"\n{len(rows)} finished run(s), {grid.seconds:g} s of training each, {grid.threads} thread(s)")
    print_report(variants, grid.baseline)
    text = markdown(variants, grid.baseline)
    compared = equal_compute(rows, grid.baseline, speeds) if speeds else None
    if compared:
        text += "\n\n" + equal_compute_markdown(compared, grid.baseline)
    print(f"\nMarkdown:\n\n{text}")
    if args.markdown:
        write_atomically(args.markdown, text + "\n")
        print(f"wrote {args.markdown}")
    if args.json:
        published = portable(results(grid, grid_path, rows, args.at_step, speeds))
        write_atomically(args.json, json.dumps(published, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, Path(args.plot), speeds)


# ----------------------------------------------------------------------------- running


def die_with_parent() -> None:
    """``preexec_fn`` of a run: its own session (a terminal's Ctrl-C reaches the harness,
    which stops it once), and SIGTERM when the harness dies, ``kill -9`` too (Linux)."""
    os.setsid()
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_child(child: subprocess.Popen) -> int:
    """The child's exit status. Ctrl-C or SIGTERM (under :func:`sigterm_raises`) meanwhile:
    the child is sent SIGTERM once (it saves and stops), waited for, then Stopped raised."""
    try:
        return child.wait()
    except (KeyboardInterrupt, Terminated) as e:
        code = INTERRUPTED[signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM]
    child.send_signal(signal.SIGTERM)
    while True:
        try:
            child.wait()
            raise Stopped(code)
        except (KeyboardInterrupt, Terminated):
            continue


def wait_for_folder(run_dir: Path, say) -> None:
    """Wait until no process trains in ``run_dir`` (a child of a harness killed meanwhile
    that is saving)."""
    lock = Lock(run_dir / LOCK_FILE, str(run_dir))
    told = False
    while True:
        try:
            lock.acquire()
            lock.release()
            return
        except LockError as e:
            if not told:
                say(f"waiting: {e}")
                told = True
            time.sleep(0.5)


def train(run: Run, out: Path, grid: Grid, say) -> int:
    """Start or resume the run (claimed by the caller); its exit status."""
    run_dir = out / run.name
    if run_dir.exists():
        wait_for_folder(run_dir, say)
        check_folder(run, run_dir, grid.seconds)
        command = [*SHARNN, "train", "--resume", str(run_dir)]
        say(f"{run.name}: resuming {run_dir}")
    else:
        command = [*SHARNN, "train", "--preset", run.preset, "--out", str(run_dir), *train_overrides(run, grid.seconds)]
        say(f"{run.name}: starting in {run_dir}")
    env = {**os.environ, "OMP_NUM_THREADS": str(grid.threads), "MKL_NUM_THREADS": str(grid.threads)}
    with open(out / f"{run.name}.log", "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)
        return wait_child(child)


def last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


class Progress:
    """``[k/N runs done, ~H:MM left]`` on stderr; runs done are counted on disk."""

    def __init__(self, runs: list[Run], out: Path, seconds: float):
        self.runs, self.out, self.seconds, self.walls = runs, out, seconds, []

    def say(self, message: str) -> None:
        over = sum(done(self.out / r.name) for r in self.runs)
        per_run = statistics.fmean(self.walls) if self.walls else self.seconds
        left = round((len(self.runs) - over) * per_run / 60)
        print(
            f"[{over}/{len(self.runs)} runs done, ~{left // 60}:{left % 60:02d} left] {message}",
            file=sys.stderr,
            flush=True,
        )


def run_grid(grid: Grid, grid_path: Path, runs: list[Run], out: Path) -> int:
    """Run every unclaimed run of ``runs`` that is not over (finished or diverged); 0, or
    1 when one failed."""
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:  # before any work: a folder of another configuration
        if (out / run.name / "config.yaml").is_file():
            check_folder(run, out / run.name, grid.seconds)
    progress, failed = Progress(runs, out, grid.seconds), False
    progress.say(f"{len(runs)} run(s) of {grid.seconds:g} s in {out}")
    for run in runs:
        if done(out / run.name):
            continue
        claim = Lock(out / f"{run.name}.claim", f"run {run.name}")
        try:
            claim.acquire()
        except LockError as e:
            progress.say(f"{run.name}: left to its holder ({e})")
            continue
        try:
            if done(out / run.name):  # finished by another harness meanwhile
                continue
            started = time.monotonic()
            code = train(run, out, grid, progress.say)
            progress.walls.append(time.monotonic() - started)
        finally:
            claim.release()
        if code in INTERRUPTED.values():
            raise Stopped(code)
        outcome = "finished" if code == 0 else "diverged" if diverged(out / run.name) else "failed"
        if outcome == "failed":
            failed = True
            print(
                f"error: {run.name} failed (exit status {code}): {last_error(out / f'{run.name}.log')}", file=sys.stderr
            )
        write_results(grid, grid_path, runs, out)
        progress.say(f"{run.name}: {outcome}")
    return 1 if failed else 0


def check_outputs(args) -> None:
    """Refuse, before any work, outputs that cannot be written: an ``--out`` that is not a
    folder (a file, or under one), a ``--json``, ``--markdown`` or ``--plot`` that is a
    folder or whose folder does not exist or cannot be written in. Raises :class:`GridError`."""
    above = args.out
    while not above.exists() and not above.is_symlink() and above != above.parent:
        above = above.parent  # the nearest existing folder, where --out is to be made
    if not above.is_dir():
        what = "is" if above == args.out else f"is inside {above}, which is"
        raise GridError(f"--out {args.out} {what} not a folder: give a folder for the run folders")
    for option in ("json", "markdown", "plot"):
        path = getattr(args, option)
        if path is None:
            continue
        folder = path.absolute().parent
        if path.is_dir():
            raise GridError(f"--{option} {path} is a folder: give a file name")
        if not folder.is_dir():
            raise GridError(f"--{option} {path}: no folder {folder}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise GridError(f"--{option} {path}: cannot write in {folder}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, default=GRID, help="the grid's YAML file [benchmarks/ablations.yaml]")
    parser.add_argument("--out", type=Path, default=Path("runs/ablations"), help="run folders [%(default)s]")
    parser.add_argument("--only", default=None, help="comma list of variants to run or report [all]")
    parser.add_argument("--seeds", default=None, help="comma list of the seeds to run or report [the grid's]")
    parser.add_argument("--seconds", type=float, default=None, help="training budget per run [the grid's]")
    parser.add_argument("--report", action="store_true", help="only report the finished runs")
    parser.add_argument("--json", type=Path, default=None, help="write the results here (results/ablations.json)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the Markdown table here")
    parser.add_argument("--plot", type=Path, default=None, help="write the figure here (PNG)")
    parser.add_argument(
        "--at-step", type=int, default=AT_STEP, help="the step of the per-step comparison [%(default)s]"
    )
    parser.add_argument(
        "--speeds", type=Path, default=None, help="compare at equal compute at these speeds (variant_speeds.py)"
    )
    args = parser.parse_args(argv)
    if args.seconds is not None and not args.seconds > 0:
        parser.error("--seconds must be > 0")
    if args.at_step < 1:
        parser.error("--at-step must be >= 1")
    code = 0
    try:
        with sigterm_raises():
            check_outputs(args)
            grid = read_grid(args.grid)
            if args.seconds is not None:
                grid = Grid(args.seconds, grid.threads, grid.baseline, grid.runs)
                for run in grid.runs:
                    planned_config(run, grid.seconds)
            runs = select(grid.runs, args.only, args.seeds)
            variants = sorted({r.variant for r in runs} | {grid.baseline})
            speeds = read_speeds(args.speeds, variants) if args.speeds else None
            if not args.report:
                code = run_grid(grid, args.grid, runs, args.out)
            report(grid, args.grid, finished_rows(runs, args.out, grid.threads), args, speeds)
    except SharnnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (Stopped, KeyboardInterrupt, Terminated) as e:
        print("interrupted: run the same command again to resume (finished runs are kept)", file=sys.stderr)
        return (
            e.code
            if isinstance(e, Stopped)
            else INTERRUPTED[signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM]
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
