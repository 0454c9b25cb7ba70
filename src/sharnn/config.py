"""Run configuration: one dataclass that fully describes a training run, whose defaults are
the paper's recipe; presets that state only how they differ from it; ``key=value``
overrides. One loader (:func:`load_config`) merges and type-checks them with OmegaConf
and checks every constraint, once, before anything runs. The type check is OmegaConf's
structured-config typing throughout: :meth:`TrainConfig.validate` and
:meth:`sharnn.models.config.SHARNNConfig.validate` apply the same to a config built in Python
(:func:`sharnn.config_check.typed`).

The resolved configuration is written into every run folder and checkpoint as
``config.yaml``, the single source of truth for that run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config_check import omegaconf_message, shown, typed
from .errors import ConfigError
from .models.config import SHARNNConfig

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OPTIMIZERS = ("lamb", "adamw")
FAST_PATH = ("auto", "on", "off")


@dataclass
class TrainConfig:
    """A training run. Defaults are the paper's recipe for its single-head enwik8 model
    (Table 2, §4.1; docs/training.md), which is the ``enwik8-paper`` preset.

    Data:
        data: corpus (see :func:`sharnn.data.corpus.load_corpus`): a prepared folder (bytes, or
            words or wordpieces with its tokenizer: then ``model.vocab_size`` must be the
            tokenizer's), a file or folder of any bytes, or a bundled name (``enwik8-head``).
        valid_fraction, test_fraction: split by position for corpora that are not prepared.
        train_streams, valid_streams, test_streams: the number of parallel streams ``B``
            each split is laid out in (the batch size; evaluation protocol: 16 and 8).
        bptt: window length ``T``; with ``bptt_jitter`` the original's random lengths.
    Optimizer: ``optimizer`` ``lamb``, Min-Trust LAMB (docs/optimizer.md; ``min_trust`` 0
        gives plain LAMB), or ``adamw``, ``torch.optim.AdamW`` with ``weight_decay`` on
        matrices only, as nanoGPT trains; lr, betas, eps, weight_decay, min_trust;
        ``clip`` is the global gradient-norm clip (0 disables).
    Schedule: ``warmup_steps`` linear warmup, then constant, or with ``lr_decay_steps``
        > 0 a cosine decay from ``lr`` at the end of the warmup to ``min_lr`` at step
        ``lr_decay_steps``, then ``min_lr`` (nanoGPT's schedule); the lr halves at the
        start of each (1-based) epoch in ``lr_halve_epochs``; ``epochs`` passes over train, or stop
        after ``max_steps`` optimizer steps or ``max_seconds`` of training (wall clock,
        validation included) when those are > 0; the run then validates, saves and tests.
    Evaluation and logging: validation after every epoch and, when > 0, every
        ``valid_every_steps``, on the first ``valid_max_bytes`` bytes of text of the valid
        split (0: all of it; for a token corpus, the longest run of whole tokens whose text
        fits), the same prefix throughout a run; the final test on the first
        ``test_max_bytes`` (0: all); ``checkpoint_every_steps`` writes ``latest``;
        ``log_every_steps`` sets the metrics period; without a terminal, a progress line
        every ``progress_every_seconds``; ``sample_bytes`` generated at the end (0: none;
        tokens, for a words or wordpiece corpus).
    Start: ``init_from``, a run folder (its best checkpoint) or a checkpoint whose weights
        the run starts from, with a new optimizer and schedule ("": a fresh
        initialisation); its model settings must be the checkpoint's (the dropouts may differ).
    Runtime (:class:`sharnn.runtime.Runtime`): ``precision`` auto (bf16 autocast on
        CUDA, fp32 on CPU) | fp32 | bf16 | fp16 (CUDA only, with a GradScaler);
        ``device`` auto | cpu | cuda | cuda:N; ``fast_path`` auto (on with CUDA) | on |
        off: SDPA attention and bf16 memory, off is the eager reference path;
        ``compile``: with the fast path, ``torch.compile`` the sub-layers; ``recompute``:
        recompute the sub-layers' activations in the backward pass; ``seed``.
    """

    model: SHARNNConfig = field(default_factory=SHARNNConfig)
    data: str = "data/enwik8"
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    train_streams: int = 16
    valid_streams: int = 16
    test_streams: int = 8
    bptt: int = 1024
    bptt_jitter: bool = True
    optimizer: str = "lamb"
    lr: float = 2e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    weight_decay: float = 0.0
    min_trust: float = 0.25
    clip: float = 0.25
    epochs: int = 25
    warmup_steps: int = 800
    lr_halve_epochs: list[int] = field(default_factory=lambda: [24])
    lr_decay_steps: int = 0
    min_lr: float = 0.0
    max_steps: int = 0
    max_seconds: float = 0.0
    valid_every_steps: int = 0
    valid_max_bytes: int = 0
    test_max_bytes: int = 0
    checkpoint_every_steps: int = 500
    log_every_steps: int = 10
    progress_every_seconds: float = 30.0
    sample_bytes: int = 256
    init_from: str = ""
    precision: str = "auto"
    device: str = "auto"
    fast_path: str = "auto"
    compile: bool = True
    recompute: bool = False
    seed: int = 5512

    def validate(self) -> None:
        """Check every value: its type (:func:`sharnn.config_check.typed`, OmegaConf's, as
        :func:`load_config` reads YAML), then its range and how the values fit together.
        Raise :class:`ConfigError` naming the first invalid value; changes nothing."""
        config = typed(self)
        config.model.check_values()
        config.check_values()

    def check_values(self) -> None:
        """Check the range of every value of this typed config (:meth:`validate` types it
        first) and how the values fit together, the model's excepted
        (:meth:`sharnn.models.config.SHARNNConfig.check_values`). Raises :class:`ConfigError`."""
        self._check_ranges()
        self._check_optimizer()
        self._check_data_and_runtime()
        try:
            self.model.check_window(self.bptt)
        except ConfigError as e:
            raise ConfigError(f"bptt: {e}") from None

    def _check_ranges(self) -> None:
        """Every number finite, and within its range (:data:`POSITIVE`, :data:`NON_NEGATIVE`)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {shown(value)}")
        for name in POSITIVE:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {shown(getattr(self, name))}")
        for name in NON_NEGATIVE:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {shown(getattr(self, name))}")
        if not self.progress_every_seconds > 0:
            raise ConfigError(f"progress_every_seconds must be > 0, got {shown(self.progress_every_seconds)}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {shown(self.lr)}")

    def _check_optimizer(self) -> None:
        """The optimizer, its betas and its learning-rate schedule."""
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {shown(self.optimizer)}")
        if self.lr_decay_steps and self.lr_decay_steps <= self.warmup_steps:
            raise ConfigError(
                f"lr_decay_steps ({shown(self.lr_decay_steps)}) must be more than warmup_steps "
                f"({shown(self.warmup_steps)}), or 0"
            )
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({shown(self.min_lr)}) must be at most lr ({shown(self.lr)})")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two values in [0, 1), got {shown(list(self.betas))}")
        if any(e < 1 for e in self.lr_halve_epochs):
            raise ConfigError(f"lr_halve_epochs are 1-based epoch numbers, got {shown(list(self.lr_halve_epochs))}")

    def _check_data_and_runtime(self) -> None:
        """The split fractions, the seed, the precision and the fast path."""
        for name in ("valid_fraction", "test_fraction"):
            if not 0 < getattr(self, name) < 0.5:
                raise ConfigError(f"{name} must be in (0, 0.5), got {shown(getattr(self, name))}")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"seed must be in [0, 2^64), got {shown(self.seed)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {shown(self.precision)}")
        if self.fast_path not in FAST_PATH:
            raise ConfigError(f"fast_path must be one of {', '.join(FAST_PATH)}, got {shown(self.fast_path)}")


