"""The checks of the Python API's arguments, at its edge (:mod:`sharnn.api`): what the
command line's options check with click's types, for a caller who passes Python values.
Each refuses a value with a :class:`~sharnn.errors.ConfigError` (a ``ValueError``) that names
the argument and quotes at most a few dozen characters of the value.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import torch

from ..config import FAST_PATH
from ..config_check import shown
from ..errors import ConfigError
from ..runtime import resolve_device


def check_count(name: str, value, minimum: int | None = 1, maximum: int | None = None, *, optional: bool = False):
    """Refuse the argument ``name`` unless it is an integer (a bool is not) in
    ``[minimum, maximum]`` (either bound None: none), or None when ``optional``. Returns
    ``value``. Raises :class:`ConfigError` (a ``ValueError``) naming the argument."""
    if value is None and optional:
        return value
    bounds = " and ".join([f">= {minimum}"] * (minimum is not None) + [f"<= {maximum}"] * (maximum is not None))
    expected = f"an integer{' ' + bounds if bounds else ''}{' or None' if optional else ''}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be {expected}, got {shown(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(f"{name} must be {expected}, got {shown(value)}")
    return value


def check_number(name: str, value) -> None:
    """Refuse the argument ``name`` unless it is a real number (a bool is not); its range
    is checked where it is used. Raises :class:`ConfigError` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {shown(value)}")


def check_flags(optional: tuple[str, ...] = (), **flags) -> None:
    """Refuse each keyword argument unless it is a bool (``True`` or ``False``: not ``'no'``,
    not ``0``, which a plain ``if`` would take as a choice), or None when its name is in
    ``optional``. Raises :class:`ConfigError` naming the first one refused."""
    for name, value in flags.items():
        if not isinstance(value, bool) and not (value is None and name in optional):
            expected = "True, False or None" if name in optional else "True or False"
            raise ConfigError(f"{name} must be {expected}, got {shown(value)}")


def check_path(name: str, value, *, optional: bool = False) -> None:
    """Refuse the argument ``name`` unless it is a path (``str`` or ``os.PathLike``), or
    None when ``optional``. Raises :class:`ConfigError` naming the argument."""
    if not (isinstance(value, (str, Path)) or hasattr(value, "__fspath__") or (value is None and optional)):
        raise ConfigError(f"{name} must be a path (str or Path){' or None' if optional else ''}, got {shown(value)}")


def check_overrides(overrides) -> None:
    """Refuse ``overrides`` unless a list or tuple of ``key=value`` strings (a string alone
    would be read character by character)."""
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(item, str) for item in overrides):
        raise ConfigError(f"overrides must be a list of key=value strings, got {shown(overrides)}")


def check_runtime(device, fast_path) -> torch.device:
    """The ``device`` (:func:`sharnn.runtime.resolve_device`: a word or a ``torch.device``),
    having refused an unknown or unavailable one, or a ``fast_path`` that is not a word of
    :data:`sharnn.config.FAST_PATH`. Raises :class:`ConfigError`."""
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {shown(device)}")
    if not isinstance(fast_path, str) or fast_path not in FAST_PATH:
        raise ConfigError(f"fast_path must be one of {', '.join(FAST_PATH)}, got {shown(fast_path)}")
    return resolve_device(device)


def check_coding(source, dest, model, streams, threads, decoding: bool, settings=(), **flags) -> None:
    """The types of ``compress_file``'s and ``decompress_file``'s arguments (the upper
    bounds of ``streams`` and ``threads`` are the codec's, with their reasons): paths,
    integers, bools (``force='no'`` is no choice; ``adapt`` may be None). Raises
    :class:`ConfigError` naming the first argument refused."""
    check_path("source", source)
    check_path("dest", dest, optional=decoding)  # decompress -t writes nothing
    check_path("model", model, optional=True)
    check_count("streams", streams, 1, optional=True)
    check_count("threads", threads, 1, optional=decoding)
    check_overrides(settings)
    check_flags(("adapt",), **flags)
