"""``sharnn decompress``: :func:`decompress_file` decodes one ``.shz`` file and checks it
(and writes it, unless it only tests it: ``-t``); the output's name by default (the input's
without ``.shz``) is :func:`sharnn.commands.names.decompressed_name`.
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path

from ..coding.codec import coding_device, decoding_threads, decompress as decode
from ..coding.container import MAX_FILE_BYTES, parse
from ..errors import ConfigError
from ..files import output_destination, read_input, write_output
from ..loading import load_model, load_shipped
from ..models.shipped import SHIPPED
from .arguments import check_coding
from .compress import Coding, CodingProgress, input_stat, shown_name


def decompress_file(
    source: str | Path,
    dest: str | Path | None,
    model: str | Path | None = None,
    *,
    threads: int | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Coding:
    """Decompress ``source`` to ``dest`` (``-``: standard input or output), as ``sharnn
    decompress FILE -o DEST``: the streams' CRC32 is checked before anything is written;
    on any mismatch nothing is. A file ``dest`` gets the mode and modification time of a
    file ``source``. ``dest`` None: decode and check only, write nothing (``sharnn
    decompress -t``).

    Args:
        model: the run, checkpoint or shipped model ``source`` was compressed with (None:
            the shipped model whose fingerprint the file records; an online or stored file
            needs none).
        threads: torch's thread count (None: the file's; another only for a portable file).
        force, quiet: as :func:`~sharnn.commands.compress.compress_file`.

    Raises:
        DataError: a file that is not sharnn's, is corrupt, or decodes to other bytes; one
            of more than :data:`~sharnn.coding.container.MAX_FILE_BYTES` bytes; as
            :func:`~sharnn.commands.compress.compress_file` for ``source``.
        CheckpointError: a model-mode file given another model, or none where no shipped
            model is the one it records.
        ConfigError: ``source`` ``-`` while standard input is a terminal; as
            :func:`~sharnn.commands.compress.compress_file` for ``dest``; an online file
            given a model; a file coded on CUDA, on a machine without it; a bf16 file coded
            on a CPU of other features (before the model is loaded); ``threads`` refused by
            :func:`sharnn.coding.codec.decoding_threads`.
    """
    check_coding(source, dest, model, None, threads, True, force=force, quiet=quiet)
    if str(source) == "-" and sys.stdin is not None and sys.stdin.isatty():
        raise ConfigError("compressed data cannot be read from a terminal: give a FILE, or redirect standard input")
    with nullcontext() if dest is None else output_destination(source, dest, force, ConfigError):
        blob = read_input(source, MAX_FILE_BYTES, "the most sharnn decompresses")
        like = input_stat(source)
        compressed = parse(blob, str(source))
        header = compressed.header
        decoding_threads(header, threads, str(source))
        predictor = None  # a stored file is the input itself, an online file trains its own model
        if header.storage != "stored" and (model is not None or header.mode == "model"):
            device = coding_device(header, str(source))
            predictor = (
                load_model(model, device=device)[0]
                if model is not None
                else load_shipped(header.model_sha256, str(source), device)
            )
        started = time.perf_counter()
        label = f"{'test' if dest is None else 'decompress'} {shown_name(source)}"
        with CodingProgress(label, enabled=not quiet) as progress:
            data = decode(compressed, predictor, name=str(source), progress=progress, threads=threads)
            progress.finish()
        if dest is not None:
            write_output(dest, data, like)
        seconds = time.perf_counter() - started
    return Coding(len(blob), len(data), seconds, header, compressed=False, tested=dest is None)


def shipped_name(fingerprint: str) -> str | None:
    """The name of the shipped model whose SHA-256 is ``fingerprint``
    (:data:`~sharnn.models.shipped.SHIPPED`, no model loaded), or None when none is."""
    return next((name for name, sha256 in SHIPPED.items() if sha256 == fingerprint), None)
