"""One LSTM layer alone, the two cells a block can run (docs/ablations.md, "The
layer-normalised LSTM's speed"): PyTorch's ``nn.LSTM`` (``model.cell = "lstm"``) against
:class:`sharnn.models.lstm.LayerNormLSTM` (``"ln_lstm"``), on one window ``x [T, B, d]``,
forward alone and forward with backward, one thread, all in one run.

A third row is the floor of any cell that runs its recurrence one position at a time
from Python, as the LN-LSTM does: the recurrent products alone, ``T`` products
``[B, d] x [d, 4d]`` forward and ``T`` products ``[B, 4d] x [4d, d]`` backward (the
weights' gradients are one product over the window, left out). The JSON records which
kernel ran ``nn.LSTM`` (on the CPU, oneDNN's fused RNN: the whole window in one call).

Each figure is the median of ``--repeats`` timed calls after one untimed one, in
milliseconds per window; "vs lstm" is the row's time over ``nn.LSTM``'s in the same pass.

    python benchmarks/lstm_cells.py                      # the grid's shapes: T 128, B 16, d 256
    python benchmarks/lstm_cells.py --d-model 512 --repeats 21
"""

from __future__ import annotations

import argparse

import torch

from common import environment, median, print_table, time_repeats, write_json
from sharnn.models.lstm import LayerNormLSTM

CPU = torch.device("cpu")


def lstm_kernel(lstm: torch.nn.LSTM, x: torch.Tensor) -> str:
    """The autograd node ``nn.LSTM``'s output on ``x`` hangs from: its kernel's backward
    (``MkldnnRnnLayerBackward0``: oneDNN's fused RNN)."""
    return lstm(x)[0].grad_fn.name()


def passes(cell, x: torch.Tensor) -> dict:
    """The cell's two passes on ``x``: its forward alone, and forward with backward."""

    def forward():
        with torch.no_grad():
            cell(x)

    def forward_backward():
        cell(x)[0].sum().backward()

    return {"forward": forward, "forward+backward": forward_backward}


def products(window: int, batch: int, d_model: int) -> dict:
    """The recurrent products alone, in both passes (module docstring)."""
    h, dgates = torch.randn(batch, d_model), torch.randn(batch, 4 * d_model)
    weight = torch.randn(4 * d_model, d_model) / d_model**0.5

    def forward():
        for _ in range(window):
            torch.mm(h, weight.t())

    def forward_backward():
        forward()
        for _ in range(window):
            torch.mm(dgates, weight)

    return {"forward": forward, "forward+backward": forward_backward}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=128, help="T, positions in the window [default: 128]")
    parser.add_argument("--batch", type=int, default=16, help="B, streams [default: 16]")
    parser.add_argument("--d-model", type=int, default=256, help="d [default: 256]")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/lstm_cells.json]")
    args = parser.parse_args()
    if min(args.window, args.batch, args.d_model, args.repeats) < 1:
        parser.error("--window, --batch, --d-model and --repeats must be at least 1")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    lstm, ln_lstm = torch.nn.LSTM(args.d_model, args.d_model), LayerNormLSTM(args.d_model, eps=1e-5)
    x = torch.randn(args.window, args.batch, args.d_model, requires_grad=True)
    rows = []
    for cell, runs in (
        ("lstm", passes(lstm, x)),
        ("ln_lstm", passes(ln_lstm, x)),
        ("recurrent products alone", products(args.window, args.batch, args.d_model)),
    ):
        row = {"cell": cell}
        for name, run in runs.items():
            run()
            row[f"{name}_ms"] = 1e3 * median(time_repeats(run, CPU, args.repeats))
        rows.append(row)
    for row in rows:
        for name in ("forward", "forward+backward"):
            row[f"{name}_vs_lstm"] = row[f"{name}_ms"] / rows[0][f"{name}_ms"]
    print_table(
        rows,
        [("cell", "cell", ""), ("forward_ms", "forward ms", ".1f"), ("forward_vs_lstm", "vs lstm", ".2f")]
        + [("forward+backward_ms", "forward+backward ms", ".1f"), ("forward+backward_vs_lstm", "vs lstm", ".2f")],
    )
    kernel = lstm_kernel(lstm, x)
    print(f"nn.LSTM's autograd node: {kernel}")
    shapes = {"window": args.window, "batch": args.batch, "d_model": args.d_model, "repeats": args.repeats}
    write_json({"rows": rows, **shapes, "lstm_kernel": kernel, **environment(CPU)}, "lstm_cells.json", args.json)


if __name__ == "__main__":
    main()
