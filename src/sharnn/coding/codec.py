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
:class:`sharnn.models.step.Step` (files of format version 3); a Transformer, and files of
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
in bfloat16 (:class:`sharnn.models.step.Step`): faster, a little less exact. The header
records the CPU features that arithmetic depends on (:func:`cpu_features`), and a bf16
file is decoded only on a CPU with the same ones.

Text whose line ends are all CRLF is coded with them folded to LF (:func:`fold_line_ends`,
format version 6): the shipped model learnt LF line ends.

When the coded file would be larger than the input stored raw (incompressible input, or
input the model predicts badly), :func:`compress` stores the input raw instead: the file's
header says ``storage: "stored"``, and such a file decodes without the model.
"""

from __future__ import annotations

import dataclasses
import zlib
from itertools import pairwise

import numpy as np
import torch

from ..compiled import ensure_compiled
from ..config import TrainConfig, load_config
from ..errors import CheckpointError, ConfigError, DataError
from ..models.build import check_finite, model_sha256
from ..models.sharnn import SHARNN
from ..progress import ProgressDisplay
from ..runtime import out_of_memory_as
from .arithmetic import DEFAULT_MIXING, MIXINGS, START_BYTE, Arithmetic, device_of, walk
from .coders import Coder, Decoder, Encoder
from .container import CODING_PRECISIONS, FORMAT_VERSION, Compressed, Header, as_bytes, pack, parse
from .environment import (
    BF16_FEATURES,
    BF16_PRODUCTS,
    MAX_THREADS,
    available_cpus,
    check_streams,
    check_threads,
    coding_threads,
    cpu_features,
    deterministic_kernels,
    environment,
)
from .online import ONLINE_STREAMS, online_model, online_settings

__all__ = [
    "START_BYTE",
    "compress",
    "decompress",
    "default_streams",
    "fold_line_ends",
    "stream_lengths",
    "unfold_line_ends",
]


# Default streams in model mode: one per BYTES_PER_STREAM bytes of input, at most
# MAX_DEFAULT_STREAMS. Each stream costs a cold start, and the streams' contexts lose the
# text just before them: with mixing 3 and the shipped model, lcet10 took 1.4909 bits per
# byte with 4 streams, 1.4985 with 8 and 1.5137 with 32, at about the same speed, and
# fewer than 4 are slower (docs/compression.md, "Streams and threads").
BYTES_PER_STREAM = 8192


MAX_DEFAULT_STREAMS = 4


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


def fold_line_ends(data: bytes) -> tuple[bytes, int]:
    """The bytes :func:`compress` codes for ``data``, and how many CRLF line ends it folded
    (docs/compression.md, "Line ends"): where every line end is CRLF (each LF after a CR,
    each CR before an LF) and there is one at least, ``data`` with each CRLF made LF and
    their count; else ``data`` itself and 0 (LF text, mixed line ends, a lone CR)."""
    crlf = data.count(b"\r\n")
    if crlf and crlf == data.count(b"\n") == data.count(b"\r"):
        return data.replace(b"\r\n", b"\n"), crlf
    return data, 0


BINARY_SHARE = 1 / 8  # input with more control bytes and invalid UTF-8 than this share is not text
BINARY_SAMPLE = 2**20  # the bytes looked at: the first MiB (a decoded str of 2 GiB would take 8)


def looks_binary(data: bytes) -> bool:
    """Whether ``data`` is not text, so that the mixing codes it without the model
    (docs/compression.md, "Input that is not text"): more than :data:`BINARY_SHARE` of its
    first :data:`BINARY_SAMPLE` bytes are control bytes (0 to 31 but tab, LF, VT, FF and
    CR; 127) or do not decode as UTF-8. Object code, images and compressed data are; text
    in any language is not."""
    data = bytes(data[:BINARY_SAMPLE])
    if not data:
        return False
    codes = np.frombuffer(data, dtype=np.uint8)
    controls = np.count_nonzero((codes < 32) & ((codes < 9) | (codes > 13)) | (codes == 127))
    invalid = data.decode("utf-8", "replace").count("\ufffd") - data.count("\ufffd".encode())
    return bool(controls + invalid > BINARY_SHARE * len(data))


def unfold_line_ends(coded: bytes, crlf: int, length: int, name: str = "input") -> bytes:
    """Invert :func:`fold_line_ends`: the ``length`` bytes of ``coded`` (the decoded
    streams) with each LF made CRLF again, where ``crlf`` line ends were folded (none: ``coded``).

    Raises:
        DataError: ``coded`` holds other than ``crlf`` LFs (unfolded, it would not be
            ``length`` bytes) or a CR (folding leaves none): a header that contradicts its streams.
    """
    if not crlf:
        return coded
    data, returns = coded.replace(b"\n", b"\r\n"), coded.count(b"\r")
    if len(data) != length or returns:
        raise DataError(
            f"{name} is corrupt: its header says {crlf:,} CRLF line ends were folded, but it decodes to "
            f"{len(data) - len(coded):,} LFs and {returns:,} CRs ({len(data):,} bytes unfolded, not {length:,})"
        )
    return data


def compress(
    data: bytes,
    model: SHARNN,
    *,
    streams: int | None = None,
    threads: int = 1,
    online: TrainConfig | None = None,
    progress: ProgressDisplay | None = None,
    precision: str | None = None,
    adapt: bool | None = None,
    mixing: int | None = None,
) -> bytes:
    """Compress ``data``.

    Args:
        data: any bytes (empty included): ``bytes``, ``bytearray`` or a ``memoryview``.
        model: the predicting model (its device is used; it is put in eval mode). In online
            mode, :func:`online_model` of ``online``, which this trains.
        streams: ``B``, the contiguous pieces coded side by side (None: :func:`default_streams`).
        threads: torch's and the kernels' thread count while coding, recorded in the header
            and used again by :func:`decompress` (another for a portable file). One is the
            default: a position's products are small, and a second thread rarely pays for
            itself and is several times slower beside other work (docs/compression.md).
        online, progress: online mode's settings (None: model mode); shows the fraction
            coded and the bits per byte so far.
        precision: the step's arithmetic (None: :func:`default_precision`): ``"integer"``,
            the integer step of an SHA-RNN in model mode, whose file decodes on any
            machine; ``"fp32"``, the float step (or a Transformer's forward), whose file
            decodes on the same kind of machine only; ``"bf16"``: its products in bfloat16
            (an SHA-RNN on a CPU with bf16 instructions, :data:`BF16_PRODUCTS`), its file
            decoded only on a CPU of the same :func:`cpu_features`.
        adapt: mix the model's distribution with context models that learn the file as
            it is coded (:mod:`sharnn.coding.mixing`; None: with precision integer).
        mixing: the adaptive stage's version, 1 or 2 (:mod:`sharnn.coding.matching`; None: the default).

    Returns:
        The compressed file's bytes: a header (format version :func:`written_version`:
        6 for an SHA-RNN, 2 for a Transformer), then the coder's payload; or, where the
        payload is no smaller than ``data`` or the file larger, the header and ``data``
        (``read_header(blob)[0]``: ``storage`` ``"stored"``, ``coded_bytes`` the coded size).

    Raises:
        ConfigError: ``streams`` or ``threads`` outside 1 to 1024, a model that is not
            byte-level, an unknown precision, integer or bf16 for a Transformer, integer
            in online mode, bf16 off the CPU or on a CPU without bf16 instructions;
            ``adapt`` with another precision than integer; an unknown ``mixing``.
    """
    data = as_bytes("data", data)
    if streams is None:
        streams = default_streams(len(data), online is not None)
    check_threads(threads)
    more = f"coding {len(data):,} bytes in {streams} streams needs more memory than this process may hold"
    with out_of_memory_as(ConfigError, f"{more}: give fewer streams, or a smaller input"), coding_threads(int(threads)):
        options = {"precision": precision, "adapt": adapt, "mixing": mixing}
        header, payload = encode(data, model, streams=streams, online=online, progress=progress, **options)
    version = written_version(model)
    coded = pack(header, version) + payload
    stored = _stored(header, data, version, len(coded))
    # stored where coding does not shrink the input (as xz stores a chunk) or the file is smaller
    return stored if len(payload) >= len(data) or len(stored) < len(coded) else coded


def _stored(header: Header, data: bytes, version: int, coded_bytes: int) -> bytes:
    """The file that stores ``data`` raw under the coded file's ``header`` (``storage``
    ``"stored"``, ``coded_bytes`` the coded file's size, the payload ``data`` itself)."""
    stored = dataclasses.replace(
        header,
        storage="stored",
        coded_bytes=coded_bytes,
        streams=0,
        stream_crc32=[],
        crc32=None,
        payload_bytes=len(data),
        payload_crc32=zlib.crc32(data),
        crlf=0,
    )
    return pack(stored, version) + data


