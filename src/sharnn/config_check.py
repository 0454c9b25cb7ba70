"""The one type check of the configurations (:class:`sharnn.models.config.SHARNNConfig`,
:class:`sharnn.config.TrainConfig`): OmegaConf's structured configs read every value as its
annotation's type, and a value OmegaConf would have to convert is refused. Messages are one
line, naming the key.
"""

from __future__ import annotations

import dataclasses
import re

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError


def typed(config, prefix: str = ""):
    """A copy of the dataclass instance ``config`` (a :class:`SHARNNConfig`, a
    :class:`sharnn.config.TrainConfig`) whose every value is read as its annotation's type
    by OmegaConf's structured configs: the one type check of the configurations, the same
    that :func:`sharnn.config.load_config` applies to YAML and ``key=value`` overrides. A
    value OmegaConf would have to convert to read it as its type (text for a number, a
    number for a bool) is refused: a configuration keeps its values as they were given,
    which is what is saved and fingerprinted; a whole number for a float passes (``0``
    reads as 0.0), and so does a tuple for a list. ``config`` itself is not changed.
    ``prefix`` says where ``config`` sits (``"model."``), for the messages.

    Raises:
        ConfigError: naming the first key whose value is not of its type.
    """
    try:
        converted = OmegaConf.to_object(OmegaConf.structured(config))
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e, prefix)) from None
    _refuse_conversions(config, converted, prefix)
    return converted


def _refuse_conversions(given, converted, prefix: str) -> None:
    """Raise :class:`ConfigError` for the first value of the dataclass ``given`` that
    OmegaConf changed in kind to read it (``converted``): text read as a number, a number
    read as a bool."""
    for f in dataclasses.fields(given):
        before, after = getattr(given, f.name), getattr(converted, f.name)
        if dataclasses.is_dataclass(before):
            _refuse_conversions(before, after, f"{prefix}{f.name}.")
            continue
        same = list(before) == after if isinstance(before, tuple) else before == after
        kind_kept = isinstance(before, str) == isinstance(after, str) and isinstance(before, bool) == isinstance(
            after, bool
        )
        if not (same and kind_kept):
            raise ConfigError(f"{prefix}{f.name} must be {_kind(after)}, got {before!r}")


def _kind(value) -> str:
    """How a message names the type of ``value``."""
    if isinstance(value, bool):
        return "true or false"
    return {int: "an integer", float: "a number", str: "a word"}.get(type(value), "a list of integers")


def omegaconf_message(e: OmegaConfBaseException, prefix: str = "") -> str:
    """One line for an error of OmegaConf's typing: the key (after ``prefix``), what it
    must be, and the value given."""
    message = str(e).splitlines()[0]
    key = prefix + e.full_key if getattr(e, "full_key", None) else None
    if "not in" in message and key:
        return f"unknown config key {key!r}"
    if "incompatible with type hint 'Union[str, list[int]]'" in message and key:  # model.attention
        return f"{key} must be a word or a list of integers, got {e.value!r}"
    converted = re.search(r"could not be converted to (Integer|Float)$", message)
    if converted and key:  # "Value 'abc' of type 'str' could not be converted to Integer"
        expected = {"Integer": "an integer", "Float": "a number"}[converted[1]]
        return f"{key} must be {expected}, got {e.value!r}"
    return f"{key}: {message}" if key else message
