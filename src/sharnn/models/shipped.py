"""The models that ship inside the package (docs/pretrained.md), each a folder that ``sharnn
export`` wrote (config.json, model.safetensors, README.md: its model card, train_config.yaml,
training.json, bpc.png) under ``sharnn/pretrained/NAME``. A shipped model is named wherever a
checkpoint is asked for, and :data:`DEFAULT_MODEL` serves wherever a model is optional
(``sharnn generate``, ``eval --file``, ``compress``, ``decompress``; ``sharnn.load()``).

A name is a bare name (``wikipedia-2x512``): it means the folder in the package, never a
folder of that name in the working folder (give that one as a path, ``./wikipedia-2x512``).
A name stands for one set of weights forever: new weights ship under a new name, and every
model that was ever the default stays in the package (:data:`DEFAULTS`), so that every file
compressed with no model named keeps decoding with no model named.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

DEFAULT_MODEL = "wikipedia-2x512"
"""The shipped model used when none is named: a 2 x 512 SHA-RNN trained on 2 CPU cores on
the package's Wikipedia text (the enwik8 head three times and WikiText-2, as bytes;
docs/pretrained.md)."""

SHIPPED = {
    "wikipedia-2x512-v1": "5c87678a6026b22bbe0d4a29dfd7771d538be17834cf9b6d3840722ffd135b7d",
    "wikipedia-2x512": "d708440ac85d148cc1d0b5b06a9cecf33dde4c7e79a4f59cd373093f9251e0f5",
}
"""Every model the package ships, by name: its fingerprint (:func:`sharnn.models.build.model_sha256`),
which every file it compressed records. ``tests/test_hostile_models.py`` checks each folder
against it: weights replaced under a kept name fail there."""

DEFAULTS = ("wikipedia-2x512-v1", "wikipedia-2x512")
"""Every model that was ever :data:`DEFAULT_MODEL`, oldest first (the last is the default):
the first ``wikipedia-2x512`` (step 4,200 on the enwik8 head and WikiText-2, until 26 November
2026), kept as ``wikipedia-2x512-v1``; then the enwik8-weighted one. Never shortened."""

WEIGHTS_FILE = "model.safetensors"


def shipped_root() -> Path:
    """The folder holding one folder per shipped model."""
    return Path(str(resources.files("sharnn") / "pretrained"))


def shipped_names() -> list[str]:
    """The names of the shipped models, sorted; a folder that cannot be read is left out
    (it breaks only what names it)."""
    try:
        folders = list(shipped_root().iterdir())
    except OSError:  # no folder, or an unreadable one
        return []
    return sorted(folder.name for folder in folders if _holds_weights(folder))


def is_name(text: str) -> bool:
    """Whether ``text`` is a bare name, as opposed to a path: no folder separator, not ``.``
    or ``..``."""
    return bool(text) and "/" not in text and os.sep not in text and text not in (".", "..")


def shipped_folder(name: str) -> Path | None:
    """The folder of the shipped model ``name`` (a bare name, :func:`is_name`), or None when
    no shipped model has that name. Only that model's folder is looked at; one that is
    there but cannot be read is returned, for its loader to say so."""
    if not is_name(str(name)):
        return None
    folder = shipped_root() / str(name)
    try:
        return folder if (folder / WEIGHTS_FILE).is_file() else None
    except OSError:  # there but unreadable (its loader says so), or behind an unreadable root (not there)
        return folder if os.path.isdir(folder) else None


def shipped_candidates(fingerprint: str) -> list[str]:
    """The shipped models to load and check for ``fingerprint``, in this order: the one
    :data:`SHIPPED` gives it (the only one loaded when it is the one), then the others (a
    folder put there by hand, whose fingerprint is known only once loaded)."""
    names = shipped_names()
    return sorted(names, key=lambda name: SHIPPED.get(name) != fingerprint)


def _holds_weights(folder: Path) -> bool:
    try:
        return (folder / WEIGHTS_FILE).is_file()
    except OSError:  # unreadable (permissions), a name too long, ...
        return False
