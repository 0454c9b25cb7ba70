"""How many threads the coding step should run on: one position of the step (``--step``:
the fp32 ``sharnn.models.step.Step`` or the integer step, whose numba kernels and products
run on the same count) per thread count and stream count, on a quiet machine and beside a
neighbour that keeps one core busy.

For every ``B`` of ``--batch`` and every thread count of ``--threads``, the step runs
``attention_span + 1`` positions untimed (the memory full), then ``--repeats`` runs of
``--positions`` positions; the figure is the median run's time per position. Each is
measured twice: quiet, and with a neighbour, a second Python process multiplying
``[256, 512] x [512, 512]`` matrices on one thread in a loop for the whole measurement
(what anything else running on a 2-core machine does). Reported per row: milliseconds per
position, bytes per second (``B`` / time), and the time relative to one thread in the
same condition. ``sharnn compress --threads`` defaults to 1 (docs/compression.md,
"Streams and threads").

    python benchmarks/coding_threads.py --model runs/tiny --batch 1 8 32 128 --threads 1 2
    python benchmarks/coding_threads.py --model wikipedia-2x512 --step integer --batch 2 8 32

Without ``--model`` the step runs a seeded random initialisation of the ``tiny`` preset's
model (the speed does not depend on the weights).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from contextlib import contextmanager

import torch

from common import environment, median, print_table, time_repeats, write_json
from sharnn import SHARNN
from sharnn.coding.environment import coding_threads
from sharnn.config import load_config
from sharnn.loading import load_model
from sharnn.models.inference import inference_step

CPU = torch.device("cpu")
NEIGHBOUR = """
import torch
torch.set_num_threads(1)
a, b = torch.randn(256, 512), torch.randn(512, 512)
print("busy", flush=True)
while True:
    a @ b
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="run or checkpoint of an SHA-RNN [default: tiny, random]")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128], help="streams B")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts")
    parser.add_argument("--positions", type=int, default=50, help="timed positions per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (the median is reported)")
    parser.add_argument("--step", choices=["fp32", "integer"], default="fp32", help="the step [%(default)s]")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/coding_threads.json]")
    args = parser.parse_args()
    if args.model is None:
        torch.manual_seed(0)
        model = SHARNN(load_config("tiny").model)
    else:
        model = load_model(args.model)[0]
    model.eval()
    rows = []
    for condition in ("quiet", "neighbour"):
        with neighbour(condition == "neighbour"):
            for streams in args.batch:
                first = None
                for threads in args.threads:
                    ms = position_ms(model, streams, threads, args.positions, args.repeats, args.step)
                    first = first or ms
                    rows.append(
                        {
                            "condition": condition,
                            "batch": streams,
                            "threads": threads,
                            "ms_per_position": ms,
                            "bytes_per_s": 1000 * streams / ms,
                            "vs_first": ms / first,
                        }
                    )
                    print(f"{condition} B={streams} threads={threads}: {ms:.3f} ms", file=sys.stderr, flush=True)
    print_table(
        rows,
        [
            ("condition", "condition", ""),
            ("batch", "B", ""),
            ("threads", "threads", ""),
            ("ms_per_position", "ms/position", ".3f"),
            ("bytes_per_s", "bytes/s", ",.0f"),
            ("vs_first", f"x {args.threads[0]} thread", ".2f"),
        ],
    )
    settings = {
        "step": args.step,
        "batch": args.batch,
        "threads": args.threads,
        "positions": args.positions,
        "repeats": args.repeats,
    }
    write_json({"environment": environment(CPU), **settings, "rows": rows}, "coding_threads.json", args.json)


@torch.no_grad()
def position_ms(model: SHARNN, streams: int, threads: int, positions: int, repeats: int, kind: str = "fp32") -> float:
    """Milliseconds of one position of the ``kind`` step at ``streams`` streams on ``threads``
    threads: the median of ``repeats`` runs of ``positions`` positions, after the memory filled."""
    generator = torch.Generator().manual_seed(0)
    with coding_threads(threads):
        step = inference_step(model, streams, None, kind)
        tokens = torch.randint(0, model.config.vocab_size, (streams,), generator=generator)
        for _ in range(model.config.attention_span + 1):
            step(tokens)

        def run() -> None:
            for _ in range(positions):
                step(tokens)

        return 1000 * median(time_repeats(run, CPU, repeats)) / positions


@contextmanager
def neighbour(busy: bool):
    """With ``busy``, a second process keeping one core busy for the block's duration."""
    if not busy:
        yield
        return
    process = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True)
    try:
        process.stdout.readline()  # "busy": the loop has started
        yield
    finally:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
