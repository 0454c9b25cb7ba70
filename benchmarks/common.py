"""What every benchmark script shares: how each execution path's :class:`sharnn.Runtime`
is built, the machine's description, device timing, peak memory, a printed table and
the JSON file. What the package already does (building a model, atomic files, tables,
metrics logs) is the package's own function, called here, not a copy. Run the scripts
from the repository root, with the package installed or ``PYTHONPATH=src``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sharnn import load_config
from sharnn.analysis_report import table_lines
from sharnn.errors import ConfigError
from sharnn.files import write_atomically
from sharnn.models.build import LanguageModel, build_model as build_language_model
from sharnn.runtime import Runtime, resolve_device

RESULTS = Path(__file__).resolve().parent / "results"


def missing_extra(error: ModuleNotFoundError, script: str) -> None:
    """A benchmark's dependency that sharnn itself does not need is missing (``error``):
    when ``script`` is run as a program, one line naming the extra that installs it and exit
    status 2; imported (a test), the error itself."""
    if script != "__main__":
        raise error
    print(f'error: {error.name} is missing: install the benchmarks\' extra, pip install -e ".[bench]"', file=sys.stderr)
    sys.exit(2)


def environment(device: torch.device) -> dict:
    """Versions and hardware, stored with every result."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": str(device),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return env


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeats(run: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``run``, the device drained before and after
    each (host clock around a synchronised region)."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak memory allocated by tensors since :func:`reset_peak_memory` (None off CUDA)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print ``rows`` under ``columns`` = ``(key, header, format spec)``; missing values as '-'
    (:func:`sharnn.analysis_report.table_lines`, the table ``sharnn analyze`` prints)."""
    print("\n".join(table_lines(rows, columns)))


def print_targets(targets: list[dict], value_format: str) -> None:
    """Print judged targets (``target``, ``measured``, ``unit``, ``pass``; ``pass`` None when
    the row ran out of memory)."""
    if not targets:
        return
    print("\ntargets:")
    for t in targets:
        verdict = "not measured (OOM)" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        measured = "-" if t["measured"] is None else f"{format(t['measured'], value_format)} {t['unit']}"
        print(f"  {t['target']:<50} measured {measured:>22}  {verdict}")


def judge(name: str, value: float | None, target: float, higher_is_better: bool, unit: str) -> dict:
    """One target, judged: ``pass`` None when ``value`` was not measured (an OOM row)."""
    passed = None if value is None else (value >= target if higher_is_better else value <= target)
    return {"target": name, "measured": value, "unit": unit, "pass": passed}


def torch_settings() -> dict:
    """The precision settings that change fp32 (eager) timings."""
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def write_json(result: dict, default_name: str, path: str | None) -> Path:
    """Write ``result`` to ``path`` or ``benchmarks/results/default_name`` (atomically:
    :func:`sharnn.files.write_atomically`); print where."""
    target = Path(path) if path else RESULTS / default_name
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, json.dumps(result, indent=2) + "\n")
    print(f"wrote {target}")
    return target


# --- Shared by train_throughput.py and inference_throughput.py ---------------------------

# How a model runs: path name -> the settings of ``Runtime.resolve`` (besides the device).
# "eager" is the reference path in plain fp32; the fast paths run under bf16 autocast.
PATHS = {
    "fast": {"precision": "bf16", "fast_path": "on", "compile": True},
    "fast-nocompile": {"precision": "bf16", "fast_path": "on", "compile": False},
    "fast-recompute": {"precision": "bf16", "fast_path": "on", "compile": True, "recompute": True},
    "eager": {"precision": "fp32", "fast_path": "off"},
}


def path_runtime(path: str, device: torch.device) -> Runtime:
    """The :class:`Runtime` of the execution path ``path`` (a key of :data:`PATHS`) on ``device``."""
    return Runtime.resolve(str(device), **PATHS[path])


def build_model(config, runtime: Runtime) -> LanguageModel:
    """A ``TrainConfig``'s model (:func:`sharnn.models.build.build_model`), initialised from
    its seed and prepared by ``runtime``, as training builds it."""
    torch.manual_seed(config.seed)
    return runtime.prepare(build_language_model(config.model))


def start_measurement(config, path: str, device: torch.device) -> tuple[Runtime, LanguageModel]:
    """The start of every measurement of a model: the peak-memory counter reset, then the
    runtime of ``path`` and the config's model prepared by it."""
    reset_peak_memory(device)
    runtime = path_runtime(path, device)
    return runtime, build_model(config, runtime)


def random_windows(
    T: int, B: int, count: int, device: torch.device, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` consecutive ``(inputs, targets)`` windows, each ``[T, B]`` int64 on
    ``device``, cut from seeded random bytes (targets are the inputs shifted by one)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (count * T + 1, B), generator=generator).to(device)
    return [(tokens[i * T : (i + 1) * T], tokens[i * T + 1 : (i + 1) * T + 1]) for i in range(count)]


def warmup_windows(config) -> int:
    """Windows to run before timing a ``TrainConfig``'s model at ``T = bptt``: enough for the
    attention memory to reach its full span (the span counts the window), plus 3 for
    compilation and allocator/kernel warm-up."""
    fill = -(-config.model.attention_span // config.bptt) if config.model.attention_blocks() else 0
    return fill + 3


DATA_WINDOWS = 4  # distinct random windows a timed loop cycles through


def time_windows(
    config,
    streams: int,
    device: torch.device,
    step: Callable[[torch.Tensor, torch.Tensor], object],
    steps: int,
    repeats: int,
) -> list[float]:
    """Seconds of each of ``repeats`` repeats of ``steps`` calls ``step(inputs, targets)``,
    after :func:`warmup_windows` untimed calls; the windows ``[T = bptt, streams]`` cycle
    through :data:`DATA_WINDOWS` windows of :func:`random_windows`, in order."""
    windows = random_windows(config.bptt, streams, DATA_WINDOWS, device)
    done = 0

    def run(n: int) -> None:
        nonlocal done
        for _ in range(n):
            step(*windows[done % DATA_WINDOWS])
            done += 1

    run(warmup_windows(config))
    return time_repeats(lambda: run(steps), device, repeats)


def release_memory(device: torch.device) -> None:
    """Free what earlier measurements left: unreachable tensors and the CUDA cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_or_oom(measure: Callable[[], dict], device: torch.device) -> dict:
    """``measure()`` with ``status: "ok"``, or ``{"status": "OOM"}`` when it runs out of
    device memory; either way its memory is released before returning."""
    release_memory(device)
    try:
        result = {"status": "ok"} | measure()
    except torch.cuda.OutOfMemoryError:
        result = {"status": "OOM"}
    release_memory(device)  # after the except block, so the traceback's frames are gone
    # reported at once on stderr, so that a run stopped before its table still leaves its figures
    line = result["status"]
    if seconds := result.get("seconds"):
        line += f", median {statistics.median(seconds):.4f} s per repeat, peak {result.get('peak_gib') or 0:.2f} GiB"
    print(f"  {line}", file=sys.stderr, flush=True)
    return result


_OVERRIDE = re.compile(r"[A-Za-z_][\w.]*=")


def parse_args_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args`` with the ``key=value`` config overrides taken out first and
    returned as ``args.overrides``, so that they may follow a list option
    (``--paths fast eager model.d_model=32``); the parser declares ``overrides`` for --help."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args([a for a in argv if not _OVERRIDE.match(a)])
    args.overrides = [a for a in argv if _OVERRIDE.match(a)]
    return args


def add_throughput_options(parser: argparse.ArgumentParser, json_default: str, overrides_help: str) -> None:
    """The options both throughput scripts end with: ``--repeats``, ``--json`` and the
    trailing ``key=value`` overrides."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help=f"results file [default: benchmarks/results/{json_default}]")
    parser.add_argument("overrides", nargs="*", help=overrides_help)


def parse_throughput_args(parser: argparse.ArgumentParser, presets: Callable[[argparse.Namespace], list[str]]):
    """Parse (:func:`parse_args_with_overrides`), then resolve ``--device`` and load every
    preset of ``presets(args)`` with the overrides; a bad one is a usage error.
    Returns ``(args, device, {preset: TrainConfig})``."""
    args = parse_args_with_overrides(parser)
    try:
        return args, resolve_device(args.device), {p: load_config(p, args.overrides) for p in presets(args)}
    except ConfigError as e:
        parser.error(str(e))


def stop_reason(config, summary: dict) -> str:
    """What ended the run: ``max_steps``, ``epochs`` or else the ``budget``."""
    if config.max_steps > 0 and summary["steps"] >= config.max_steps:
        return "max_steps"
    if summary["epochs"] >= config.epochs:
        return "epochs"
    return "budget"
