"""Lossless compression driven by the model: range coding of every byte under the model's
next-byte distribution, with ``constriction`` (docs/compression.md).

A byte of probability ``p`` costs ``-log2 p`` bits, so a file compresses to about its
length times the model's bits per byte. Two modes:

- **model**: a trained checkpoint predicts (as ts_zip); the same checkpoint decompresses.
- **online**: no model file. A fixed-seed initialisation is trained, window by window,
  on the bytes already coded (as nncp and cmix); the decoder trains identically on the
  bytes it has decoded. Its settings are a :class:`~sharnn.config.TrainConfig` stored in
  the file.

The input is cut into ``B`` contiguous streams, coded in lockstep through the model's
batch dimension: one position of every stream at a time. Each stream starts cold after
a newline, as generation does. An SHA-RNN computes each position with
:class:`sharnn.inference.Step` (files of format version 3); a Transformer, and files of
versions 1 and 2, with the model's forward ``[1, B]``, the path that wrote them.

Exact round trip: the decoder can only compute the distribution of position ``t`` after
decoding position ``t - 1``, so the encoder computes every distribution the same way,
one position at a time with the same shapes, dtype, device and thread count (a forward
batched over time rounds differently, and one differing probability corrupts the rest
of the stream). Logits become float64 probabilities by one deterministic function on
both sides. The file records what the result depends on; decompression checks a CRC32
of the header, of the payload and of every stream's decoded bytes, and writes nothing
unless all of them match.

With ``precision="bf16"`` (an SHA-RNN on a CPU with bf16 instructions) the step multiplies
in bfloat16 (:class:`sharnn.inference.Step`): faster, a little less exact. The header
records the CPU features that arithmetic depends on (:func:`cpu_features`), and a bf16
file is decoded only on a CPU with the same ones.

When the coded file would be larger than the input stored raw (incompressible input, or
input the model predicts badly), :func:`compress` stores the input raw instead: the file's
header says ``storage: "stored"``, and such a file decodes without the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import constriction
import numpy as np
import torch

from .config import TrainConfig, load_config
from .errors import CheckpointError, ConfigError, DataError
from .inference import PRECISIONS, Step
from .model import SHARNN
from .pretrained import update_weights_digest
from .progress import ProgressDisplay
from .recipe import build_optimizer, learning_rate, train_step

MAGIC = b"\x89sharnn\n"
# The version compress() writes for an SHA-RNN, whose positions the inference step computes;
# a Transformer's files, computed by its forward, keep version 2. Versions 1 (no storage
# keys) and 2 decode with the model's forward, the path that wrote them.
FORMAT_VERSION = 3
FORWARD_VERSIONS = (1, 2)
READABLE_VERSIONS = (*FORWARD_VERSIONS, FORMAT_VERSION)
MAX_ONLINE_PARAMETERS = 100_000_000  # online models larger than this are refused on both sides
# A byte under constriction's leaky 24-bit categorical has probability <= 1 - 255 / 2**24,
# so it costs >= 2.2e-5 bits: a payload of P bits codes fewer than 2**16 * P bytes.
_BYTES_PER_PAYLOAD_BIT = 2**16
_MAX_THREADS = 1024
_MAX_FEATURES = 16  # names in a header's environment.cpu_features
START_BYTE = 10  # every stream starts after a newline
_FAMILY = constriction.stream.model.Categorical(perfect=False)
_PREFIX = struct.Struct("<8sHI")  # magic, format version, header length
_CRC = struct.Struct("<I")
_PROGRESS_EVERY = 256  # positions between progress updates

# Default streams in model mode: one per BYTES_PER_STREAM bytes of input, at most
# MAX_DEFAULT_STREAMS. Each stream costs a cold start and its CRC32 in the header, about
# 15 bytes with the tiny model (0.7% of what 8 KiB of text codes to); past 32 streams a
# position costs nearly as much per stream as it saves (docs/compression.md, "Streams
# and threads").
BYTES_PER_STREAM = 8192
MAX_DEFAULT_STREAMS = 32
ONLINE_STREAMS = 8  # online mode's default (ONLINE_DEFAULTS)

# The CPU features bf16 products depend on, as /proc/cpuinfo names them: those that decide
# which kernel oneDNN (and torch's choice of it) runs for a bf16 matrix product: AVX2 and
# AVX-512 (conversion and emulation), AVX-512 BF16 and AVX-NE-CONVERT (bf16 instructions),
# AVX-512 FP16 (a higher oneDNN level, recorded to be safe), AMX (tiles, their bf16 products).
BF16_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile", "amx_bf16")
BF16_PRODUCTS = ("avx512_bf16", "amx_bf16")  # a CPU with one of them multiplies in bf16
_CPUINFO = Path("/proc/cpuinfo")

# Online mode's default settings, the best of a search on the bundled enwik8 head's test
# split among those that code at 4 KB/s or more both ways on one thread of this project's
# CPU (docs/compression.md, "Online mode"): the tiny preset's architecture at 192 wide,
# 64 positions of attention span, one AdamW step per window of 8 positions of 8 streams.
ONLINE_PRESET = "tiny"
ONLINE_DEFAULTS = (
    "model.d_model=192",
    "model.boom_dim=768",
    "model.attention_span=64",
    "bptt=8",
    "warmup_steps=0",
    "optimizer=adamw",
    "lr=0.001",
)
# The settings online mode uses, which its files record: files of version 3 all of them,
# those of versions 1 and 2 all but the optimizer (theirs is Min-Trust LAMB).
ONLINE_KEYS = (
    "model", "optimizer", "bptt", "lr", "betas", "eps", "weight_decay", "min_trust", "clip", "warmup_steps", "seed"
)  # fmt: skip
_FORWARD_ONLINE_KEYS = tuple(key for key in ONLINE_KEYS if key != "optimizer")


@dataclass
class Header:
    """What a compressed file says about itself (stored as JSON; docs/compression.md).

    Attributes:
        mode: ``"model"`` or ``"online"``.
        model_sha256: fingerprint of the model's config and starting weights
            (:func:`model_sha256`); in online mode, of the fixed-seed initialisation.
        length: the original size in bytes.
        streams: the number of streams ``B`` (0 for an empty file).
        stream_crc32: CRC32 of each stream's original bytes.
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
        precision: ``"fp32"`` or ``"bf16"``, the step's (:class:`~sharnn.inference.Step`);
            a key of version 3 only (files of versions 1 and 2 read as ``"fp32"``).
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


