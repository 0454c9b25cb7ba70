"""Sampling from a trained model, streaming, any number of streams at once (one stream is
the case ``B = 1``).

The prompts are fed once, in windows, carrying the LSTM state and memory; then every
sampled token is fed alone with the carried state. Nothing is re-encoded per token. An
SHA-RNN runs the sampled tokens through the inference step
(:class:`sharnn.models.step.Step`), its state the prompt's: in fp32 without autocast, in
bf16 under bf16 autocast (the fast path). A Transformer, or a model under fp16 autocast,
runs them through its forward, which copies the whole memory at every token: on an H200
the fast path generated 3.5 times slower than eager that way
(benchmarks/records/gpu-h200-2026-11-26/README.md).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .data.corpus import Corpus
from .errors import CheckpointError, ConfigError
from .models.inference import inference_step
from .models.sharnn import SHARNN
from .runtime import autocast


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Next-token probabilities ``[..., V]`` (float32) from logits ``[..., V]``, row by row.

    ``temperature`` 0 puts all mass on the argmax; ``top_k`` > 0 keeps the k most likely
    tokens; ``top_p`` < 1 keeps the smallest set whose probability reaches ``top_p``
    (nucleus sampling). The kept probabilities are renormalised.

    Raises:
        ConfigError (a ``ValueError``): negative or non-finite temperature, negative top_k,
            or top_p outside (0, 1].
    """
    if not 0 <= temperature < float("inf") or top_k < 0 or not 0 < top_p <= 1:
        raise ConfigError("temperature must be a finite number >= 0, top_k >= 0 and top_p in (0, 1]")
    logits = logits.float()
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = _scaled(logits, temperature)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        drop[..., 0] = False  # the most likely token stays, however small top_p (below float32's smallest: 0)
        probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature``; in a row where that overflows (a temperature so small, or
    below float32's smallest number, that the quotient passes float32's range), the
    quotient of the logits less their largest, in float64: 0 for the largest, the rest
    -inf or below, so that the softmax puts the mass on the largest, as the limit does.
    No branch on the values: nothing waits for the device."""
    scaled = logits / temperature
    safe = (logits - logits.amax(-1, keepdim=True)).double().div(temperature).float()
    return torch.where(torch.isfinite(scaled).all(-1, keepdim=True), scaled, safe)


def prompt_bytes(prompt: str | bytes) -> bytes:
    """A prompt's bytes: text as UTF-8, where the bytes a command line could not decode as
    UTF-8 (which Python keeps as lone surrogates, PEP 383) are the bytes given; bytes as they are.

    Raises:
        ConfigError: text with a lone surrogate that stands for no byte (not text at all).
    """
    if not isinstance(prompt, str):
        return prompt
    try:
        return prompt.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"the prompt is not valid text: {prompt[e.start]!r} at character {e.start} is a lone surrogate"
        ) from None


def _draw(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row of ``probs``. Raises :class:`CheckpointError` where the model's
    predictions are not numbers (weights too large for its arithmetic: NaN or infinity)."""
    try:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    except RuntimeError:
        if bool(torch.isfinite(probs).all()):
            raise
        raise CheckpointError(
            "the model's predictions are not numbers (NaN or infinity): its weights are too large for its "
            "arithmetic, or broken"
        ) from None


