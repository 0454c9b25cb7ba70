"""Tables computed with :mod:`decimal`, shipped computed.

The integer step and the mixers read ``sigmoid``, ``tanh``, ``exp``, ``ln`` and ``st``
from tables that :mod:`decimal` computes exactly rounded, the same on every machine (the
compiled core's rules, docs/compression.md). Computing them took about half a second at the
start of every command that codes; so they ship computed, in ``tables.npz`` beside this
module, and a process reads them from there (a few milliseconds). ``tests/test_tables.py``
computes each again and compares every entry; after a table's definition changes,
``python -c "import sharnn.coding.bitwise, sharnn.tables; sharnn.tables.write()"`` writes
the file again. A table the file does not hold is computed, as before.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from functools import cache, wraps
from pathlib import Path

import numpy as np

SHIPPED = Path(__file__).with_name("tables.npz")
DEFINITIONS: dict[str, Callable[[], np.ndarray]] = {}  # each table's name: the function that computes it


def decimal_table(compute: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """Decorate ``compute`` (no arguments; returns an array): once per process, the table
    as :data:`SHIPPED` holds it under ``compute``'s module and name, or computed where the
    file does not hold it."""
    name = f"{compute.__module__}.{compute.__qualname__}"
    DEFINITIONS[name] = compute

    @cache
    @wraps(compute)
    def table() -> np.ndarray:
        shipped = _shipped()
        return shipped[name] if name in shipped else compute()

    return table


@cache
def _shipped() -> dict[str, np.ndarray]:
    """Every table :data:`SHIPPED` holds, by name (none where the file is missing)."""
    try:
        with np.load(SHIPPED, allow_pickle=False) as tables:
            return {name: tables[name] for name in tables.files}
    except FileNotFoundError:
        return {}


def computed() -> dict[str, np.ndarray]:
    """Every table of :data:`DEFINITIONS`, computed (seconds): what :data:`SHIPPED` must
    hold once the modules that define tables are imported (:mod:`sharnn.coding.bitwise`
    imports them all)."""
    return {name: compute() for name, compute in DEFINITIONS.items()}


def write(path: Path = SHIPPED) -> None:
    """Write every table, computed, to ``path`` (whole or not at all)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez_compressed(out, **computed())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
