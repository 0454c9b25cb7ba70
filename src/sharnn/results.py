"""What the API's functions return (:mod:`sharnn.api`), and the lines the commands print
for them: a loaded checkpoint (:class:`Loaded`), a score (:class:`Evaluation`), text being
sampled (:class:`Generation`); a file coded is :class:`sharnn.commands.compress.Coding`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from .config import TrainConfig
from .data.tokenizer import Tokenizer
from .evaluation import EvalResult
from .models.build import LanguageModel


def _streams(count: int) -> str:
    """``"1 stream"``, ``"3 streams"``."""
    return f"{count} stream{'' if count == 1 else 's'}"


class Loaded(NamedTuple):
    """A loaded checkpoint: ``model`` (in eval mode, on the eager path), ``config`` (the
    run's TrainConfig; None for a plain ``save_pretrained`` folder, which records no
    training) and ``tokenizer`` (bytes unless the folder has a ``tokenizer.json``)."""

    model: LanguageModel
    config: TrainConfig | None
    tokenizer: Tokenizer


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate_checkpoint` scored: ``result`` (bits per byte, nats per token,
    perplexities), ``data`` (the file, or ``DATA (SPLIT)``), the ``streams`` and the
    ``window`` length (tokens) it used, the model's ``tokenizer``, and the
    ``attention_span`` it was given (None: the one it trained with)."""

    result: EvalResult
    data: str
    streams: int
    window: int
    tokenizer: Tokenizer
    attention_span: int | None = None

    def format(self) -> str:
        """The lines ``sharnn eval`` prints: what was predicted, then bits per byte, nats per
        byte or bits per token, perplexity, and word perplexity where words are counted."""
        result, tokenizer = self.result, self.tokenizer
        unit = "bytes" if tokenizer.is_bytes else f"tokens ({tokenizer.name}: {result.bytes:,} bytes)"
        span = "" if self.attention_span is None else f", attention span {self.attention_span:,}"
        streams = _streams(self.streams)
        lines = [
            f"{self.data}: {result.tokens:,} {unit} predicted, {streams}, windows of {self.window}{span}",
            f"bits per byte: {result.bpc:.4f}",
        ]
        if tokenizer.is_bytes:
            lines += [f"nats per byte: {result.nats:.4f}", f"perplexity:    {result.perplexity:.4f}"]
        else:
            lines += [f"bits per token: {result.bits_per_token:.4f}", f"perplexity per token: {result.perplexity:.2f}"]
        if result.word_perplexity is not None:
            lines.append(f"word perplexity ({result.words:,} words + <eos>): {result.word_perplexity:.2f}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Generation:
    """Text being sampled by :func:`generate_text`: iterate over it for the bytes of each
    new token as it is drawn; ``prompt``: the bytes it continues."""

    prompt: bytes
    pieces: Iterator[bytes]

    def __iter__(self) -> Iterator[bytes]:
        return self.pieces

    def text(self) -> Iterator[str]:
        """The prompt, then the new text as it comes, decoded as UTF-8 across token
        boundaries (what ``sharnn generate`` prints; invalid UTF-8 shown as U+FFFD)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        yield decoder.decode(self.prompt)
        for piece in self.pieces:
            yield decoder.decode(piece)
        yield decoder.decode(b"", final=True)
