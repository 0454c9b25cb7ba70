"""What each ``sharnn`` command does, callable from Python with the command's defaults:
the command line (:mod:`sharnn.cli`) parses its options, calls one of these and prints.

- :func:`load`: a checkpoint, run folder (its best checkpoint) or exported /
  ``save_pretrained`` folder, with its train config and tokenizer;
- :func:`evaluate_checkpoint` (``sharnn eval``), :func:`generate_text` (``sharnn
  generate``), :func:`analyze_tokenization` (``sharnn analyze tokenization``),
  :func:`compress_file` and :func:`decompress_file` (``sharnn compress`` /
  ``decompress``), :func:`train_run` (``sharnn train``) and :func:`info` (``sharnn info``);
  ``sharnn export`` is :func:`sharnn.export.export`.

Every function raises a :class:`sharnn.errors.SharnnError` subclass for what a user can
get wrong (a missing file, an incompatible checkpoint, bad settings), with the command
line's message; ``OSError`` when the file system refuses.
"""

from __future__ import annotations

import codecs
import dataclasses
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import torch

from .coding.codec import coding_device, compress as encode, decompress as decode
from .coding.container import Header, read_header
from .coding.online import online_config, online_model
from .config import TrainConfig, load_config, preset_names, to_yaml
from .data.corpus import Corpus, load_corpus, read_bytes
from .data.tokenizer import Tokenizer, check_corpus_tokenizer
from .errors import CheckpointError, ConfigError, DataError
from .evaluation import EvalResult, evaluate
from .files import check_new, output_lock, write_atomically
from .generation import filter_logits, generate as sample
from .models.build import LanguageModel, build_model
from .progress import ProgressDisplay
from .runtime import Runtime, resolve_device
from .training.checkpoint import is_pretrained, load_model, read_config, read_info, read_tokenizer, resolve


class Loaded(NamedTuple):
    """A loaded checkpoint: ``model`` (in eval mode, on the eager path), ``config`` (the
    run's TrainConfig; None for a plain ``save_pretrained`` folder, which records no
    training) and ``tokenizer`` (bytes unless the folder has a ``tokenizer.json``)."""

    model: LanguageModel
    config: TrainConfig | None
    tokenizer: Tokenizer


