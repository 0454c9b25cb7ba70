"""The ``.shz`` file: magic, format version, a JSON header with its CRC32, the payload
(docs/compression.md, "File format"). :func:`pack` writes a header; :func:`read_header`
and :func:`parse` check one completely (keys, types, ranges, and what contradicts what)
before anything is allocated for it. What the payload means is :mod:`sharnn.coding.codec`'s.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from ..config import load_config
from ..errors import ConfigError, DataError
from .environment import MAX_FEATURES, MAX_THREADS
from .online import FORWARD_ONLINE_KEYS, ONLINE_KEYS, check_online_size

MAGIC = b"\x89sharnn\n"


# The version compress() writes for an SHA-RNN, whose positions an inference step computes
# (version 6: version 5's coding of the input with its CRLF line ends folded to LF where
# every line end is CRLF; version 5: the integer step mixed with context models that
# adapt to the file, by default; version 4: the integer step, its files portable; version
# 3: the float step only); a Transformer's files, computed by its forward, keep version 2.
# Versions 1 (no storage keys) and 2 decode with the model's forward, the path that wrote them.
FORMAT_VERSION = 6


FORWARD_VERSIONS = (1, 2)


STEP_VERSIONS = (3, 4, 5, FORMAT_VERSION)


READABLE_VERSIONS = (*FORWARD_VERSIONS, *STEP_VERSIONS)


# From version 5 the header's JSON is stored raw-deflated (RFC 1951) with a preset
# dictionary, a typical header: its keys and common values cost a few bits each, and
# a header takes about 90 bytes instead of about 420 (what a small file is made of).
# Version 5's is HEADER_DICTIONARY; version 6's is a version-6 header of the shipped model
# (its fingerprint: 64 hex digits, 35 bytes deflated, become a reference of 3) at 4 streams,
# with both common CPU capabilities, after what a stored file's header has instead: a
# typical header deflates to 48-75 bytes, not 93-120.
# A dictionary is part of its format: fixed forever, whatever model ships later.
DEFLATED_FROM = 5
HEADER_DICTIONARY = (
    b'{"mode":"model","model_sha256":"","length":,"streams":,"stream_crc32":[],"payload_bytes":,'
    b'"payload_crc32":,"environment":{"device":"cpu","torch":"2.13.0+cpu","threads":1,"cpu_capability":"AVX2"},'
    b'"online":null,"tokenizer":"bytes","storage":"coded","coded_bytes":null,"precision":"integer",'
    b'"portable":true,"integer_step":1,"mixing":1}'
)
HEADER_DICTIONARIES = {
    5: HEADER_DICTIONARY,
    6: (
        b'"model_input":false,"crc32":null}"streams":0,"storage":"stored","coded_bytes":'  # a stored file's
        b'"AVX512"{"mode":"model","model_sha256":"d708440ac85d148cc1d0b5b06a9cecf33dde4c7e79a4f59cd373093f9251e0f5",'
        b'"length":,"streams":4,"payload_bytes":,"payload_crc32":,'
        b'"environment":{"device":"cpu","torch":"2.13.0+cpu","threads":1,"cpu_capability":"AVX2"},'
        b'"online":null,"tokenizer":"bytes","storage":"coded","coded_bytes":null,"precision":"integer",'
        b'"portable":true,"integer_step":1,"mixing":3,"crlf":0,"model_input":true,"crc32":'
    ),
}


# The step arithmetic a file may name: ``integer`` (portable: the same bits everywhere,
# :mod:`sharnn.models.integer_step`), ``fp32`` and ``bf16`` (the float step: the same kind
# of machine only). Version 3 knew the last two.
CODING_PRECISIONS = ("integer", "fp32", "bf16")


# The largest input compression takes, 2 GiB: the compressor holds the input, a grid of
# it and the coder's output in memory. Larger inputs are refused before they are read
# (:func:`sharnn.files.read_input`); a file's ``length`` is not limited by it, so that
# every file ever written still decodes.
MAX_LENGTH = 2**31


# The largest file decompression reads: a stored input of MAX_LENGTH bytes with room for
# a header of up to 1 GiB (its stream CRC32s).
MAX_FILE_BYTES = MAX_LENGTH + 2**30


# A byte under constriction's leaky 24-bit categorical has probability <= 1 - 255 / 2**24,
# so it costs >= 2.2e-5 bits: a payload of P bits codes fewer than 2**16 * P bytes.
_BYTES_PER_PAYLOAD_BIT = 2**16


_PREFIX = struct.Struct("<8sHI")  # magic, format version, header length


_CRC = struct.Struct("<I")


@dataclass
class Header:
    """What a compressed file says about itself (stored as JSON; docs/compression.md).

    Attributes:
        mode: ``"model"`` or ``"online"``.
        model_sha256: fingerprint of the model's config and starting weights
            (:func:`model_sha256`); in online mode, of the fixed-seed initialisation.
        length: the original size in bytes.
        streams: the number of streams ``B`` (0 for an empty file).
        stream_crc32: CRC32 of each stream's original bytes (versions 1 to 5; version 6
            reads as ``[]``: one ``crc32`` of all of them instead).
        payload_bytes, payload_crc32: size and CRC32 of the range coder's output.
        environment: what the probabilities depend on besides the model: device, torch
            version, CPU capability, thread count, and on CUDA the GPU, CUDA and cuDNN
            (:func:`environment`).
        online: online mode's settings (:data:`ONLINE_KEYS` of a :class:`TrainConfig`), or None.
        tokenizer: ``"bytes"``.
        storage: ``"coded"`` (the payload is the range coder's) or ``"stored"`` (the
            payload is the input itself, ``streams`` 0; the model is not needed to decode).
        coded_bytes: for a stored file, the size in bytes the coded file would have had;
            None for a coded file.
        precision: ``"integer"`` (:class:`~sharnn.models.integer_step.IntegerStep`, version
            4 on), ``"fp32"`` or ``"bf16"`` (:class:`~sharnn.models.step.Step`); a key of
            versions 3 on (files of versions 1 and 2 read as ``"fp32"``).
        portable: whether the file decodes on any machine (precision ``"integer"``); a
            key of versions 4 on (older files read as False).
        integer_step: the :data:`INTEGER_STEP_VERSION` of an integer file, else None; a
            key of versions 4 on.
        mixing: the :data:`~sharnn.coding.mixing.MIXING_VERSION` of a file whose model was
            mixed with adaptive context models (integer files only), else None; a key of
            versions 5 on.
        crlf: how many CRLF line ends were folded to LF before coding (0: none; the
            streams hold ``length - crlf`` bytes; :func:`sharnn.coding.codec.fold_line_ends`);
            a key of version 6 (older files read as 0).
        model_input: whether the model's predictions entered the mixing (false: input that
            is not text, coded by the context models alone; a mixed file only;
            :func:`sharnn.coding.codec.looks_binary`); a key of version 6 (older files read as true).
        crc32: CRC32 of the bytes coded, the streams joined (their line ends folded where
            ``crlf`` is not 0), or None in a stored file; a key of version 6, which has it
            instead of ``stream_crc32`` (older files read as None).
    """

    mode: str
    model_sha256: str
    length: int
    streams: int
    stream_crc32: list[int]
    payload_bytes: int
    payload_crc32: int
    environment: dict
    online: dict | None = None
    tokenizer: str = "bytes"
    storage: str = "coded"
    coded_bytes: int | None = None
    precision: str = "fp32"
    portable: bool = False
    integer_step: int | None = None
    mixing: int | None = None
    crlf: int = 0
    model_input: bool = True
    crc32: int | None = None


_V1_KEYS = frozenset(field.name for field in dataclasses.fields(Header)) - {
    "storage",
    "coded_bytes",
    "precision",
    "portable",
    "integer_step",
    "mixing",
    "crlf",
    "model_input",
    "crc32",
}


_V2_KEYS = _V1_KEYS | {"storage", "coded_bytes"}


_KEYS = {  # the exact keys of each version
    1: _V1_KEYS,
    2: _V2_KEYS,
    3: _V2_KEYS | {"precision"},
    4: _V2_KEYS | {"precision", "portable", "integer_step"},
    5: _V2_KEYS | {"precision", "portable", "integer_step", "mixing"},
    6: _V2_KEYS - {"stream_crc32"}
    | {"precision", "portable", "integer_step", "mixing", "crlf", "model_input"}
    | {"crc32"},  # one CRC32 of the streams joined, not one per stream
}


def read_header(blob: bytes, name: str = "input") -> tuple[Header, bytes]:
    """Split a compressed file into its checked header and payload. The header is validated
    completely (docs/compression.md, "File format") before anything is allocated for it.

    Returns:
        The :class:`Header` (a version-1 file reads as ``storage="coded"``) and the payload.

    Raises:
        DataError: not a sharnn file, an unknown format version, a header or payload that
            is truncated or altered (its CRC32 does not match), or a header that is not the
            expected JSON object (keys, types, ranges, or values that contradict each other
            or the payload's size).
    """
    return parse(blob, name)[1:]


def as_bytes(name: str, value) -> bytes:
    """``value`` as ``bytes``, from ``bytes``, ``bytearray`` or a ``memoryview`` (its
    bytes, whatever its format or strides: a copy); anything else refused with a
    :class:`ConfigError` naming the argument ``name``."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, (bytearray, memoryview)):
        raise ConfigError(f"{name} must be bytes, got {type(value).__name__}")
    try:
        return bytes(value) if isinstance(value, bytearray) else value.tobytes()
    except ValueError as e:  # a released memoryview
        raise ConfigError(f"{name} cannot be read: {e}") from None


class Compressed(NamedTuple):
    """A compressed file read and checked by :func:`parse`: its format ``version``, its
    ``header`` and its ``payload``."""

    version: int
    header: Header
    payload: bytes


def parse(blob: bytes, name: str) -> Compressed:
    """:func:`read_header`, with the file's format version first."""
    blob = as_bytes("blob", blob)
    if blob and len(blob) < _PREFIX.size and MAGIC.startswith(blob[: len(MAGIC)]):
        raise DataError(f"{name} is truncated (its header is incomplete)")
    if len(blob) < _PREFIX.size or blob[: len(MAGIC)] != MAGIC:
        raise DataError(f"{name} is not a sharnn compressed file")
    _, version, size = _PREFIX.unpack_from(blob)
    if version not in READABLE_VERSIONS:
        raise DataError(
            f"{name} has format version {version}; this sharnn reads versions {', '.join(map(str, READABLE_VERSIONS))}"
        )
    end = _PREFIX.size + size
    if len(blob) < end + _CRC.size:
        raise DataError(f"{name} is truncated (its header is incomplete)")
    text = blob[_PREFIX.size : end]
    if zlib.crc32(text) != _CRC.unpack_from(blob, end)[0]:
        raise DataError(f"{name} is corrupt: its header fails its CRC32 check")
    if version >= DEFLATED_FROM:
        text = _inflate(text, version, name)
    header = _check_header(_parse_header(text, name), version, name)
    payload = blob[end + _CRC.size :]
    if len(payload) != header.payload_bytes:
        raise DataError(
            f"{name} is truncated or extended: {len(payload):,} payload bytes, the header says {header.payload_bytes:,}"
        )
    if zlib.crc32(payload) != header.payload_crc32:
        raise DataError(f"{name} is corrupt: its payload fails its CRC32 check")
    return Compressed(version, header, payload)


def pack(header: Header, version: int = FORMAT_VERSION) -> bytes:
    """A version-``version`` file's header (the keys of that version): prefix, JSON and its CRC32.
    A header of folded line ends (``crlf``), or of a model left out (``model_input``), packs
    only in a version that records them; a coded file's CRC32s as its version keeps them
    (one of the streams joined from version 6, one per stream before; else ValueError)."""
    if header.crlf and "crlf" not in _KEYS[version]:
        raise ValueError(f"a version-{version} header cannot record {header.crlf} folded line ends")
    if not header.model_input and "model_input" not in _KEYS[version]:
        raise ValueError(f"a version-{version} header cannot record a model left out")
    if header.storage == "coded" and (problem := _crc_problem(header, version)):
        raise ValueError(f"a version-{version} header's {problem}")
    fields = {key: value for key, value in dataclasses.asdict(header).items() if key in _KEYS[version]}
    return frame(json.dumps(fields, separators=(",", ":")).encode(), version)


def frame(text: bytes, version: int) -> bytes:
    """Magic, ``version``, the length of the stored header, the stored header (``text``;
    from version 5 raw-deflated with its version's :data:`HEADER_DICTIONARIES`, a later
    version than this sharnn's with its own version's) and its CRC32."""
    if version >= DEFLATED_FROM:
        dictionary = HEADER_DICTIONARIES[min(version, FORMAT_VERSION)]
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary)
        text = deflate.compress(text) + deflate.flush()
    return _PREFIX.pack(MAGIC, version, len(text)) + text + _CRC.pack(zlib.crc32(text))


