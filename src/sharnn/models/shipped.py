"""The models that ship inside the package (docs/pretrained.md), each a folder that ``sharnn
export`` wrote (config.json, model.safetensors, README.md: its model card, train_config.yaml,
training.json, bpc.png) under ``sharnn/pretrained/NAME``. A shipped model is named wherever a
checkpoint is asked for, and :data:`DEFAULT_MODEL` serves wherever a model is optional
(``sharnn generate``, ``eval --file``, ``compress``, ``decompress``; ``sharnn.load()``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT_MODEL = "wikipedia-2x512"
"""The shipped model used when none is named: a 2 x 512 SHA-RNN trained on 2 CPU cores on
the package's Wikipedia text (the enwik8 head and WikiText-2, as bytes; docs/pretrained.md)."""


def shipped_root() -> Path:
    """The folder holding one folder per shipped model."""
    return Path(str(resources.files("sharnn") / "pretrained"))


def shipped_names() -> list[str]:
    """The names of the shipped models, sorted."""
    root = shipped_root()
    return sorted(p.name for p in root.iterdir() if (p / "model.safetensors").is_file()) if root.is_dir() else []


def shipped_folder(name: str) -> Path | None:
    """The folder of the shipped model ``name``, or None when no shipped model has that name."""
    return shipped_root() / name if name in shipped_names() else None
