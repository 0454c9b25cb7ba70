"""Evaluation in bits per byte with the paper's protocol (docs/evaluation.md).

The split is laid out as ``streams`` contiguous streams (16 for valid, 8 for test in the
paper), read in windows of ``bptt`` with the LSTM state and attention memory carried
from window to window, starting cold. Every byte after the first of each stream is
predicted exactly once; the result is the mean negative log-likelihood over exactly
those predictions (the original code divided by one row too many: a relative bias of
1/rows, a few parts per million on enwik8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .data import batchify, bptt_windows, get_batch
from .errors import DataError
from .model import SHARNN, State
from .progress import ProgressDisplay
from .runtime import autocast


@dataclass
class EvalResult:
    """A split's score. ``nats``: mean negative log-likelihood per byte, in nats;
    ``tokens``: the number of predicted bytes; ``bpc``: bits per byte (``nats / ln 2``);
    ``perplexity``: per byte (``e^nats``; ``inf`` where that overflows a float)."""

    nats: float
    tokens: int

    @property
    def bpc(self) -> float:
        return self.nats / math.log(2)

    @property
    def perplexity(self) -> float:
        try:
            return math.exp(self.nats)
        except OverflowError:  # a diverged model: nats above ~709
            return math.inf


@torch.no_grad()
def evaluate(
    model: SHARNN,
    data: np.ndarray,
    streams: int,
    bptt: int,
    autocast_dtype: torch.dtype | None = None,
    progress: ProgressDisplay | None = None,
    block: slice | None = None,
) -> EvalResult:
    """Score a byte split.

    Args:
        model: the model; it is put in eval mode and returned to its previous mode.
        data: uint8 bytes ``[N]``.
        streams: number of parallel streams ``B`` (paper: 16 valid, 8 test).
        bptt: window length ``T`` (at most the model's attention span).
        autocast_dtype: run under autocast with this dtype (None: fp32).
        progress: where to show how far the evaluation is (fraction of the windows done).
        block: score only these of the ``B`` streams (one process's share in a
            multi-process run, :mod:`sharnn.distributed`); None: all of them.

    Returns:
        :class:`EvalResult` (over the streams of ``block``).

    Raises:
        DataError: if the split has fewer than 2 bytes per stream.
        ConfigError: a window longer than the model's attention span (from the model).
    """
    batched = batchify(data, streams)[:, block or slice(None)]
    rows = batched.shape[0]
    if rows < 2:
        raise DataError(f"split of {len(data):,} bytes is too small for {streams} evaluation streams")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    state = None
    for row, length in bptt_windows(rows, bptt):
        inputs, targets = get_batch(batched, row, length, device)
        nll, state = window_nll(model, inputs, targets, state, autocast_dtype)
        total += nll
        if progress is not None:
            progress.update((row + length) / (rows - 1))
    model.train(was_training)
    tokens = (rows - 1) * batched.shape[1]
    return EvalResult(nats=total.item() / tokens, tokens=tokens)


def window_nll(
    model: SHARNN, inputs: Tensor, targets: Tensor, state: State | None, autocast_dtype: torch.dtype | None = None
) -> tuple[Tensor, State]:
    """One evaluation window: ``(summed negative log-likelihood in nats, a float64 0-dim
    tensor left on the device; the state for the next window)``. ``inputs`` and
    ``targets`` are ``[T, B]``; call under ``torch.no_grad()`` with the model in eval mode."""
    with autocast(inputs.device.type, autocast_dtype):
        logits, state = model(inputs, state)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double(), state
