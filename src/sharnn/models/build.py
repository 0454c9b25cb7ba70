"""The one place that picks a model's class by ``SHARNNConfig.architecture``: every
command builds, loads and restores state through these functions, so a Transformer run
(:mod:`sharnn.models.transformer`) is trained, resumed, evaluated, exported and reloaded by
the same code as an SHA-RNN. :class:`LanguageModel` is what the rest of the package may
ask of either; :func:`model_sha256` is a model's fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from ..config_check import shown
from ..errors import CheckpointError, ConfigError
from . import hub
from .config import SHARNNConfig
from .hub import pretrained_config
from .sharnn import SHARNN, State
from .transformer import TokenState, Transformer

CLASSES = {"sha-rnn": SHARNN, "transformer": Transformer}


class RecurrentState(Protocol):
    """What a model carries from one window of its streams to the next: an SHA-RNN's
    :class:`~sharnn.models.sharnn.State` (LSTM ``(h, c)`` and memory per block), a
    Transformer's :class:`~sharnn.models.transformer.TokenState` (its last token ids)."""

    def detach(self) -> RecurrentState:
        """The same state cut from the autograd graph (truncated BPTT)."""

    def tensors(self) -> dict[str, Tensor]:
        """Flat name -> tensor mapping, every tensor ``[..., B, ...]`` with the streams on dim 1."""


class LanguageModel(Protocol):
    """What training, evaluation, generation, compression and sharing ask of a model; both
    :class:`~sharnn.models.sharnn.SHARNN` and :class:`~sharnn.models.transformer.Transformer`
    are one (as ``nn.Module`` and :class:`~sharnn.models.hub.HubModel`).

    - ``config``: the :class:`SHARNNConfig` that describes it completely;
    - ``model(tokens [T, B], state | None) -> (logits [T, B, V], state)``: one window,
      the state carried to the next window of the same streams;
    - ``collapse()``: fold what only training needs into constants, outputs unchanged;
    - ``parameter_counts()`` (per part) and ``num_parameters(collapsed=False)``;
    - ``set_attn_implementation(name, memory_dtype)`` and ``sublayers()``: how attention
      computes, and the units the runtime compiles and recomputes;
    - ``save_pretrained(folder)`` / ``from_pretrained(folder)``: the Hub layout.
    """

    config: SHARNNConfig

    def __call__(self, tokens: Tensor, state: RecurrentState | None = None) -> tuple[Tensor, RecurrentState]: ...

    def collapse(self) -> LanguageModel: ...

    def parameter_counts(self) -> dict[str, int]: ...

    def num_parameters(self, collapsed: bool = False) -> int: ...

    def set_attn_implementation(self, name: str = "eager", memory_dtype: torch.dtype | None = None): ...

    def sublayers(self) -> list[nn.Module]: ...

    def save_pretrained(self, save_directory: str | Path, **kwargs): ...


def build_model(config: SHARNNConfig) -> LanguageModel:
    """The freshly initialised model ``config`` describes (its ``architecture``'s class).
    Raises :class:`sharnn.errors.ConfigError`: an invalid config."""
    config.validate()
    return CLASSES[config.architecture](config)


def load_pretrained(folder: str | Path, map_location: str | torch.device = "cpu") -> LanguageModel:
    """The model saved in a Hub-layout ``folder`` (``save_pretrained``, ``sharnn
    export``), of the class its ``config.json`` names, in eval mode on ``map_location``.

    Raises:
        CheckpointError: as ``SHARNN.from_pretrained`` (no or an invalid config.json,
            weights that fail their check or do not fit).
    """
    config = pretrained_config(hub.read_config_json(Path(folder)), Path(folder) / hub.CONFIG_JSON)
    return CLASSES[config.architecture].from_pretrained(folder, map_location=map_location)


def state_from_tensors(tensors: dict[str, Tensor], n_layers: int) -> State | TokenState:
    """The recurrent state saved as ``tensors`` (a state's ``tensors()``): a Transformer's
    :class:`TokenState` (key ``tokens``) or an SHA-RNN's :class:`State` of ``n_layers``
    blocks. Raises ``KeyError``: a tensor missing."""
    if "tokens" in tensors:
        return TokenState.from_tensors(tensors, n_layers)
    return State.from_tensors(tensors, n_layers)


def parameter_count(config: SHARNNConfig) -> int:
    """Parameters of the model ``config`` describes (the tied embedding once), by arithmetic
    (:meth:`SHARNNConfig.weight_sizes`): nothing is built. What an experiment grid matches
    sizes with. Raises :class:`sharnn.errors.ConfigError`: an invalid config."""
    config.validate()
    return config.weight_sizes()[1]


def meta_model(config: SHARNNConfig) -> LanguageModel:
    """The model ``config`` describes on the meta device: its shapes and parameter counts,
    nothing allocated, however large.

    Raises:
        ConfigError: an invalid config; a weight too large for torch to size (its bytes
            past 2^63), which the meta device reports as an overflow (a ``TypeError`` for
            a size past 2^63 itself).
    """
    try:
        with torch.device("meta"):
            return build_model(config)
    except (RuntimeError, TypeError) as e:
        if "overflow" not in str(e).lower():
            raise
        sizes = ", ".join(
            f"model.{name}={shown(getattr(config, name))}" for name in ("vocab_size", "d_model", "boom_dim")
        )
        raise ConfigError(f"a model of {sizes} is too large: one of its weights would pass 2^63 bytes") from None


def check_finite(weights: dict[str, Tensor], source: str | Path) -> None:
    """Refuse weights that hold a NaN or an infinity: every prediction of the model would be
    NaN (a trained model's weights are finite). Raises :class:`CheckpointError` naming
    ``source`` and the first such tensor."""
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{source}: the weight {name} holds NaN or infinite values; a model's weights are finite numbers"
            )


def model_sha256(model: LanguageModel) -> str:
    """A model's fingerprint, as compressed files record it: SHA-256 of its config (its JSON,
    keys sorted) and then of every weight (name, dtype, shape and bytes;
    :func:`sharnn.models.hub.update_weights_digest`), hex."""
    digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    hub.update_weights_digest(digest, model.state_dict())
    return digest.hexdigest()