def _inflate(stored: bytes, version: int, name: str) -> bytes:
    """A header's JSON from its stored bytes (version 5 on: deflated with its version's
    dictionary): at most 4,096 + 16 bytes per stored byte (a legitimate header deflates far
    less; a larger one is refused before it is allocated), or :class:`DataError`."""
    inflate = zlib.decompressobj(-15, zdict=HEADER_DICTIONARIES[version])
    try:
        text = inflate.decompress(stored, 4096 + 16 * len(stored))
    except zlib.error:
        raise DataError(f"{name} is corrupt: its header is not deflated JSON") from None
    if inflate.unconsumed_tail or not inflate.eof or inflate.unused_data:
        raise DataError(f"{name} is corrupt: its deflated header is incomplete, or inflates past 16 times its size")
    return text


def _parse_header(text: bytes, name: str) -> object:
    """The header's JSON (UTF-8; no duplicate keys, no NaN or Infinity), or :class:`DataError`."""

    def no_duplicates(pairs: list) -> dict:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key appears twice ({min(k for k in set(keys) if keys.count(k) > 1)!r})")
        return dict(pairs)

    def no_constant(constant: str):
        raise ValueError(f"{constant} is not a number JSON allows")

    try:
        return json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except UnicodeDecodeError:
        raise DataError(f"{name} is corrupt: its header is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{name} is corrupt: its header is not valid JSON ({e})") from None


