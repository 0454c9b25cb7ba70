"""Online mode: no model file. A fixed-seed initialisation is trained, window by window, on
the bytes already coded (as nncp and cmix); the decoder trains identically on the bytes it
has decoded (docs/compression.md, "Online mode"). Its settings are a
:class:`~sharnn.config.TrainConfig` the file records (:data:`ONLINE_KEYS`).
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import TrainConfig, load_config
from ..errors import ConfigError
from ..models.config import SHARNNConfig
from ..models.sharnn import SHARNN
from ..training.recipe import build_optimizer, learning_rate, train_step

MAX_ONLINE_PARAMETERS = 100_000_000  # online models larger than this are refused on both sides


ONLINE_STREAMS = 8  # online mode's default (ONLINE_DEFAULTS)


# Online mode's default settings, the best of a search on the bundled enwik8 head's test
# split among those that code at 4 KB/s or more both ways on one thread of this project's
# CPU (docs/compression.md, "Online mode"): the tiny preset's architecture at 192 wide,
# 64 positions of attention span, one AdamW step per window of 8 positions of 8 streams.
ONLINE_PRESET = "tiny"


ONLINE_DEFAULTS = (
    "model.d_model=192",
    "model.boom_dim=768",
    "model.attention_span=64",
    "bptt=8",
    "warmup_steps=0",
    "optimizer=adamw",
    "lr=0.001",
)


# The settings online mode uses, which its files record: files of version 3 all of them,
# those of versions 1 and 2 all but the optimizer (theirs is Min-Trust LAMB).
ONLINE_KEYS = (
    "model", "optimizer", "bptt", "lr", "betas", "eps", "weight_decay", "min_trust", "clip", "warmup_steps", "seed"
)  # fmt: skip


FORWARD_ONLINE_KEYS = tuple(key for key in ONLINE_KEYS if key != "optimizer")


def online_config(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Online mode's settings: the ``tiny`` preset with :data:`ONLINE_DEFAULTS`, then
    ``overrides``. ``bptt`` is the training window, ``seed`` the initialisation; lr,
    warmup_steps, betas, eps, weight_decay, min_trust, clip and dropout apply as in
    training. Raises :class:`ConfigError`, also for a setting outside :data:`ONLINE_KEYS`:
    the file would not record it, and decompression would train otherwise."""
    config = load_config(ONLINE_PRESET, [*ONLINE_DEFAULTS, *overrides])
    for item in overrides:
        if item.split("=", 1)[0].split(".", 1)[0] not in ONLINE_KEYS:
            raise ConfigError(
                f"{item}: online mode takes only the settings its files record "
                f"({', '.join(key + '.*' if key == 'model' else key for key in ONLINE_KEYS)})"
            )
    return config


def online_model(config: TrainConfig) -> SHARNN:
    """The fixed-seed initialisation online mode starts from (seeds torch's RNG).

    Raises:
        ConfigError: a model of more than :data:`MAX_ONLINE_PARAMETERS` parameters.
    """
    check_online_size(config)
    torch.manual_seed(config.seed)
    return SHARNN(config.model)


def check_online_size(config: TrainConfig) -> None:
    """Raise :class:`ConfigError` if online mode's model is not an SHA-RNN or has more than
    :data:`MAX_ONLINE_PARAMETERS` parameters (counted by :func:`count_parameters`: nothing
    is built or allocated, however large the sizes)."""
    if config.model.architecture != "sha-rnn":
        raise ConfigError(
            f"online mode trains an SHA-RNN, not model.architecture {config.model.architecture}; "
            "compress with a trained model (--model) instead"
        )
    parameters = count_parameters(config.model)
    if parameters > MAX_ONLINE_PARAMETERS:
        raise ConfigError(
            f"online mode's model would have {parameters:,} parameters; at most {MAX_ONLINE_PARAMETERS:,} are allowed"
        )


def count_parameters(model: SHARNNConfig) -> int:
    """:meth:`SHARNN.num_parameters` of an SHA-RNN of the (valid) config ``model``, counted
    from its sizes with Python's integers: no model is built, so sizes too large for torch
    to count (or to build in reasonable time) give their count all the same."""
    d, f, v = model.d_model, model.boom_dim, model.vocab_size
    lstm = 8 * d * d + 8 * d  # W_ih and W_hh [4d, d], two biases [4d]
    if model.cell == "ln_lstm":  # W_ih, W_hh, one bias [4d], LN_ih and LN_hh [4d], LN_cell [d]
        lstm = 8 * d * d + 4 * d + 2 * 8 * d + 2 * d
    feed_forward = 2 * 2 * d + d * f + f + (f * d + d if model.feed_forward == "mlp" else 0)  # LN_ff, LN_xff
    gate = d if model.collapsed else d + (2 * d * d + 2 * d if model.value_gate == "overparam" else 0)
    attention = 2 * 2 * d + d * d + d + 2 * d + 2 * d + gate  # LN_mid, LN_mem, query, LN_query, gate_q and gate_k
    block = 2 * d + lstm + feed_forward  # LN_start
    return v * d + v + model.n_layers * block + len(model.attention_blocks()) * attention


def online_settings(config: TrainConfig) -> dict:
    """The :data:`ONLINE_KEYS` of ``config``, as a mapping :func:`load_config` reads."""
    everything = dataclasses.asdict(config)
    return {key: everything[key] for key in ONLINE_KEYS}


class OnlineLearner:
    """Online mode's training: truncated BPTT over the windows already coded, with its
    own recurrent state, the config's optimizer (AdamW by default online, or Min-Trust
    LAMB), warmup and clip."""

    def __init__(self, model: SHARNN, config: TrainConfig, device: torch.device):
        self.model, self.config = model, config
        self.optimizer = build_optimizer(model, config)
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)
        self.state = None
        self.steps = 0

    def learn(self, window: torch.Tensor) -> None:
        """One optimizer step on ``window`` ``[T + 1, B]`` (inputs, then the targets one
        position on); the model goes back to eval mode for coding."""
        self.steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.config, self.steps, 0)
        self.model.train()
        with torch.enable_grad():
            _, _, self.state = train_step(
                self.model, self.optimizer, self.scaler, window[:-1], window[1:], self.state, self.config.clip
            )
        self.model.eval()
