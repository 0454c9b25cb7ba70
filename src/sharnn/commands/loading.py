"""What several commands share: :func:`load` (``sharnn.load``), a checkpoint, run folder,
exported folder or shipped model with its tokenizer (:class:`Loaded`); the run's corpus
checked against the model's tokenizer (:func:`run_corpus`) and the evaluation window
(:func:`window_of`), for ``eval`` and ``analyze``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from ..config import TrainConfig
from ..config_check import shown
from ..data.corpus import Corpus, load_corpus
from ..data.tokenizer import Tokenizer, check_corpus_tokenizer
from ..errors import ConfigError
from ..loading import load_model, read_tokenizer
from ..models.build import LanguageModel
from ..models.shipped import DEFAULT_MODEL
from ..runtime import resolve_device
from .arguments import check_path


class Loaded(NamedTuple):
    """A loaded checkpoint: ``model`` (in eval mode, on the eager path), ``config`` (the
    run's TrainConfig; None for a plain ``save_pretrained`` folder, which records no
    training) and ``tokenizer`` (bytes unless the folder has a ``tokenizer.json``)."""

    model: LanguageModel
    config: TrainConfig | None
    tokenizer: Tokenizer


def load(path: str | Path | None = None, device: str | torch.device = "cpu") -> Loaded:
    """Load a checkpoint folder, a run folder (its ``best`` checkpoint, else ``latest``), an
    exported or ``save_pretrained`` folder, or a shipped model by name (None: the default
    one, :data:`~sharnn.models.shipped.DEFAULT_MODEL`; docs/pretrained.md), with its
    tokenizer, onto ``device``.

    Raises:
        CheckpointError: no checkpoint there, or missing, corrupt or mismatched files.
        DataError: an invalid ``tokenizer.json``, or one that does not fit the model.
        ConfigError: a ``path`` that is no path; an unknown or unavailable ``device``
            (:func:`sharnn.runtime.resolve_device`: ``auto`` too).
    """
    path = DEFAULT_MODEL if path is None else path
    check_path("path", path)
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {shown(device)}")
    model, config = load_model(path, device=resolve_device(device))
    return Loaded(model, config, read_tokenizer(path, model.config.vocab_size))


def run_corpus(config: TrainConfig, model: LanguageModel, tokenizer: Tokenizer) -> Corpus:
    """The run's corpus, refused when another tokenizer than the model's made it."""
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    check_corpus_tokenizer(model.config.vocab_size, corpus.tokenizer, config.data, tokenizer)
    return corpus


def window_of(config: TrainConfig, bptt: int | None) -> int:
    """The evaluation window: ``bptt`` or the run's, refused in one line when the model's
    attention span cannot take it."""
    window = bptt or config.bptt
    try:
        config.model.check_window(window)
    except ConfigError as e:
        raise ConfigError(f"--bptt: {e}") from None
    return window
