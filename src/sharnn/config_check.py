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

SHOWN = 40  # the most characters of a value an error message quotes (:func:`shown`)


def shown(value, limit: int = SHOWN) -> str:
    """``repr(value)`` for an error message, cut to its first ``limit`` characters when
    longer (then ``...`` and the size of the whole): a message stays one short line
    whatever the value (a 10 MB word, a list of a million numbers, an integer of a
    million digits)."""
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"
    if len(text) <= limit:
        return text
    if isinstance(value, (list, tuple, dict)):
        size = f"{len(value):,} items"
    else:
        size = f"{len(value) if isinstance(value, (str, bytes)) else len(text):,} characters"
    return f"{text[:limit]}... ({size})"


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
            raise ConfigError(f"{prefix}{f.name} must be {_kind(after)}, got {shown(before)}")


def _kind(value) -> str:
    """How a message names the type of ``value``."""
    if isinstance(value, bool):
        return "true or false"
    return {int: "an integer", float: "a number", str: "a word"}.get(type(value), "a list of integers")


def omegaconf_message(e: OmegaConfBaseException, prefix: str = "") -> str:
    """One line for an error of OmegaConf's typing: the key (after ``prefix``), what it
    must be, and the value given."""
    message = (str(e).splitlines() or [type(e).__name__])[0]
    key = prefix + e.full_key if getattr(e, "full_key", None) else None
    if "not in" in message and key:
        return f"unknown config key {shown(key)}"
    if "incompatible with type hint 'Union[str, list[int]]'" in message and key:  # model.attention
        return f"{key} must be a word or a list of integers, got {shown(e.value)}"
    converted = re.search(r"could not be converted to (Integer|Float)$", message)
    if converted and key:  # "Value 'abc' of type 'str' could not be converted to Integer"
        expected = {"Integer": "an integer", "Float": "a number"}[converted[1]]
        return f"{key} must be {expected}, got {shown(e.value)}"
    message = _cut(message, getattr(e, "value", None))
    return f"{key}: {message}" if key else message


def _cut(message: str, value) -> str:
    """OmegaConf's ``message``, the value it quotes shortened as :func:`shown` does, and
    cut to a line of at most a few hundred characters."""
    try:
        text = str(value)
    except ValueError:  # an int past sys.get_int_max_str_digits(): not in the message either
        text = ""
    if len(text) > SHOWN and text in message:
        message = message.replace(text, f"{text[:SHOWN]}... ({len(text):,} characters)")
    return message if len(message) <= 5 * SHOWN else f"{message[: 5 * SHOWN]}..."
