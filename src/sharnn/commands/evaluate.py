"""``sharnn eval``: :func:`evaluate_checkpoint` scores a checkpoint with the paper's
protocol, and :class:`Evaluation` is its score with the lines the command prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig
from ..data.corpus import read_bytes
from ..data.tokenizer import Tokenizer
from ..errors import CheckpointError
from ..evaluation import EvalResult, evaluate
from ..models.build import LanguageModel
from ..models.shipped import DEFAULT_MODEL
from ..progress import ProgressDisplay
from ..runtime import Runtime
from .arguments import check_count, check_path, check_runtime
from .loading import load, run_corpus, window_of


def _streams(count: int) -> str:
    """``"1 stream"``, ``"3 streams"``."""
    return f"{count} stream{'' if count == 1 else 's'}"


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


def evaluate_checkpoint(
    path: str | Path | None = None,
    split: str = "test",
    file: str | Path | None = None,
    streams: int | None = None,
    bptt: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    quiet: bool = False,
    attention_span: int | None = None,
) -> Evaluation:
    """Score a checkpoint (anything :func:`load` takes; None: the default shipped model) with the paper's protocol
    (docs/evaluation.md), as ``sharnn eval`` does.

    Args:
        split: ``valid`` or ``test`` (the command's choices; ``train`` too) of the run's
            data, checked to be what the model's tokenizer made.
        file: score this file instead of a split (needed for a plain ``save_pretrained``
            folder, which records no data).
        streams: parallel streams (None: the run's ``valid_streams`` or ``test_streams``;
            ``test_streams`` for a file).
        bptt: window length in tokens (None: the run's ``bptt``).
        device, fast_path: see :meth:`sharnn.Runtime.resolve` (precision: the run's).
        quiet: show no progress on standard error.
        attention_span: positions each window attends to, the window included (None: the
            trained span); a SHA-RNN reads any length, a Transformer at most its trained
            span (``set_attention_span`` of each; docs/ablations.md).

    Raises:
        CheckpointError: as :func:`load`; a file (give it as ``file``); a folder without training data and no ``file``.
        ConfigError: a window the attention span cannot take; bad device settings; an
            argument of the wrong type, ``streams``, ``bptt`` or ``attention_span`` < 1.
        DataError: a missing corpus or file, one too small for ``streams``, or a corpus
            made by another tokenizer than the model's.
    """
    path = DEFAULT_MODEL if path is None else path
    check_path("path", path)
    check_path("file", file, optional=True)
    check_count("streams", streams, 1, optional=True)
    check_count("bptt", bptt, 1, optional=True)
    check_count("attention_span", attention_span, 1, optional=True)
    check_runtime(device, fast_path)
    model, config, tokenizer = load(_not_a_file(path, file))
    if config is None:  # a plain save_pretrained folder: no data recorded; the paper's protocol for a file
        if file is None:
            raise CheckpointError(f"{path} records no training data (no train_config.yaml): give --file FILE")
        config = TrainConfig(model=model.config)
    if attention_span is not None:
        config = dataclasses.replace(config, model=model.set_attention_span(attention_span).config)
    runtime = Runtime.resolve(device, config.precision, fast_path)
    window = window_of(config, bptt)
    data, what, count_words, default_streams = _scored(config, model, tokenizer, file, split)
    streams = streams or default_streams
    with ProgressDisplay("eval", enabled=not quiet) as progress:
        model, dtype = runtime.prepare(model), runtime.autocast_dtype
        result = evaluate(
            model, data, streams, window, dtype, progress=progress, tokenizer=tokenizer, count_words=count_words
        )
    return Evaluation(result, what, streams, window, tokenizer, attention_span)


def _not_a_file(path: str | Path, file: str | Path | None) -> str | Path:
    """``path``, refused when it is a file and no ``file`` is given: ``sharnn eval notes.txt``
    means ``--file notes.txt`` (a checkpoint is a folder). Raises :class:`CheckpointError`."""
    if file is None and Path(path).is_file():
        raise CheckpointError(f"{path} is a file, not a checkpoint: to score it, give --file {path}")
    return path


def _scored(config: TrainConfig, model: LanguageModel, tokenizer: Tokenizer, file, split: str):
    """What :func:`evaluate_checkpoint` scores: the ids of ``file`` or of the run's ``split``,
    what to call them, whether words are counted, and the run's streams for them."""
    if file is not None:
        return tokenizer.ids(bytes(read_bytes(file))), str(file), False, config.test_streams
    corpus = run_corpus(config, model, tokenizer)
    streams = config.valid_streams if split == "valid" else config.test_streams
    return corpus.split(split), f"{config.data} ({split})", corpus.words is not None, streams