# The settings that must be >= 1, and those that must be >= 0 (TrainConfig._check_ranges).
POSITIVE = (
    "train_streams",
    "valid_streams",
    "test_streams",
    "bptt",
    "epochs",
    "log_every_steps",
    "checkpoint_every_steps",
)
NON_NEGATIVE = (
    "eps",
    "weight_decay",
    "min_trust",
    "clip",
    "warmup_steps",
    "max_steps",
    "max_seconds",
    "valid_every_steps",
    "sample_bytes",
    "valid_max_bytes",
    "test_max_bytes",
    "lr_decay_steps",
    "min_lr",
)


def preset_names() -> list[str]:
    """Names of the bundled presets (``sharnn/presets/*.yaml``)."""
    return sorted(
        p.name[:-5] for p in resources.files("sharnn").joinpath("presets").iterdir() if p.name.endswith(".yaml")
    )


def load_config(
    source: str | Path | dict | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    model: SHARNNConfig | None = None,
) -> TrainConfig:
    """The one way to build a :class:`TrainConfig`: the defaults (the paper's recipe),
    then a preset name, a YAML file, a folder holding ``config.yaml`` (a run or a
    checkpoint) or a mapping of the same keys, then ``model`` when given (it replaces the model settings: a run that
    starts from a checkpoint's weights takes its model), then ``key=value`` overrides
    (dotted keys for the model: ``model.d_model=256``); validated.

    Raises:
        ConfigError: unknown preset, file or key; invalid YAML; a value of the wrong type
            or out of range, or a combination of values that cannot run.
    """
    merged = OmegaConf.structured(TrainConfig)
    try:
        if source is not None:
            mapping = source if isinstance(source, dict) else _read_mapping(source)
            merged = OmegaConf.merge(merged, _check_shapes(mapping))
        if model is not None:
            merged.model = OmegaConf.structured(model)
        merged = OmegaConf.merge(merged, _check_shapes(_read_overrides(overrides)))
        _spell_fast_path(merged)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    config.validate()
    return config


