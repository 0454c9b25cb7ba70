"""The Hugging Face Hub layout of a model, which ``SHARNN.save_pretrained`` writes and
``SHARNN.from_pretrained`` reads (docs/sharing.md)::

    config.json          the SHARNNConfig, one JSON object
    model.safetensors    the weights; its metadata holds ``format: pt`` and ``sha256``,
                         the SHA-256 of the weights (:func:`weights_sha256`)
    README.md            the model card (template ``sharnn/model_card.md``)

Safetensors files carry no checksum, so a flipped byte in the tensor data would load
silently; the recorded SHA-256 is checked on every load. This module holds the file
format, and :class:`HubModel`, the mixin through which both architectures
(:class:`~sharnn.models.sharnn.SHARNN`, :class:`~sharnn.models.transformer.Transformer`)
write and read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path

import safetensors.torch
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData, PyTorchModelHubMixin, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HFValidationError
from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError, ConfigError
from ..files import write_atomically
from .config import SHARNNConfig

CONFIG_JSON, WEIGHTS_FILE = "config.json", "model.safetensors"


def update_weights_digest(digest, weights: Mapping[str, torch.Tensor]) -> None:
    """Feed every tensor of ``weights`` to ``digest`` (a ``hashlib`` object), sorted by
    name: ``"NAME DTYPE SHAPE"`` then its bytes. The compressor's model fingerprint
    (:func:`sharnn.models.build.model_sha256`) is this after the config."""
    for name, tensor in sorted(weights.items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def weights_sha256(weights: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the weights (name, dtype, shape and bytes of every tensor), hex."""
    digest = hashlib.sha256()
    update_weights_digest(digest, weights)
    return digest.hexdigest()


def write_files(folder: Path, config: dict, weights: Mapping[str, torch.Tensor]) -> None:
    """Write ``config.json`` and ``model.safetensors`` (with ``format: pt`` and the
    weights' SHA-256 in its metadata) into ``folder``, each atomically. Raises ``OSError``
    when the file system refuses."""
    tensors = {name: t.detach().contiguous().cpu() for name, t in weights.items()}
    metadata = {"format": "pt", "sha256": weights_sha256(tensors)}
    files = {
        CONFIG_JSON: (json.dumps(config, sort_keys=True, indent=2) + "\n").encode(),
        WEIGHTS_FILE: safetensors.torch.save(tensors, metadata=metadata),
    }
    for name, data in files.items():
        write_atomically(folder / name, data)


def read_config_json(folder: Path) -> dict:
    """The JSON object in ``folder/config.json``.

    Raises:
        CheckpointError: no config.json, an unreadable one, or one that is not a JSON object.
    """
    file = Path(folder) / CONFIG_JSON
    try:
        fields = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} has no {CONFIG_JSON}: not a folder written by save_pretrained or sharnn export"
        ) from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} is unreadable or not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise CheckpointError(f"{file} must hold a JSON object of model settings")
    return fields


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/model.safetensors`` on the CPU, after checking them
    against the SHA-256 its metadata records.

    Raises:
        CheckpointError: a missing, truncated or corrupt file, one the system does not
            let be read (:func:`reading_weights`: too many open files, ...), one without a
            recorded SHA-256, or weights whose SHA-256 differs from the recorded one.
    """
    file = Path(folder) / WEIGHTS_FILE
    with reading_weights(file), safe_open(file, framework="pt") as f:
        recorded = (f.metadata() or {}).get("sha256")
        weights = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 safe_open is not iterable
    if recorded is None:
        raise CheckpointError(f"{file} records no sha256 of its weights: not written by SHARNN.save_pretrained")
    if weights_sha256(weights) != recorded:
        raise CheckpointError(f"{file} fails its SHA-256 check: the weights were altered or corrupted")
    return weights


@contextlib.contextmanager
def reading_weights(file: Path) -> Iterator[None]:
    """Run the block, which reads the weights file ``file`` with safetensors, with what
    safetensors raises as one :class:`CheckpointError` naming ``file``: a ``SafetensorError``
    (a truncated or corrupt file), or an ``OSError`` or ``RuntimeError`` (torch's mapping of
    the file: ``unable to open file <...> in read-only mode: Too many open files (24)``)
    where the system refuses, with the system's reason."""
    try:
        yield
    except SafetensorError as e:
        raise CheckpointError(f"{file} is missing or corrupt ({str(e).splitlines()[0]})") from None
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"cannot read {file}: {_system_reason(file, e)}") from None


def _system_reason(file: Path, error: OSError | RuntimeError) -> str:
    """Why the system refused ``file`` to safetensors: an ``OSError``'s own reason; torch's
    ``RuntimeError`` ends with the error number. Safetensors raises ``No such file or
    directory`` (no error number) for any file it cannot open: the system is asked again."""
    if isinstance(error, OSError) and error.strerror is None:
        try:
            file.open("rb").close()
        except OSError as e:
            error = e
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    line = (str(error).splitlines() or [type(error).__name__])[0]
    number = re.search(r"\((\d+)\)$", line)
    return os.strerror(int(number[1])) if number else line[:200]


def apply_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str | Path) -> None:
    """``model.load_state_dict(weights)`` (strict: every key, every shape), with a mismatch
    reported as a :class:`CheckpointError` naming ``source``."""
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{source} does not match its config: {detail}") from None


