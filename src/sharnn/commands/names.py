"""The names ``sharnn compress`` and ``decompress`` give their outputs, and the inputs they
skip, as xz does: checked before torch loads or a kernel compiles, so that a mistyped name
is refused at once. Nothing here imports torch.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import ConfigError, DataError

SUFFIX = ".shz"
"""What ``sharnn compress`` adds to a file's name, and ``sharnn decompress`` takes off."""


def check_source(source: str, *, follow_links: bool) -> None:
    """Refuse an input FILE that cannot be coded: it does not exist or cannot be opened,
    or it is a symbolic link and ``follow_links`` is off (``-f``, as xz: a link's target
    may be anything, and ``--rm`` would remove the link alone). ``-`` (standard input)
    passes.

    Raises:
        DataError: no such file; it cannot be opened (permissions).
        ConfigError: a symbolic link, without ``follow_links``.
    """
    if source == "-":
        return
    if os.path.islink(source) and not follow_links:
        raise ConfigError(f"{source} is a symbolic link: skipped (give -f to follow it)")
    try:
        info = os.stat(source)
        if stat.S_ISREG(info.st_mode):  # a FIFO would wait for its writer here
            os.close(os.open(source, os.O_RDONLY))
    except OSError as e:
        reason = e.strerror or os.strerror(e.errno or errno.EIO)
        raise DataError(f"cannot read {source}: {reason}") from None


def compressed_name(source: str) -> str:
    """The name ``sharnn compress FILE`` writes to: ``FILE.shz`` (``-``: standard output).

    Raises:
        ConfigError: ``source`` ends in ``.shz`` already, or is a folder or not a regular
            file (a device, a FIFO): skipped, as xz skips them (``-o`` or ``-c`` takes any).
    """
    if source == "-":
        return "-"
    if source.endswith(SUFFIX):
        raise ConfigError(f"{source} already ends in {SUFFIX}: skipped (give -o FILE to compress it anyway)")
    if os.path.isdir(source):
        raise ConfigError(f"{source} is a folder: skipped")
    if os.path.exists(source) and not os.path.isfile(source):
        raise ConfigError(f"{source} is not a regular file: skipped (give -c or -o FILE to compress it)")
    return source + SUFFIX


def decompressed_name(source: str) -> str:
    """The name ``sharnn decompress FILE`` writes to: ``FILE`` without its ``.shz``
    (``-``: standard output).

    Raises:
        ConfigError: a name that does not end in ``.shz`` (skipped, as xz skips a name
            without its suffix: ``-o`` or ``-c`` takes any).
    """
    if source == "-":
        return "-"
    stem = source[: -len(SUFFIX)]
    if not source.endswith(SUFFIX) or not stem or stem.endswith("/"):
        raise ConfigError(f"{source} does not end in {SUFFIX}: skipped (give -o FILE or -c to name its output)")
    return stem
