"""The training speed of each variant of an ablation grid, all in one quiet run
(docs/ablations.md, "Three ways to compare").

A grid's wall-clock budget measures the machine's day as well as the variant: on a shared
host the same run took 1,100 to 1,529 steps in 900 s. This script measures every
variant's speed once, in one process on the grid's thread count, so that
``ablations.py --report --speeds FILE`` can compare the variants at equal compute: each
run's validation BPC at the step it reaches in the baseline's time at these speeds.

Every variant's model (its first seed's configuration) trains on the first windows of its
corpus with ``sharnn.training.recipe.train_step``, as ``sharnn train`` does without its
validations and checkpoints; after ``--warmup`` untimed rounds, ``--repeats`` rounds time
``--steps`` steps of every variant in turn, so that drift touches all alike. The figure is
the median tokens/s (``bptt`` x ``train_streams`` a step), and its ratio to the baseline's.

    python benchmarks/variant_speeds.py --grid benchmarks/ablations-span1024.yaml --json results/span1024-speeds.json

Exit status 0; 2 for a bad grid or option.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

from ablations import GRID, planned_config, read_grid
from common import environment, print_table, time_repeats, write_json
from sharnn import SHARNN, load_corpus
from sharnn.data.corpus import batchify, get_batch
from sharnn.errors import SharnnError
from sharnn.runtime import Runtime
from train_throughput_cpu import make_step


def trainer(config, windows: int):
    """``(run, tokens)``: a call that trains a fresh model of ``config`` on the corpus's first
    ``windows`` windows, one step each, and the tokens one call trains on."""
    runtime = Runtime.for_training(dataclasses.replace(config, device="cpu"))
    torch.manual_seed(config.seed)
    model = runtime.prepare(SHARNN(config.model)).train()
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    batched = batchify(corpus.train, config.train_streams)
    batches = [get_batch(batched, i * config.bptt, config.bptt) for i in range(windows)]
    step = make_step(model, config, runtime)

    def run():
        for inputs, targets in batches:
            step(inputs, targets)

    return run, windows * config.bptt * config.train_streams


def interleaved(timed: dict, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Tokens/s of each ``variant: (run, tokens)`` in ``repeats`` rounds, every variant in
    turn each round, after ``warmup`` untimed rounds."""
    rates: dict[str, list[float]] = {variant: [] for variant in timed}
    for index in range(warmup + repeats):
        for variant, (run, tokens) in timed.items():
            (seconds,) = time_repeats(run, torch.device("cpu"), 1)
            if index >= warmup:
                rates[variant].append(tokens / seconds)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, default=GRID, help="the grid's YAML file [benchmarks/ablations.yaml]")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant and round [%(default)s]")
    parser.add_argument("--repeats", type=int, default=5, help="rounds [%(default)s]")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first [%(default)s]")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/variant_speeds.json]")
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be at least 1, --warmup at least 0")
    try:
        grid = read_grid(args.grid)
    except SharnnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(grid.threads)
    first = {}
    for run in grid.runs:
        first.setdefault(run.variant, run)
    timed = {variant: trainer(planned_config(run, grid.seconds), args.steps) for variant, run in first.items()}
    rates = interleaved(timed, args.warmup, args.repeats)
    base = statistics.median(rates[grid.baseline])
    rows = [
        {"variant": variant, "tokens_per_second": statistics.median(samples)}
        | {"vs_baseline": statistics.median(samples) / base, "samples": samples}
        for variant, samples in rates.items()
    ]
    print_table(
        rows,
        [("variant", "variant", ""), ("tokens_per_second", "tokens/s", ",.0f"), ("vs_baseline", "vs baseline", ".3f")],
    )
    result = {"grid": str(args.grid), "baseline": grid.baseline, "threads": grid.threads, "steps": args.steps}
    result |= {"repeats": args.repeats, "warmup": args.warmup, "variants": rows, **environment(torch.device("cpu"))}
    write_json(result, "variant_speeds.json", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
