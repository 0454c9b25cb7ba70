"""Writing a file a user keeps (a config, a summary, a model, a decompressed output) so
that a crash, a kill or a full disk never leaves it half-written."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (``str`` as UTF-8) to ``path`` through a temporary file beside it
    (``.NAME.tmp``), flushed to disk and renamed over it: ``path`` holds either what it
    held before or all of ``data``. The temporary file is removed on any error.

    Raises:
        OSError: the file system refused (a full disk, a quota, permissions).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
