"""``sharnn compress``: :func:`compress_file` codes one file with a model (or online), and
:class:`Coding` is what it did, with the line the command prints (the output's name by
default, ``FILE.shz``, is :func:`sharnn.commands.names.compressed_name`).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..coding.codec import compress as encode
from ..coding.container import MAX_LENGTH, Header, read_header
from ..coding.online import online_config, online_model
from ..config import TrainConfig
from ..errors import ConfigError
from ..files import Lock, output_destination, read_input, write_output
from ..loading import load_model, resolve
from ..models.build import LanguageModel
from ..models.shipped import DEFAULT_MODEL, shipped_folder
from ..progress import ProgressDisplay
from ..runtime import resolve_device
from .arguments import check_coding, check_count


def _streams(count: int) -> str:
    """``"1 stream"``, ``"3 streams"``."""
    return f"{count} stream{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class Coding:
    """What :func:`compress_file` or :func:`~sharnn.commands.decompress.decompress_file` did:
    ``read`` and ``written`` (bytes; nothing is written when decompression only tests the
    file, ``written`` is then what it decoded), ``seconds`` from the coding's start to the
    output's end, the compressed file's ``header``, and whether it ``compressed`` (else it
    decompressed) or only ``tested``."""

    read: int
    written: int
    seconds: float
    header: Header
    compressed: bool
    tested: bool = False

    def format(self, name: str | Path) -> str:
        """The line ``sharnn compress`` or ``decompress`` prints for the input ``name``: sizes,
        bits per byte (none for an empty input) or the streams checked, and speed in bytes
        of the original per second."""
        header, stored = self.header, self.header.storage == "stored"
        original = self.read if self.compressed else self.written
        speed = f"{original / self.seconds:,.0f} bytes/s ({self.seconds:.1f} s)"
        streams = _streams(header.streams)
        if self.compressed:
            how = f"stored raw: coding gave {header.coded_bytes:,} bytes" if stored else streams
            if not self.read:
                return f"compressed {name}: 0 -> {self.written:,} bytes (an empty input: no bits per byte), {speed}"
            return (
                f"compressed {name}: {self.read:,} -> {self.written:,} bytes, "
                f"{8 * self.written / self.read:.4f} bits per byte, {how}, {speed}"
            )
        checked = "stored raw, its CRC32 checked" if stored else f"CRC32 of {streams} checked"
        if self.tested:
            return f"tested {name}: {self.read:,} bytes decode to {self.written:,}, {checked}, {speed}"
        return f"decompressed {name}: {self.read:,} -> {self.written:,} bytes, {checked}, {speed}"


class CodingProgress(ProgressDisplay):
    """The progress of coding: no bits per byte until the first positions are coded (the
    codec's first figure, at position 0, is a few bytes' bits over one byte), and a last
    frame at 100% (:meth:`~sharnn.progress.ProgressDisplay.finish`)."""

    def update(self, fraction: float | None = None, **fields) -> None:
        if not self.fraction:
            fields.pop("bpc", None)
        super().update(fraction, **fields)


def compress_file(
    source: str | Path,
    dest: str | Path,
    model: str | Path | None = None,
    *,
    online: bool = False,
    settings: Sequence[str] = (),
    streams: int | None = None,
    threads: int = 1,
    device: str = "cpu",
    precision: str | None = None,
    force: bool = False,
    quiet: bool = False,
    adapt: bool | None = None,
    mixing: int | None = None,
) -> Coding:
    """Compress the file ``source`` to ``dest`` (``-``: standard input or output), exactly
    invertible by :func:`~sharnn.commands.decompress.decompress_file` (docs/compression.md),
    as ``sharnn compress FILE -o DEST``. A file ``dest`` gets the mode (permission bits) and
    the modification time of a file ``source``.

    Args:
        model: the run (its best checkpoint), checkpoint or shipped model that predicts
            the bytes (None: :data:`~sharnn.models.shipped.DEFAULT_MODEL`); or
        online: a fixed-seed model learns from the bytes already coded, with ``settings``
            (``key=value`` overrides of :func:`sharnn.coding.online.online_config`).
        streams: contiguous pieces coded side by side (None: by the input's size,
            :func:`sharnn.coding.codec.default_streams`): more are faster, each a cold start.
        threads: torch's thread count while coding (recorded; decompression uses it too).
        device: ``cpu`` or ``cuda[:N]`` (a CUDA file decodes on the same GPU type and libraries only).
        precision: ``integer`` (the default with a model: a file that decodes anywhere),
            ``fp32`` (the default online) or ``bf16``, as :func:`sharnn.coding.codec.compress`.
        adapt, mixing: mix the model with context models that learn the file (None: with
            integer, the only precision that can: :func:`precision_note`), by mixing ``mixing`` (None: the latest).
        force, quiet: replace ``dest`` if a file or symbolic link (the link); no progress shown.

    ``dest`` is checked before any work, held for this call alone and written atomically
    (:func:`sharnn.files.output_destination`); ``source`` holds at most
    :data:`~sharnn.coding.container.MAX_LENGTH` bytes (2 GiB).

    Raises:
        ConfigError: arguments of the wrong type; both ``model`` and ``online``; ``settings`` without ``online``; a
            precision :func:`sharnn.coding.codec.compress` refuses; ``dest`` ``-`` while
            standard output is a terminal; a ``dest`` :func:`sharnn.files.output_destination`
            refuses (the input, a file without ``force``, a folder, a device or FIFO).
        DataError: an unreadable or too large ``source``. CheckpointError: as :func:`sharnn.load`.
    """
    options = {"streams": streams, "threads": threads, "precision": precision, "adapt": adapt, "mixing": mixing}
    _check_request(source, dest, model, settings, options, online=online, force=force, quiet=quiet)
    with output_destination(source, dest, force, ConfigError):
        data = read_input(source, MAX_LENGTH, "the most sharnn compresses")
        like = input_stat(source)
        predictor, config = _predictor(model, online, settings, device)
        started = time.perf_counter()
        with CodingProgress(f"compress {shown_name(source)}", enabled=not quiet) as progress:
            blob = encode(data, predictor, online=config, progress=progress, **options)
            progress.finish(**({"bpc": f"{8 * len(blob) / len(data):.4f}"} if data else {}))
        write_output(dest, blob, like)
        seconds = time.perf_counter() - started
    return Coding(len(data), len(blob), seconds, read_header(blob, str(dest))[0], compressed=True)


def _check_request(source, dest, model, settings: Sequence[str], options: dict, online, **flags) -> None:
    """Refuse, before any work, what :func:`compress_file` cannot do (a :class:`ConfigError`):
    arguments of the wrong type (:func:`~sharnn.commands.arguments.check_coding`), then the
    combinations it refuses."""
    streams, threads = options["streams"], options["threads"]
    check_coding(source, dest, model, streams, threads, False, settings, online=online, adapt=options["adapt"], **flags)
    check_count("mixing", options["mixing"], 1, optional=True)
    if online and model is not None:
        raise ConfigError("give --model or --online, not both")
    if settings and not online:
        raise ConfigError(f"key=value settings ({settings[0]}) are for --online only")
    if str(dest) == "-" and sys.stdout is not None and sys.stdout.isatty():
        raise ConfigError("compressed data cannot be written to a terminal: give -o FILE, or redirect standard output")


def _predictor(
    model: str | Path | None, online: bool, settings: Sequence[str], device: str
) -> tuple[LanguageModel, TrainConfig | None]:
    """What predicts the bytes :func:`compress_file` codes, on ``device``: online, the
    fixed-seed model of ``settings`` with its config; else the checkpoint ``model``'s, with None."""
    target = resolve_device(device)
    if online:
        config = online_config(settings)
        return online_model(config).to(target), config
    if model is not None:
        check_model_stays(model)
    return load_model(DEFAULT_MODEL if model is None else model, device=target)[0], None


