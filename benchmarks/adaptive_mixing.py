"""What each part of the adaptive stage gives, in bits per byte (docs/compression.md,
"Adapting to the file").

For each file: the integer step's log-weights of every position (the shipped model or
``--model``; the file cut into streams as ``sharnn compress`` cuts it, one thread), computed
once; then the ideal code length (the sum of ``-log2 p``, no coder, no header) under

- ``model alone``: the integer step's distribution (``--no-adapt``);
- ``one mixer, model start``: context models and one mixer (weight sets by the contexts
  seen), every weight starting at zero but the model's at one;
- ``two mixers, model start``: and the second mixer (weight sets by the previous byte);
- ``default``: and the starting weights of :mod:`sharnn.coding.mixing`;

beside PPMd (``pyppmd``, order 8, 16 MiB) on the same bytes. The variants change the
module's constants for their run alone (a measurement, not a mode of the package).

    python benchmarks/adaptive_mixing.py                         # alice29, the shipped model
    python benchmarks/adaptive_mixing.py --files alice29 lcet10 enwik8-head-test --markdown ablation.md
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from unittest import mock

import numpy as np
import torch

from common import missing_extra, print_table, write_json
from compressors import CANTERBURY, WIKITEXT, read_file
from sharnn.coding import mixing
from sharnn.coding.codec import START_BYTE, default_streams, stream_lengths
from sharnn.models import exact
from sharnn.models.integer_step import IntegerStep
from sharnn.models.shipped import DEFAULT_MODEL
from sharnn.training.checkpoint import load_model

try:
    import pyppmd
except ModuleNotFoundError as e:  # not a dependency of sharnn itself: the extra "bench" installs it
    missing_extra(e, __name__)

FILES = ("enwik8-head-test", "wikitext2-test", *CANTERBURY)
UNIT = mixing.WEIGHT_UNIT
VARIANTS = {  # name: the module constants it changes
    "one mixer, model start": {"SELECTORS": mixing.SELECTORS[:1], "MODEL_PRIOR": UNIT, "COUNT_PRIOR": 0},
    "two mixers, model start": {"MODEL_PRIOR": UNIT, "COUNT_PRIOR": 0},
    "default": {},
}


def model_log_weights(model, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The integer step's log-weights ``[rows, B, 256]`` (1/256 nat) over ``data`` cut into
    ``sharnn compress``'s streams, and the grid of bytes ``[rows, B]`` they predict."""
    lengths = stream_lengths(len(data), default_streams(len(data)))
    rows, starts = max(lengths), np.cumsum([0, *lengths])
    grid = np.zeros((rows + 1, len(lengths)), dtype=np.int64)
    grid[0] = START_BYTE
    for b, n in enumerate(lengths):
        grid[1 : n + 1, b] = np.frombuffer(data[starts[b] : starts[b] + n], dtype=np.uint8)
    step = IntegerStep(model, len(lengths), rows)
    weights = np.stack([exact.log_weights(step(torch.from_numpy(grid[t]))).numpy() for t in range(rows)])
    return weights, grid[1:], np.array(lengths)


def ideal_bits(weights: np.ndarray, grid: np.ndarray, lengths: np.ndarray, mixed: bool) -> float:
    """The sum of ``-log2 p`` of every byte, under the model alone or the mixer."""
    mixer, bits = mixing.AdaptiveMixer(len(lengths)) if mixed else None, 0.0
    for t in range(len(grid)):
        running = int((lengths > t).sum())
        if mixer is None:
            q = exact.exp_table().numpy()[-weights[t]]
            probs = q / q.sum(1, keepdims=True)
        else:
            probs = mixer.mix(weights[t])
        bits -= np.log2(probs[np.arange(running), grid[t, :running]]).sum()
        if mixer is not None:
            mixer.update(grid[t, :running])
    return bits


def measure(name: str, model, limit: int | None) -> dict:
    data = read_file(name, WIKITEXT)[:limit]
    started = time.perf_counter()
    weights, grid, lengths = model_log_weights(model, data)
    row = {"file": name, "bytes": len(data), "streams": len(lengths), "model_seconds": time.perf_counter() - started}
    row["model alone"] = ideal_bits(weights, grid, lengths, mixed=False) / len(data)
    for variant, constants in VARIANTS.items():
        with ExitStack() as stack:
            for constant, value in constants.items():
                stack.enter_context(mock.patch.object(mixing, constant, value))
            started = time.perf_counter()
            row[variant] = ideal_bits(weights, grid, lengths, mixed=True) / len(data)
            row[f"{variant} seconds"] = time.perf_counter() - started
    row["PPMd"] = 8 * len(pyppmd.compress(data, variant="H", max_order=8, mem_size=16 << 20)) / len(data)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="run, checkpoint or shipped model [%(default)s]")
    parser.add_argument("--files", nargs="+", choices=FILES, default=["alice29"])
    parser.add_argument("--limit", type=int, default=None, help="keep each file's first N bytes")
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/adaptive_mixing.json]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model)[0]
    rows = [measure(name, model, args.limit) for name in args.files]
    columns = ["model alone", *VARIANTS, "PPMd"]
    print_table(rows, [("file", "file", ""), ("bytes", "bytes", ",")] + [(c, c, ".4f") for c in columns])
    if args.markdown:
        lines = ["| file | bytes | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
        lines += [
            f"| {r['file']} | {r['bytes']:,} | " + " | ".join(f"{r[c]:.4f}" for c in columns) + " |" for r in rows
        ]
        with open(args.markdown, "w") as out:
            out.write("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
    write_json({"model": str(args.model), "limit": args.limit, "rows": rows}, "adaptive_mixing.json", args.json)


if __name__ == "__main__":
    main()
