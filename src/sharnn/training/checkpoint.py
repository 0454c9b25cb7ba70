"""Checkpoints: the file format, and the checkpoint folders and links of a run.

A checkpoint is a folder in which nothing runs code when loaded::

    config.yaml          the run's full TrainConfig (model config included)
    model.safetensors    the weights
    state.safetensors    the recurrent state of every stream: LSTM (h, c) per block as
                         ``lstm.I.h``/``lstm.I.c`` and attention memory as ``memory.I``
                         (optional; absent at an epoch boundary, where streams start cold)
    trainer.pt           the rest of the training state (optional): a dict of tensors,
                         numbers and strings only, read with torch.load(weights_only=True)
    tokenizer.json       the tokenizer of a run on words or wordpieces (:mod:`sharnn.data.tokenizer`;
                         absent for bytes), so that eval and generate need nothing else

``trainer.pt`` holds::

    optimizer    the optimizer's state_dict(): every parameter's moments (and AdamW's
                 step count), every group's settings
    scaler       GradScaler.state_dict() (disabled unless fp16)
    jitter_rng   JSON of the NumPy bit-generator state that draws window lengths
    torch_rng    torch.get_rng_state() of every process, one row each ([N, 5056]; an
                 older single-process checkpoint has one 1-D state): dropout masks
    cuda_rng     torch.cuda.get_rng_state() of every process, CUDA runs only
    progress     JSON of sharnn.training.recipe.Progress: optimizer steps done, epoch, the next
                 window's row in the train streams, best valid BPC and its step,
                 training seconds, finished

These are the three parts of ``sharnn.training.recipe.TrainingState.state_dict()``: ``model``,
``recurrent_state`` and ``trainer``. In a run folder::

    checkpoints/step-NNNNNNNN/    one folder per saved step
    latest -> checkpoints/...     the newest checkpoint (what --resume continues from)
    best   -> checkpoints/...     the checkpoint with the best validation BPC

A checkpoint is written into a staging folder of a unique name, flushed to disk and
renamed; the links are swapped atomically. A crash therefore leaves the previous link and
never a half-written checkpoint; checkpoints no link points to are deleted after each
save. One process writes them: the run's writer (see :class:`sharnn.training.run_folder.RunFolder`).

The functions that read a model from a checkpoint, an exported folder or a shipped model
(``resolve``, ``read_config``, ``load_model``, ``load_weights``, ``read_tokenizer``) are
:mod:`sharnn.loading`'s, which every command loads through; they are named here too, where
they were first.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..config import TrainConfig, to_yaml
from ..config_check import shown
from ..data.tokenizer import TOKENIZER_FILE
from ..errors import CheckpointError, RunError
from ..files import staging_folder, write_atomically
from ..loading import (  # noqa: F401 (named here too: sharnn.training.checkpoint.load_model, ...)
    CONFIG_FILE,
    MODEL_FILE,
    TRAIN_CONFIG_FILE,
    is_pretrained,
    load_model,
    load_weights,
    read_config,
    read_model_config,
    read_tokenizer,
    resolve,
)
from ..models.build import state_from_tensors

STATE_FILE, TRAINER_FILE = "state.safetensors", "trainer.pt"
# The staging folders of checkpoints and links (sharnn.files.staging_folder: tempfile's names).
_STAGING = re.compile(r"\.(step-\d{8}|latest|best)\.[a-z0-9_]{8}\.tmp")


def write_checkpoint(folder: Path, config: TrainConfig, state: dict, info: dict[str, str] | None = None) -> Path:
    """Write a checkpoint folder atomically: into a staging folder beside it
    (:func:`sharnn.files.staging_folder`), flushed, then renamed.

    Args:
        folder: the folder to create.
        config: stored as ``config.yaml``.
        state: ``{"model": weights, "recurrent_state": State or None, "trainer": dict,
            "tokenizer": Tokenizer}``; all but the first are optional.
        info: strings stored in the header of ``model.safetensors`` (training writes the
            step, the epochs done and the valid BPC; :func:`read_info` reads them back).

    Raises:
        CheckpointError: ``folder`` exists, the disk lacks room for the checkpoint, or a
            write fails (the disk filled, a quota, an I/O error). Nothing is left behind:
            this call's staging folder is removed (no other) and ``folder`` is not created.
    """
    folder = Path(folder)
    if folder.exists() or folder.is_symlink():
        raise CheckpointError(f"{folder} already exists")
    try:
        files = _serialise(config, state, info)
        folder.parent.mkdir(parents=True, exist_ok=True)
        _check_free_space(folder.parent, sum(map(len, files.values())))
        with staging_folder(folder) as staging:
            for name, data in files.items():
                with open(staging / name, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(staging, folder)
    except (OSError, RuntimeError, SafetensorError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())[:200]
        raise CheckpointError(f"cannot write the checkpoint {folder}: {reason}") from None
    return folder


def _serialise(config: TrainConfig, state: dict, info: dict[str, str] | None) -> dict[str, bytes]:
    """Each file of the checkpoint, as bytes. Serialising in memory gives the exact size to
    check against the free space, and lets plain file writes report a full disk as an
    ``OSError`` naming the cause (torch.save and safetensors' own writers report it as an
    opaque ``RuntimeError``)."""
    weights = {k: v.detach().contiguous().cpu() for k, v in state["model"].items()}
    files = {MODEL_FILE: safetensors.torch.save(weights, metadata=info)}
    if state.get("recurrent_state") is not None:
        tensors = state["recurrent_state"].tensors()
        files[STATE_FILE] = safetensors.torch.save({k: v.contiguous().cpu() for k, v in tensors.items()})
    if state.get("trainer") is not None:
        buffer = io.BytesIO()
        torch.save(state["trainer"], buffer)
        files[TRAINER_FILE] = buffer.getvalue()
    files[CONFIG_FILE] = to_yaml(config).encode()
    tokenizer = state.get("tokenizer")
    text = tokenizer.to_json() if tokenizer is not None else None
    if text is not None:
        files[TOKENIZER_FILE] = text.encode()
    return files


def _check_free_space(folder: Path, size: int) -> None:
    """Refuse to start a checkpoint the disk has no room for (with 5% and 16 MB to spare).
    The previous checkpoint is only deleted after the new one is complete, so a run
    needs room for two checkpoints at once."""
    need = int(size * 1.05) + (16 << 20)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise CheckpointError(
            f"not enough free space in {folder} for a checkpoint of {size / 2**20:,.0f} MB "
            f"({free / 2**20:,.0f} MB free); a run needs room for two checkpoints at once (the last one "
            f"and the new one): free some space, then resume the run"
        )


def read_info(path: str | Path) -> dict[str, str]:
    """The strings :func:`write_checkpoint` stored in ``model.safetensors``'s header (empty
    for a checkpoint written without them); reads the header only.

    Raises:
        CheckpointError: no readable ``model.safetensors`` there.
    """
    file = Path(path) / MODEL_FILE
    try:
        with safe_open(file, framework="pt") as f:
            return dict(f.metadata() or {})
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{file} is missing or corrupt: {e}") from None


def read_checkpoint(folder: Path, n_layers: int, device: str | torch.device = "cpu") -> dict:
    """The state a checkpoint holds, as :func:`write_checkpoint` took it (``trainer`` None
    and ``recurrent_state`` None where the files are absent).

    Raises:
        CheckpointError: missing or corrupt files.
    """
    folder = Path(folder)
    state = {"model": None, "recurrent_state": None, "trainer": None}
    file = folder / MODEL_FILE
    try:
        state["model"] = load_file(file, device=str(device))
        file = folder / STATE_FILE
        if file.is_file():
            state["recurrent_state"] = state_from_tensors(load_file(file, device=str(device)), n_layers)
        file = folder / TRAINER_FILE
        if file.is_file():
            if not zipfile.is_zipfile(file):  # torch.save writes a zip; unpickling anything else may raise anything
                raise pickle.UnpicklingError("not a torch.save archive")
            state["trainer"] = torch.load(file, map_location=device, weights_only=True)
    except (OSError, RuntimeError, SafetensorError, KeyError, EOFError, pickle.UnpicklingError) as e:
        reason = str(e).splitlines()[0] if isinstance(e, (OSError, SafetensorError, KeyError)) else "corrupt"
        raise CheckpointError(
            f"cannot read the checkpoint in {folder}: {file.name} is missing or corrupt ({reason})"
        ) from None
    return state


def point(link: Path, target: Path) -> None:
    """Make ``link`` a relative symbolic link to ``target``, replacing it atomically: the
    new link is made in a staging folder of a unique name beside it and renamed over it.

    Raises:
        OSError: the file system refused; ``link`` is left as it was.
    """
    with staging_folder(link) as staging:
        staging.rmdir()  # the new link takes the staging folder's name
        staging.symlink_to(os.path.relpath(target, link.parent))
        os.replace(staging, link)


TRAINING_FILE = "training.json"  # an exported folder's record of its run (sharnn.export.training_record)
# The numbers training.json holds: whether each is required, and its kinds (the other keys are optional).
_RECORD_NUMBERS = {"step": (True, int), "epochs": (True, (int, float)), "valid_bpc": (False, (int, float))}
_RECORD_NUMBERS["test_bpc"] = _RECORD_NUMBERS["valid_bpc"]
MAX_RECORD_BYTES = 1 << 20


def check_training_record(folder: str | Path) -> dict | None:
    """The ``training.json`` of an exported folder (None where there is none), having
    refused one that is not what ``sharnn export`` writes: over :data:`MAX_RECORD_BYTES`,
    not JSON, not an object, or without its ``step`` (an integer) and ``epochs`` (a
    number); ``valid_bpc`` and ``test_bpc``, where present, numbers.

    Raises:
        CheckpointError: naming the file and what is wrong with it.
    """
    file = Path(folder) / TRAINING_FILE
    if not file.is_file():
        return None
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            raise CheckpointError(f"{file} is over {MAX_RECORD_BYTES >> 20} MB: not the record sharnn export writes")
        record = json.loads(data)
    except (OSError, ValueError, RecursionError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise CheckpointError(f"{file} is unreadable or not JSON ({reason})") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{file} holds a JSON {type(record).__name__}, not the object sharnn export writes")
    for key, (required, kinds) in _RECORD_NUMBERS.items():
        if key not in record and not required:
            continue
        if key not in record:
            raise CheckpointError(f"{file} has no {key!r}: it is not the record sharnn export writes")
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            expected = "an integer" if kinds is int else "a number"
            raise CheckpointError(f"{file}: {key} must be {expected}, got {shown(value)}")
    return record


class RunCheckpoints:
    """The checkpoints of one run folder: ``checkpoints/step-N``, ``latest`` and ``best``."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.latest = self.run_dir / "latest"
        self.best = self.run_dir / "best"

    def step_folder(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / f"step-{step:08d}"

    def has_latest(self) -> bool:
        return (self.latest / MODEL_FILE).is_file()

    def save(self, step: int, config: TrainConfig, state: dict, best: bool, info: dict[str, str] | None = None) -> Path:
        """Write the checkpoint of ``step`` (with ``info``, see :func:`write_checkpoint`),
        point ``latest`` (and, if ``best``, ``best``) at it, and delete the checkpoints no
        link points to.

        Raises:
            RunError: the step's folder exists and a link points to it.
            CheckpointError: the checkpoint could not be written; the previous one and
                the links are left as they were.
        """
        target = self.step_folder(step)
        if target.exists():
            if target.resolve() in self._linked():
                raise RunError(f"{target} is in use; refusing to overwrite it")
            shutil.rmtree(target)  # left over from a killed run after its last link
        write_checkpoint(target, config, state, info)
        point(self.latest, target)
        if best:
            point(self.best, target)
        linked = self._linked()
        for folder in target.parent.glob("step-*"):  # the checkpoints this class writes, and nothing else
            if folder.is_dir() and not folder.is_symlink() and folder.resolve() not in linked:
                shutil.rmtree(folder)
        return target

    def rewrite(
        self, step: int, config: TrainConfig, state: dict, best: bool, info: dict[str, str] | None = None
    ) -> Path:
        """Write the checkpoint of ``step`` again in place, for a validation done after it
        was saved: its ``model.safetensors`` (whose header holds ``info``) and then its
        ``trainer.pt``, each replaced atomically, so that a crash between the two leaves
        the old training state, which only repeats the validation on resume; point
        ``best`` at it if ``best``.

        Raises:
            CheckpointError: a file could not be written; the folder keeps the old one.
        """
        target = self.step_folder(step)
        files = _serialise(config, state, info)
        try:
            for name in (MODEL_FILE, TRAINER_FILE):
                write_atomically(target / name, files[name])
        except OSError as e:
            raise CheckpointError(f"cannot write the checkpoint {target}: {e.strerror or e}") from None
        if best:
            point(self.best, target)
        return target

    def remove_staging(self) -> None:
        """Remove what a writer of this run killed mid-save left half made: the staging
        folders of its checkpoints and links (``checkpoints/.step-N.<random>.tmp``,
        ``.latest.<random>.tmp``, ``.best.<random>.tmp``), and nothing else. Only the run's
        one writer calls this, holding the run's lock."""
        for folder in (self.run_dir, self.run_dir / "checkpoints"):
            for path in folder.glob(".*.tmp"):
                if _STAGING.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)

    def load_latest(self, n_layers: int, device: str | torch.device) -> dict:
        """The state saved in ``latest`` (see :func:`read_checkpoint`).

        Raises:
            RunError: no ``latest`` checkpoint.
            CheckpointError: one without a training state, or missing or corrupt files.
        """
        if not self.has_latest():
            raise RunError(f"nothing to resume: {self.run_dir} has no latest checkpoint")
        state = read_checkpoint(self.latest.resolve(), n_layers, device)
        if state["trainer"] is None:
            raise CheckpointError(f"cannot resume from {self.latest.resolve()}: it has no {TRAINER_FILE}")
        return state

    def repair_best(self, best_step: int) -> None:
        """Point ``best`` at the checkpoint of ``best_step``: a crash between repointing
        ``latest`` and ``best`` leaves ``best`` behind (or absent)."""
        folder = self.step_folder(best_step)
        if folder.is_dir() and self.best.resolve() != folder.resolve():
            point(self.best, folder)

    def _linked(self) -> set[Path]:
        return {link.resolve() for link in (self.latest, self.best) if link.exists()}