def _is_count(value: object, most: int | None = None) -> bool:
    """An int (not a bool) in ``[0, most]``."""
    return type(value) is int and 0 <= value and (most is None or value <= most)


_U32 = 2**32 - 1


_FIELDS = {  # key: (valid?, what it must be)
    "mode": (lambda v: v in ("model", "online"), '"model" or "online"'),
    "model_sha256": (lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v) is not None, "64 hex digits"),
    "length": (_is_count, "an integer >= 0"),
    "streams": (_is_count, "an integer >= 0"),
    "stream_crc32": (lambda v: type(v) is list and all(_is_count(c, _U32) for c in v), "a list of CRC32s"),
    "payload_bytes": (_is_count, "an integer >= 0"),
    "payload_crc32": (lambda v: _is_count(v, _U32), "a CRC32"),
    "environment": (lambda v: type(v) is dict, "an object"),
    "online": (lambda v: v is None or type(v) is dict, "null or an object"),
    "tokenizer": (lambda v: v == "bytes", '"bytes"'),
    "storage": (lambda v: v in ("coded", "stored"), '"coded" or "stored"'),
    "coded_bytes": (lambda v: v is None or _is_count(v), "null or an integer >= 0"),
    "precision": (lambda v: v in CODING_PRECISIONS, " or ".join(f'"{p}"' for p in CODING_PRECISIONS)),
    "portable": (lambda v: type(v) is bool, "true or false"),
    "integer_step": (lambda v: v is None or _is_count(v), "null or an integer >= 0"),
    "mixing": (lambda v: v is None or _is_count(v), "null or an integer >= 0"),
    "crlf": (_is_count, "an integer >= 0"),
    "model_input": (lambda v: type(v) is bool, "true or false"),
    "crc32": (lambda v: v is None or _is_count(v, _U32), "null or a CRC32"),
}