_V1_KEYS = frozenset(field.name for field in dataclasses.fields(Header)) - {"storage", "coded_bytes", "precision"}
_V2_KEYS = _V1_KEYS | {"storage", "coded_bytes"}
_KEYS = {1: _V1_KEYS, 2: _V2_KEYS, 3: _V2_KEYS | {"precision"}}  # the exact keys of each version


def model_sha256(model: SHARNN) -> str:
    """SHA-256 of a model's config (its JSON, keys sorted) and then of every weight (name,
    dtype, shape and bytes; :func:`sharnn.pretrained.update_weights_digest`), hex."""
    digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    update_weights_digest(digest, model.state_dict())
    return digest.hexdigest()


def environment(device: torch.device, precision: str = "fp32") -> dict:
    """What the model's arithmetic depends on besides its weights: the device, the torch
    version, the CPU's vector capability and torch's thread count; on CUDA also the GPU's
    name and the CUDA and cuDNN versions; for precision bf16 also the CPU's
    :func:`cpu_features` (key ``cpu_features``)."""
    env = {
        "device": device.type,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if precision == "bf16":
        env["cpu_features"] = cpu_features()
    if device.type == "cuda":
        env |= {
            "gpu": torch.cuda.get_device_name(device),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return env


def cpu_features() -> list[str]:
    """The :data:`BF16_FEATURES` this CPU has, in that order, from the ``flags`` of
    /proc/cpuinfo (Linux on x86); elsewhere ``[torch.backends.cpu.get_cpu_capability()]``
    (e.g. ``["AVX2"]``), which names no bf16 instructions."""
    try:
        lines = _CPUINFO.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    fields = (line.partition(":") for line in lines)
    flags = next((value.split() for key, _, value in fields if key.strip() == "flags"), None)
    if flags is None:
        return [torch.backends.cpu.get_cpu_capability()]
    return [feature for feature in BF16_FEATURES if feature in flags]


def online_config(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Online mode's settings: the ``tiny`` preset with :data:`ONLINE_DEFAULTS`, then
    ``overrides``. ``bptt`` is the training window, ``seed`` the initialisation; lr,
    warmup_steps, betas, eps, weight_decay, min_trust, clip and dropout apply as in
    training. Raises :class:`ConfigError`, also for a setting outside :data:`ONLINE_KEYS`:
    the file would not record it, and decompression would train otherwise."""
    config = load_config(ONLINE_PRESET, [*ONLINE_DEFAULTS, *overrides])
    for item in overrides:
        if item.split("=", 1)[0].split(".", 1)[0] not in ONLINE_KEYS:
            raise ConfigError(
                f"{item}: online mode takes only the settings its files record "
                f"({', '.join(key + '.*' if key == 'model' else key for key in ONLINE_KEYS)})"
            )
    return config


def online_model(config: TrainConfig) -> SHARNN:
    """The fixed-seed initialisation online mode starts from (seeds torch's RNG).

    Raises:
        ConfigError: a model of more than :data:`MAX_ONLINE_PARAMETERS` parameters.
    """
    _check_online_size(config)
    torch.manual_seed(config.seed)
    return SHARNN(config.model)


def default_streams(length: int, online: bool = False) -> int:
    """The streams :func:`compress` uses when none are given: in model mode one per
    :data:`BYTES_PER_STREAM` bytes, from 1 to :data:`MAX_DEFAULT_STREAMS`; in online mode
    :data:`ONLINE_STREAMS` (docs/compression.md, "Streams and threads")."""
    if online:
        return ONLINE_STREAMS
    return max(1, min(MAX_DEFAULT_STREAMS, -(-length // BYTES_PER_STREAM)))


def stream_lengths(length: int, streams: int) -> list[int]:
    """Lengths of the ``min(streams, length)`` contiguous streams a file is cut into: as
    equal as possible, the longer ones first."""
    streams = min(streams, length)
    return [length // streams + (i < length % streams) for i in range(streams)]


def compress(
    data: bytes,
    model: SHARNN,
    *,
    streams: int | None = None,
    threads: int = 1,
    online: TrainConfig | None = None,
    progress: ProgressDisplay | None = None,
    precision: str = "fp32",
) -> bytes:
    """Compress ``data``.

    Args:
        data: any bytes (empty included).
        model: the predicting model (its device is used; it is put in eval mode). In online
            mode, :func:`online_model` of ``online``, which this trains.
        streams: ``B``, the number of contiguous pieces coded side by side (None:
            :func:`default_streams`).
        threads: torch's thread count while coding, recorded in the header and used
            again by :func:`decompress`. One is the default: a position's products are
            small, and a second thread rarely pays for itself and is several times
            slower when anything else runs (docs/compression.md, "Streams and threads").
        online: online mode's settings (None: model mode).
        progress: shows the fraction coded and the bits per byte so far.
        precision: ``"fp32"``, or ``"bf16"``: the step's products in bfloat16 (an SHA-RNN
            on a CPU with bf16 instructions, :data:`BF16_PRODUCTS`), its file decoded
            only on a CPU of the same :func:`cpu_features`.

    Returns:
        The compressed file's bytes: a header (format version :func:`written_version`:
        3 for an SHA-RNN, 2 for a Transformer), then the coder's payload; or, when that
        would be larger, the header and ``data`` itself (``read_header(blob)[0].storage``
        is then ``"stored"`` and ``.coded_bytes`` the coded file's size), at most
        ``len(data)`` plus the header.

    Raises:
        ConfigError: ``streams`` < 1, ``threads`` outside 1 to 1024, a model that is not
            byte-level, a precision other than fp32 and bf16, or bf16 for a Transformer,
            off the CPU or on a CPU without bf16 instructions.
    """
    if streams is None:
        streams = default_streams(len(data), online is not None)
    if not 1 <= threads <= _MAX_THREADS:
        raise ConfigError(f"threads must be between 1 and {_MAX_THREADS}, got {threads}")
    with torch_threads(threads):
        header, payload = _code(data, model, streams=streams, online=online, progress=progress, precision=precision)
    version = written_version(model)
    coded = _pack(header, version) + payload
    stored = (
        _pack(
            dataclasses.replace(
                header,
                storage="stored",
                coded_bytes=len(coded),
                streams=0,
                stream_crc32=[],
                payload_bytes=len(data),
                payload_crc32=zlib.crc32(data),
            ),
            version,
        )
        + data
    )
    return stored if len(stored) < len(coded) else coded


def _code(
    data: bytes,
    model: SHARNN,
    *,
    streams: int,
    online: TrainConfig | None,
    progress: ProgressDisplay | None,
    precision: str = "fp32",
) -> tuple[Header, bytes]:
    """Range-code ``data`` (:func:`compress`'s arguments): the coded file's header and payload."""
    if streams < 1:
        raise ConfigError(f"streams must be >= 1, got {streams}")
    _check_byte_model(model)
    _check_precision(model, precision)
    lengths = stream_lengths(len(data), streams)
    grid = _to_grid(np.frombuffer(data, dtype=np.uint8), lengths)
    fingerprint = model_sha256(model)
    encoder = constriction.stream.queue.RangeEncoder()

    def code(t: int, probs: np.ndarray) -> np.ndarray:
        symbols = grid[t, : len(probs)]
        encoder.encode(symbols.astype(np.int32), _FAMILY, probs)
        if progress is not None and t % _PROGRESS_EVERY == 0:
            progress.update(bpc=f"{encoder.num_bits() / max(t * len(lengths), 1):.4f}")
        return symbols

    _walk(model, lengths, code, online, progress, written_version(model), precision)
    payload = encoder.get_compressed().astype("<u4").tobytes()
    starts = np.cumsum([0, *lengths])
    header = Header(
        mode="model" if online is None else "online",
        model_sha256=fingerprint,
        length=len(data),
        streams=len(lengths),
        stream_crc32=[zlib.crc32(data[a:b]) for a, b in pairwise(starts)],
        payload_bytes=len(payload),
        payload_crc32=zlib.crc32(payload),
        environment=environment(_device(model), precision),
        online=None if online is None else _online_settings(online),
        precision=precision,
    )
    return header, payload


def _check_precision(model: SHARNN, precision: str) -> None:
    """Raise :class:`ConfigError` for a precision :func:`compress` cannot code with."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be {' or '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return
    if written_version(model) != FORMAT_VERSION:
        raise ConfigError(f"precision bf16 runs the SHA-RNN's inference step; a {type(model).__name__} codes in fp32")
    if _device(model).type != "cpu":
        raise ConfigError(f"precision bf16 runs on the CPU, not on {_device(model).type}: use fp32 there")
    features = cpu_features()
    if not set(BF16_PRODUCTS) & set(features):
        raise ConfigError(
            f"precision bf16 needs a CPU with bf16 instructions ({' or '.join(BF16_PRODUCTS)}); this one has "
            f"{' '.join(features) or 'none of ' + ', '.join(BF16_FEATURES)}: use fp32"
        )


def written_version(model: SHARNN) -> int:
    """The format version :func:`compress` writes for ``model``: :data:`FORMAT_VERSION`
    for an SHA-RNN (coded by the inference step), 2 for a Transformer (by its forward)."""
    return FORMAT_VERSION if isinstance(model, SHARNN) else 2


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
    return _split(blob, name)[1:]


def _split(blob: bytes, name: str) -> tuple[int, Header, bytes]:
    """:func:`read_header`, with the file's format version first."""
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
    header = _check_header(_parse_header(text, name), version, name)
    payload = blob[end + _CRC.size :]
    if len(payload) != header.payload_bytes:
        raise DataError(
            f"{name} is truncated or extended: {len(payload):,} payload bytes, the header says {header.payload_bytes:,}"
        )
    if zlib.crc32(payload) != header.payload_crc32:
        raise DataError(f"{name} is corrupt: its payload fails its CRC32 check")
    return version, header, payload


def decompress(
    blob: bytes, model: SHARNN | None = None, *, name: str = "input", progress: ProgressDisplay | None = None
) -> bytes:
    """Invert :func:`compress`.

    Args:
        blob: a compressed file's bytes.
        model: the model it was compressed with (model mode), on the device it used; None
            for an online file, whose model is rebuilt from its header.
        name: the file's name, for messages.
        progress: shows the fraction decoded.

    Returns:
        The original bytes, every stream's CRC32 checked (a stored file's payload, its
        CRC32 checked; ``model`` is not used).

    Raises:
        DataError: a file that is not sharnn's, corrupt, truncated, or that decodes to
            bytes whose CRC32 differs (another model, machine or library version), or
            one whose decoding needs more memory than this machine has.
        CheckpointError: a model-mode file without its model, or with another model.
        ConfigError: an online file given a model; a bf16 file coded on a CPU of other
            :func:`cpu_features` (before anything is decoded).
    """
    version, header, payload = _split(blob, name)
    if header.storage == "stored":  # the input itself, its CRC32 checked by read_header
        return payload
    check_cpu_features(header, name)
    model, online = _decoding_model(header, model, name)
    if not header.length:
        return b""
    decoder = constriction.stream.queue.RangeDecoder(np.frombuffer(payload, dtype="<u4").astype(np.uint32))
    lengths = stream_lengths(header.length, header.streams)

    def code(t: int, probs: np.ndarray) -> np.ndarray:
        return decoder.decode(_FAMILY, probs)

    try:
        with torch_threads(header.environment["threads"]):
            grid = _walk(model, lengths, code, online, progress, version, header.precision)
    except (ValueError, RuntimeError, AssertionError) as e:
        # constriction's "out of data" on a payload that ends early, or its AssertionError on
        # data invalid under the model (probabilities that differ from the encoder's)
        raise DataError(f"{name} does not decode: {e}") from None
    except MemoryError:
        raise DataError(
            f"{name}: decoding its {header.length:,} bytes needs more memory than this machine has"
        ) from None
    return _check_streams(grid, lengths, header, name, _device(model))


def _decoding_model(header: Header, model: SHARNN | None, name: str) -> tuple[SHARNN, TrainConfig | None]:
    """The model that decodes a coded file and, in online mode, its settings: ``model`` in
    model mode, the fixed-seed initialisation rebuilt from the header in online mode,
    checked against the header's fingerprint.

    Raises:
        CheckpointError: a model-mode file without its model, or another model.
        ConfigError: an online file given a model.
    """
    if header.mode == "online":
        if model is not None:
            raise ConfigError(f"{name} was compressed in online mode: decompress it without a model")
        online = load_config(header.online)
        model = online_model(online).to(coding_device(header, name))
    elif model is None:
        raise CheckpointError(
            f"{name} was compressed with a model (sha256 {header.model_sha256[:16]}...): give it with --model"
        )
    else:
        online = None
    fingerprint = model_sha256(model)
    if fingerprint != header.model_sha256:
        what = (
            "the fixed-seed online model differs on this machine"
            if online
            else "this is not the model it was compressed with"
        )
        raise CheckpointError(
            f"{name}: {what} (sha256 {fingerprint[:16]}..., the file says {header.model_sha256[:16]}...)"
        )
    return model, online


def check_cpu_features(header: Header, name: str = "input") -> None:
    """Refuse a bf16 file coded on a CPU whose :func:`cpu_features` differ from this one's:
    its products would round otherwise, and decode to other bytes. An fp32 file passes.

    Raises:
        ConfigError: one line naming the features that differ.
    """
    if header.precision != "bf16":
        return
    here, there = cpu_features(), header.environment["cpu_features"]
    lacks, extra = [f for f in there if f not in here], [f for f in here if f not in there]
    if lacks or extra:
        differs = [f"lacks {' '.join(lacks)}"] * bool(lacks) + [f"also has {' '.join(extra)}"] * bool(extra)
        raise ConfigError(
            f"{name} was compressed in bf16 on a CPU with {' '.join(there)}; this CPU {' and '.join(differs)}: "
            "decompress it on a CPU with the same features"
        )


def coding_device(header: Header, name: str = "input") -> torch.device:
    """The device a file decodes on: the kind it was coded on (``cpu`` or ``cuda``).

    Raises:
        ConfigError: a file coded on CUDA, on a machine without it; a bf16 file coded on
            a CPU of other features (:func:`check_cpu_features`).
    """
    check_cpu_features(header, name)
    if header.environment["device"] == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{name} was compressed on CUDA ({header.environment.get('gpu')}): decompress it on a "
            "machine with the same GPU type and library versions"
        )
    return torch.device(header.environment["device"])


@contextmanager
def torch_threads(count: int):
    """Run with torch's intra-op thread count at ``count``; the previous count is restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------- the one code path


@torch.no_grad()
def _walk(
    model: SHARNN,
    lengths: list[int],
    code: Callable[[int, np.ndarray], np.ndarray],
    online: TrainConfig | None,
    progress: ProgressDisplay | None,
    version: int,
    precision: str,
) -> np.ndarray:
    """Walk the streams in lockstep, one position at a time, for both directions.

    At position ``t`` the model reads the previous byte of every stream (``[B]``) and
    ``code(t, probs)`` codes the bytes of the ``k`` streams still running (``probs``:
    ``[k, 256]`` float64), returning them. The model computes each position as files of
    format ``version`` were coded: by the inference step (:data:`FORMAT_VERSION`) in
    ``precision``, or by its forward on ``[1, B]`` (:data:`FORWARD_VERSIONS`). In online
    mode, every ``bptt`` positions the model takes one optimizer step on the window just
    coded, and the step is prepared again from the new weights, before coding on. ``progress`` is given the
    fraction of positions done.

    Returns:
        ``[max(lengths), B]`` uint8: column ``b`` holds stream ``b`` (zeros past its end).
    """
    device = _device(model)
    if device.type == "cuda":  # the same kernels on both sides: no TF32, no autotuned choice
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rows = max(lengths, default=0)
    grid = np.zeros((rows + 1, len(lengths)), dtype=np.int64)  # row 0: the start byte; row t + 1: byte t
    grid[0] = START_BYTE
    learner = _OnlineLearner(model, online, device) if online is not None else None
    longer = lengths.count(rows)  # the streams one byte longer than the rest, which come first
    model.eval()
    if not rows:  # an empty file: no position to compute
        return grid[1:].astype(np.uint8)
    position = Step(model, len(lengths), rows, precision) if version == FORMAT_VERSION else _Forward(model)
    for t in range(rows):
        if learner is not None and t > 0 and t % online.bptt == 0:
            learner.learn(torch.from_numpy(grid[t - online.bptt : t + 1]).to(device))
            position.refresh()
        probs = _probabilities(position(torch.from_numpy(grid[t]).to(device)))
        running = longer if t == rows - 1 else len(lengths)
        grid[t + 1, :running] = code(t, probs[:running])
        if progress is not None and t % _PROGRESS_EVERY == 0:
            progress.update(t / rows)
    return grid[1:].astype(np.uint8)


def _probabilities(logits: torch.Tensor) -> np.ndarray:
    """Logits ``[B, V]`` -> float64 probabilities ``[B, V]`` for the coder: the same
    deterministic computation on both sides."""
    return torch.softmax(logits.to(torch.float64), dim=-1).cpu().numpy()


class _Forward:
    """The model's forward on one position ``[1, B]``, its state carried: how files of
    versions 1 and 2 were coded. The interface of :class:`~sharnn.inference.Step`."""

    def __init__(self, model: SHARNN):
        self.model, self.state = model, None

    def refresh(self) -> None:
        """Nothing to prepare: the forward reads the weights as they are."""

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B]`` -> logits ``[B, V]``."""
        logits, self.state = self.model(tokens.view(1, -1), self.state)
        return logits[0]


class _OnlineLearner:
    """Online mode's training: truncated BPTT over the windows already coded, with its
    own recurrent state, the config's optimizer (AdamW by default online, or Min-Trust
    LAMB), warmup and clip."""

    def __init__(self, model: SHARNN, config: TrainConfig, device: torch.device):
        self.model, self.config = model, config
        self.optimizer = build_optimizer(model, config)
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)
        self.state = None
        self.steps = 0

    def learn(self, window: torch.Tensor) -> None:
        """One optimizer step on ``window`` ``[T + 1, B]`` (inputs, then the targets one
        position on); the model goes back to eval mode for coding."""
        self.steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.config, self.steps, 0)
        self.model.train()
        with torch.enable_grad():
            _, _, self.state = train_step(
                self.model, self.optimizer, self.scaler, window[:-1], window[1:], self.state, self.config.clip
            )
        self.model.eval()


# ---------------------------------------------------------------------------- helpers


def _to_grid(data: np.ndarray, lengths: list[int]) -> np.ndarray:
    """``[max(lengths), B]`` uint8 with the streams as columns, zero-padded."""
    grid = np.zeros((max(lengths, default=0), len(lengths)), dtype=np.uint8)
    start = 0
    for b, n in enumerate(lengths):
        grid[:n, b] = data[start : start + n]
        start += n
    return grid


def _check_streams(grid: np.ndarray, lengths: list[int], header: Header, name: str, device: torch.device) -> bytes:
    """The decoded streams joined, after checking each one's CRC32 (raises :class:`DataError`)."""
    pieces = [grid[:n, b].tobytes() for b, n in enumerate(lengths)]
    bad = [b for b, piece in enumerate(pieces) if zlib.crc32(piece) != header.stream_crc32[b]]
    if bad:
        here, there = environment(device, header.precision), header.environment
        differs = [f"{k} {there[k]} (here {here.get(k)})" for k in there if k != "threads" and there[k] != here.get(k)]
        hint = f"; it was compressed with {', '.join(differs)}" if differs else ""
        raise DataError(
            f"{name}: stream {bad[0]} decodes to bytes that fail its CRC32 check ({len(bad)} of "
            f"{len(lengths)} streams){hint}; nothing was written"
        )
    return b"".join(pieces)


def _pack(header: Header, version: int = FORMAT_VERSION) -> bytes:
    """A version-``version`` file's header (the keys of that version): prefix, JSON and its CRC32."""
    fields = {key: value for key, value in dataclasses.asdict(header).items() if key in _KEYS[version]}
    return _frame(json.dumps(fields, separators=(",", ":")).encode(), version)


def _frame(text: bytes, version: int) -> bytes:
    """Magic, ``version``, the length of ``text``, ``text`` and its CRC32."""
    return _PREFIX.pack(MAGIC, version, len(text)) + text + _CRC.pack(zlib.crc32(text))


# ---------------------------------------------------------------------------- header validation


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
    "precision": (lambda v: v in PRECISIONS, " or ".join(f'"{p}"' for p in PRECISIONS)),
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
    header = Header(**fields)
    for problem in (_environment_problem(header.environment, header.precision), _layout_problem(header)):
        if problem:
            raise DataError(f"{name} is corrupt: its header's {problem}")
    if header.online is not None:
        _check_online(header.online, ONLINE_KEYS if version == FORMAT_VERSION else _FORWARD_ONLINE_KEYS, name)
    return header


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
        "threads": (lambda v: 1 <= v <= _MAX_THREADS, f"threads: 1 to {_MAX_THREADS}"),
        "cpu_features": (_is_feature_list, f"cpu_features: 1 to {_MAX_FEATURES} distinct names"),
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
    """A header's ``cpu_features``: 1 to :data:`_MAX_FEATURES` distinct names of letters, digits and ``_``."""
    return (
        0 < len(value) <= _MAX_FEATURES
        and all(type(f) is str and re.fullmatch("[A-Za-z0-9_]{1,32}", f) for f in value)
        and len(set(value)) == len(value)
    )


def _layout_problem(header: Header) -> str | None:
    """What contradicts what in a header's sizes, streams and mode, or None."""
    n, streams, size = header.length, header.streams, header.payload_bytes
    if (header.mode == "online") != (header.online is not None):
        return f"mode is {header.mode} but its online settings are {'absent' if header.online is None else 'present'}"
    if header.storage == "stored":
        if streams or header.stream_crc32:
            return f"streams is {streams} with {len(header.stream_crc32)} stream CRC32s in a stored file (it has none)"
        if size != n:
            return f"payload_bytes is {size:,} for a length of {n:,} in a stored file (its payload is the input)"
        if header.coded_bytes is None or header.coded_bytes <= n:
            return f"coded_bytes is {header.coded_bytes} for a length of {n:,} in a stored file (coding gave more)"
        return None
    if header.coded_bytes is not None:
        return f"coded_bytes is {header.coded_bytes} in a coded file (it is null there)"
    if streams != len(header.stream_crc32):
        return f"streams is {streams} but it lists {len(header.stream_crc32)} stream CRC32s"
    if streams > n or (streams == 0) != (n == 0):
        return f"streams is {streams} for a length of {n:,} (between 1 and the length, 0 only for an empty file)"
    if size % 4 or (size == 0) != (n == 0):
        return f"payload_bytes is {size:,} for a length of {n:,} (32-bit words, none only for an empty file)"
    if n > _BYTES_PER_PAYLOAD_BIT * 8 * size:
        return f"length {n:,} is more than {size:,} payload bytes can code"
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
        _check_online_size(load_config(settings))
    except ConfigError as e:
        raise DataError(f"{name} is corrupt: its header's online settings are invalid: {e}") from None


def _check_online_size(config: TrainConfig) -> None:
    """Raise :class:`ConfigError` if online mode's model is not an SHA-RNN or has more than
    :data:`MAX_ONLINE_PARAMETERS` parameters (counted on the meta device: nothing allocated)."""
    if config.model.architecture != "sha-rnn":
        raise ConfigError(
            f"online mode trains an SHA-RNN, not model.architecture {config.model.architecture}; "
            "compress with a trained model (--model) instead"
        )
    with torch.device("meta"):
        parameters = SHARNN(config.model).num_parameters()
    if parameters > MAX_ONLINE_PARAMETERS:
        raise ConfigError(
            f"online mode's model would have {parameters:,} parameters; at most {MAX_ONLINE_PARAMETERS:,} are allowed"
        )


def _online_settings(config: TrainConfig) -> dict:
    """The :data:`ONLINE_KEYS` of ``config``, as a mapping :func:`load_config` reads."""
    everything = dataclasses.asdict(config)
    return {key: everything[key] for key in ONLINE_KEYS}


def _device(model: SHARNN) -> torch.device:
    return next(model.parameters()).device


def _check_byte_model(model: SHARNN) -> None:
    if model.config.vocab_size != 256:
        raise ConfigError(
            f"compression codes bytes: the model's vocabulary has {model.config.vocab_size} tokens, not 256"
        )