def encode(
    data: bytes,
    model: SHARNN,
    *,
    streams: int,
    online: TrainConfig | None,
    progress: ProgressDisplay | None,
    precision: str | None = None,
    adapt: bool | None = None,
    mixing: int | None = None,
) -> tuple[Header, bytes]:
    """Range-code ``data`` (:func:`compress`'s arguments), its CRLF line ends folded
    (:func:`fold_line_ends`) where the format records them: the coded file's header and payload."""
    if precision is None:
        precision = default_precision(model, online)
    check_streams(streams)
    mixed = _check_coding(model, precision, online, adapt, mixing)
    latest = written_version(model) == FORMAT_VERSION  # a Transformer's version 2 records neither
    folded, crlf = fold_line_ends(data) if latest else (data, 0)
    text = not (latest and looks_binary(folded))
    arithmetic = Arithmetic.written(written_version(model), precision, mixed, online, mixing or DEFAULT_MIXING, text)
    lengths = stream_lengths(len(folded), streams)
    grid = _to_grid(np.frombuffer(folded, dtype=np.uint8), lengths)
    fingerprint = model_sha256(model)  # before online mode trains it
    encoder = Encoder(grid, progress)
    with deterministic_kernels(device_of(model)):
        _walk(arithmetic, model, lengths, encoder, progress)
    payload = encoder.payload(arithmetic.bitwise)
    starts = np.cumsum([0, *lengths])
    header = Header(
        mode="model" if online is None else "online",
        model_sha256=fingerprint,
        length=len(data),
        streams=len(lengths),
        stream_crc32=[] if latest else [zlib.crc32(folded[a:b]) for a, b in pairwise(starts)],
        payload_bytes=len(payload),
        payload_crc32=zlib.crc32(payload),
        environment=environment(device_of(model), precision),
        online=None if online is None else online_settings(online),
        precision=precision,
        portable=arithmetic.portable,
        integer_step=arithmetic.integer_step,
        mixing=arithmetic.mixing,
        crlf=crlf,
        model_input=arithmetic.model_input,
        crc32=zlib.crc32(folded) if latest else None,  # version 6: one CRC32 for all the streams
    )
    return header, payload


