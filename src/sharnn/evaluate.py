"""Evaluation in bits per byte with the paper's protocol (reference §7).

The split is laid out as ``streams`` contiguous streams (16 for valid, 8 for test in the
paper), read in windows of ``bptt`` with the LSTM state and attention memory carried
from window to window, starting cold. Every byte after the first of each stream is
predicted exactly once; the result is the mean negative log-likelihood over exactly
those predictions (the original divided by one row too many, a 3e-6 relative bias).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .data import batchify, bptt_windows, get_batch
from .errors import DataError
from .model import SHARNN


@dataclass
class EvalResult:
    """Attributes: ``nats`` mean NLL per byte (nats), ``bits`` per byte (BPC = nats / ln 2),
    ``perplexity`` per byte (e^nats), ``tokens`` the number of predicted bytes."""

    nats: float
    tokens: int

    @property
    def bits(self) -> float:
        return self.nats / math.log(2)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nats)


@torch.no_grad()
def evaluate(
    model: SHARNN,
    data: np.ndarray,
    streams: int,
    bptt: int,
    autocast_dtype: torch.dtype | None = None,
) -> EvalResult:
    """Score a byte split.

    Args:
        model: the model; it is put in eval mode and returned to its previous mode.
        data: uint8 bytes ``[N]``.
        streams: number of parallel streams ``B`` (paper: 16 valid, 8 test).
        bptt: window length ``T``.
        autocast_dtype: run under autocast with this dtype (None: no autocast).

    Returns:
        :class:`EvalResult`.

    Raises:
        DataError: if the split has fewer than 2 bytes per stream.
    """
    batched = batchify(data, streams)
    rows = batched.shape[0]
    if rows < 2:
        raise DataError(f"split of {len(data):,} bytes is too small for {streams} evaluation streams")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    state = None
    for row, length in bptt_windows(rows, min(bptt, model.config.attention_span), rng=None):
        inputs, targets = get_batch(batched, row, length, device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            logits, state = model(inputs, state)
        total += F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double()
    model.train(was_training)
    tokens = (rows - 1) * streams
    return EvalResult(nats=total.item() / tokens, tokens=tokens)