def _check_header(fields: object, version: int, name: str) -> Header:
    """The :class:`Header` of a parsed header of format ``version``: the exact keys of the
    version, each of its type and range, consistent with each other; or :class:`DataError`."""
    if type(fields) is not dict:
        raise DataError(f"{name} is corrupt: its header is a JSON {type(fields).__name__}, not an object")
    missing, unknown = sorted(_KEYS[version] - fields.keys()), sorted(fields.keys() - _KEYS[version])
    if missing or unknown:
        what = [f"lacks {', '.join(missing)}"] * bool(missing) + [f"has unknown keys {', '.join(unknown)}"] * bool(
            unknown
        )
        raise DataError(f"{name} is corrupt: its version-{version} header {' and '.join(what)}")
    for key, value in fields.items():
        valid, expected = _FIELDS[key]
        if not valid(value):
            shown = json.dumps(value)
            raise DataError(
                f"{name} is corrupt: its header's {key} is "
                f"{shown if len(shown) <= 40 else shown[:37] + '...'}, not {expected}"
            )
    header = Header(**({"stream_crc32": []} | fields))  # version 6 has one crc32 instead
    problems = (_precision_problem(header, version), _environment_problem(header.environment, header.precision))
    for problem in (*problems, _layout_problem(header, version)):
        if problem:
            raise DataError(f"{name} is corrupt: its header's {problem}")
    if header.online is not None:
        _check_online(header.online, ONLINE_KEYS if version in STEP_VERSIONS else FORWARD_ONLINE_KEYS, name)
    return header


