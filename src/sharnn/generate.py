"""Sampling bytes from a trained model, streaming (SPEC §5).

The prompt is fed once, in windows, carrying the LSTM state and memory; then every
sampled byte is fed alone with the carried state. Nothing is re-encoded per byte.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .model import SHARNN


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Next-token probabilities ``[V]`` from logits ``[V]``.

    ``temperature`` 0 puts all mass on the argmax; ``top_k`` > 0 keeps the k most likely
    tokens; ``top_p`` < 1 keeps the smallest set whose probability reaches ``top_p``
    (nucleus sampling). The kept probabilities are renormalised.

    Raises:
        ValueError: negative temperature or top_k, or top_p outside (0, 1].
    """
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError("temperature and top_k must be >= 0 and top_p in (0, 1]")
    logits = logits.float()
    if temperature == 0:
        probs = torch.zeros_like(logits)
        probs[logits.argmax()] = 1.0
        return probs
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        # drop a token when the mass before it already reaches top_p
        drop = sorted_probs.cumsum(0) - sorted_probs >= top_p
        probs[order[drop]] = 0.0
        probs = probs / probs.sum()
    return probs


@torch.no_grad()
def generate(
    model: SHARNN,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    window: int = 1024,
) -> Iterator[int]:
    """Yield sampled token ids one at a time, as they are produced.

    Args:
        model: a trained model (put in eval mode).
        prompt: int64 token ids ``[N]``, ``N >= 1``.
        max_new_tokens: how many tokens to sample.
        temperature, top_k, top_p: see :func:`filter_logits`.
        seed: seed of the sampling generator (None: nondeterministic).
        window: longest chunk in which the prompt is fed (capped at the attention span).

    Raises:
        ValueError: an empty prompt or invalid sampling settings.
    """
    if prompt.numel() == 0:
        raise ValueError("the prompt must hold at least one token")
    filter_logits(torch.zeros(2), temperature, top_k, top_p)  # validate settings before any work
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed) if seed is not None else generator.seed()
    window = min(window, model.config.attention_span)
    state = None
    prompt = prompt.to(device)
    for start in range(0, prompt.numel(), window):
        logits, state = model(prompt[start : start + window].view(-1, 1), state)
    for i in range(max_new_tokens):
        probs = filter_logits(logits[-1, 0].cpu(), temperature, top_k, top_p)
        token = int(torch.multinomial(probs, 1, generator=generator))
        yield token
        if i + 1 < max_new_tokens:
            logits, state = model(torch.tensor([[token]], device=device), state)
