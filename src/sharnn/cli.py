"""The ``sharnn`` command line: prepare, train, eval, generate, compress, decompress, export, analyze, info.

User errors (bad config, missing file, wrong checksum, incompatible checkpoint, ...)
print one ``error:`` line and exit with status 1; usage errors (an unknown option, an
option value out of its range) print one ``error:`` line and exit with status 2; Ctrl-C
prints ``interrupted`` and exits with status 130, SIGTERM ``terminated`` and 143 (``train``
saves first and prints its resume command, with the same statuses).

Each command parses its options, calls one function of the library (:mod:`sharnn.api`,
reached through ``sharnn``'s names, which load on first use, or its command's module in
:mod:`sharnn.commands`, imported inside the command) and prints its result; the
errors and signals become lines and exit statuses in :mod:`sharnn.console`, which also
defines the options several commands share. torch loads only when a command runs, so
that ``--help``, ``--version`` and usage errors answer at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import sharnn

from . import console
from .models.shipped import DEFAULT_MODEL


@click.group(cls=console.Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sharnn")
@click.pass_context
def main(ctx):
    """SHA-RNN toolkit: the Single Headed Attention RNN (Merity 2019) for byte-level
    language modelling. Run `sharnn COMMAND --help` for each command."""
    from .files import sigterm_raises

    # Clean-ups run, as for Ctrl-C; exit status 143. Training replaces it while it trains
    # (it stops at the end of a step and saves: sharnn.training.trainer), not while it sets up.
    ctx.with_resource(sigterm_raises())


@main.group()
def prepare():
    """Prepare a dataset as memory-mappable train/valid/test byte files."""


@prepare.command("enwik8")
@click.option(
    "--source",
    default=None,
    help="enwik8.zip or the raw enwik8 file: a path or an http(s) URL [default: the canonical URL].",
)
@console.new_folder_options
def prepare_enwik8_command(source, out, force):
    """Check enwik8 (size, MD5) and split it 90M / 5M / 5M."""
    from .commands import prepare

    _echo_lines(prepare.enwik8(source, out, force))


@prepare.command("wikitext-2")
@click.option(
    "--source",
    default=None,
    type=click.Path(path_type=Path),
    help="wikitext-2-v1.zip, or a folder with wiki.{train,valid,test}.tokens or {train,valid,test}.txt "
    "(.gz or not) [default: the copy bundled with sharnn].",
)
@click.option("--tokenizer", default="words", show_default=True, help="bytes, words or bpe:N (e.g. bpe:8000).")
@console.new_folder_options
def prepare_wikitext2_command(source, tokenizer, out, force):
    """Check WikiText-2 (v1) against its published counts and checksums; tokenize it (docs/tokenization.md)."""
    from .commands import prepare

    _echo_lines(prepare.wikitext2(source, out, tokenizer, force))


@prepare.command("corpus")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--valid-fraction", default=0.05, show_default=True, type=console.fraction_type)
@click.option("--test-fraction", default=0.05, show_default=True, type=console.fraction_type)
@click.option("--tokenizer", default="bytes", show_default=True, help="bytes or bpe:N (trained on the train split).")
@console.new_folder_options
def prepare_corpus_command(source, out, valid_fraction, test_fraction, tokenizer, force):
    """Any file or folder of files (concatenated), split by position."""
    from .commands import prepare

    _echo_lines(prepare.corpus(source, out, valid_fraction, test_fraction, tokenizer, force))


@prepare.command("english")
@click.option("--source", "root", default="/", show_default=True, type=Path, help="Where the packages are installed.")
@click.option("--exclude", multiple=True, type=click.Path(path_type=Path), help="Texts no document may hold.")
@console.new_folder_options
def prepare_english_command(root, exclude, out, force):
    """English from named Debian packages, held out by document (docs/data.md, "English")."""
    from .commands import prepare

    _echo_lines(prepare.english(root, exclude, out, force))


@main.command()
@click.option("--preset", default=None, help="A bundled preset (see `sharnn info`).")
@click.option("--config", "config_file", default=None, type=click.Path(path_type=Path), help="A YAML config file.")
@click.option(
    "--out", default=None, type=click.Path(path_type=Path), help="Run folder to create [default: runs/NAME-TIMESTAMP]."
)
@click.option(
    "--resume",
    default=None,
    type=click.Path(path_type=Path),
    help="Continue the run in this folder from its latest checkpoint; overrides may change its length, "
    "learning rate and cadence.",
)
@click.option(
    "--init-from",
    default=None,
    type=console.model_path,
    help="Start from the weights of this run (its best checkpoint) or checkpoint: the model is its, the "
    "data and recipe come from the preset or config; a new optimizer and schedule.",
)
@console.quiet_option
@click.argument("overrides", nargs=-1)
def train(preset, config_file, out, resume, init_from, quiet, overrides):
    """Train from a preset or config file, with key=value overrides
    (e.g. `sharnn train --preset tiny epochs=2 model.d_model=128`), or go on with a run
    (`sharnn train --resume RUN max_steps=5000 lr=1e-3`).

    SIGTERM, as Ctrl-C, stops at the end of the step and saves `latest` (exit status 143,
    130 for Ctrl-C): with SLURM, `#SBATCH --signal=TERM@120` leaves two minutes for it.

    Under `torchrun --nproc_per_node=N -m sharnn train ...` it trains with N processes
    (DistributedDataParallel; docs/training.md, "Several GPUs or processes")."""
    from .commands import train as training

    summary = sharnn.train_run(preset, config_file, out, resume, init_from, overrides, quiet=quiet)
    if not sharnn.training.distributed.is_main_process():
        return
    config = training.run_config(summary)
    sample = [] if quiet else training.training_sample(summary, config)
    for header, text in sample:
        click.echo(f"\n--- {header} ---", err=True)
        click.echo(text)
    if sample:
        click.echo("---", err=True)
    click.echo(training.format_summary(summary))
    if note := training.budget_note(summary, config):
        click.echo(note, err=True)


@main.command("eval")
@console.model_argument
@console.split_option
@click.option("--file", default=None, type=click.Path(path_type=Path), help="Evaluate on this file instead of a split.")
@console.streams_option("the run's valid_streams or test_streams; test_streams for files")
@console.bptt_option
@console.attention_span_option
@console.runtime_options
def eval_command(checkpoint, split, file, streams, bptt, span, device, fast_path):
    """Bits per byte, nats per token and perplexity of a checkpoint (a checkpoint folder,
    a run folder for its best checkpoint, an exported or save_pretrained folder, or a
    shipped model's name; without CHECKPOINT, the shipped model, docs/pretrained.md); for
    WikiText, word perplexity too (docs/tokenization.md)."""
    scored = sharnn.evaluate_checkpoint(checkpoint, split, file, streams, bptt, device, fast_path, False, span)
    click.echo(scored.format())


@main.command()
@console.model_argument
@click.option("--prompt", default=None, help="Prompt text (UTF-8).")
@click.option("--prompt-file", default=None, type=click.Path(path_type=Path), help="Read the prompt bytes from a file.")
@click.option(
    "--max-bytes",
    default=512,
    show_default=True,
    type=click.IntRange(min=0),
    help="Bytes to generate (tokens, for a words or wordpiece model).",
)
@click.option("--temperature", default=1.0, show_default=True, type=float, help="0: greedy; must be finite.")
@click.option(
    "--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="Keep the k most likely bytes (0: all)."
)
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus sampling mass, in (0, 1].")
@click.option("--seed", default=None, type=int, help="Seed for reproducible samples.")
@console.runtime_options
def generate(checkpoint, prompt, prompt_file, max_bytes, temperature, top_k, top_p, seed, device, fast_path):
    """Sample from a checkpoint (a checkpoint, run, exported or save_pretrained folder, or a
    shipped model's name; without CHECKPOINT, the shipped model), streaming the text to
    standard output as it comes: --max-bytes bytes from a byte model, as many tokens from a
    words or wordpiece model. Invalid UTF-8 is shown with replacement characters."""
    for text in sharnn.generate_text(
        checkpoint, prompt, max_bytes, temperature, top_k, top_p, seed, device, fast_path, prompt_file
    ).text():
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")


@main.command(cls=click.Command)  # not console.Command: the files are checked before torch loads
@click.argument("files", nargs=-1, required=True, metavar="FILE... [KEY=VALUE]...")
@click.option(
    "--model",
    "model_path",
    default=None,
    type=console.model_path,
    help=f"The run (its best checkpoint), checkpoint or shipped model that predicts the bytes.  "
    f"[default: {DEFAULT_MODEL}]",
)
@click.option(
    "--online",
    is_flag=True,
    help="No model file: a fixed-seed model learns from the bytes already coded; key=value settings "
    "change its settings (e.g. lr=0.003 bptt=64).",
)
@click.option(
    "--streams",
    default=None,
    type=click.IntRange(min=1),
    help="Contiguous pieces coded side by side: each costs a cold start and the text before it (lcet10: "
    "1.5% larger with 32 than with 4); fewer than 4 are slower.  [default: one per 8 KiB of input, 1 to 4; "
    "online: 8]",  # sharnn.coding.codec.default_streams (the help imports no torch)
)
@console.coding_options
@console.file_options(compressing=True)
def compress(files, model_path, online, streams, mixing, threads, device, adapt, precision, **how):
    """Compress each FILE to FILE.shz (`-`: standard input to standard output), exactly
    invertible by `sharnn decompress` (docs/compression.md). Each FILE is kept (--rm
    removes it); FILE.shz takes its mode and modification time. Compressed data is never
    written to a terminal. Standard output carries the compressed data only (-c); each
    file's summary goes to standard error, and -q prints nothing but errors."""
    coding = dict(online=online, streams=streams, device=device, precision=precision, adapt=adapt, mixing=mixing)
    console.code_files(files, how, coding, model=model_path, threads=threads)


@main.command(cls=click.Command)  # the files checked before torch loads, as compress
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option(
    "--model",
    "model_path",
    default=None,
    type=console.model_path,
    help="The run, checkpoint or model FILE was compressed with (not for --online files).  "
    "[default: the shipped model the file names]",
)
@console.decoding_threads_option
@console.file_options
def decompress(files, model_path, threads, **how):
    """Decompress each FILE.shz to FILE (`-`: standard input to standard output): the
    streams' CRC32 is checked before anything is written; on any mismatch nothing is. Each
    FILE.shz is kept (--rm removes it); FILE takes its mode and modification time. The
    summary goes to standard error; -q prints nothing but errors."""
    console.code_files(files, how, None, model=model_path, threads=threads)


@main.command()
@console.checkpoint_argument
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create; it must not exist.")
@click.option(
    "--collapse",
    is_flag=True,
    help="Fold each value-gate network into its constant first: fewer parameters, the same outputs.",
)
@click.option(
    "--storage",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help="The weights' dtype in model.safetensors: bf16 halves the file (loading widens it back to fp32).",
)
@console.force_out_option
def export(checkpoint, out, collapse, storage, force):
    """Write a run's best checkpoint (or the given checkpoint) as a folder to share in the
    Hugging Face Hub layout: config.json, model.safetensors, a model card README.md,
    train_config.yaml, training.json and bpc.png (docs/sharing.md)."""
    from .commands.export import export as export_checkpoint

    click.echo(export_checkpoint(checkpoint, out, collapse, force, storage))


@main.group()
def analyze():
    """Analyses of a trained model."""


@analyze.command("tokenization")
@console.checkpoint_argument
@console.split_option
@console.streams_option()
@console.bptt_option
@click.option(
    "--max-tokens",
    default=None,
    type=click.IntRange(min=2),
    help="Score only the first N tokens of the split, for a quick look [default: all].",
)
@console.runtime_options
@click.option(
    "--out",
    default=None,
    type=click.Path(path_type=Path),
    help="Folder for the JSON and PNG files [default: RUN/analysis; required for a checkpoint or an exported folder].",
)
def analyze_tokenization_command(checkpoint, split, streams, bptt, max_tokens, device, fast_path, out):
    """Where a model's bits fall within words, and what converting its perplexity to
    another tokenization's hides (paper §6.1; docs/tokenization.md): for a byte model,
    bits by character position in the word and by the word's train-set frequency, and
    2^(BPC * Nc / Nw) beside the exact word perplexity; for a wordpiece model, bits per
    word by number of pieces; for a words model, its totals. CHECKPOINT: a run folder (its
    best checkpoint), a checkpoint or an exported folder."""
    from .commands.analyze import write_and_describe

    report, folder = sharnn.analyze_tokenization(checkpoint, split, streams, bptt, max_tokens, device, fast_path, out)
    _echo_lines(write_and_describe(report, folder))


@main.command()
@click.argument("target", required=False)
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def info(target, overrides):
    """Configuration and parameter counts of a preset or a config file (with KEY=VALUE
    settings: a variant's, e.g. model.cell=ln_lstm), a run, a checkpoint or an exported
    or save_pretrained folder, and for these folders their step, epoch and scores
    (without TARGET: the list of presets)."""
    click.echo(sharnn.info(target, overrides))


def _echo_lines(lines) -> None:
    for line in lines:
        click.echo(line)