def _precision_problem(header: Header, version: int) -> str | None:
    """What contradicts what in a header's precision, portability, integer step and mixing, or None."""
    integer = header.precision == "integer"
    if integer and version < 4:
        return f'precision is "integer" in a version-{version} file (version 4 brought it)'
    if header.portable != integer:
        return f"portable is {str(header.portable).lower()} for precision {header.precision} (true for integer only)"
    if (integer and header.integer_step is None) or (not integer and header.integer_step is not None):
        return f"integer_step is {header.integer_step} for precision {header.precision} (a version for integer only)"
    if integer and header.mode == "online":
        return "precision is integer in online mode (online mode trains in floating point)"
    if header.mixing is not None and not integer:
        return f"mixing is {header.mixing} for precision {header.precision} (the mixing needs the integer step)"
    if not header.model_input and header.mixing is None:
        return "model_input is false in a file without mixing (the context models code without the model)"
    return None


def _environment_problem(env: dict, precision: str) -> str | None:
    """What is wrong with a header's ``environment`` (:func:`environment` of ``precision``), or None."""
    text, number, maybe = (str,), (int,), type(None)
    kinds = {"device": text, "torch": text, "threads": number, "cpu_capability": text}
    if env.get("device") == "cuda":
        kinds |= {"gpu": text, "cuda": (str, maybe), "cudnn": (int, maybe)}
    if precision == "bf16":
        kinds |= {"cpu_features": (list,)}
    if env.keys() != kinds.keys():
        return f"environment has keys {', '.join(sorted(env))}, not {', '.join(sorted(kinds))}"
    devices = ("cpu",) if precision == "bf16" else ("cpu", "cuda")
    rules = {  # key: (valid?, what it must be), checked once every key has its type
        "device": (lambda v: v in devices, "device: cpu or cuda, cpu for bf16"),
        "threads": (lambda v: 1 <= v <= MAX_THREADS, f"threads: 1 to {MAX_THREADS}"),
        "cpu_features": (_is_feature_list, f"cpu_features: 1 to {MAX_FEATURES} distinct names"),
    }
    wrong = [key for key, allowed in kinds.items() if type(env[key]) not in allowed]
    wrong = wrong or [key for key, (valid, _) in rules.items() if key in env and not valid(env[key])]
    if not wrong:
        return None
    key, names = wrong[0], {str: "text", int: "an integer", list: "a list", maybe: "null"}
    shown = json.dumps(env[key])
    if type(env[key]) in kinds[key]:  # of its type, against its rule
        expected = rules[key][1]
    else:
        expected = f"{key}: {' or '.join(names[kind] for kind in kinds[key])}"
    return f"environment.{key} is {shown if len(shown) <= 40 else shown[:37] + '...'} ({expected})"


