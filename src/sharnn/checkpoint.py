"""Checkpoints: one folder each, written atomically, no pickles.

A checkpoint folder holds::

    config.yaml          the run's full TrainConfig (model config included)
    model.safetensors    the weights
    state.safetensors    LSTM (h, c) and attention memory at that point of training (optional)
    trainer.pt           optimizer, schedule, RNG and stream position (optional; tensors,
                         numbers and strings only, read with torch.load(weights_only=True))

In a run folder, checkpoints live in ``checkpoints/step-NNNNNNNN`` and ``latest`` and
``best`` are symbolic links to them, swapped atomically (a crash leaves the previous
link, never a half-written checkpoint).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import TrainConfig, from_yaml, to_yaml
from .errors import CheckpointError, ConfigError
from .model import SHARNN, State

MODEL_FILE, STATE_FILE, TRAINER_FILE, CONFIG_FILE = "model.safetensors", "state.safetensors", "trainer.pt", "config.yaml"


def write_checkpoint(
    folder: Path,
    model: SHARNN,
    config: TrainConfig,
    state: State | None = None,
    trainer: dict | None = None,
) -> Path:
    """Write a checkpoint folder atomically (into a temporary sibling, then renamed).

    Raises:
        CheckpointError: if ``folder`` already exists.
    """
    folder = Path(folder)
    if folder.exists():
        raise CheckpointError(f"{folder} already exists")
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(weights, staging / MODEL_FILE)
    if state is not None:
        save_file({k: v.contiguous().cpu() for k, v in state.tensors().items()}, staging / STATE_FILE)
    if trainer is not None:
        torch.save(trainer, staging / TRAINER_FILE)
    (staging / CONFIG_FILE).write_text(to_yaml(config))
    for file in staging.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    os.replace(staging, folder)
    return folder


def point(link: Path, target: Path) -> None:
    """Make ``link`` a relative symbolic link to ``target``, replacing it atomically."""
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)


def resolve(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint path or a run folder (its ``best``, else ``latest``).

    Raises:
        CheckpointError: if no checkpoint is there.
    """
    path = Path(path)
    for candidate in (path, path / "best", path / "latest"):
        if (candidate / MODEL_FILE).is_file() and (candidate / CONFIG_FILE).is_file():
            return candidate.resolve()
    raise CheckpointError(f"no checkpoint at {path} (expected {MODEL_FILE} and {CONFIG_FILE}, or a run folder)")


def read_config(path: str | Path) -> TrainConfig:
    """The configuration stored with a checkpoint. Raises :class:`CheckpointError`."""
    folder = resolve(path)
    try:
        return from_yaml((folder / CONFIG_FILE).read_text())
    except ConfigError as e:
        raise CheckpointError(f"{folder / CONFIG_FILE}: {e}") from None


def load_weights(model: SHARNN, folder: Path, device: str | torch.device = "cpu") -> None:
    """Load ``folder/model.safetensors`` into ``model``.

    Raises:
        CheckpointError: a missing or corrupt file, or weights that do not fit the model.
    """
    try:
        weights = load_file(folder / MODEL_FILE, device=str(device))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{folder / MODEL_FILE} is missing or corrupt: {e}") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{folder} does not match its config: {detail}") from None


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[SHARNN, TrainConfig]:
    """Build the model a checkpoint describes and load its weights.

    Returns:
        ``(model, config)``, the model in eval mode on ``device``.

    Raises:
        CheckpointError: missing or corrupt files, or weights that do not match the config.
    """
    folder = resolve(path)
    config = read_config(folder)
    model = SHARNN(config.model)
    load_weights(model, folder)
    return model.to(device).eval(), config


def load_training_state(folder: Path, n_layers: int, device: torch.device) -> tuple[dict, State | None]:
    """The trainer dict and recurrent :class:`State` saved with a checkpoint.

    Raises:
        CheckpointError: missing or corrupt files.
    """
    try:
        trainer = torch.load(folder / TRAINER_FILE, map_location=device, weights_only=True)
        state = None
        if (folder / STATE_FILE).is_file():
            tensors = load_file(folder / STATE_FILE, device=str(device))
            state = State.from_tensors(tensors, n_layers)
    except (OSError, RuntimeError, SafetensorError, KeyError) as e:
        raise CheckpointError(f"cannot resume from {folder}: {e}") from None
    return trainer, state
