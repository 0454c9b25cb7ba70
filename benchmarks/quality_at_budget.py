"""Quality at a fixed time budget: train presets or settings for the same wall-clock time
and compare their validation BPC against seconds.

Each run is a whole ``sharnn.training.trainer.train`` run into its own folder, stopped by
``max_seconds = 60 * --minutes`` alone: ``max_steps=0`` and ``epochs=1000`` are set first
(any of the trailing overrides or ``--set`` may change them, and the run may then stop
earlier: the ``stopped by`` column says). As ``TrainConfig.max_seconds`` counts it, the
budget is training wall clock with the validations inside it, so compare runs with the
same ``--valid-every``. Each epoch's end validates too, and the preset's learning-rate
halvings happen at their epochs (a small corpus such as ``enwik8-head`` has short
epochs). After the budget the run validates once more and tests its best checkpoint
(outside the budget). No sample is generated (``sample_bytes=0``).

Runs: every ``--preset`` (default ``tiny``) with every ``--set "k=v k=v"`` (default: one
run with none), one after another in that order, in ``--out/NN-PRESET``; trailing
``key=value`` overrides apply to every run, ``--set`` ones after them. The table has one
row per run: steps, training seconds, tokens/s (the median over the logged training
intervals, which the few intervals holding a validation or compilation hardly move), the
last validation's BPC, the best validation BPC and the test BPC of the best checkpoint;
then every run's validation curve (BPC against seconds and steps, from ``metrics.jsonl``),
which the JSON holds too.

GPU (from the repository root; ``enwik8-head`` is bundled, ``data/enwik8`` needs
``sharnn prepare enwik8 --out data/enwik8``)::

    PYTHONPATH=src python benchmarks/quality_at_budget.py --device cuda --preset enwik8-paper \\
        --data enwik8-head --minutes 10 --valid-every 200
    PYTHONPATH=src python benchmarks/quality_at_budget.py --device cuda --preset enwik8-paper \\
        --preset enwik8-paper-4head --preset enwik8-paper-noattn --data data/enwik8 --minutes 30
    PYTHONPATH=src python benchmarks/quality_at_budget.py --device cuda --preset enwik8-paper \\
        --data enwik8-head --minutes 10 --set "train_streams=16" --set "train_streams=32 lr=0.003"

CPU, the tiny preset for 10 minutes on the bundled corpus::

    python benchmarks/quality_at_budget.py --device cpu --minutes 10

JSON in ``benchmarks/results/quality_at_budget.json`` unless ``--json PATH`` (rewritten
after every run, so a long comparison keeps what it finished); run folders in a new
``benchmarks/results/runs/quality-YYYYmmdd-HHMMSS`` unless ``--out`` (which must not exist).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import RESULTS, environment, print_table, stop_reason, write_json
from sharnn import load_config
from sharnn.errors import SharnnError, TrainingDiverged
from sharnn.runtime import resolve_device
from sharnn.training.metrics import read_records
from sharnn.training.trainer import train

# Set before the user's overrides, so that the budget is what stops a run.
BUDGET_DEFAULTS = ["max_steps=0", "epochs=1000", "sample_bytes=0"]
# Set by options; refused as overrides.
OPTION_KEYS = {"max_seconds": "--minutes", "valid_every_steps": "--valid-every", "data": "--data", "device": "--device"}


def fresh_folder(out: str | None) -> Path:
    """``out`` if it does not exist yet, else an error; by default a new timestamped folder."""
    if out is not None:
        folder = Path(out)
        if folder.exists():
            raise SharnnError(f"--out {folder} exists; choose a new folder")
        return folder
    base = RESULTS / "runs" / f"quality-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def run_result(
    name: str, preset: str, settings: str, overrides: list[str], config, summary: dict, run_dir: Path
) -> dict:
    """One run's row and curve, from its summary and metrics.jsonl."""
    records = read_records(run_dir)
    valid = [{"step": r["step"], "seconds": r["seconds"], "bpc": r["bpc"]} for r in records if r["split"] == "valid"]
    rates = [r["tokens_per_s"] for r in records if r["split"] == "train" and "tokens_per_s" in r]
    return {
        "name": name,
        "preset": preset,
        "settings": settings,
        "overrides": overrides,
        "run_dir": str(run_dir),
        "data": config.data,
        "train_streams": config.train_streams,
        "bptt": config.bptt,
        "budget_seconds": config.max_seconds,
        "valid_every_steps": config.valid_every_steps,
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "stopped_by": stop_reason(config, summary),
        "tokens_per_s": statistics.median(rates) if rates else None,
        "final_valid_bpc": valid[-1]["bpc"] if valid else None,
        "best_valid_bpc": summary["valid_bpc"],
        "best_step": summary["best_step"],
        "test_bpc": summary["test_bpc"],
        "parameters": summary["parameters"],
        "valid_curve": valid,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", help="preset or config file; repeat to compare [tiny]")
    parser.add_argument(
        "--set",
        action="append",
        dest="settings",
        metavar='"K=V K=V"',
        help="one run's extra overrides; repeat to compare (each with every preset)",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget per run, wall clock [10]")
    parser.add_argument("--data", default=None, help="corpus for every run [each preset's own]")
    parser.add_argument("--valid-every", type=int, default=500, help="validate every this many steps [500]")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--out", default=None, help="new folder for the runs [benchmarks/results/runs/quality-TIME]")
    parser.add_argument("--json", default=None, help="results file [benchmarks/results/quality_at_budget.json]")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args()

    presets = args.preset or ["tiny"]
    settings = args.settings or [""]
    if not args.minutes > 0:
        parser.error("--minutes must be > 0")
    if args.valid_every < 1:
        parser.error("--valid-every must be >= 1")
    for item in args.overrides + [item for s in settings for item in s.split()]:
        key = item.split("=", 1)[0]
        if key in OPTION_KEYS:
            parser.error(f"set {key} with {OPTION_KEYS[key]}, not as an override")

    forced = [
        f"max_seconds={round(60 * args.minutes, 3)}",
        f"valid_every_steps={args.valid_every}",
        f"device={args.device}",
    ]
    forced += [f"data={args.data}"] if args.data else []
    plan = []  # (name, preset, settings, overrides, config), all validated before the first run
    try:
        device = resolve_device(args.device)
        for preset in presets:
            for extra in settings:
                overrides = BUDGET_DEFAULTS + args.overrides + extra.split() + forced
                name = f"{len(plan) + 1:02d}-{Path(preset).stem}"
                plan.append((name, preset, extra, overrides, load_config(preset, overrides)))
        out = fresh_folder(args.out)
    except SharnnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(
        f"{len(plan)} run(s) of {args.minutes:g} min each on {device}, validation every {args.valid_every} steps; "
        f"run folders in {out}",
        flush=True,
    )
    result = {
        "environment": environment(device),
        "minutes": args.minutes,
        "valid_every_steps": args.valid_every,
        "out": str(out),
        "runs": [],
    }
    diverged = []
    for name, preset, extra, overrides, config in plan:
        run_dir = out / name
        print(f"\n{name}: preset {preset} {extra}".rstrip(), flush=True)
        try:
            summary = train(config, run_dir)
        except TrainingDiverged as e:
            print(f"{name}: {e}", file=sys.stderr)
            diverged.append(name)
            result["runs"].append(
                {
                    "name": name,
                    "preset": preset,
                    "settings": extra,
                    "overrides": overrides,
                    "run_dir": str(run_dir),
                    "error": str(e),
                }
            )
        except SharnnError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
        else:
            result["runs"].append(run_result(name, preset, extra, overrides, config, summary, run_dir))
        write_json(result, "quality_at_budget.json", args.json)

    print(f"\nquality after {args.minutes:g} min of training per run (BPC: bits per byte, lower is better)")
    print_table(
        [r | {"settings": r["settings"] or "-"} for r in result["runs"]],
        [
            ("name", "run", ""),
            ("preset", "preset", ""),
            ("settings", "settings", ""),
            ("steps", "steps", ""),
            ("train_seconds", "seconds", ".0f"),
            ("stopped_by", "stopped by", ""),
            ("tokens_per_s", "tokens/s", ",.0f"),
            ("final_valid_bpc", "final valid BPC", ".4f"),
            ("best_valid_bpc", "best valid BPC", ".4f"),
            ("test_bpc", "test BPC", ".4f"),
        ]
        + ([("error", "error", "")] if diverged else []),
    )
    print("\nvalidation curves")
    print_table(
        [{"name": r["name"], **point} for r in result["runs"] for point in r.get("valid_curve", [])],
        [("name", "run", ""), ("step", "step", ""), ("seconds", "seconds", ".1f"), ("bpc", "valid BPC", ".4f")],
    )
    write_json(result, "quality_at_budget.json", args.json)
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
