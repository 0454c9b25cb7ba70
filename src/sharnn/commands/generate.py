"""``sharnn generate``: :func:`generate_text` samples from a checkpoint, and
:class:`Generation` is the text as it is drawn.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config_check import shown
from ..data.corpus import read_bytes
from ..errors import ConfigError
from ..generation import filter_logits, generate as sample, prompt_bytes
from ..runtime import Runtime
from .arguments import check_count, check_number, check_path, check_runtime
from .loading import load


@dataclass(frozen=True)
class Generation:
    """Text being sampled by :func:`generate_text`, each token drawn as it is iterated (once:
    the three ways below share one stream). Iterate over it for the new text as it comes
    (``str``, UTF-8 decoded across token boundaries, a character split between tokens
    given once whole, invalid UTF-8 as U+FFFD); :meth:`token_bytes` for each token's bytes;
    :meth:`text` for the prompt first. ``prompt``: the bytes it continues."""

    prompt: bytes
    pieces: Iterator[bytes]

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for piece in self.pieces:
            if text := decoder.decode(piece):
                yield text
        if text := decoder.decode(b"", final=True):
            yield text

    def token_bytes(self) -> Iterator[bytes]:
        """Each new token's bytes, as it is drawn (one byte per token for a byte model)."""
        return self.pieces

    def text(self) -> Iterator[str]:
        """The prompt, then the new text as it comes, decoded as UTF-8 across token
        boundaries (what ``sharnn generate`` prints; invalid UTF-8 shown as U+FFFD)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        yield decoder.decode(self.prompt)
        for piece in self.pieces:
            yield decoder.decode(piece)
        yield decoder.decode(b"", final=True)


def generate_text(
    path: str | Path | None = None,
    prompt: str | bytes | None = None,
    max_tokens: int = 512,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    prompt_file: str | Path | None = None,
) -> Generation:
    """Sample one stream from a checkpoint (anything :func:`load` takes; None: the default
    shipped model), as ``sharnn
    generate`` does; the model is loaded and the settings checked before this returns,
    and each token is drawn as the result is iterated.

    Args:
        prompt: text (UTF-8) or bytes to continue; empty or None: a newline, as is a
            prompt of whitespace alone for a words model.
        max_tokens: tokens to sample: bytes for a byte model.
        temperature, top_k, top_p: see :func:`sharnn.generation.filter_logits` (0: greedy).
        seed: seed of the sampling (None: nondeterministic).
        device, fast_path: see :meth:`sharnn.Runtime.resolve` (precision: the run's).
        prompt_file: read the prompt's bytes from this file instead.

    Raises:
        ConfigError: both ``prompt`` and ``prompt_file``; bad sampling or device settings;
            an argument of the wrong type (a prompt neither text nor bytes, a count that is
            not an integer), ``max_tokens`` < 0, a seed outside [-2^63, 2^64).
        DataError: an unreadable ``prompt_file``; CheckpointError, DataError: as :func:`load`.
    """
    check_path("path", path, optional=True)
    _check_generation(prompt, prompt_file, max_tokens, temperature, top_k, top_p, seed)
    check_runtime(device, fast_path)
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    filter_logits(torch.zeros(2), temperature, top_k, top_p)  # refuses bad settings with one line
    if prompt_file is not None:
        prompt = bytes(read_bytes(prompt_file))
    prompt = prompt_bytes(prompt) or b"\n"  # empty: after a newline
    model, config, tokenizer = load(path)
    prompts = tokenizer.encode(prompt)
    if not len(prompts):  # whitespace alone is no word: start after a line, as an empty prompt does
        prompts = tokenizer.encode(b"\n")
    runtime = Runtime.resolve(device, config.precision if config else "auto", fast_path)
    steps = sample(
        runtime.prepare(model),
        prompts.view(-1, 1),
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        autocast_dtype=runtime.autocast_dtype,
    )
    return Generation(prompt, (tokenizer.decode_bytes([int(tokens[0])]) for tokens in steps))


def _check_generation(prompt, prompt_file, max_tokens, temperature, top_k, top_p, seed) -> None:
    """The types of :func:`generate_text`'s arguments, and the ranges
    :func:`sharnn.generation.filter_logits` does not check. Raises :class:`ConfigError`."""
    if prompt is not None and not isinstance(prompt, (str, bytes)):
        raise ConfigError(f"prompt must be text (str) or bytes, got {shown(prompt)}")
    check_path("prompt_file", prompt_file, optional=True)
    check_count("max_tokens", max_tokens, 0)
    check_number("temperature", temperature)
    check_count("top_k", top_k, 0)
    check_number("top_p", top_p)
    check_count("seed", seed, -(2**63), 2**64 - 1, optional=True)  # what torch.Generator.manual_seed takes