def to_yaml(config: TrainConfig) -> str:
    """The full configuration as YAML (what ``config.yaml`` holds; :func:`load_config` reads it)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


PATH_SHOWN = 200  # a path is quoted whole up to this length (a value: config_check.SHOWN)
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few kilobytes: refuse what is not one
MAX_DEPTH = 32  # a config nests two levels (model, lists): refuse a YAML bomb's depth


class _Refused(yaml.MarkedYAMLError):
    """YAML that :class:`_ConfigLoader` refuses to read: an alias, or too deep."""


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing aliases (``*name``; ``<<: *name`` too), whose
    expansion is exponential in the file's size (the "billion laughs"), and nesting past
    :data:`MAX_DEPTH` (the composer recurses once per level)."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise _Refused(
                problem="YAML aliases (*name) are not allowed in a config: write the value out",
                problem_mark=self.peek_event().start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise _Refused(
                problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=self.peek_event().start_mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _read_mapping(source: str | Path) -> dict:
    """The mapping in a preset, a YAML file, or a folder's ``config.yaml``. Raises
    :class:`ConfigError` for an unknown or unreadable source, or invalid YAML (with its
    line and column); a file over :data:`MAX_CONFIG_BYTES`, YAML aliases or nesting
    past :data:`MAX_DEPTH`; a run's or checkpoint's ``config.yaml`` that is empty."""
    name, whole = str(source), False
    if name in preset_names():
        text = resources.files("sharnn").joinpath("presets", f"{name}.yaml").read_text()
    else:
        path = Path(source)
        if path.is_dir() and (path / "config.yaml").is_file():
            path, whole = path / "config.yaml", True
        if path.is_dir():
            raise ConfigError(
                f"{name} is a folder without config.yaml; give a preset, a YAML file, or a run or checkpoint folder"
            )
        if not path.is_file():
            raise ConfigError(
                f"unknown preset or config file {shown(name, PATH_SHOWN)} (presets: {', '.join(preset_names())})"
            )
        whole = whole or _written_by_sharnn(path)
        text = _read_text(path)
    try:
        loaded = yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as e:
        mark = e.problem_mark if isinstance(e, yaml.MarkedYAMLError) and e.problem else None
        where = f"{name}, line {mark.line + 1}, column {mark.column + 1}" if mark else name
        if isinstance(e, _Refused):
            raise ConfigError(f"{where}: {e.problem}") from None
        problem = e.problem if mark else str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    except ValueError as e:  # an integer past sys.get_int_max_str_digits()
        raise ConfigError(f"{name}: not valid YAML ({str(e).split(':')[0]})") from None
    if whole and not loaded:
        raise ConfigError(f"{path} is empty: a run's or checkpoint's {path.name} holds its whole configuration")
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"{name}: a config file must be a mapping of keys to values")
    return loaded


def _written_by_sharnn(path: Path) -> bool:
    """Whether ``path`` is the configuration of a checkpoint or an exported folder (beside
    its ``model.safetensors``), which holds the whole configuration, never nothing."""
    return path.name in ("config.yaml", "train_config.yaml") and (path.parent / "model.safetensors").is_file()


def _read_text(path: Path) -> str:
    """The text of the config file ``path``, refused past :data:`MAX_CONFIG_BYTES`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MB: a config file is a few kilobytes of YAML")
        return data.decode()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None


