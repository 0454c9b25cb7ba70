"""How fast the integer step computes a position, against the float step (docs/compression.md,
"The integer step").

Times, per position of ``B`` streams (each of ``--streams``), one thread:

- ``fp32``: the float step (:class:`sharnn.models.step.Step`), oneDNN's float32 products;
- ``spec``: the integer step's specification (tests/spec_integer_step.py), the torch code
  the step ran until its kernels, one torch call per operation;
- ``integer``: the integer step (:class:`sharnn.models.integer_step.IntegerStep`), numba
  kernels, the same bits as ``spec``;
- ``fp32 products``: the integer step's matrix products alone (its shapes, one call each),
  as oneDNN float32 products of integers (the same sums; what the spec computed them with);
- ``integer products``: the same products alone on the step's integer kernels;
- ``cold products``: the same again, every cache emptied before each position (a write to
  each line of 64 MiB, not timed): the weights come from memory, as while a long file is
  coded beside the adaptive stage's tables and other programs (the warm figure is a floor
  only while the weights, 5.4 MB as int8 for the shipped model, stay in the L3 cache).

Each step first runs ``--warmup`` positions (by default past the span: the memory full),
then the contenders take turns, ``--positions`` positions each per repeat, ``--repeats``
times; a contender's time is the median over its repeats. The ratios are to ``fp32``.

    python benchmarks/integer_step_speed.py
    python benchmarks/integer_step_speed.py --streams 8 32 --repeats 30 --json speed.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import llvmlite.binding as llvm
import numba
import numpy as np
import torch

from common import environment, median, print_table, write_json
from sharnn import compiled
from sharnn.models.integer_products import IntegerLinear
from sharnn.models.integer_step import IntegerStep
from sharnn.models.shipped import DEFAULT_MODEL, shipped_folder
from sharnn.models.step import Step, linear
from sharnn.training.checkpoint import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the specification lives with the tests
import spec_integer_step as spec

CONTENDERS = ["fp32", "spec", "integer", "fp32 products", "integer products", "cold products"]
FLUSH_BYTES = 64 << 20  # larger than any L3 cache of the CPUs CI has seen


def products(step: IntegerStep) -> list[IntegerLinear]:
    """The integer step's products of one position, in the order it runs them."""
    names = ("fused", "from_h", "from_input", "query", "up", "down")
    found = [getattr(block, name) for block in step.blocks for name in names if getattr(block, name, None)]
    return [*found, step.output]


def product_runs(step: IntegerStep, streams: int) -> tuple:
    """Two functions, each one position's products: as oneDNN float32 products of integers
    (inputs in ``[-L, L]``, the quantized weights), and on the integer kernels."""
    generator = np.random.default_rng(0)
    inputs, fp32 = [], []
    for product in products(step):
        (n, k), levels = product.shape, int(product.levels)
        x = generator.integers(-levels, levels + 1, (streams, k)).astype(np.float32)
        inputs.append(x)
        fp32.append((torch.from_numpy(x), torch.from_numpy(product.weight[:n, :k].astype(np.float32))))

    def float_products():
        for x, w in fp32:
            linear(x, w)

    def integer_products():
        for product, x in zip(products(step), inputs):
            product(x)

    return float_products, integer_products


def per_position(run, positions: int, flush: np.ndarray | None = None) -> float:
    """Seconds per position of ``positions`` calls of ``run``, each timed alone; with
    ``flush``, after a write to every cache line of ``flush`` (not timed)."""
    spent = 0.0
    for _ in range(positions):
        if flush is not None:
            flush[::64] += 1
        start = time.perf_counter()
        run()
        spent += time.perf_counter() - start
    return spent / positions


def measure(model, streams: int, args) -> dict:
    """One row: every contender's milliseconds per position at ``B = streams``, medians of
    interleaved repeats, and their ratios to fp32."""
    tokens = torch.randint(0, model.config.vocab_size, (streams,), generator=torch.Generator().manual_seed(streams))
    steps = {
        "fp32": Step(model, streams),
        "spec": spec.IntegerStep(model, streams),
        "integer": IntegerStep(model, streams),
    }
    for step in steps.values():
        for _ in range(args.warmup):
            step(tokens)
    runs = {name: (lambda step=step: step(tokens)) for name, step in steps.items()}
    runs["fp32 products"], runs["integer products"] = product_runs(steps["integer"], streams)
    runs["cold products"] = runs["integer products"]
    flush = np.zeros(FLUSH_BYTES, np.uint8)
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(per_position(run, args.positions, flush if name == "cold products" else None))
    row = {"streams": streams} | {f"{name}_ms": 1e3 * median(values) for name, values in times.items()}
    row["cold_vs_warm"] = row["cold products_ms"] / row["integer products_ms"]
    return row | {f"{name}_vs_fp32": row[f"{name}_ms"] / row["fp32_ms"] for name in CONTENDERS[1:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help=f"run or checkpoint [default: the shipped {DEFAULT_MODEL}]")
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 2, 8, 32])
    parser.add_argument("--positions", type=int, default=10, help="positions per contender per repeat [default: 10]")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=200, help="positions before timing [default: 200]")
    parser.add_argument("--json", default=None, help="[default: benchmarks/results/integer_step_speed.json]")
    args = parser.parse_args()
    if min(args.streams) < 1 or args.positions < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--streams, --positions and --repeats must be at least 1, --warmup at least 0")
    torch.set_num_threads(1)  # the integer step's kernels run on torch's thread count
    compile_seconds = compiled.ensure_compiled()
    model = load_model(args.model or shipped_folder(DEFAULT_MODEL))[0].float().eval()
    with torch.no_grad(), compiled.kernel_threads(1):  # the products alone run outside the step's own setting
        rows = [measure(model, streams, args) for streams in args.streams]
    print(f"{args.model or DEFAULT_MODEL}, ms per position, one thread, medians of {args.repeats} interleaved repeats")
    print_table(
        rows,
        [("streams", "B", "")]
        + [(f"{name}_ms", f"{name} ms", ".3f") for name in CONTENDERS]
        + [(f"{name}_vs_fp32", f"{name}/fp32", ".2f") for name in ("spec", "integer", "fp32 products")]
        + [("cold_vs_warm", "cold/warm products", ".2f")],
    )
    result = {
        "model": args.model or DEFAULT_MODEL,
        "positions": args.positions,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rows": rows,
        "kernels_compile_or_load_s": compile_seconds,
        "numba": numba.__version__,
        "numba_cpu": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
        "cpu": platform.processor() or platform.machine(),
        **environment(torch.device("cpu")),
    }
    write_json(result, "integer_step_speed.json", args.json)


if __name__ == "__main__":
    main()
