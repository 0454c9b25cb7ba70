"""``sharnn export``: a run's best checkpoint (or a checkpoint) as a folder to share
(:func:`sharnn.export.export` does the work), with the line the command prints.
"""

from __future__ import annotations

from pathlib import Path

from ..export import export as export_folder


def export(checkpoint: Path, out: Path, collapse: bool = False, force: bool = False, storage: str = "fp32") -> str:
    """Export ``checkpoint`` to the new folder ``out`` as :func:`sharnn.export.export` does;
    the line ``sharnn export`` prints."""
    return f"exported {checkpoint} to {export_folder(checkpoint, out, collapse, force, storage)}"
