"""Evaluation in bits per byte with the paper's protocol (docs/evaluation.md).

The split is laid out as ``streams`` contiguous streams (16 for valid, 8 for test in the
paper), read in windows of ``bptt`` with the LSTM state and attention memory carried
from window to window, starting cold. Every token after the first of each stream is
predicted exactly once; the result is the negative log-likelihood over exactly those
predictions (their total, and its mean per token) (the original code divided by one row too many: a relative bias of
1/rows, a few parts per million on enwik8).

One total, three figures (paper §6.1, docs/tokenization.md): bits per byte of the text
the predicted tokens stand for, word perplexity over its words + ``<eos>`` (WikiText),
and the model's own per-token perplexity. Each token stands for exact bytes
(:attr:`sharnn.data.tokenizer.Tokenizer.token_bytes`), so these are counted, not estimated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .data.corpus import batchify, bptt_windows, get_batch
from .data.tokenizer import ByteTokenizer, Tokenizer
from .errors import DataError
from .models.sharnn import SHARNN, State
from .progress import ProgressDisplay
from .runtime import autocast


class EvaluationStopped(Exception):
    """Raised by :func:`score_windows` (and :func:`evaluate`) when its ``stop`` callable asks
    to end the walk between two windows: the split was not scored."""


@dataclass
class EvalResult:
    """A split's score.

    ``nats``: mean negative log-likelihood per predicted token, in nats; ``tokens``: the
    number of predicted tokens; ``bytes``: the bytes of text they stand for (= tokens
    for a byte model); ``words``: the words + ``<eos>`` among them, for corpora that
    count words (WikiText: the space characters of the text, one before every word and
    before each line's end), else None.

    ``bits``: the total in bits; ``bpc``: bits per byte of text (``bits / bytes``);
    ``bits_per_token``: ``nats / ln 2``; ``perplexity``: per token (``e^nats``);
    ``word_perplexity``: ``2^(bits / words)`` (None without words). A perplexity that
    overflows a float is ``inf``.
    """

    nats: float
    tokens: int
    bytes: int | None = None
    words: int | None = None

    def __post_init__(self):
        if self.bytes is None:
            self.bytes = self.tokens

    def totals(self) -> list[float]:
        """``[nats * tokens, tokens, bytes, words or 0]``: what adds up over the blocks of a
        split's streams (several processes score one block each)."""
        return [self.nats * self.tokens, self.tokens, self.bytes, self.words or 0]

    @classmethod
    def from_totals(cls, totals: list[float], words: bool) -> EvalResult:
        """The score of the summed :meth:`totals` of several blocks: the total negative
        log-likelihood over the total predicted tokens; ``words`` whether they count words."""
        nats, tokens, count, word_count = totals
        return cls(nats / tokens, int(tokens), int(count), int(word_count) if words else None)

    @property
    def bits(self) -> float:
        return self.nats * self.tokens / math.log(2)

    @property
    def bpc(self) -> float:
        return self.bits / self.bytes

    @property
    def bits_per_token(self) -> float:
        return self.nats / math.log(2)

    @property
    def perplexity(self) -> float:
        return _power(math.e, self.nats)

    @property
    def word_perplexity(self) -> float | None:
        return None if not self.words else _power(2.0, self.bits / self.words)


def _power(base: float, exponent: float) -> float:
    try:
        return base**exponent
    except OverflowError:  # a diverged model
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
    tokenizer: Tokenizer | None = None,
    count_words: bool = False,
    stop: Callable[[], bool] | None = None,
) -> EvalResult:
    """Score a split.

    Args:
        model: the model; it is put in eval mode and returned to its previous mode.
        data: token ids ``[N]`` (uint8 bytes for a byte model).
        streams: number of parallel streams ``B`` (paper: 16 valid, 8 test).
        bptt: window length ``T`` (at most the model's attention span).
        autocast_dtype: run under autocast with this dtype (None: fp32).
        progress: where to show how far the evaluation is (fraction of the windows done).
        block: score only these of the ``B`` streams (one process's share in a
            multi-process run, :mod:`sharnn.training.distributed`); None: all of them.
        tokenizer: what the ids stand for (None: bytes).
        count_words: count the words + ``<eos>`` of the predicted text (WikiText).
        stop: asked before every window (None: never); True abandons the evaluation.

    Returns:
        :class:`EvalResult` (over the streams of ``block``).

    Raises:
        EvaluationStopped: ``stop`` returned True.
        DataError: if the split has fewer than 2 tokens per stream, or holds ids wider
            than bytes with no tokenizer given (its bits per byte would be per token).
        ConfigError: a window longer than the model's attention span (from the model).
    """
    if tokenizer is None and np.asarray(data).dtype != np.uint8:
        raise DataError(
            f"token ids of dtype {np.asarray(data).dtype}: pass the corpus's tokenizer, which the bytes "
            f"per token come from"
        )
    total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)

    def add(row: int, logits: Tensor, targets: Tensor) -> None:
        total.add_(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").double())

    batched = score_windows(model, data, streams, bptt, add, autocast_dtype, progress, block, stop)
    tokens = (batched.shape[0] - 1) * batched.shape[1]
    return EvalResult(
        total.item() / tokens, tokens, *predicted_text(batched[1:], tokenizer or ByteTokenizer(), count_words)
    )


def score_windows(
    model: SHARNN,
    data: np.ndarray,
    streams: int,
    bptt: int,
    score: Callable[[int, Tensor, Tensor], None],
    autocast_dtype: torch.dtype | None = None,
    progress: ProgressDisplay | None = None,
    block: slice | None = None,
    stop: Callable[[], bool] | None = None,
) -> Tensor:
    """The protocol's walk over a split (module docstring), shared by :func:`evaluate` and
    :func:`sharnn.analysis.token_scores`: ``data`` ``[N]`` laid out as ``streams`` streams
    (those of ``block``), read in windows of ``bptt`` with the state carried from a cold
    start; ``score(row, logits, targets)`` gets each window's fp32 logits ``[T, B, V]``
    and targets ``[T, B]`` (rows ``row+1 .. row+T``). Call under ``torch.no_grad()``; the
    model is put in eval mode and returned to its previous mode. ``progress`` gets the
    fraction of the windows done and the tokens predicted so far; ``stop`` (None: never)
    is asked before every window, so that a stop request ends a long walk within a window.

    Returns:
        the batchified split ``[rows, B]``.

    Raises:
        EvaluationStopped: ``stop`` returned True.
        DataError: fewer than 2 tokens per stream.
        ConfigError: a window longer than the model's attention span (from the model).
    """
    batched = batchify(data, streams)[:, block or slice(None)]
    rows = batched.shape[0]
    if rows < 2:
        raise DataError(f"split of {len(data):,} tokens is too small for {streams} evaluation streams")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    state = None
    try:
        for row, length in bptt_windows(rows, bptt):
            if stop is not None and stop():
                raise EvaluationStopped
            inputs, targets = get_batch(batched, row, length, device)
            with autocast(device.type, autocast_dtype):
                logits, state = model(inputs, state)
            score(row, logits.float(), targets)
            if progress is not None:
                progress.update((row + length) / (rows - 1), done=(row + length) * batched.shape[1])
    finally:
        model.train(was_training)
    return batched


def predicted_text(targets: Tensor, tokenizer: Tokenizer, count_words: bool) -> tuple[int, int | None]:
    """``(bytes, words + <eos> or None)`` of the text the target ids ``[T, B]`` stand for."""
    if tokenizer.is_bytes and not count_words:
        return targets.numel(), None
    ids = targets.numpy().ravel()
    size = int(tokenizer.byte_lengths()[ids].sum())
    return size, int(tokenizer.space_counts()[ids].sum()) if count_words else None


def window_nll(
    model: SHARNN, inputs: Tensor, targets: Tensor, state: State | None, autocast_dtype: torch.dtype | None = None
) -> tuple[Tensor, State]:
    """One evaluation window: ``(summed negative log-likelihood in nats, a float64 0-dim
    tensor left on the device; the state for the next window)``. ``inputs`` and
    ``targets`` are ``[T, B]``; call under ``torch.no_grad()`` with the model in eval mode."""
    with autocast(inputs.device.type, autocast_dtype):
        logits, state = model(inputs, state)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double(), state
