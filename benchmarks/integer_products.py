"""The integer step's matrix products in two exact forms torch has, float32 and int8
(docs/compression.md, "The integer step's kernels").

The integer step's products are sums of integers, so any kernel that sums them without
rounding gives the same bits (the step itself sums them with its own numba kernel,
sharnn.models.integer_products; benchmarks/integer_step_speed.py times it). Two kernels
torch offers on the CPU compute them exactly:

- ``fp32``: integers held in float32, oneDNN's float32 product (what the specification,
  tests/spec_integer_step.py, uses; exact while every partial sum stays within 2**24), also
  the float step's kernel;
- ``int8``: ``torch._int_mm``, int8 x int8 summed in int32 (exact for any inputs of 8 bits);

(A bfloat16 product is no third way: on the CPU torch returns it in bfloat16, its sums
rounded to 8 bits.) The two results are checked to be equal (exit status 1 if not).

Each is timed at the shipped model's shapes and ``B = --streams`` rows, one thread, as the
median of ``--repeats`` runs of ``--calls`` calls, all in one run; the table gives each
int8 kernel's time over float32's. (The step's inputs take 10 to 16 bits, so int8 would
need each input split in two.)

    python benchmarks/integer_products.py
    python benchmarks/integer_products.py --streams 8 32 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from common import environment, median, print_table, write_json
from sharnn.models.step import linear

# [N, K] of the shipped model's products: the LSTM's gates (both inputs), the Boom, the query, the output
SHAPES = {"lstm gates": (2048, 1024), "boom": (2048, 512), "query": (512, 512), "output": (256, 512)}


def kernels(rows: int, n: int, k: int) -> dict:
    """The two products of ``[rows, k]`` integers by ``[n, k]`` integers in [-127, 127]."""
    x = torch.randint(-127, 128, (rows, k))
    w = torch.randint(-127, 128, (n, k))
    x32, w32, x8, w8t = x.float(), w.float(), x.to(torch.int8), w.to(torch.int8).t()
    return {"fp32": lambda: linear(x32, w32), "int8": lambda: torch._int_mm(x8, w8t)}


def seconds_per_call(run, calls: int, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - started) / calls)
    return median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/integer_products.json]")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = []
    for streams in args.streams:
        for name, (n, k) in SHAPES.items():
            runs = kernels(streams, n, k)
            results = [run().double() for run in runs.values()]
            if not all(torch.equal(r, results[0]) for r in results):
                sys.exit(f"error: the kernels' sums of {name} differ: one of them is not exact here")
            timed = {kernel: seconds_per_call(run, args.calls, args.repeats) for kernel, run in runs.items()}
            row = {"streams": streams, "product": f"{name} [{n}, {k}]"} | {
                f"{kk}_us": 1e6 * v for kk, v in timed.items()
            }
            rows.append(row | {f"{kk}_vs_fp32": v / timed["fp32"] for kk, v in timed.items() if kk != "fp32"})
    print_table(
        rows,
        [("streams", "B", ""), ("product", "product", ""), ("fp32_us", "fp32 us", ".1f")]
        + [("int8_us", "int8 us", ".1f"), ("int8_vs_fp32", "int8/fp32", ".2f")],
    )
    write_json({"rows": rows, **environment(torch.device("cpu"))}, "integer_products.json", args.json)


if __name__ == "__main__":
    main()