def check_model_stays(model: str | Path) -> None:
    """Refuse to code with a checkpoint of a run that is training (its ``.lock`` held):
    the run replaces its ``best`` and ``latest`` as it goes and deletes the checkpoints
    it no longer keeps, so the file could not be decoded once the one it was coded with is
    gone. A shipped model, an exported folder and a run that is not training pass.

    Raises:
        ConfigError: the run is training (naming the process).
        CheckpointError: no checkpoint at ``model`` (:func:`sharnn.loading.resolve`).
    """
    if shipped_folder(str(model)) is not None:
        return
    checkpoint = resolve(model)
    run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    lock = ".lock"  # sharnn.training.run_folder.LOCK_FILE, named here: coding imports nothing of training
    holder = None if run is None else Lock(run / lock, str(run)).holder_elsewhere()
    if holder is not None:
        raise ConfigError(
            f"--model {model}: the run {run} is training ({holder}) and replaces or deletes this checkpoint as it "
            f"goes, which would leave the file undecodable; wait for the run to end, or give a copy "
            f"(sharnn export {model} --out DIR)"
        )


def shown_name(source: str | Path) -> str:
    """How a file is named in progress and messages: its name, ``standard input`` for ``-``."""
    return "standard input" if str(source) == "-" else str(source)


def input_stat(source: str | Path) -> os.stat_result | None:
    """The ``os.stat`` of an input file whose mode and modification time its output takes:
    None for standard input, or for anything but a regular file (a FIFO, a device)."""
    if str(source) == "-":
        return None
    try:
        info = os.stat(source)
    except OSError:  # gone since it was read: the output keeps the usual mode
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def precision_note(precision: str | None, online: bool, adapt: bool | None) -> str | None:
    """The note ``sharnn compress`` prints when a precision it was given leaves out the
    adaptive mixing, which only the integer step can feed (it mixes the integer logits, in
    integer arithmetic, so that files stay portable); None when nothing goes without saying."""
    if online or adapt is not None or precision not in ("fp32", "bf16"):
        return None
    return (
        f"note: --precision {precision} codes with the model alone: the adaptive mixing needs the integer "
        "step's integer logits (--precision integer, the default); without it files come out larger (31% on "
        "10 KB of English with the shipped model)"
    )