def load(path: str | Path, device: str | torch.device = "cpu") -> Loaded:
    """Load a checkpoint folder, a run folder (its ``best`` checkpoint, else ``latest``) or
    an exported or ``save_pretrained`` folder, with its tokenizer, onto ``device``.

    Raises:
        CheckpointError: no checkpoint there, or missing, corrupt or mismatched files.
        DataError: an invalid ``tokenizer.json``, or one that does not fit the model.
    """
    model, config = load_model(path, device=device)
    return Loaded(model, config, read_tokenizer(path, model.config.vocab_size))


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate_checkpoint` scored: ``result`` (bits per byte, nats per token,
    perplexities), ``data`` (the file, or ``DATA (SPLIT)``), the ``streams`` and the
    ``window`` length (tokens) it used, and the model's ``tokenizer``."""

    result: EvalResult
    data: str
    streams: int
    window: int
    tokenizer: Tokenizer

    def format(self) -> str:
        """The lines ``sharnn eval`` prints: what was predicted, then bits per byte, nats per
        byte or bits per token, perplexity, and word perplexity where words are counted."""
        result, tokenizer = self.result, self.tokenizer
        unit = "bytes" if tokenizer.is_bytes else f"tokens ({tokenizer.name}: {result.bytes:,} bytes)"
        lines = [
            f"{self.data}: {result.tokens:,} {unit} predicted, {self.streams} streams, windows of {self.window}",
            f"bits per byte: {result.bpc:.4f}",
        ]
        if tokenizer.is_bytes:
            lines += [f"nats per byte: {result.nats:.4f}", f"perplexity:    {result.perplexity:.4f}"]
        else:
            lines += [f"bits per token: {result.bits_per_token:.4f}", f"perplexity per token: {result.perplexity:.2f}"]
        if result.word_perplexity is not None:
            lines.append(f"word perplexity ({result.words:,} words + <eos>): {result.word_perplexity:.2f}")
        return "\n".join(lines)


def evaluate_checkpoint(
    path: str | Path,
    split: str = "test",
    file: str | Path | None = None,
    streams: int | None = None,
    bptt: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    quiet: bool = False,
) -> Evaluation:
    """Score a checkpoint (anything :func:`load` takes) with the paper's protocol
    (docs/evaluation.md), as ``sharnn eval`` does.

    Args:
        split: ``valid`` or ``test`` (the command's choices; ``train`` too) of the run's
            data, checked to be what the model's tokenizer made.
        file: score this file instead of a split (needed for a plain ``save_pretrained``
            folder, which records no data).
        streams: parallel streams (None: the run's ``valid_streams`` or ``test_streams``;
            ``test_streams`` for a file).
        bptt: window length in tokens (None: the run's ``bptt``).
        device, fast_path: see :meth:`sharnn.Runtime.resolve` (precision: the run's).
        quiet: show no progress on standard error.

    Raises:
        CheckpointError: as :func:`load`; a folder without training data and no ``file``.
        ConfigError: a window the attention span cannot take; bad device settings.
        DataError: a missing corpus or file, one too small for ``streams``, or a corpus
            made by another tokenizer than the model's.
    """
    model, config, tokenizer = load(path)
    count_words = False
    if config is None:  # a plain save_pretrained folder: no data recorded; the paper's protocol for a file
        if file is None:
            raise CheckpointError(f"{path} records no training data (no train_config.yaml): give --file FILE")
        config = TrainConfig(model=model.config)
    runtime = Runtime.resolve(device, config.precision, fast_path)
    window = _window(config, bptt)
    if file is not None:
        data, what, default_streams = tokenizer.ids(bytes(read_bytes(file))), str(file), config.test_streams
    else:
        corpus = _corpus(config, model, tokenizer)
        data, what, count_words = corpus.split(split), f"{config.data} ({split})", corpus.words is not None
        default_streams = config.valid_streams if split == "valid" else config.test_streams
    streams = streams or default_streams
    with ProgressDisplay("eval", enabled=not quiet) as progress:
        result = evaluate(
            runtime.prepare(model),
            data,
            streams,
            window,
            runtime.autocast_dtype,
            progress=progress,
            tokenizer=tokenizer,
            count_words=count_words,
        )
    return Evaluation(result, what, streams, window, tokenizer)


@dataclass(frozen=True)
class Generation:
    """Text being sampled by :func:`generate_text`: iterate over it for the bytes of each
    new token as it is drawn; ``prompt``: the bytes it continues."""

    prompt: bytes
    pieces: Iterator[bytes]

    def __iter__(self) -> Iterator[bytes]:
        return self.pieces

    def text(self) -> Iterator[str]:
        """The prompt, then the new text as it comes, decoded as UTF-8 across token
        boundaries (what ``sharnn generate`` prints; invalid UTF-8 shown as U+FFFD)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        yield decoder.decode(self.prompt)
        for piece in self.pieces:
            yield decoder.decode(piece)
        yield decoder.decode(b"", final=True)


def generate_text(
    path: str | Path,
    prompt: str | bytes | None = None,
    max_tokens: int = 512,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    prompt_file: str | Path | None = None,
) -> Generation:
    """Sample one stream from a checkpoint (anything :func:`load` takes), as ``sharnn
    generate`` does; the model is loaded and the settings checked before this returns,
    and each token is drawn as the result is iterated.

    Args:
        prompt: text (UTF-8) or bytes to continue; empty or None: a newline, as is a
            prompt of whitespace alone for a words model.
        max_tokens: tokens to sample: bytes for a byte model.
        temperature, top_k, top_p: see :func:`sharnn.generation.filter_logits` (0: greedy).
        seed: seed of the sampling (None: nondeterministic).
        device, fast_path: see :meth:`sharnn.Runtime.resolve` (precision: the run's).
        prompt_file: read the prompt's bytes from this file instead.

    Raises:
        ConfigError: both ``prompt`` and ``prompt_file``; bad sampling or device settings.
        DataError: an unreadable ``prompt_file``; CheckpointError, DataError: as :func:`load`.
    """
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    filter_logits(torch.zeros(2), temperature, top_k, top_p)  # refuses bad settings with one line
    if prompt_file is not None:
        prompt = bytes(read_bytes(prompt_file))
    prompt = (prompt.encode("utf-8") if isinstance(prompt, str) else prompt) or b"\n"  # empty: after a newline
    model, config, tokenizer = load(path)
    prompts = tokenizer.encode(prompt)
    if not len(prompts):  # whitespace alone is no word: start after a line, as an empty prompt does
        prompts = tokenizer.encode(b"\n")
    runtime = Runtime.resolve(device, config.precision if config else "auto", fast_path)
    steps = sample(
        runtime.prepare(model),
        prompts.view(-1, 1),
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        autocast_dtype=runtime.autocast_dtype,
    )
    return Generation(prompt, (tokenizer.decode_bytes([int(tokens[0])]) for tokens in steps))


def analyze_tokenization(
    path: str | Path,
    split: str = "test",
    streams: int | None = None,
    bptt: int | None = None,
    max_tokens: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    out: str | Path | None = None,
    quiet: bool = False,
) -> tuple[dict, Path]:
    """Where a model's bits fall within words (paper §6.1; docs/tokenization.md), as
    ``sharnn analyze tokenization`` computes it, on a split of the run's data.

    Args:
        path: a run folder (its best checkpoint), a checkpoint or an exported folder.
        split, streams, bptt, device, fast_path, quiet: as :func:`evaluate_checkpoint`.
        max_tokens: score only the first N tokens of the split (None: all).
        out: the folder for the report's files (None: ``RUN/analysis``, for a run folder only).

    Returns:
        ``(report, folder)``: the report of :func:`sharnn.analysis.analyze` (with
        ``checkpoint``, ``data`` and ``split``), and the folder in which
        :func:`sharnn.analysis_report.write_report` is to write it (nothing is written here).

    Raises:
        CheckpointError: as :func:`load`; a folder that records no training data.
        ConfigError: no ``out`` for what is not a run folder; a window the attention span
            cannot take. DataError: a tokenizer with no analysis; as :func:`evaluate_checkpoint`.
    """
    from .analysis import analyze, kind

    path = Path(path)
    model, config, tokenizer = load(path)
    if config is None:
        raise CheckpointError(f"{path} records no training data (no train_config.yaml): nothing to analyze")
    kind(tokenizer)  # refuses a tokenizer with no analysis
    if out is None and resolve(path) == path.resolve():  # not a run folder: keep the checkpoint as it is
        raise ConfigError(f"{path} is not a run folder: give --out DIR (the default, RUN/analysis, is in a run)")
    corpus = _corpus(config, model, tokenizer)
    runtime = Runtime.resolve(device, config.precision, fast_path)
    window = _window(config, bptt)
    streams = streams or (config.valid_streams if split == "valid" else config.test_streams)
    data = corpus.split(split)[:max_tokens]
    with ProgressDisplay("analyze", enabled=not quiet) as progress:
        report = analyze(
            runtime.prepare(model),
            tokenizer,
            data,
            streams,
            window,
            corpus.train,
            runtime.autocast_dtype,
            progress=progress,
        )
    report.update(checkpoint=str(resolve(path)), data=config.data, split=split)
    return report, Path(out) if out is not None else path / "analysis"


def _corpus(config: TrainConfig, model: LanguageModel, tokenizer: Tokenizer) -> Corpus:
    """The run's corpus, refused when another tokenizer than the model's made it."""
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    check_corpus_tokenizer(model.config.vocab_size, corpus.tokenizer, config.data, tokenizer)
    return corpus


def _window(config: TrainConfig, bptt: int | None) -> int:
    """The evaluation window: ``bptt`` or the run's, refused in one line when the model's
    attention span cannot take it."""
    window = bptt or config.bptt
    try:
        config.model.check_window(window)
    except ConfigError as e:
        raise ConfigError(f"--bptt: {e}") from None
    return window


@dataclass(frozen=True)
class Coding:
    """What :func:`compress_file` or :func:`decompress_file` did: ``read`` and ``written``
    (bytes), ``seconds`` from the coding's start to the output's end, the compressed
    file's ``header``, and whether it ``compressed`` (else it decompressed)."""

    read: int
    written: int
    seconds: float
    header: Header
    compressed: bool

    def format(self, name: str | Path) -> str:
        """The line ``sharnn compress`` or ``decompress`` prints for the input ``name``: sizes,
        bits per byte or the streams checked, and speed in bytes of the original per second."""
        header, stored = self.header, self.header.storage == "stored"
        original = self.read if self.compressed else self.written
        speed = f"{original / self.seconds:,.0f} bytes/s ({self.seconds:.1f} s)"
        if self.compressed:
            how = f"stored raw: coding gave {header.coded_bytes:,} bytes" if stored else f"{header.streams} streams"
            return (
                f"compressed {name}: {self.read:,} -> {self.written:,} bytes, "
                f"{8 * self.written / max(self.read, 1):.4f} bits per byte, {how}, {speed}"
            )
        checked = "stored raw, its CRC32 checked" if stored else f"CRC32 of {header.streams} streams checked"
        return f"decompressed {name}: {self.read:,} -> {self.written:,} bytes, {checked}, {speed}"


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
    precision: str = "fp32",
    force: bool = False,
    quiet: bool = False,
) -> Coding:
    """Compress the file ``source`` to ``dest`` (``-``: standard input or output), exactly
    invertible by :func:`decompress_file` (docs/compression.md), as ``sharnn compress``.

    Args:
        model: the run (its best checkpoint) or checkpoint that predicts the bytes; or
        online: a fixed-seed model learns from the bytes already coded, with ``settings``
            (``key=value`` overrides of :func:`sharnn.coding.online.online_config`).
        streams: contiguous pieces coded side by side (None: by the input's size,
            :func:`sharnn.coding.codec.default_streams`).
        threads: torch's thread count while coding (recorded; decompression uses it too).
        device: ``cpu`` or ``cuda[:N]``: a file coded on CUDA decodes only on the same GPU
            type with the same library versions.
        precision: ``fp32``, or ``bf16``: the products in bfloat16, on a CPU with bf16
            instructions; the file then decodes only on a CPU with the same features
            (:func:`sharnn.coding.environment.cpu_features`).
        force: replace ``dest`` if it is a file or a symbolic link (the link, never its target).
        quiet: show no progress on standard error.

    ``dest`` is held for this call alone (:func:`sharnn.files.output_lock`) and written
    atomically: never half-written.

    Raises:
        ConfigError: neither or both of ``model`` and ``online``; ``settings`` without
            ``online``; a precision :func:`sharnn.coding.codec.compress` refuses; a ``dest``
            that exists (without ``force``), is the input or a folder, or whose folder
            does not exist. DataError: an unreadable ``source``.
        CheckpointError: as :func:`load`.
    """
    if online == (model is not None):
        raise ConfigError("give --model RUN_OR_CHECKPOINT or --online")
    if settings and not online:
        raise ConfigError(f"key=value settings ({settings[0]}) are for --online only")
    source, dest = Path(source), Path(dest)
    with _destination(source, dest, force):
        data = _read_input(source)
        target = resolve_device(device)
        if online:
            config = online_config(settings)
            predictor = online_model(config).to(target)
        else:
            predictor, config = load_model(model, device=target)[0], None
        started = time.perf_counter()
        with ProgressDisplay("compress", enabled=not quiet) as progress:
            blob = encode(
                data, predictor, streams=streams, threads=threads, online=config, progress=progress, precision=precision
            )
        _write_output(dest, blob)
        seconds = time.perf_counter() - started
    return Coding(len(data), len(blob), seconds, read_header(blob, str(dest))[0], compressed=True)


def decompress_file(
    source: str | Path, dest: str | Path, model: str | Path | None = None, *, force: bool = False, quiet: bool = False
) -> Coding:
    """Decompress ``source`` to ``dest`` (``-``: standard input or output), as ``sharnn
    decompress``: every stream's CRC32 is checked before anything is written; on any
    mismatch nothing is.

    Args:
        model: the run or checkpoint ``source`` was compressed with (None for an online
            or stored file).
        force, quiet: as :func:`compress_file`.

    Raises:
        DataError: a file that is not sharnn's, is corrupt, or decodes to other bytes.
        CheckpointError: a model-mode file without its model or with another one.
        ConfigError: as :func:`compress_file` for ``dest``; an online file given a model; a
            file coded on CUDA, on a machine without it; a bf16 file coded on a CPU of
            other features (before the model is loaded).
    """
    source, dest = Path(source), Path(dest)
    with _destination(source, dest, force):
        blob = _read_input(source)
        header, _ = read_header(blob, str(source))
        stored = header.storage == "stored"  # the input itself: no model needed
        predictor = None if model is None or stored else load_model(model, device=coding_device(header, str(source)))[0]
        started = time.perf_counter()
        with ProgressDisplay("decompress", enabled=not quiet) as progress:
            data = decode(blob, predictor, name=str(source), progress=progress)
        _write_output(dest, data)
        seconds = time.perf_counter() - started
    return Coding(len(blob), len(data), seconds, header, compressed=False)


@contextmanager
def _destination(source: Path, dest: Path, force: bool) -> Iterator[None]:
    """Hold ``dest`` for the block alone (:func:`sharnn.files.output_lock`), having refused,
    before any work, a destination that would overwrite the source, an existing file or a
    symbolic link (dangling or looping too; without ``force``: with it the link is
    replaced by the file, its target left as it is), a folder, or one whose folder does
    not exist."""
    if str(dest) == "-":
        yield
        return
    with output_lock(dest):
        if str(source) != "-" and dest.exists() and dest.resolve() == source.resolve():
            raise ConfigError(f"{dest} is the input file")
        if not force or dest.is_symlink():
            check_new(dest, force, ConfigError, f"{dest} exists; give --force to replace it")
        elif dest.is_dir():
            raise ConfigError(f"{dest} is a folder")
        if not dest.absolute().parent.is_dir():
            raise ConfigError(f"no folder {dest.absolute().parent}")
        yield


def _read_input(source: Path) -> bytes:
    if str(source) == "-":
        return sys.stdin.buffer.read()
    try:
        return source.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {source}: {e.strerror or e}") from None


def _write_output(dest: Path, data: bytes) -> None:
    """Write ``data`` to standard output (``-``), or to a temporary file of a unique name
    beside ``dest`` that is renamed over it once complete: never a half-written ``dest``;
    a symbolic link there is replaced, never written through."""
    if str(dest) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        write_atomically(dest, data)


def train_run(
    preset: str | None = None,
    config_file: str | Path | None = None,
    out: str | Path | None = None,
    resume: str | Path | None = None,
    init_from: str | Path | None = None,
    overrides: Sequence[str] = (),
    quiet: bool = False,
) -> dict:
    """Train from a preset or config file with ``key=value`` overrides, or go on with the
    run in ``resume``, as ``sharnn train`` does (:func:`sharnn.training.trainer.train` does the work).

    Args:
        out: the run folder to create (None: ``runs/NAME-TIMESTAMP``).
        init_from: start from the weights of this run (its best checkpoint) or checkpoint:
            the model is its, the data and recipe the preset's or config's.
        overrides: with ``resume``, may change only its length, learning rate and cadence.
        quiet: no progress bar or progress lines.

    Returns:
        the run's summary (``summary.json``): valid and test BPC, steps, seconds, ``run_dir``.

    Raises:
        ConfigError: neither or both of ``preset`` and ``config_file``; ``resume`` with
            another source; bad settings. Interrupted: stopped by Ctrl-C or SIGTERM after
            saving. RunError, DataError, CheckpointError, TrainingDiverged: see
            :func:`sharnn.training.trainer.train`.
    """
    from .training.distributed import Distributed
    from .training.run_start import resume_config
    from .training.trainer import train

    if resume is not None:
        if preset or config_file or out or init_from:
            raise ConfigError(
                "--resume continues a run with its own config: give no --preset, --config, --out or "
                "--init-from (key=value overrides may change its length, learning rate and cadence)"
            )
        return train(resume_config(resume, overrides), resume, resume=True, quiet=quiet)
    if preset and config_file:
        raise ConfigError("give --preset or --config, not both")
    source = preset or (str(config_file) if config_file else None)
    if source is None:
        raise ConfigError("give --preset NAME or --config FILE (presets: see `sharnn info`), or --resume RUN")
    if init_from is not None:  # the model is the checkpoint's; overrides may still change its dropouts
        config = load_config(source, overrides, model=read_config(init_from).model)
        config = dataclasses.replace(config, init_from=str(init_from))
    else:
        config = load_config(source, overrides)
    if out is None:  # under torchrun, the main process's time names the folder of every process
        stamp = Distributed.from_environment(resolve_device(config.device).type).share(
            f"{datetime.now():%Y%m%d-%H%M%S}"
        )
        out = Path("runs") / f"{Path(source).stem}-{stamp}"
    return train(config, out, quiet=quiet)


def format_summary(summary: dict) -> str:
    """The line ``sharnn train`` prints for the summary :func:`train_run` returns."""
    on = {
        split: f" on the first {summary[f'{split}_prefix_bytes']:,} bytes"
        if summary.get(f"{split}_prefix_bytes")
        else ""
        for split in ("valid", "test")
    }
    return (
        f"done: valid {summary['valid_bpc']:.4f} BPC "
        f"(best, step {summary['best_step']}{',' * bool(on['valid'])}{on['valid']}), "
        f"test {summary['test_bpc']:.4f} BPC{on['test']}"
        + (f" (word perplexity {summary['test_word_perplexity']:.1f})" if summary.get("test_word_perplexity") else "")
        + f", {summary['steps']} steps in {summary['train_seconds']:.0f} s; "
        f"run folder {summary['run_dir']}"
    )


def info(target: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """What ``sharnn info`` prints: the configuration and parameter counts of a preset, a
    config file (with ``key=value`` ``overrides``: a variant's, e.g. ``model.cell=ln_lstm``),
    a run, a checkpoint or an exported or ``save_pretrained`` folder, and for these folders
    their step, epoch and scores (None: the list of presets).

    Raises:
        ConfigError: an unknown preset or an invalid config file or override; overrides
            given with a folder (they describe a new run). CheckpointError: an invalid
            checkpoint or exported folder.
    """
    from .export import describe

    if target is None:
        return "presets: " + ", ".join(preset_names())
    path, scores = Path(target), None
    if overrides and path.is_dir():
        raise ConfigError(f"{target} is a folder: key=value settings go with a preset or a config file")
    if is_pretrained(path):
        text, model_config, scores = describe(path)
    else:
        config = load_config(str(target), overrides)  # a preset, a YAML file, or a run/checkpoint folder's config.yaml
        text, model_config = to_yaml(config), config.model
        if path.is_dir():
            scores = _checkpoint_scores(path)
    with torch.device("meta"):
        model = build_model(model_config)
    lines = [text.rstrip(), ""]
    lines += [f"  {part:<24} {count:>14,}" for part, count in model.parameter_counts().items() if count]
    total, collapsed = model.num_parameters(), model.num_parameters(collapsed=True)
    lines.append(
        f"parameters: {total:,} trainable ({total / 1e6:.2f}M), {collapsed:,} collapsed ({collapsed / 1e6:.2f}M)"
    )
    return "\n".join(lines + [scores] * bool(scores))


def _checkpoint_scores(path: Path) -> str:
    """``checkpoint FOLDER: step N, epoch E, valid X BPC, test Y BPC`` for the checkpoint
    at ``path`` (a run's best): what its run recorded in it, and the test BPC from the
    run's summary.json when it is the checkpoint that was tested."""
    from .training.run_folder import read_summary

    try:
        folder = resolve(path)
    except CheckpointError:
        return "no checkpoint yet"
    record = read_info(folder)
    if "step" not in record:
        return f"checkpoint {folder}: no training record"
    parts = [f"step {record['step']}", f"epoch {float(record['epochs']):.2f}"]
    if "valid_bpc" in record:
        parts.append(f"valid {float(record['valid_bpc']):.4f} BPC")
    elif float(record["best_valid_bpc"]) < float("inf"):
        parts.append(f"best valid so far {float(record['best_valid_bpc']):.4f} BPC (step {record['best_step']})")
    summary = read_summary(folder.parent.parent) or {}  # the run holding checkpoints/step-N
    if summary.get("best_step") == int(record["step"]):
        parts.append(f"test {summary['test_bpc']:.4f} BPC")
    return f"checkpoint {folder}: " + ", ".join(parts)
