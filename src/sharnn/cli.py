"""The ``sharnn`` command line: prepare, train, eval, generate, compress, decompress, export, analyze, info.

User errors (bad config, missing file, wrong checksum, incompatible checkpoint, ...)
print one ``error:`` line and exit with status 1; usage errors (an unknown option, an
option value out of its range) print one ``error:`` line and exit with status 2; Ctrl-C
prints ``interrupted`` and exits with status 130, SIGTERM ``terminated`` and 143 (``train``
saves first and prints its resume command, with the same statuses).

torch and the modules that need it are imported inside the commands that use them, so
that ``--help``, ``--version`` and usage errors answer at once.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click

from .errors import Interrupted, SharnnError
from .files import Terminated


class _Command(click.Command):
    """A command: it loads torch first (see :func:`_import_torch`)."""

    def invoke(self, ctx):
        _import_torch()
        return super().invoke(ctx)


class _Group(click.Group):
    """Turns the errors a user can cause into one line and an exit status."""

    command_class = _Command
    group_class = type  # its groups are _Groups too

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:  # the group's own options, e.g. `sharnn --bogus`
            _usage_error(e)
        except KeyboardInterrupt:  # click's own handler would print "Aborted!" and exit 1
            _interrupted()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Interrupted as e:
            _echo_once(str(e))
            sys.exit(e.exit_code)
        except SharnnError as e:
            _echo_once(f"error: {e}")
            sys.exit(1)
        except click.UsageError as e:
            _usage_error(e)
        except OSError as e:  # the file system refused: a full disk, a quota, permissions
            where = f" ({e.filename})" if e.filename else ""
            click.echo(f"error: {e.strerror or e}{where}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            _interrupted()
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(143)


def _interrupted():
    click.echo("interrupted", err=True)
    sys.exit(130)


def _import_torch() -> None:
    """Import torch, which every command uses, with Ctrl-C and SIGTERM ending the process
    at once (one line, status 130 or 143): torch's import catches some exceptions and goes
    on half done, so an exception raised inside it can turn into another error (and a
    traceback) further on."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        import torch  # noqa: F401
        return
    previous = {sig: signal.signal(sig, _exit_at_once) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        import torch  # noqa: F401, F811
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_at_once(signum, frame):
    os.write(2, b"interrupted\n" if signum == signal.SIGINT else b"terminated\n")
    os._exit(128 + signum)


def _echo_once(message: str) -> None:
    """Print ``message`` on standard error; under torchrun, from the first process of each
    machine only (every process meets the same error)."""
    from .distributed import first_on_its_machine

    if first_on_its_machine():
        click.echo(message, err=True)


def _usage_error(e: click.UsageError):
    hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
    click.echo(f"error: {e.format_message()}{hint}", err=True)
    sys.exit(2)


# The options several commands share.
_force_out = click.option("--force", "-f", is_flag=True, help="Replace --out if it is a symbolic link (the link, "
                                                              "never its target); an existing folder is never replaced.")
_force_dest = click.option("--force", "-f", is_flag=True,
                           help="Replace DEST if it is a file or a symbolic link (the link, never its target).")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sharnn")
@click.pass_context
def main(ctx):
    """SHA-RNN toolkit: the Single Headed Attention RNN (Merity 2019) for byte-level
    language modelling. Run `sharnn COMMAND --help` for each command."""
    from .files import sigterm_raises

    # Clean-ups run, as for Ctrl-C; exit status 143. Training replaces it while it trains
    # (it stops at the end of a step and saves: sharnn.train), not while it sets up.
    ctx.with_resource(sigterm_raises())


@main.group()
def prepare():
    """Prepare a dataset as memory-mappable train/valid/test byte files."""


@prepare.command("enwik8")
@click.option("--source", default=None, help="enwik8.zip or the raw enwik8 file: a path or an http(s) URL [default: the canonical URL].")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create.")
@_force_out
def prepare_enwik8_command(source, out, force):
    """Check enwik8 (size, MD5) and split it 90M / 5M / 5M."""
    from .prepare import ENWIK8_URL, prepare_enwik8

    folder = prepare_enwik8(source or ENWIK8_URL, out, force=force)
    click.echo(f"prepared enwik8 in {folder}")


@prepare.command("wikitext-2")
@click.option("--source", default=None, type=click.Path(path_type=Path),
              help="wikitext-2-v1.zip, or a folder with wiki.{train,valid,test}.tokens or {train,valid,test}.txt "
                   "(.gz or not) [default: the copy bundled with sharnn].")
@click.option("--tokenizer", default="words", show_default=True, help="bytes, words or bpe:N (e.g. bpe:8000).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create.")
@_force_out
def prepare_wikitext2_command(source, tokenizer, out, force):
    """Check WikiText-2 (v1, tokenized) against its published counts and checksums and
    tokenize it (docs/tokenization.md)."""
    from .data import SPLITS, load_corpus
    from .prepare import prepare_wikitext2

    corpus = load_corpus(str(prepare_wikitext2(source, out, tokenizer, force=force)))
    lengths = corpus.tokenizer.byte_lengths()
    for name in SPLITS:
        ids = corpus.split(name)
        click.echo(f"{name}: {len(ids):,} tokens, {int(lengths[ids].sum()):,} bytes, {corpus.words[name]:,} words + <eos>")
    click.echo(f"prepared WikiText-2 with {corpus.tokenizer.name} ({corpus.tokenizer.vocab_size:,} token ids) in {out}")


@prepare.command("corpus")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create.")
@click.option("--valid-fraction", default=0.05, show_default=True, type=click.FloatRange(0, 0.5, min_open=True, max_open=True))
@click.option("--test-fraction", default=0.05, show_default=True, type=click.FloatRange(0, 0.5, min_open=True, max_open=True))
@click.option("--tokenizer", default="bytes", show_default=True, help="bytes or bpe:N (trained on the train split).")
@_force_out
def prepare_corpus_command(source, out, valid_fraction, test_fraction, tokenizer, force):
    """Any file or folder of files (concatenated), split by position."""
    from .prepare import prepare_corpus, prepared_report

    folder = prepare_corpus(source, out, valid_fraction, test_fraction, tokenizer, force=force)
    for line in prepared_report(folder):
        click.echo(line)


@main.command()
@click.option("--preset", default=None, help="A bundled preset (see `sharnn info`).")
@click.option("--config", "config_file", default=None, type=click.Path(path_type=Path), help="A YAML config file.")
@click.option("--out", default=None, type=click.Path(path_type=Path), help="Run folder to create [default: runs/NAME-TIMESTAMP].")
@click.option("--resume", default=None, type=click.Path(path_type=Path),
              help="Continue the run in this folder from its latest checkpoint; overrides may change its length, "
                   "learning rate and cadence.")
@click.option("--init-from", default=None, type=click.Path(path_type=Path),
              help="Start from the weights of this run (its best checkpoint) or checkpoint: the model is its, the "
                   "data and recipe come from the preset or config; a new optimizer and schedule.")
@click.option("--quiet", is_flag=True, help="No progress bar or progress lines.")
@click.argument("overrides", nargs=-1)
def train(preset, config_file, out, resume, init_from, quiet, overrides):
    """Train from a preset or config file, with key=value overrides
    (e.g. `sharnn train --preset tiny epochs=2 model.d_model=128`), or go on with a run
    (`sharnn train --resume RUN max_steps=5000 lr=1e-3`).

    SIGTERM, as Ctrl-C, stops at the end of the step and saves `latest` (exit status 143,
    130 for Ctrl-C): with SLURM, `#SBATCH --signal=TERM@120` leaves two minutes for it.

    Under `torchrun --nproc_per_node=N -m sharnn train ...` it trains with N processes
    (DistributedDataParallel; docs/training.md, "Several GPUs or processes")."""
    from .checkpoint import read_config
    from .config import load_config
    from .distributed import Distributed, is_main_process
    from .errors import ConfigError
    from .runtime import resolve_device
    from .train import resume_config
    from .train import train as run_training

    if resume is not None:
        if preset or config_file or out or init_from:
            raise ConfigError("--resume continues a run with its own config: give no --preset, --config, --out or "
                              "--init-from (key=value overrides may change its length, learning rate and cadence)")
        summary = run_training(resume_config(resume, overrides), resume, resume=True, quiet=quiet)
    else:
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
            stamp = Distributed.from_environment(resolve_device(config.device).type).share(f"{datetime.now():%Y%m%d-%H%M%S}")
            out = Path("runs") / f"{Path(source).stem}-{stamp}"
        summary = run_training(config, out, quiet=quiet)
    if not is_main_process():
        return
    on = {split: f" on the first {summary[f'{split}_prefix_bytes']:,} bytes" if summary.get(f"{split}_prefix_bytes") else ""
          for split in ("valid", "test")}
    click.echo(
        f"done: valid {summary['valid_bpc']:.4f} BPC (best, step {summary['best_step']}{',' * bool(on['valid'])}{on['valid']}), "
        f"test {summary['test_bpc']:.4f} BPC{on['test']}"
        + (f" (word perplexity {summary['test_word_perplexity']:.1f})" if summary.get("test_word_perplexity") else "")
        + f", {summary['steps']} steps in {summary['train_seconds']:.0f} s; "
        f"run folder {summary['run_dir']}"
    )


@main.command("eval")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--split", type=click.Choice(["valid", "test"]), default="test", show_default=True)
@click.option("--file", "file", default=None, type=click.Path(path_type=Path), help="Evaluate on this file instead of a split.")
@click.option("--streams", default=None, type=click.IntRange(min=1), help="Parallel streams [default: the run's valid_streams or test_streams; test_streams for files].")
@click.option("--bptt", default=None, type=click.IntRange(min=1), help="Window length [default: the run's bptt].")
@click.option("--device", default="auto", show_default=True)
@click.option("--fast-path", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True, help="SDPA attention and bf16 memory (auto: on with CUDA); off is the eager reference path.")
def eval_command(checkpoint, split, file, streams, bptt, device, fast_path):
    """Bits per byte, nats per token and perplexity of a checkpoint (a checkpoint folder,
    a run folder for its best checkpoint, or an exported or save_pretrained folder); for
    WikiText, word perplexity too (docs/tokenization.md)."""
    from .checkpoint import load_model, read_tokenizer
    from .config import TrainConfig
    from .data import load_corpus, read_bytes
    from .errors import CheckpointError
    from .evaluate import evaluate
    from .tokenizer import check_corpus_tokenizer
    from .progress import ProgressDisplay

    model, config = load_model(checkpoint)
    tokenizer, count_words = read_tokenizer(checkpoint, model.config.vocab_size), False
    if config is None:  # a plain save_pretrained folder: no data recorded; the paper's protocol for --file
        if file is None:
            raise CheckpointError(f"{checkpoint} records no training data (no train_config.yaml): give --file FILE")
        config = TrainConfig(model=model.config)
    runtime = _runtime(device, config.precision, fast_path)
    window = _window(config, bptt)
    if file is not None:
        data, what, default_streams = tokenizer.ids(bytes(read_bytes(file))), str(file), config.test_streams
    else:
        corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
        check_corpus_tokenizer(model.config.vocab_size, corpus.tokenizer, config.data, tokenizer)
        data, what, count_words = corpus.split(split), f"{config.data} ({split})", corpus.words is not None
        default_streams = config.valid_streams if split == "valid" else config.test_streams
    streams = streams or default_streams
    with ProgressDisplay("eval") as progress:
        result = evaluate(runtime.prepare(model), data, streams, window, runtime.autocast_dtype, progress=progress,
                          tokenizer=tokenizer, count_words=count_words)
    unit = "bytes" if tokenizer.is_bytes else f"tokens ({tokenizer.name}: {result.bytes:,} bytes)"
    click.echo(f"{what}: {result.tokens:,} {unit} predicted, {streams} streams, windows of {window}")
    click.echo(f"bits per byte: {result.bpc:.4f}")
    if tokenizer.is_bytes:
        click.echo(f"nats per byte: {result.nats:.4f}")
        click.echo(f"perplexity:    {result.perplexity:.4f}")
    else:
        click.echo(f"bits per token: {result.bits_per_token:.4f}")
        click.echo(f"perplexity per token: {result.perplexity:.2f}")
    if result.word_perplexity is not None:
        click.echo(f"word perplexity ({result.words:,} words + <eos>): {result.word_perplexity:.2f}")


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--prompt", default=None, help="Prompt text (UTF-8).")
@click.option("--prompt-file", default=None, type=click.Path(path_type=Path), help="Read the prompt bytes from a file.")
@click.option("--max-bytes", default=512, show_default=True, type=click.IntRange(min=0),
              help="Bytes to generate (tokens, for a words or wordpiece model).")
@click.option("--temperature", default=1.0, show_default=True, type=float, help="0: greedy; must be finite.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="Keep the k most likely bytes (0: all).")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus sampling mass, in (0, 1].")
@click.option("--seed", default=None, type=int, help="Seed for reproducible samples.")
@click.option("--device", default="auto", show_default=True)
@click.option("--fast-path", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True, help="SDPA attention and bf16 memory (auto: on with CUDA); off is the eager reference path.")
def generate(checkpoint, prompt, prompt_file, max_bytes, temperature, top_k, top_p, seed, device, fast_path):
    """Sample from a checkpoint (a checkpoint, run, exported or save_pretrained folder),
    streaming the text to standard output as it comes: --max-bytes bytes from a byte
    model, as many tokens from a words or wordpiece model. Invalid UTF-8 is shown with
    replacement characters."""
    import torch

    from .checkpoint import load_model, read_tokenizer
    from .data import read_bytes
    from .errors import ConfigError
    from .generate import filter_logits
    from .generate import generate as sample

    if prompt is not None and prompt_file is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    filter_logits(torch.zeros(2), temperature, top_k, top_p)  # refuses bad settings with one line
    if prompt_file is not None:
        prompt_bytes = bytes(read_bytes(prompt_file))
    else:
        prompt_bytes = (prompt or "").encode("utf-8")
    if not prompt_bytes:
        prompt_bytes = b"\n"  # an empty prompt starts after a newline
    model, config = load_model(checkpoint)
    tokenizer = read_tokenizer(checkpoint, model.config.vocab_size)
    prompts = tokenizer.encode(prompt_bytes)
    if not len(prompts):  # whitespace alone is no word: start after a line, as an empty prompt does
        prompts = tokenizer.encode(b"\n")
    runtime = _runtime(device, config.precision if config else "auto", fast_path)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = sys.stdout
    out.write(decoder.decode(prompt_bytes))
    prompts = prompts.view(-1, 1)  # one stream
    steps = sample(runtime.prepare(model), prompts, max_bytes, temperature, top_k, top_p, seed,
                   autocast_dtype=runtime.autocast_dtype)
    for tokens in steps:
        out.write(decoder.decode(tokenizer.decode_bytes([int(tokens[0])])))
        out.flush()
    out.write(decoder.decode(b"", final=True) + "\n")


@main.command()
@click.argument("source", type=click.Path(path_type=Path, allow_dash=True))
@click.argument("dest", type=click.Path(path_type=Path, allow_dash=True))
@click.option("--model", "model_path", default=None, type=click.Path(path_type=Path),
              help="The run (its best checkpoint) or checkpoint that predicts the bytes.")
@click.option("--online", is_flag=True,
              help="No model file: a fixed-seed model learns from the bytes already coded; key=value overrides "
                   "change its settings (e.g. lr=0.003 bptt=64).")
@click.option("--streams", default=8, show_default=True, type=click.IntRange(min=1),
              help="Contiguous pieces coded side by side: faster, each starts cold.")
@click.option("--device", default="cpu", show_default=True,
              help="cpu or cuda[:N]: a file coded on CUDA decodes only on the same GPU type with the same library versions.")
@_force_dest
@click.option("--quiet", is_flag=True, help="No progress bar or progress lines.")
@click.argument("overrides", nargs=-1)
def compress(source, dest, model_path, online, streams, device, force, quiet, overrides):
    """Compress SOURCE to DEST (`-`: standard input or output) with a model, exactly
    invertible by `sharnn decompress` (docs/compression.md)."""
    from .checkpoint import load_model
    from .compress import compress as encode
    from .compress import online_config, online_model, read_header
    from .errors import ConfigError
    from .progress import ProgressDisplay
    from .runtime import resolve_device

    if online == (model_path is not None):
        raise ConfigError("give --model RUN_OR_CHECKPOINT or --online")
    if overrides and not online:
        raise ConfigError(f"key=value settings ({overrides[0]}) are for --online only")
    _check_destination(source, dest, force)
    data = _read_input(source)
    target = resolve_device(device)
    if online:
        settings = online_config(overrides)
        model = online_model(settings).to(target)
    else:
        model, settings = load_model(model_path, device=target)[0], None
    started = time.perf_counter()
    with ProgressDisplay("compress", enabled=not quiet) as progress:
        blob = encode(data, model, streams=streams, online=settings, progress=progress)
    _write_output(dest, blob)
    seconds = time.perf_counter() - started
    header = read_header(blob, str(dest))[0]
    how = (f"stored raw: coding gave {header.coded_bytes:,} bytes" if header.storage == "stored"
           else f"{header.streams} streams")
    click.echo(f"compressed {source}: {len(data):,} -> {len(blob):,} bytes, "
               f"{8 * len(blob) / max(len(data), 1):.4f} bits per byte, {how}, "
               f"{len(data) / seconds:,.0f} bytes/s ({seconds:.1f} s)", err=str(dest) == "-")


@main.command()
@click.argument("source", type=click.Path(path_type=Path, allow_dash=True))
@click.argument("dest", type=click.Path(path_type=Path, allow_dash=True))
@click.option("--model", "model_path", default=None, type=click.Path(path_type=Path),
              help="The run or checkpoint SOURCE was compressed with (not for --online files).")
@_force_dest
@click.option("--quiet", is_flag=True, help="No progress bar or progress lines.")
def decompress(source, dest, model_path, force, quiet):
    """Decompress SOURCE to DEST (`-`: standard input or output). Every stream's CRC32 is
    checked before anything is written; on any mismatch nothing is."""
    from .checkpoint import load_model
    from .compress import coding_device, read_header
    from .compress import decompress as decode
    from .progress import ProgressDisplay

    _check_destination(source, dest, force)
    blob = _read_input(source)
    header, _ = read_header(blob, str(source))
    stored = header.storage == "stored"  # the input itself: no model needed
    model = None if model_path is None or stored else load_model(model_path, device=coding_device(header, str(source)))[0]
    started = time.perf_counter()
    with ProgressDisplay("decompress", enabled=not quiet) as progress:
        data = decode(blob, model, name=str(source), progress=progress)
    _write_output(dest, data)
    seconds = time.perf_counter() - started
    checked = "stored raw, its CRC32 checked" if stored else f"CRC32 of {header.streams} streams checked"
    click.echo(f"decompressed {source}: {len(blob):,} -> {len(data):,} bytes, {checked}, "
               f"{len(data) / seconds:,.0f} bytes/s ({seconds:.1f} s)", err=str(dest) == "-")


def _check_destination(source: Path, dest: Path, force: bool) -> None:
    """Hold ``dest`` for this command alone until it ends (:func:`sharnn.files.output_lock`),
    then refuse, before any work, a destination that would overwrite the source, an
    existing file or a symbolic link (dangling or looping too; without ``force``: with
    it the link is replaced by the file, its target left as it is), a folder, or one
    whose folder does not exist."""
    from .errors import ConfigError
    from .files import check_new, output_lock

    if str(dest) == "-":
        return
    click.get_current_context().with_resource(output_lock(dest))
    if str(source) != "-" and dest.exists() and dest.resolve() == source.resolve():
        raise ConfigError(f"{dest} is the input file")
    if not force or dest.is_symlink():
        check_new(dest, force, ConfigError, f"{dest} exists; give --force to replace it")
    elif dest.is_dir():
        raise ConfigError(f"{dest} is a folder")
    if not dest.absolute().parent.is_dir():
        raise ConfigError(f"no folder {dest.absolute().parent}")


def _read_input(source: Path) -> bytes:
    from .errors import DataError

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
    from .files import write_atomically

    if str(dest) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        write_atomically(dest, data)


def _window(config, bptt: int | None) -> int:
    """The evaluation window: ``--bptt`` or the run's, refused in one line when the model's
    attention span cannot take it."""
    from .errors import ConfigError

    window = bptt or config.bptt
    try:
        config.model.check_window(window)
    except ConfigError as e:
        raise ConfigError(f"--bptt: {e}") from None
    return window


def _runtime(device: str, precision: str, fast_path: str):
    """Evaluation and generation run the way the checkpoint's run did, on this machine's
    device, without compilation."""
    from .runtime import Runtime

    return Runtime.resolve(device, precision, fast_path)


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create; it must not exist.")
@click.option("--collapse", is_flag=True, help="Fold each value-gate network into its constant first: fewer "
                                               "parameters, the same outputs.")
@_force_out
def export(checkpoint, out, collapse, force):
    """Write a run's best checkpoint (or the given checkpoint) as a folder to share in the
    Hugging Face Hub layout: config.json, model.safetensors, a model card README.md,
    train_config.yaml, training.json and bpc.png (docs/sharing.md)."""
    from .export import export as write_export

    click.echo(f"exported {checkpoint} to {write_export(checkpoint, out, collapse, force)}")


@main.group()
def analyze():
    """Analyses of a trained model."""


@analyze.command("tokenization")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--split", type=click.Choice(["valid", "test"]), default="test", show_default=True)
@click.option("--streams", default=None, type=click.IntRange(min=1), help="Parallel streams [default: the run's valid_streams or test_streams].")
@click.option("--bptt", default=None, type=click.IntRange(min=1), help="Window length [default: the run's bptt].")
@click.option("--max-tokens", default=None, type=click.IntRange(min=2), help="Score only the first N tokens of the split, for a quick look [default: all].")
@click.option("--device", default="auto", show_default=True)
@click.option("--fast-path", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True, help="SDPA attention and bf16 memory (auto: on with CUDA); off is the eager reference path.")
@click.option("--out", default=None, type=click.Path(path_type=Path), help="Folder for the JSON and PNG files [default: RUN/analysis; required for a checkpoint or an exported folder].")
def analyze_tokenization_command(checkpoint, split, streams, bptt, max_tokens, device, fast_path, out):
    """Where a model's bits fall within words, and what converting its perplexity to
    another tokenization's hides (paper §6.1; docs/tokenization.md): for a byte model,
    bits by character position in the word and by the word's train-set frequency, and
    2^(BPC * Nc / Nw) beside the exact word perplexity; for a wordpiece model, bits per
    word by number of pieces; for a words model, its totals. CHECKPOINT: a run folder (its
    best checkpoint), a checkpoint or an exported folder."""
    from .analysis import analyze as analyze_split
    from .analysis import format_report, kind, write_report
    from .checkpoint import load_model, read_tokenizer, resolve
    from .data import load_corpus
    from .errors import CheckpointError, ConfigError
    from .progress import ProgressDisplay
    from .tokenizer import check_corpus_tokenizer

    model, config = load_model(checkpoint)
    if config is None:
        raise CheckpointError(f"{checkpoint} records no training data (no train_config.yaml): nothing to analyze")
    tokenizer = read_tokenizer(checkpoint, model.config.vocab_size)
    kind(tokenizer)  # refuses a tokenizer with no analysis
    if out is None and resolve(checkpoint) == checkpoint.resolve():  # not a run folder: keep the checkpoint as it is
        raise ConfigError(f"{checkpoint} is not a run folder: give --out DIR (the default, RUN/analysis, is in a run)")
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    check_corpus_tokenizer(model.config.vocab_size, corpus.tokenizer, config.data, tokenizer)
    runtime = _runtime(device, config.precision, fast_path)
    window = _window(config, bptt)
    streams = streams or (config.valid_streams if split == "valid" else config.test_streams)
    data = corpus.split(split)[:max_tokens]
    with ProgressDisplay("analyze") as progress:
        report = analyze_split(runtime.prepare(model), tokenizer, data, streams, window, corpus.train,
                               runtime.autocast_dtype, progress=progress)
    report.update(checkpoint=str(resolve(checkpoint)), data=config.data, split=split)
    click.echo(format_report(report))
    for path in write_report(report, out or checkpoint / "analysis"):
        click.echo(f"wrote {path}")


@main.command()
@click.argument("target", required=False)
def info(target):
    """Configuration and parameter counts of a preset, a config file, a run, a checkpoint
    or an exported or save_pretrained folder, and for these folders their step, epoch and
    scores (without TARGET: the list of presets)."""
    import torch

    from .checkpoint import is_pretrained
    from .config import load_config, preset_names, to_yaml
    from .export import describe
    from .model import SHARNN

    if target is None:
        click.echo("presets: " + ", ".join(preset_names()))
        return
    path, scores = Path(target), None
    if is_pretrained(path):
        text, model_config, scores = describe(path)
    else:
        config = load_config(target)  # a preset, a YAML file, or a run/checkpoint folder's config.yaml
        text, model_config = to_yaml(config), config.model
        if path.is_dir():
            scores = _checkpoint_scores(path)
    with torch.device("meta"):
        model = SHARNN(model_config)
    click.echo(text.rstrip())
    click.echo("")
    for part, count in model.parameter_counts().items():
        if count:
            click.echo(f"  {part:<24} {count:>14,}")
    total, collapsed = model.num_parameters(), model.num_parameters(collapsed=True)
    click.echo(f"parameters: {total:,} trainable ({total / 1e6:.2f}M), {collapsed:,} collapsed ({collapsed / 1e6:.2f}M)")
    if scores:
        click.echo(scores)


def _checkpoint_scores(path: Path) -> str:
    """``checkpoint FOLDER: step N, epoch E, valid X BPC, test Y BPC`` for the checkpoint
    at ``path`` (a run's best): what its run recorded in it, and the test BPC from the
    run's summary.json when it is the checkpoint that was tested."""
    from .checkpoint import read_info, resolve
    from .errors import CheckpointError
    from .train import read_summary

    try:
        folder = resolve(path)
    except CheckpointError:
        return "no checkpoint yet"
    info = read_info(folder)
    if "step" not in info:
        return f"checkpoint {folder}: no training record"
    parts = [f"step {info['step']}", f"epoch {float(info['epochs']):.2f}"]
    if "valid_bpc" in info:
        parts.append(f"valid {float(info['valid_bpc']):.4f} BPC")
    elif float(info["best_valid_bpc"]) < float("inf"):
        parts.append(f"best valid so far {float(info['best_valid_bpc']):.4f} BPC (step {info['best_step']})")
    summary = read_summary(folder.parent.parent) or {}  # the run holding checkpoints/step-N
    if summary.get("best_step") == int(info["step"]):
        parts.append(f"test {summary['test_bpc']:.4f} BPC")
    return f"checkpoint {folder}: " + ", ".join(parts)


if __name__ == "__main__":
    from sharnn.__main__ import run

    run()