# The fields that hold a mapping or a list, and what they must look like: OmegaConf's own
# errors for a scalar there ("Merge error: int is not a subclass of ...") say neither.
_SHAPES = {
    "model": (dict, "a mapping of model settings (e.g. model.d_model: 512)"),
    "betas": (list, "a list of two numbers (e.g. [0.9, 0.999])"),
    "lr_halve_epochs": (list, "a list of 1-based epoch numbers (e.g. [24], or [] for none)"),
}


def _check_shapes(mapping: dict) -> dict:
    """``mapping``, after raising :class:`ConfigError` if it gives anything but a mapping
    where one belongs (``model``), or anything but a list where one belongs."""
    for key, (kind, expected) in _SHAPES.items():
        value = mapping.get(key, kind())
        if not isinstance(value, kind):
            raise ConfigError(f"{key} must be {expected}, got {'null' if value is None else shown(value)}")
    return mapping


def _read_overrides(overrides: list[str] | tuple[str, ...]) -> dict:
    """The ``key=value`` ``overrides`` as a nested mapping, each value read as YAML by
    OmegaConf (whose loader bounds the expansion of aliases). Raises :class:`ConfigError`:
    an override without ``=``, or whose value is not YAML OmegaConf reads."""
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {shown(item)} must look like key=value")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        bad, error = " ".join(overrides), e
        for item in overrides:  # which one
            try:
                OmegaConf.from_dotlist([item])
            except OmegaConfBaseException:
                continue
            except (yaml.YAMLError, ValueError, RecursionError) as e_item:
                bad, error = item, e_item
                break
        problem = getattr(error, "problem", None) or (str(error).splitlines() or [type(error).__name__])[0]
        problem = problem.split(": ")[0].split(". ")[0][:120]
        raise ConfigError(f"override {shown(bad)}: not a value sharnn can read ({problem})") from None


def _spell_fast_path(merged: DictConfig) -> None:
    """YAML reads ``on``/``off`` (and yes/no, true/false) as booleans, which reach the
    string field as "True"/"False": spell them as the setting's words."""
    merged.fast_path = {"true": "on", "false": "off"}.get(str(merged.fast_path).lower(), merged.fast_path)


def config_changes(old, new) -> dict[str, list]:
    """The settings that differ between two configurations of one kind (:class:`TrainConfig`
    or :class:`SHARNNConfig`), as ``{key: [old, new]}`` with dotted keys for the model."""
    before, after = flatten(dataclasses.asdict(old)), flatten(dataclasses.asdict(new))
    return {key: [before[key], after[key]] for key in before if before[key] != after[key]}


def flatten(mapping: dict, prefix: str = "") -> dict:
    """A nested mapping as one level, its keys dotted (``model.d_model``)."""
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
