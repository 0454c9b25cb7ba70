"""The one place that picks a model's class by ``SHARNNConfig.architecture``: every
command builds, loads and restores state through these functions, so a Transformer run
(:mod:`sharnn.transformer`) is trained, resumed, evaluated, exported and reloaded by the
same code as an SHA-RNN."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from . import pretrained
from .model import SHARNN, SHARNNConfig, State, pretrained_config
from .transformer import TokenState, Transformer

CLASSES = {"sha-rnn": SHARNN, "transformer": Transformer}
Model = SHARNN | Transformer


def build_model(config: SHARNNConfig) -> Model:
    """The freshly initialised model ``config`` describes (its ``architecture``'s class).
    Raises :class:`sharnn.errors.ConfigError`: an invalid config."""
    config.validate()
    return CLASSES[config.architecture](config)


def load_pretrained(folder: str | Path, map_location: str | torch.device = "cpu") -> Model:
    """The model saved in a Hub-layout ``folder`` (``save_pretrained``, ``sharnn
    export``), of the class its ``config.json`` names, in eval mode on ``map_location``.

    Raises:
        CheckpointError: as ``SHARNN.from_pretrained`` (no or an invalid config.json,
            weights that fail their check or do not fit).
    """
    config = pretrained_config(pretrained.read_config_json(Path(folder)), Path(folder) / pretrained.CONFIG_JSON)
    return CLASSES[config.architecture].from_pretrained(folder, map_location=map_location)


def state_from_tensors(tensors: dict[str, Tensor], n_layers: int) -> State | TokenState:
    """The recurrent state saved as ``tensors`` (a state's ``tensors()``): a Transformer's
    :class:`TokenState` (key ``tokens``) or an SHA-RNN's :class:`State` of ``n_layers``
    blocks. Raises ``KeyError``: a tensor missing."""
    if "tokens" in tensors:
        return TokenState.from_tensors(tensors, n_layers)
    return State.from_tensors(tensors, n_layers)


def parameter_count(config: SHARNNConfig) -> int:
    """Parameters of the model ``config`` describes (the tied embedding once), counted on
    the meta device: nothing is allocated. What an experiment grid matches sizes with.
    Raises :class:`sharnn.errors.ConfigError`: an invalid config."""
    with torch.device("meta"):
        return build_model(config).num_parameters()