def _check_coding(model: SHARNN, precision: str, online: TrainConfig | None, adapt: bool | None, mixing) -> bool:
    """Whether :func:`encode` mixes (``adapt``, None: for the integer step); a
    :class:`ConfigError` for a model, precision, ``adapt`` or ``mixing`` it cannot code with."""
    check_finite(model.state_dict(), "the model")
    if adapt and precision != "integer":
        why = "online mode learns the model itself" if online is not None else f"not {precision}'s"
        raise ConfigError(f"--adapt mixes the integer step's distribution ({why}): leave it out")
    _check_byte_model(model)
    _check_precision(model, precision, online is not None)
    if mixing is not None and mixing not in MIXINGS:
        raise ConfigError(f"mixing must be one of {', '.join(map(str, MIXINGS))}, got {mixing}")
    mixed = bool(adapt or (adapt is None and precision == "integer"))
    if mixing is not None and not mixed:
        without = "online mode" if online is not None else f"--precision {precision}"
        without = "--no-adapt" if adapt is False else without
        raise ConfigError(f"--mixing chooses the adaptive mixing, which {without} leaves out: leave it out")
    return mixed


def default_precision(model: SHARNN, online: TrainConfig | None = None) -> str:
    """The precision :func:`compress` codes with when none is given: ``"integer"`` (portable
    files) for an SHA-RNN in model mode; ``"fp32"`` in online mode, which trains in floating
    point, and for a Transformer, which has no inference step."""
    return "integer" if isinstance(model, SHARNN) and online is None else "fp32"


