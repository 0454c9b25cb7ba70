"""Run configuration: one dataclass that fully describes a training run, presets as YAML
files, and ``key=value`` overrides (merged and type-checked with OmegaConf).

The resolved configuration is written into every run folder and checkpoint as
``config.yaml``, the single source of truth for that run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError
from .model import SHARNNConfig

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
FAST_PATH = ("auto", "on", "off")


@dataclass
class TrainConfig:
    """A training run. Defaults are the paper's recipe (SPEC §3).

    Data:
        data: corpus (see :func:`sharnn.data.load_corpus`): a prepared folder, a file or
            folder of any bytes, or a bundled name (``enwik8-head``).
        valid_fraction, test_fraction: split by position for corpora that are not prepared.
        batch_size: training streams ``B``.
        bptt: window length ``T``; with ``bptt_jitter`` the original's random lengths.
        valid_streams, test_streams: evaluation streams (paper protocol: 16 and 8).
    Optimizer (Min-Trust LAMB, SPEC §2): lr, betas, eps, weight_decay, min_trust; ``clip``
        is the global gradient-norm clip (0 disables).
    Schedule: ``warmup_steps`` linear warmup, then constant; the lr halves at the start of
        each (1-based) epoch in ``lr_halve_epochs``; ``epochs`` passes over train, or stop
        after ``max_steps`` optimizer steps or ``max_seconds`` of training (wall clock,
        validation included) when those are > 0; the run then validates, saves and tests.
    Evaluation and logging: validation after every epoch and, when > 0, every
        ``valid_every_steps``; ``checkpoint_every_steps`` writes ``latest``;
        ``log_every_steps`` sets the metrics and progress-bar period; ``sample_bytes``
        generated at the end (0: none).
    Runtime: ``precision`` auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
        (CUDA only, with a GradScaler); ``device`` auto | cpu | cuda | cuda:N; ``seed``.
        ``fast_path`` auto (on with CUDA) | on | off: SDPA attention and bf16 memory
        (:meth:`sharnn.model.SHARNN.set_execution`); off is the eager reference path.
        ``compile``: with the fast path, ``torch.compile`` the LayerNorm/Boom sub-layers.
        ``recompute``: recompute attention and Boom activations in the backward pass
        (less activation memory, about a quarter more compute).
    """

    model: SHARNNConfig = field(default_factory=SHARNNConfig)
    data: str = "data/enwik8"
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    batch_size: int = 16
    bptt: int = 1024
    bptt_jitter: bool = True
    valid_streams: int = 16
    test_streams: int = 8
    lr: float = 2e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    weight_decay: float = 0.0
    min_trust: float = 0.25
    clip: float = 0.25
    epochs: int = 25
    warmup_steps: int = 800
    lr_halve_epochs: list[int] = field(default_factory=lambda: [24])
    max_steps: int = 0
    max_seconds: float = 0.0
    valid_every_steps: int = 0
    checkpoint_every_steps: int = 500
    log_every_steps: int = 10
    sample_bytes: int = 256
    precision: str = "auto"
    device: str = "auto"
    fast_path: str = "auto"
    compile: bool = True
    recompute: bool = False
    seed: int = 5512

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid value."""
        try:
            self.model.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        positive = ("batch_size", "bptt", "valid_streams", "test_streams", "epochs", "log_every_steps", "checkpoint_every_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        non_negative = ("eps", "weight_decay", "min_trust", "clip", "warmup_steps", "max_steps", "max_seconds", "valid_every_steps", "sample_bytes")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two values in [0, 1), got {list(self.betas)}")
        for name in ("valid_fraction", "test_fraction"):
            if not 0 < getattr(self, name) < 0.5:
                raise ConfigError(f"{name} must be in (0, 0.5), got {getattr(self, name)}")
        if self.bptt > self.model.attention_span and self.model.attention_blocks():
            raise ConfigError(f"bptt ({self.bptt}) must not exceed model.attention_span ({self.model.attention_span})")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        # YAML reads on/off/yes/no/true/false as booleans, which arrive here as "True"/"False"
        self.fast_path = {"true": "on", "false": "off"}.get(str(self.fast_path).lower(), self.fast_path)
        if self.fast_path not in FAST_PATH:
            raise ConfigError(f"fast_path must be one of {', '.join(FAST_PATH)}, got {self.fast_path!r}")


def preset_names() -> list[str]:
    """Names of the bundled presets (``sharnn/presets/*.yaml``)."""
    return sorted(p.name[:-5] for p in resources.files("sharnn").joinpath("presets").iterdir() if p.name.endswith(".yaml"))


def _read_source(source: str) -> str:
    if source in preset_names():
        return resources.files("sharnn").joinpath("presets", f"{source}.yaml").read_text()
    path = Path(source)
    if path.is_dir() and (path / "config.yaml").is_file():  # a run folder or a checkpoint
        path = path / "config.yaml"
    if path.is_file():
        return path.read_text()
    raise ConfigError(f"unknown preset or config file {source!r} (presets: {', '.join(preset_names())})")


def load_config(source: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Build a validated :class:`TrainConfig` from the defaults, a preset name or YAML file
    (or a folder holding ``config.yaml``), then ``key=value`` overrides (dotted keys for the
    model: ``model.d_model=256``).

    Raises:
        ConfigError: unknown preset, file or key; a value of the wrong type or out of range.
    """
    config = OmegaConf.structured(TrainConfig)
    try:
        if source is not None:
            text = _read_source(source)
            try:
                loaded = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{source}: not valid YAML ({str(e).splitlines()[0]})") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{source}: a config file must be a mapping of keys to values")
            config = OmegaConf.merge(config, loaded)
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} must look like key=value")
        config = OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))
        result = OmegaConf.to_object(config)
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    result.validate()
    return result


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    message = str(e).splitlines()[0]
    key = getattr(e, "full_key", None)
    if "not in" in message and key:
        return f"unknown config key {key!r}"
    return f"{key}: {message}" if key else message


def to_yaml(config: TrainConfig) -> str:
    """The full configuration as YAML (what ``config.yaml`` holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def from_yaml(text: str) -> TrainConfig:
    """Inverse of :func:`to_yaml`, validated. Raises :class:`ConfigError`."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), yaml.safe_load(text) or {})
        result = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    result.validate()
    return result
