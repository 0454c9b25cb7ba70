"""What every benchmark script shares: the machine's description, device timing, peak
memory, a printed table and the JSON file. Run the scripts from the repository root,
with the package installed or ``PYTHONPATH=src``.
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

RESULTS = Path(__file__).resolve().parent / "results"


def environment(device: torch.device) -> dict:
    """Versions and hardware, stored with every result."""
    env = {
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "device": str(device), "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
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
    """Print ``rows`` under ``columns`` = ``(key, header, format spec)``; missing values as '-'."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        line = []
        for key, _, spec in columns:
            value = row.get(key)
            line.append("-" if value is None else format(value, spec) if spec else str(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for i, line in enumerate(cells):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


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


def torch_settings() -> dict:
    """The precision settings that change fp32 (eager) timings."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


def write_json(result: dict, default_name: str, path: str | None) -> Path:
    """Write ``result`` to ``path`` or ``benchmarks/results/default_name``; print where."""
    target = Path(path) if path else RESULTS / default_name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(target)
    print(f"wrote {target}")
    return target


# --- Shared by train_throughput.py and inference_throughput.py ---------------------------

# How a model runs: name -> (keyword arguments of SHARNN.set_execution, autocast dtype or
# None for plain fp32). "eager" is the reference path; the fast paths run under bf16 autocast.
PATHS = {
    "fast": ({"fast": True, "compile": True}, torch.bfloat16),
    "fast-nocompile": ({"fast": True, "compile": False}, torch.bfloat16),
    "fast-recompute": ({"fast": True, "compile": True, "recompute": True}, torch.bfloat16),
    "eager": ({"fast": False, "compile": False}, None),
}


def random_windows(T: int, B: int, count: int, device: torch.device, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
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


def release_memory(device: torch.device) -> None:
    """Free what earlier measurements left: unreachable tensors and the CUDA cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_or_oom(measure: Callable[[], dict], device: torch.device) -> dict:
    """``measure()`` with ``status: "ok"``, or ``{"status": "OOM"}`` when it runs out of
    device memory; either way its memory is released before returning. Compiled graphs
    are dropped first, so that every measurement compiles its own (and never hits
    dynamo's recompile limit, which would silently fall back to eager)."""
    torch._dynamo.reset()
    release_memory(device)
    try:
        result = {"status": "ok"} | measure()
    except torch.cuda.OutOfMemoryError:
        result = {"status": "OOM"}
    release_memory(device)  # after the except block, so the traceback's frames are gone
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