def _check_precision(model: SHARNN, precision: str, online: bool) -> None:
    """Raise :class:`ConfigError` for a precision :func:`compress` cannot code with."""
    if precision not in CODING_PRECISIONS:
        raise ConfigError(f"precision must be {', '.join(CODING_PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return
    if written_version(model) != FORMAT_VERSION:
        raise ConfigError(
            f"precision {precision} runs the SHA-RNN's inference step; a {type(model).__name__} codes in fp32"
        )
    if precision == "integer":
        if online:
            raise ConfigError(
                "online mode trains in floating point, so its files are not portable: use precision fp32 (the default)"
            )
        return
    if device_of(model).type != "cpu":
        raise ConfigError(f"precision bf16 runs on the CPU, not on {device_of(model).type}: use fp32 there")
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


def decompress(
    blob: bytes | Compressed,
    model: SHARNN | None = None,
    *,
    name: str = "input",
    progress: ProgressDisplay | None = None,
    threads: int | None = None,
) -> bytes:
    """Invert :func:`compress`.

    Args:
        blob: a compressed file's bytes, or the file :func:`~sharnn.coding.container.parse` read.
        model: the model it was compressed with (model mode), on the device it used; None
            for an online file, whose model is rebuilt from its header.
        name, progress: the file's name, for messages; shows the fraction decoded.
        threads: torch's and the kernels' thread count (None: the file's); another only for
            a portable file.

    Returns:
        The original bytes, the streams' CRC32 checked (a stored file's payload, its
        CRC32 checked; ``model`` is not used).

    Raises:
        DataError: a file that is not sharnn's, corrupt, truncated, or one whose decoding
            needs more memory than this machine has; a coded file that does not decode
            here or decodes to bytes whose CRC32 differs (made on another kind of machine,
            or with another library version): one line that names what differs from the
            header's environment (docs/compression.md, "Which files travel").
        CheckpointError: a model-mode file without its model, or with another model.
        ConfigError: an online file given a model; a bf16 file coded on a CPU of other
            :func:`cpu_features` (before anything is decoded); ``threads`` outside 1 to
            1024, or other than the file's for a file that is not portable.
    """
    version, header, payload = blob if isinstance(blob, Compressed) else parse(blob, name)
    threads = decoding_threads(header, threads, name)
    if header.storage == "stored":  # the input itself, its CRC32 checked by read_header
        return payload
    arithmetic = Arithmetic.of(version, header, name)
    check_cpu_features(header, name)
    model = _decoding_model(header, model, name)
    if not header.length:
        return b""
    coded = _decode(arithmetic, model, header, payload, name, progress, threads)
    return unfold_line_ends(coded, header.crlf, header.length, name)


def _decode(arithmetic: Arithmetic, model: SHARNN, header: Header, payload: bytes, name: str, progress, threads: int):
    """The bytes a coded file's ``payload`` codes (:func:`decompress`'s arguments; its
    line ends still folded, ``length - crlf`` bytes), the streams' CRC32 checked; a
    payload that does not decode here raises :class:`DataError`."""
    decoder = Decoder(payload, arithmetic.bitwise)
    lengths = stream_lengths(header.length - header.crlf, header.streams)
    try:
        with coding_threads(threads), deterministic_kernels(device_of(model)):
            grid = _walk(arithmetic, model, lengths, decoder, progress)
    except (ValueError, RuntimeError, AssertionError) as e:
        # constriction's "out of data" or AssertionError: probabilities that differ from the
        # encoder's (the payload's CRC32 passed, so the file is as it was written)
        failure = f" does not decode ({(str(e).strip().splitlines() or [type(e).__name__])[0]})"
        raise _undecodable(header, name, device_of(model), failure) from None
    except MemoryError:
        raise DataError(f"{name}: decoding {header.length:,} bytes needs more memory than this machine has") from None
    return _check_streams(grid, lengths, header, name, device_of(model))


def decoding_threads(header: Header, threads: int | None, name: str = "input") -> int:
    """The thread count a file decodes with: ``threads``, or the header's when None; for a
    portable file, which decodes to the same bytes with any count, at most this machine's
    CPUs (:func:`available_cpus`: a header that says 1,024 starts no more threads than there are CPUs).

    Raises:
        ConfigError: ``threads`` outside 1 to :data:`MAX_THREADS`, or another count than
            the header's for a file that is not portable (its sums depend on the count).
    """
    recorded = header.environment["threads"]
    if threads is None:  # a portable file decodes to the same bytes with any count: its own is a hint
        return min(recorded, available_cpus()) if header.portable else recorded
    if type(threads) is not int or not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"threads must be an integer between 1 and {MAX_THREADS}, got {threads!r:.40}")
    if threads != recorded and not header.portable:
        raise ConfigError(
            f"{name} is coded in {header.precision}, not portable: it decodes with the {recorded} thread(s) "
            "it was coded with"
        )
    return threads