@torch.no_grad()
def generate(
    model: SHARNN,
    prompts: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    window: int = 1024,
    autocast_dtype: torch.dtype | None = None,
) -> Iterator[Tensor]:
    """Sample ``B`` streams at once; yield each step's tokens ``[B]`` (int64, on the model's
    device) as soon as they are drawn. Sampling happens on the device: nothing here waits
    for the GPU unless the caller reads the tokens (``int(tokens[0])`` for one stream).

    Args:
        model: a trained model (put in eval mode); its attention implementation is kept.
        prompts: int64 token ids ``[N, B]``, ``N >= 1``: one prompt per stream, all of one
            length. One stream: ``prompt.view(-1, 1)``.
        max_new_tokens: how many tokens to sample per stream.
        temperature, top_k, top_p: see :func:`filter_logits`.
        seed: seed of the sampling generator (None: nondeterministic).
        window: longest chunk in which the prompts are fed (capped at the attention span).
        autocast_dtype: run the model under autocast with this dtype (None: fp32).

    Raises:
        ValueError: prompts that are not a non-empty ``[N, B]`` tensor.
        ConfigError (a ``ValueError``): invalid sampling settings (before any work).
        CheckpointError: predictions that are not numbers (on the CPU; a weight too large).
    """
    if prompts.dim() != 2 or prompts.numel() == 0:
        raise ValueError("prompts must be a non-empty [N, B] tensor of token ids")
    filter_logits(torch.zeros(2), temperature, top_k, top_p)  # validate settings before any work
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed) if seed is not None else generator.seed()
    logits, advance = _read_prompts(model, prompts.to(device), window, autocast_dtype, max_new_tokens)
    for i in range(max_new_tokens):
        probs = filter_logits(logits, temperature, top_k, top_p)  # [B, V]
        tokens = _draw(probs, generator)
        yield tokens
        if i + 1 < max_new_tokens:
            logits = advance(tokens)


STEP_PRECISION = {None: "fp32", torch.bfloat16: "bf16"}  # the autocast dtypes the inference step has a precision for


def _read_prompts(
    model: SHARNN, prompts: Tensor, window: int, autocast_dtype: torch.dtype | None, max_new_tokens: int
) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """Feed ``prompts [N, B]`` in chunks of ``window`` (capped at the attention span): the
    logits ``[B, V]`` of their last position, and the step that runs one more position
    (``tokens [B] -> logits [B, V]``) from the prompts' state: an SHA-RNN's inference
    :class:`~sharnn.models.step.Step` (fp32, or bf16 under bf16 autocast), the model's
    forward otherwise."""
    window = min(window, model.config.attention_span)

    def forward(tokens: Tensor, state):
        with autocast(prompts.device.type, autocast_dtype):
            return model(tokens, state)

    state = None
    for start in range(0, prompts.shape[0], window):
        logits, state = forward(prompts[start : start + window], state)
    if isinstance(model, SHARNN) and autocast_dtype in STEP_PRECISION:  # the inference step, from the prompt's state
        step = inference_step(
            model, prompts.shape[1], prompts.shape[0] + max_new_tokens, STEP_PRECISION[autocast_dtype]
        )
        step.load_state(state)
        return logits[-1], step

    def advance(tokens: Tensor) -> Tensor:
        nonlocal state
        logits, state = forward(tokens.view(1, -1), state)
        return logits[0]

    return logits[-1], advance


def training_sample(
    model: SHARNN, corpus: Corpus, n: int, seed: int, autocast_dtype: torch.dtype | None = None
) -> list[tuple[str, str]]:
    """What ``sharnn train`` prints at its end (``sample_bytes``), as ``(header, text)``
    pairs: the prompt, the first 256 ids of the corpus's test split, then ``n`` ids
    generated from it at temperature 0.8 with ``seed``, decoded as UTF-8 across the two
    (invalid UTF-8 shown as U+FFFD)."""
    tokenizer = corpus.tokenizer
    unit = "bytes" if tokenizer.is_bytes else f"{tokenizer.name} tokens"
    prompt = torch.from_numpy(corpus.test[:256].astype(np.int64))
    steps = generate(model, prompt.view(-1, 1), n, temperature=0.8, seed=seed, autocast_dtype=autocast_dtype)
    sample = [int(tokens[0]) for tokens in steps]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [
        (header, decoder.decode(tokenizer.decode_bytes(ids), final=final))
        for header, ids, final in (
            (f"prompt: the first 256 {unit} of the test split", prompt.tolist(), False),
            (f"sample: {n} {unit} generated at temperature 0.8", sample, True),
        )
    ]