def load_strictly(load, name: str | Path, **kwargs):
    """``load(name, **kwargs)`` (a mixin's ``from_pretrained``) with its failures as one
    :class:`CheckpointError`: a local folder without ``config.json`` (the mixin would only
    warn), a name that is neither a folder nor a model the Hub gives."""
    if Path(name).is_dir():
        read_config_json(Path(name))
    try:
        return load(name, **kwargs)
    except (HFValidationError, EntryNotFoundError, OSError) as e:
        reason = " ".join(str(e).split())[:200]
        raise CheckpointError(
            f"{name} is not a folder, and the Hugging Face Hub does not give it ({type(e).__name__}: {reason})"
        ) from None


def locate(model_id: str, **download) -> Path:
    """The folder holding ``model.safetensors``: ``model_id`` itself when it is a local
    folder (nothing touches the network), else the Hub cache's snapshot folder after
    ``hf_hub_download`` (``download``: revision, cache_dir, token, ... as the mixin
    passes them), where the mixin has put ``config.json`` already."""
    if Path(model_id).is_dir():
        return Path(model_id)
    return Path(hf_hub_download(repo_id=model_id, filename=WEIGHTS_FILE, **download)).parent


def model_card(
    card_data: ModelCardData,
    license: str | None = None,
    datasets: list[str] | None = None,
    model_name: str | None = None,
    eval_results: list[EvalResult] | None = None,
    **fields,
) -> ModelCard:
    """The model card: ``card_data`` (the mixin's metadata: library, tags) with
    ``pipeline_tag: text-generation``, ``license``, ``datasets`` and, given
    ``eval_results`` (its scores) and ``model_name``, the ``model-index``, over the
    template ``sharnn/model_card.md`` filled with ``fields`` (see the template for the
    names it reads)."""
    metadata = ModelCardData(
        **{
            **card_data.to_dict(),
            "pipeline_tag": "text-generation",
            "license": license,
            "datasets": datasets,
            "model_name": model_name,
            "eval_results": eval_results,
        }
    )
    template = resources.files("sharnn").joinpath("model_card.md").read_text(encoding="utf-8")
    return ModelCard.from_template(metadata, template_str=template, **fields)


def pretrained_config(fields: dict | None, source: Path) -> SHARNNConfig:
    """The :class:`SHARNNConfig` of config.json's object ``fields``. Raises
    :class:`CheckpointError` naming ``source``: no config.json, an unknown setting, a
    wrong type or an invalid value."""
    if fields is None:
        raise CheckpointError(f"{source} is missing")
    try:
        return SHARNNConfig.from_dict(fields)
    except ConfigError as e:
        raise CheckpointError(f"{source}: {e}") from None


class HubModel(PyTorchModelHubMixin):
    """``save_pretrained`` and ``from_pretrained`` in the Hub layout above, for both
    architectures: a model class derives from ``nn.Module`` and this mixin (with the
    mixin's class keywords: ``library_name``, ``tags``, ...), holds its
    :class:`SHARNNConfig` as ``self.config``, is built by ``cls(config)``, and defines
    ``model_card_fields() -> dict``: what its model card says of the model itself (config,
    attention blocks, parameter counts, paper)."""

    def _save_pretrained(self, save_directory: Path) -> None:
        """The mixin's hook: write ``config.json`` (this model's config, so a collapsed
        model says so) and ``model.safetensors`` (with the weights' SHA-256). A model card
        left by an earlier save is removed, so that the mixin writes this model's."""
        write_files(Path(save_directory), self.config.to_dict(), self.state_dict())
        (Path(save_directory) / "README.md").unlink(missing_ok=True)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs):
        """The model saved in a local folder (read offline, silently) or a Hub repo id, in
        eval mode on ``map_location`` (default ``"cpu"``); other keywords (revision,
        cache_dir, token, ...) are the mixin's, for the Hub.

        Raises:
            CheckpointError: no ``config.json``, an invalid one, weights that fail their
                SHA-256 check, a missing or corrupt ``model.safetensors``, or weights
                that do not fit the config (a missing or extra tensor, a wrong shape); a
                name that is neither a folder nor a model the Hub gives (not a valid repo
                id, not found, no network).
        """
        return load_strictly(super().from_pretrained, pretrained_model_name_or_path, **kwargs)

    @classmethod
    def _from_pretrained(
        cls, *, model_id: str, config: dict | None = None, map_location: str | torch.device = "cpu", **download
    ):
        """The mixin's hook: ``config`` is config.json's object as the mixin read it (it
        does not decode it: the annotation of ``__init__`` is text here); the weights are
        checked and loaded strictly into a model built without its initialisation (on the
        meta device, then given memory: drawing the shipped model's random weights, which
        the loading overwrote, took 0.06 s; every tensor is a parameter and is loaded)."""
        folder = locate(model_id, **download)
        config = pretrained_config(config, folder / CONFIG_JSON)
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device="cpu")
        apply_weights(model, read_weights(folder), folder / WEIGHTS_FILE)
        return model.to(map_location).eval()

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The ``README.md`` that ``save_pretrained`` writes: ``model_card_fields()`` of this
        model; ``kwargs`` add the rest (``sharnn export`` adds the training record, the data
        and its licence; see :func:`model_card`)."""
        return model_card(self._hub_mixin_info.model_card_data, **(self.model_card_fields() | kwargs))