def _is_feature_list(value: list) -> bool:
    """A header's ``cpu_features``: 1 to :data:`MAX_FEATURES` distinct names of letters, digits and ``_``."""
    return (
        0 < len(value) <= MAX_FEATURES
        and all(type(f) is str and re.fullmatch("[A-Za-z0-9_]{1,32}", f) for f in value)
        and len(set(value)) == len(value)
    )


def _crc_problem(header: Header, version: int) -> str | None:
    """What is wrong with a coded file's CRC32s for its ``version``, or None: from version 6
    one of the streams joined, before one per stream."""
    if "crc32" in _KEYS[version]:
        return None if header.crc32 is not None else "crc32 is null in a coded file (the CRC32 of the bytes coded)"
    if header.streams != len(header.stream_crc32):
        return f"streams is {header.streams} but it lists {len(header.stream_crc32)} stream CRC32s"
    return None


def _layout_problem(header: Header, version: int) -> str | None:
    """What contradicts what in a header's sizes, streams, their CRC32s, folded line ends and
    mode, or None. The streams hold the ``length - crlf`` bytes coded (``n`` below)."""
    n, streams, size, crlf = header.length - header.crlf, header.streams, header.payload_bytes, header.crlf
    if (header.mode == "online") != (header.online is not None):
        return f"mode is {header.mode} but its online settings are {'absent' if header.online is None else 'present'}"
    if crlf > header.length // 2:
        return f"crlf is {crlf:,} for a length of {header.length:,} (a folded line end is 2 bytes of it)"
    if header.storage == "stored":
        if crlf:
            return f"crlf is {crlf:,} in a stored file (its payload is the input: nothing is folded)"
        if streams or header.stream_crc32:
            return f"streams is {streams} with {len(header.stream_crc32)} stream CRC32s in a stored file (it has none)"
        if header.crc32 is not None:
            return f"crc32 is {header.crc32} in a stored file (its payload is the input: payload_crc32 checks it)"
        if size != n:
            return f"payload_bytes is {size:,} for a length of {n:,} in a stored file (its payload is the input)"
        if header.coded_bytes is None or header.coded_bytes <= n:
            return f"coded_bytes is {header.coded_bytes} for a length of {n:,} in a stored file (coding gave more)"
        return None
    if header.coded_bytes is not None:
        return f"coded_bytes is {header.coded_bytes} in a coded file (it is null there)"
    coded = f"{n:,}" + (f" ({header.length:,} less {crlf:,} folded CRs)" if crlf else "")
    if problem := _crc_problem(header, version):
        return problem
    if streams > n or (streams == 0) != (n == 0):
        return f"streams is {streams} for a length of {coded} (between 1 and the length, 0 only for an empty file)"
    words = header.mixing != 3  # the range coder's 32-bit words; mixing 3's binary coder writes bytes
    if (words and size % 4) or (size == 0) != (n == 0):
        unit = "32-bit words" if words else "bytes"
        return f"payload_bytes is {size:,} for a length of {coded} ({unit}, none only for an empty file)"
    if n > _BYTES_PER_PAYLOAD_BIT * 8 * size:
        return f"length {coded} is more than {size:,} payload bytes can code"
    return None


def _check_online(settings: dict, keys: tuple[str, ...], name: str) -> None:
    """A header's online settings: exactly ``keys`` (its version's), a valid configuration,
    a model of at most :data:`MAX_ONLINE_PARAMETERS` parameters; or :class:`DataError`."""
    if settings.keys() != set(keys):
        raise DataError(
            f"{name} is corrupt: its header's online settings have keys {', '.join(sorted(settings))}, "
            f"not {', '.join(sorted(keys))}"
        )
    try:
        check_online_size(load_config(settings))
    except ConfigError as e:
        raise DataError(f"{name} is corrupt: its header's online settings are invalid: {e}") from None