def _decoding_model(header: Header, model: SHARNN | None, name: str) -> SHARNN:
    """The model that decodes a coded file: ``model`` in model mode, the fixed-seed
    initialisation rebuilt from the header in online mode, checked against the header's
    fingerprint.

    Raises:
        CheckpointError: a model-mode file without its model, or another model.
        ConfigError: an online file given a model.
    """
    if header.mode == "online":
        if model is not None:
            raise ConfigError(f"{name} was compressed in online mode: decompress it without a model")
        model = online_model(load_config(header.online)).to(coding_device(header, name))
    elif model is None:
        raise CheckpointError(
            f"{name} was compressed with a model (sha256 {header.model_sha256[:16]}...): give it with --model"
        )
    fingerprint = model_sha256(model)
    if fingerprint != header.model_sha256:
        what = (
            "the fixed-seed online model differs on this machine"
            if header.mode == "online"
            else "this is not the model it was compressed with"
        )
        raise CheckpointError(
            f"{name}: {what} (sha256 {fingerprint[:16]}..., the file says {header.model_sha256[:16]}...)"
        )
    return model


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
    """The device a file decodes on: the kind it was coded on (``cpu`` or ``cuda``); the
    CPU for a portable file.

    Raises:
        ConfigError: a file coded on CUDA, on a machine without it; a bf16 file coded on
            a CPU of other features (:func:`check_cpu_features`).
    """
    check_cpu_features(header, name)
    if header.portable:
        return torch.device("cpu")
    if header.environment["device"] == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{name} was compressed on CUDA ({header.environment.get('gpu')}): decompress it on a "
            "machine with the same GPU type and library versions"
        )
    return torch.device(header.environment["device"])


def _walk(arithmetic: Arithmetic, model: SHARNN, lengths: list[int], coder: Coder, progress) -> np.ndarray:
    """:func:`~sharnn.coding.arithmetic.walk` with ``arithmetic``'s predictor (none for an
    empty file: no position to compute). Returns ``[max(lengths), B]`` uint8."""
    if not lengths:
        return np.zeros((0, 0), dtype=np.uint8)
    ensure_compiled()
    model.eval()
    return walk(arithmetic.predictor(model, len(lengths), max(lengths)), lengths, coder, progress)


def _to_grid(data: np.ndarray, lengths: list[int]) -> np.ndarray:
    """``[max(lengths), B]`` uint8 with the streams as columns, zero-padded."""
    grid = np.zeros((max(lengths, default=0), len(lengths)), dtype=np.uint8)
    start = 0
    for b, n in enumerate(lengths):
        grid[:n, b] = data[start : start + n]
        start += n
    return grid


def _check_streams(grid: np.ndarray, lengths: list[int], header: Header, name: str, device: torch.device) -> bytes:
    """The decoded streams joined, after checking their CRC32 (version 6: one of them all;
    before, one each; raises :class:`DataError`)."""
    pieces = [grid[:n, b].tobytes() for b, n in enumerate(lengths)]
    joined = b"".join(pieces)
    if header.crc32 is not None:
        if zlib.crc32(joined) != header.crc32:
            failure = f" decodes to bytes that fail its CRC32 check ({len(lengths)} streams)"
            raise _undecodable(header, name, device, failure)
        return joined
    bad = [b for b, piece in enumerate(pieces) if zlib.crc32(piece) != header.stream_crc32[b]]
    if bad:
        failure = f": stream {bad[0]} decodes to bytes that fail its CRC32 check ({len(bad)} of {len(lengths)} streams)"
        raise _undecodable(header, name, device, failure)
    return joined


def _undecodable(header: Header, name: str, device: torch.device, failure: str) -> DataError:
    """The one line that refuses a coded file whose payload is intact but does not decode
    here (``failure``, after the file's name): its probabilities differed from the
    encoder's. Where the environment the header records differs from this machine's (the
    thread count aside: decoding runs on the header's), the line says the file was made on
    another kind of machine and names what differs, whatever failed; where nothing recorded
    differs, it keeps ``failure`` (the coder's first line, or the streams that fail their
    CRC32) and says that CPUs of one capability can round differently. A portable file
    should decode everywhere: the line says so, and that it was altered or the machine errs."""
    if header.portable:
        return DataError(
            f"{name}{failure}, though it is portable (integer step version {header.integer_step}): it was altered "
            "before its checksums were written, or this machine's arithmetic is broken; nothing was written"
        )
    here, there = environment(device, header.precision), header.environment
    differs = [f"{k} {there[k]} (here {here.get(k)})" for k in there if k != "threads" and there[k] != here.get(k)]
    if differs:
        failure, made = " does not decode", f"it was made on another kind of machine ({', '.join(differs)})"
    else:
        recorded = ", ".join(f"{k} {there[k]}" for k in there if k != "threads")
        made = (
            f"it records this machine's {recorded}, but CPUs of one capability can round differently "
            "(an Intel and an AMD one), so it was likely made on another kind of machine"
        )
    return DataError(
        f"{name}{failure}: {made}; files coded in {header.precision} with float probabilities decode only on "
        "the same kind of CPU, torch version and thread count; nothing was written"
    )


def _check_byte_model(model: SHARNN) -> None:
    if model.config.vocab_size != 256:
        raise ConfigError(
            f"compression codes bytes: the model's vocabulary has {model.config.vocab_size} tokens, not 256"
        )
