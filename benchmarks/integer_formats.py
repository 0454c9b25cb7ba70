"""What each number format of the integer step costs, in bits per byte (docs/compression.md,
"The integer step").

Codes the first ``--bytes`` bytes of a file with ``B = --streams`` streams (as
``sharnn compress`` cuts them) and sums ``-log2 p`` of every byte (the ideal code length,
no coder, no header) under: the fp32 step (:class:`sharnn.models.step.Step`); the integer
step's specification (tests/spec_integer_step.py: the torch code whose bits the kernels of
:class:`sharnn.models.integer_step.IntegerStep` compute, one call per operation, so that a
piece can be swapped); and that specification with one of its exactly specified pieces put
back to floating point at a time:

- ``products``: the matrix products in float32 with the float weights (no 8-bit weights,
  no integer inputs);
- ``layer norms``: ``F.layer_norm`` in place of the exact LayerNorm;
- ``tables``: ``torch.sigmoid`` and ``torch.tanh`` in place of the tables;
- ``attention``: the memory and the query unrounded (float64) and ``exp`` in place of the
  integer weights;
- ``output softmax``: ``torch.softmax`` (float64) in place of the integer weights.

A piece's cost is the integer step's bits per byte minus those with that piece in float.
One thread. The variants replace module attributes for their run alone (a measurement, not
a mode of the package).

    python benchmarks/integer_formats.py                          # the shipped model, enwik8-head-test
    python benchmarks/integer_formats.py --model runs/tiny --file alice29 --bytes 4000
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from common import print_table, write_json
from compressors import CANTERBURY, WIKITEXT, read_file
from sharnn.coding.arithmetic import probabilities
from sharnn.coding.codec import stream_lengths
from sharnn.models.shipped import DEFAULT_MODEL, shipped_folder
from sharnn.models.step import Step
from sharnn.training.checkpoint import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the specification lives with the tests
import spec_integer_step as spec
from spec_integer_step import IntegerStep


class _FloatLinear(spec.ExactLinear):
    """The product in float32 with the float weights, as the fp32 step computes it."""

    def __init__(self, weight, bias=None):
        super().__init__(weight, bias)
        self.float_weight = weight

    def __call__(self, x, product):
        return F.linear(x, self.float_weight, self.bias)


def _float_layer_norm(x, eps):
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def _float_exp_weights(gaps):
    return spec.exact.EXP_ONE * torch.exp(-gaps)


VARIANTS = {  # name: the attributes replaced for the run
    "products": [(spec, "ExactLinear", _FloatLinear)],
    "layer norms": [(spec, "layer_norm", _float_layer_norm)],
    "tables": [
        (spec, "sigmoid", torch.sigmoid),
        (spec, "tanh", torch.tanh),
        (spec, "sigmoid_and_tanh", lambda x, split: torch.cat([x[:, :split].sigmoid(), x[:, split:].tanh()], 1)),
    ],
    "attention": [
        (spec, "MEMORY_FRACTION_BITS", 40),
        (spec, "MEMORY_LIMIT", 2.0**70),
        (spec, "QUERY_BITS", 45),
        (spec.exact, "exp_weights", _float_exp_weights),
    ],
    "output softmax": [(IntegerStep, "probabilities", staticmethod(probabilities))],
}


def bits(model, data: bytes, streams: int, step_class) -> float:
    """The ideal code length in bits of ``data`` cut into ``streams`` streams, each starting
    after a newline, under ``step_class(model, B)``'s probabilities."""
    lengths = stream_lengths(len(data), streams)
    starts = np.cumsum([0, *lengths])
    rows = lengths[0]
    grid = np.full((rows + 1, len(lengths)), 10, dtype=np.int64)
    for b, (a, n) in enumerate(zip(starts, lengths)):
        grid[1 : n + 1, b] = np.frombuffer(data[a : a + n], dtype=np.uint8)
    step = step_class(model, len(lengths), rows)
    to_probabilities = step.probabilities if isinstance(step, IntegerStep) else probabilities
    total = 0.0
    for t in range(rows):
        p = to_probabilities(step(torch.from_numpy(grid[t])))
        running = [b for b, n in enumerate(lengths) if t < n]
        total -= np.log2(p[running, grid[t + 1, running]]).sum()
    return float(total)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help=f"run or checkpoint [default: the shipped {DEFAULT_MODEL}]")
    parser.add_argument("--file", default="enwik8-head-test", choices=["enwik8-head-test", "sharnn-docs", *CANTERBURY])
    parser.add_argument("--bytes", type=int, default=16000, help="the file's first N bytes [default: 16000]")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--json", default=None, help="[default: benchmarks/results/integer_formats.json]")
    args = parser.parse_args()
    if args.bytes < 1 or args.streams < 1:
        parser.error("--bytes and --streams must be at least 1")
    torch.set_num_threads(1)
    model = load_model(args.model or shipped_folder(DEFAULT_MODEL))[0].float().eval()
    data = read_file(args.file, WIKITEXT)[: args.bytes]
    measured = {
        "fp32 step": bits(model, data, args.streams, Step),
        "integer step": bits(model, data, args.streams, IntegerStep),
    }
    for name, replacements in VARIANTS.items():
        with ExitStack() as stack:
            for owner, attribute, value in replacements:
                stack.enter_context(mock.patch.object(owner, attribute, value))
            measured[f"integer, {name} in float"] = bits(model, data, args.streams, IntegerStep)
    integer = measured["integer step"]
    rows = [
        {
            "variant": name,
            "bits_per_byte": value / len(data),
            "cost_of_the_piece": None if "in float" not in name else (integer - value) / len(data),
        }
        for name, value in measured.items()
    ]
    print(f"{args.file}, first {len(data):,} bytes, {args.streams} streams, one thread")
    print_table(
        rows,
        [
            ("variant", "variant", ""),
            ("bits_per_byte", "bits/byte", ".5f"),
            ("cost_of_the_piece", "cost of the piece", "+.5f"),
        ],
    )
    result = {
        "model": args.model or DEFAULT_MODEL,
        "file": args.file,
        "bytes": len(data),
        "streams": args.streams,
        "rows": rows,
    }
    write_json(result, "integer_formats.json", args.json)


if __name__ == "__main__":
    main()
