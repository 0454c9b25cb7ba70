"""Where every command's model comes from: a shipped model's name, an exported or
``save_pretrained`` folder (the Hub layout, :mod:`sharnn.models.hub`), a checkpoint, or a
run folder (its ``best`` checkpoint, else ``latest``; :mod:`sharnn.training.checkpoint`
writes them). Nothing here is training: compressing, generating and evaluating load
through this module alone.

- :func:`resolve`: the folder a name or path means. A bare name of a shipped model is the
  folder in the package, never one in the working folder (``./NAME`` is the path);
- :func:`load_model`: the model, its sizes checked before anything is built (the tensors
  the weights file lists against the config's, and the memory they need), its weights
  read, checked (SHA-256 for an exported folder, finite numbers within the integer
  step's range) and loaded;
- :func:`load_shipped`: the shipped model of a fingerprint (``sharnn decompress`` with no
  ``--model``), among every model the package ships (:data:`~sharnn.models.shipped.SHIPPED`);
- :func:`read_config`, :func:`read_model_config`, :func:`read_tokenizer`, :func:`load_weights`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .config import TrainConfig, load_config
from .data.tokenizer import Tokenizer, check_vocabulary, load_tokenizer
from .errors import CheckpointError, ConfigError
from .models.build import LanguageModel, check_finite, load_pretrained, meta_model, model_sha256
from .models.config import SHARNNConfig
from .models.hub import CONFIG_JSON, apply_weights, pretrained_config, read_config_json, reading_weights
from .models.integer_step import check_range
from .models.sharnn import SHARNN
from .models.shipped import shipped_candidates, shipped_folder, shipped_names
from .runtime import check_memory, gib, memory_limit, out_of_memory_as

MODEL_FILE, CONFIG_FILE = "model.safetensors", "config.yaml"
TRAIN_CONFIG_FILE = "train_config.yaml"  # an exported folder's TrainConfig


def resolve(path: str | Path) -> Path:
    """A checkpoint folder from the name of a shipped model (:mod:`sharnn.models.shipped`:
    a bare name, looked up in the package only), a checkpoint path, a run folder (its
    ``best``, else ``latest``) or a folder in the Hub layout (:func:`is_pretrained`).

    Raises:
        CheckpointError: if no checkpoint is there.
    """
    given = os.fspath(path)  # as typed: ./NAME is a path
    if (shipped := shipped_folder(given)) is not None:
        return shipped
    path = Path(path)
    for candidate in (path, path / "best", path / "latest"):
        if (candidate / MODEL_FILE).is_file() and (candidate / CONFIG_FILE).is_file():
            return candidate.resolve()
    if is_pretrained(path):
        return path.resolve()
    names = ", ".join(shipped_names()) or "none"
    raise CheckpointError(
        f"no checkpoint at {given} (expected {MODEL_FILE} with {CONFIG_FILE} (a checkpoint) or "
        f"{CONFIG_JSON} (save_pretrained, sharnn export), a run folder, or a shipped model: {names})"
    )


def is_pretrained(folder: Path) -> bool:
    """Whether ``folder`` is in the Hub layout: ``config.json`` and ``model.safetensors``."""
    return (folder / CONFIG_JSON).is_file() and (folder / MODEL_FILE).is_file()


def read_config(path: str | Path) -> TrainConfig:
    """The configuration stored with a checkpoint (or a run folder's best/latest one); for
    an exported folder, its ``train_config.yaml`` with the model of its ``config.json``
    (collapsed, when it was exported so).

    Raises:
        CheckpointError: no checkpoint there; an invalid ``config.yaml``,
            ``train_config.yaml`` or ``config.json``; a folder written by a plain
            ``save_pretrained``, which records no training config.
    """
    folder = resolve(path)
    if not is_pretrained(folder):
        return _load_config(folder / CONFIG_FILE)
    if not (folder / TRAIN_CONFIG_FILE).is_file():
        raise CheckpointError(
            f"{folder} has no {TRAIN_CONFIG_FILE} (saved with save_pretrained, not sharnn export): "
            f"it does not record the data or the evaluation protocol"
        )
    return _load_config(folder / TRAIN_CONFIG_FILE, read_model_config(folder))


def read_model_config(folder: Path) -> SHARNNConfig:
    """The model config in a Hub-layout folder's ``config.json``. Raises :class:`CheckpointError`."""
    return pretrained_config(read_config_json(folder), folder / CONFIG_JSON)


def _load_config(file: Path, model: SHARNNConfig | None = None) -> TrainConfig:
    try:
        return load_config(file, model=model)
    except ConfigError as e:
        message = str(e)  # an empty file's message names it already
        raise CheckpointError(message if message.startswith(f"{file} ") else f"{file}: {message}") from None


def read_tokenizer(path: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer of a checkpoint, run folder or exported folder: its ``tokenizer.json``,
    or bytes when it has none; checked against a model of ``vocab_size`` token ids when
    given. Raises :class:`CheckpointError` (no checkpoint) or :class:`DataError` (an
    invalid ``tokenizer.json``, or one that does not fit the model)."""
    folder = resolve(path)
    tokenizer = load_tokenizer(folder)
    if vocab_size is not None:
        check_vocabulary(vocab_size, tokenizer, str(folder))
    return tokenizer


def load_weights(model: LanguageModel, folder: Path, device: str | torch.device = "cpu") -> None:
    """Load ``folder/model.safetensors`` into ``model``.

    Raises:
        CheckpointError: a missing, corrupt or unreadable file (:func:`~sharnn.models.hub.reading_weights`),
            or weights that do not fit the model.
    """
    with reading_weights(Path(folder) / MODEL_FILE):
        weights = load_file(Path(folder) / MODEL_FILE, device=str(device))
    apply_weights(model, weights, folder)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[LanguageModel, TrainConfig | None]:
    """Build the model a checkpoint (or a run folder's best checkpoint) describes and load
    its weights; a Hub-layout folder through ``SHARNN.from_pretrained`` (its weights'
    SHA-256 checked). Before anything is built, the tensors ``model.safetensors`` lists
    are checked against those of the config (names and shapes, from the file's header and
    a model on the meta device) and the memory the model needs against what this process
    may hold (:func:`sharnn.runtime.check_memory`); after loading, the weights must be
    finite numbers, and an SHA-RNN's within the range of the integer step that compresses
    with it (:func:`~sharnn.models.integer_step.check_range`).

    Returns:
        ``(model, config)``, the model in eval mode on ``device``, on the eager path;
        ``config`` is None for a folder written by a plain ``save_pretrained`` (no
        ``train_config.yaml``).

    Raises:
        CheckpointError: missing, unreadable or corrupt files, weights that do not match
            the config, that hold NaN or infinite values, that are out of the integer
            step's range, or that do not fit in memory.
    """
    folder = Path(path)
    try:
        folder = resolve(path)
        if is_pretrained(folder):
            config = read_config(folder) if (folder / TRAIN_CONFIG_FILE).is_file() else None
            model = _built(read_model_config(folder), folder, lambda: load_pretrained(folder, map_location=device))
            return model, config
        config = read_config(folder)
        model = _built(config.model, folder, lambda: _checkpoint_model(config.model, folder))
        return model.to(device).eval(), config
    except OSError as e:  # a folder or file that cannot be read (permissions)
        raise CheckpointError(f"cannot read {e.filename or folder}: {e.strerror or e}") from None


def _checkpoint_model(config: SHARNNConfig, folder: Path) -> LanguageModel:
    model = meta_model(config).to_empty(device="cpu")  # not initialised: every parameter is loaded
    load_weights(model, folder)
    return model


def _built(config: SHARNNConfig, folder: Path, build: Callable[[], LanguageModel]) -> LanguageModel:
    """``build()``, the model of ``config`` and ``folder``'s weights, once
    :func:`check_sizes` has passed; an allocation that fails all the same is one line too,
    as are weights that are not finite numbers or out of the integer step's range."""
    check_sizes(config, folder)
    limit, what = memory_limit()
    with out_of_memory_as(CheckpointError, f"loading {folder} ran out of memory ({what}: {gib(limit)})"):
        model = build()
    check_finite(model.state_dict(), folder / MODEL_FILE)
    if isinstance(model, SHARNN):  # what compressing it needs, refused before any coding
        check_range(model, folder / MODEL_FILE)
    return model


def check_sizes(config: SHARNNConfig, folder: Path) -> None:
    """Refuse, before anything is built or read but the file's header, weights in
    ``folder/model.safetensors`` that are not the tensors ``config`` makes, and a model whose
    fp32 weights and file do not fit in this process's memory. The config's tensors are
    counted first, by arithmetic (:meth:`SHARNNConfig.weight_sizes`): a config that makes
    more tensors than the file holds (a million blocks beside two) is refused on the counts
    alone, in no time; the others are compared name by name and shape by shape (a model on
    the meta device, of no more tensors than the file's header lists), so that a config
    claiming a huge model is refused whatever the memory.

    Raises:
        CheckpointError: naming ``folder``: the counts, or as torch's strict loading says
            (``size mismatch``, ``Missing key(s)``), or the memory needed and the limit; a
            file that cannot be read (:func:`~sharnn.models.hub.reading_weights`).
    """
    file = folder / MODEL_FILE
    with reading_weights(file), safe_open(file, framework="pt") as f:
        stored = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    try:
        tensors, parameters = config.weight_sizes()
        if tensors > len(stored):
            held = sum(_count(shape) for shape in stored.values())
            raise CheckpointError(
                f"{folder} does not match its config: it makes {tensors:,} tensors of {parameters:,} numbers, "
                f"{MODEL_FILE} holds {len(stored):,} of {held:,}"
            )
        made = {name: tuple(t.shape) for name, t in meta_model(config).state_dict().items()}
    except ConfigError as e:
        raise CheckpointError(f"{folder}: {e}") from None
    problem = _mismatch(made, stored)
    if problem:
        raise CheckpointError(f"{folder} does not match its config: {problem}")
    try:
        check_memory(4 * parameters + file.stat().st_size, f"loading {folder} ({parameters:,} parameters)")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def _mismatch(made: dict[str, tuple], stored: dict[str, tuple]) -> str | None:
    """What differs between the tensors a config makes and those a file holds, in the words
    of torch's strict loading; None when nothing does."""
    missing, extra = sorted(made.keys() - stored.keys()), sorted(stored.keys() - made.keys())
    if missing or extra:
        parts = [f"Missing key(s): {', '.join(missing[:3])}"] * bool(missing)
        parts += [f"Unexpected key(s): {', '.join(extra[:3])}"] * bool(extra)
        return "; ".join(parts)
    for name, shape in made.items():
        if stored[name] != shape:
            return f"size mismatch for {name}: the file holds {list(stored[name])}, the config makes {list(shape)}"
    return None


def _count(shape: tuple) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def load_shipped(fingerprint: str, name: str, device: str | torch.device = "cpu") -> LanguageModel:
    """The shipped model whose :func:`~sharnn.models.build.model_sha256` is ``fingerprint``
    (what a compressed file records), loaded on ``device``: every model the package ships
    is looked at, the default and those that were the default before
    (:data:`~sharnn.models.shipped.DEFAULTS`).

    Raises:
        CheckpointError: none is; the line says the file ``name`` needs ``--model``.
    """
    for shipped in shipped_candidates(fingerprint):
        if model_sha256(candidate := load_model(shipped, device=device)[0]) == fingerprint:
            return candidate
    raise CheckpointError(
        f"{name} was compressed with a model that is not shipped (sha256 {fingerprint[:16]}...; this sharnn ships "
        f"{', '.join(shipped_names()) or 'none'}): give it with --model"
    )
