"""What each ``sharnn`` command does, callable from Python with the command's defaults:
the command line (:mod:`sharnn.cli`) parses its options, calls one of these and prints.

- :func:`load`: a checkpoint, run folder (its best checkpoint), exported folder or shipped model;
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

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import torch

from .analysis_report import check_destination
from .arguments import check_count, check_number, check_overrides, check_path, check_runtime
from .commands.compress import Coding as Coding, compress_file as compress_file
from .commands.decompress import decompress_file as decompress_file
from .commands.listing import Listing as Listing, is_compressed, list_file as list_file
from .config import TrainConfig, load_config, preset_names, to_yaml
from .config_check import shown
from .data.corpus import Corpus, load_corpus, read_bytes
from .data.tokenizer import Tokenizer, check_corpus_tokenizer
from .errors import CheckpointError, ConfigError
from .evaluation import evaluate
from .generation import filter_logits, generate as sample
from .models.build import LanguageModel, build_model
from .models.shipped import DEFAULT_MODEL, shipped_folder, shipped_names
from .progress import ProgressDisplay
from .results import Evaluation, Generation, Loaded
from .runtime import Runtime, resolve_device
from .training.checkpoint import (
    is_pretrained,
    load_model,
    read_config,
    read_info,
    read_tokenizer,
    resolve,
)


def load(path: str | Path | None = None, device: str | torch.device = "cpu") -> Loaded:
    """Load a checkpoint folder, a run folder (its ``best`` checkpoint, else ``latest``), an
    exported or ``save_pretrained`` folder, or a shipped model by name (None: the default
    one, :data:`~sharnn.models.shipped.DEFAULT_MODEL`; docs/pretrained.md), with its
    tokenizer, onto ``device``.

    Raises:
        CheckpointError: no checkpoint there, or missing, corrupt or mismatched files.
        DataError: an invalid ``tokenizer.json``, or one that does not fit the model.
        ConfigError: a ``path`` that is no path; an unknown or unavailable ``device``
            (:func:`sharnn.runtime.resolve_device`: ``auto`` too).
    """
    path = DEFAULT_MODEL if path is None else path
    check_path("path", path)
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {shown(device)}")
    model, config = load_model(path, device=resolve_device(device))
    return Loaded(model, config, read_tokenizer(path, model.config.vocab_size))


def evaluate_checkpoint(
    path: str | Path | None = None,
    split: str = "test",
    file: str | Path | None = None,
    streams: int | None = None,
    bptt: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    quiet: bool = False,
    attention_span: int | None = None,
) -> Evaluation:
    """Score a checkpoint (anything :func:`load` takes; None: the default shipped model) with the paper's protocol
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
        attention_span: positions each window attends to, the window included (None: the
            trained span); a SHA-RNN reads any length, a Transformer at most its trained
            span (``set_attention_span`` of each; docs/ablations.md).

    Raises:
        CheckpointError: as :func:`load`; a folder without training data and no ``file``.
        ConfigError: a window the attention span cannot take; bad device settings; an
            argument of the wrong type, ``streams``, ``bptt`` or ``attention_span`` < 1.
        DataError: a missing corpus or file, one too small for ``streams``, or a corpus
            made by another tokenizer than the model's.
    """
    path = DEFAULT_MODEL if path is None else path
    check_path("path", path)
    check_path("file", file, optional=True)
    check_count("streams", streams, 1, optional=True)
    check_count("bptt", bptt, 1, optional=True)
    check_count("attention_span", attention_span, 1, optional=True)
    check_runtime(device, fast_path)
    model, config, tokenizer = load(path)
    if config is None:  # a plain save_pretrained folder: no data recorded; the paper's protocol for a file
        if file is None:
            raise CheckpointError(f"{path} records no training data (no train_config.yaml): give --file FILE")
        config = TrainConfig(model=model.config)
    if attention_span is not None:
        config = dataclasses.replace(config, model=model.set_attention_span(attention_span).config)
    runtime = Runtime.resolve(device, config.precision, fast_path)
    window = _window(config, bptt)
    data, what, count_words, default_streams = _scored(config, model, tokenizer, file, split)
    streams = streams or default_streams
    with ProgressDisplay("eval", enabled=not quiet) as progress:
        model, dtype = runtime.prepare(model), runtime.autocast_dtype
        result = evaluate(
            model, data, streams, window, dtype, progress=progress, tokenizer=tokenizer, count_words=count_words
        )
    return Evaluation(result, what, streams, window, tokenizer, attention_span)


def _scored(config: TrainConfig, model: LanguageModel, tokenizer: Tokenizer, file, split: str):
    """What :func:`evaluate_checkpoint` scores: the ids of ``file`` or of the run's ``split``,
    what to call them, whether words are counted, and the run's streams for them."""
    if file is not None:
        return tokenizer.ids(bytes(read_bytes(file))), str(file), False, config.test_streams
    corpus = _corpus(config, model, tokenizer)
    streams = config.valid_streams if split == "valid" else config.test_streams
    return corpus.split(split), f"{config.data} ({split})", corpus.words is not None, streams


def generate_text(
    path: str | Path | None = None,
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
    """Sample one stream from a checkpoint (anything :func:`load` takes; None: the default
    shipped model), as ``sharnn
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
        ConfigError: both ``prompt`` and ``prompt_file``; bad sampling or device settings;
            an argument of the wrong type (a prompt neither text nor bytes, a count that is
            not an integer), ``max_tokens`` < 0, a seed outside [-2^63, 2^64).
        DataError: an unreadable ``prompt_file``; CheckpointError, DataError: as :func:`load`.
    """
    check_path("path", path, optional=True)
    _check_generation(prompt, prompt_file, max_tokens, temperature, top_k, top_p, seed)
    check_runtime(device, fast_path)
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


def _check_generation(prompt, prompt_file, max_tokens, temperature, top_k, top_p, seed) -> None:
    """The types of :func:`generate_text`'s arguments, and the ranges
    :func:`sharnn.generation.filter_logits` does not check. Raises :class:`ConfigError`."""
    if prompt is not None and not isinstance(prompt, (str, bytes)):
        raise ConfigError(f"prompt must be text (str) or bytes, got {shown(prompt)}")
    check_path("prompt_file", prompt_file, optional=True)
    check_count("max_tokens", max_tokens, 0)
    check_number("temperature", temperature)
    check_count("top_k", top_k, 0)
    check_number("top_p", top_p)
    check_count("seed", seed, -(2**63), 2**64 - 1, optional=True)  # what torch.Generator.manual_seed takes


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
        ConfigError: no ``out`` for what is not a run folder, or one the report cannot be written
            into (refused first: :func:`sharnn.analysis_report.check_destination`); a window the
            attention span cannot take. DataError: a tokenizer with no analysis; as :func:`evaluate_checkpoint`.
    """
    from .analysis import analyze, kind

    path = Path(path)
    model, config, tokenizer = load(path)
    if config is None:
        raise CheckpointError(f"{path} records no training data (no train_config.yaml): nothing to analyze")
    analysis = kind(tokenizer)  # refuses a tokenizer with no analysis
    if out is None and resolve(path) == path.resolve():  # not a run folder: keep the checkpoint as it is
        raise ConfigError(f"{path} is not a run folder: give --out DIR (the default, RUN/analysis, is in a run)")
    folder = Path(out) if out is not None else path / "analysis"
    check_destination(folder, split, analysis)
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
    return report, folder


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

    for name, value in (("preset", preset), ("config_file", config_file), ("out", out), ("resume", resume)):
        check_path(name, value, optional=True)
    check_path("init_from", init_from, optional=True)
    check_overrides(overrides)
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
    a run, a checkpoint, an exported or ``save_pretrained`` folder or a shipped model's name,
    and for these folders their step, epoch and scores (None: the lists of presets and of
    shipped models, the default marked).

    Raises:
        ConfigError: an unknown preset or an invalid config file or override; overrides
            given with a folder (they describe a new run); a model too large to count (a
            weight past 2^63 bytes). CheckpointError: an invalid checkpoint or exported
            folder (its ``training.json`` too: :func:`sharnn.training.checkpoint.check_training_record`).
    """
    from .export import describe

    if target is None:
        shipped = [f"{name} (default)" if name == DEFAULT_MODEL else name for name in shipped_names()]
        return f"presets: {', '.join(preset_names())}\nshipped models: {', '.join(shipped) or 'none'}"
    check_path("target", target)
    check_overrides(overrides)
    if not overrides and is_compressed(target):
        return list_file(target).format()
    path, scores = Path(target), None
    if not path.exists() and str(target) in shipped_names():
        path = shipped_folder(str(target))
    if overrides and path.is_dir():
        raise ConfigError(f"{target} is a folder: key=value settings go with a preset or a config file")
    if is_pretrained(path):
        text, model_config, scores = describe(path)
    else:
        config = load_config(str(target), overrides)  # a preset, a YAML file, or a run/checkpoint folder's config.yaml
        text, model_config = to_yaml(config), config.model
        if path.is_dir():
            scores = _checkpoint_scores(path)
    model = _meta_model(model_config)
    lines = [text.rstrip(), ""]
    lines += [f"  {part:<24} {count:>14,}" for part, count in model.parameter_counts().items() if count]
    total, collapsed = model.num_parameters(), model.num_parameters(collapsed=True)
    lines.append(
        f"parameters: {total:,} trainable ({total / 1e6:.2f}M), {collapsed:,} collapsed ({collapsed / 1e6:.2f}M)"
    )
    return "\n".join(lines + [scores] * bool(scores))


def _meta_model(config) -> LanguageModel:
    """The model ``config`` describes, on the meta device (nothing allocated), to count its
    parameters. Raises :class:`ConfigError`: a weight too large for torch to size (its
    bytes past 2^63), which the meta device reports as an overflow."""
    try:
        with torch.device("meta"):
            return build_model(config)
    except RuntimeError as e:
        if "overflow" not in str(e):
            raise
        sizes = ", ".join(
            f"model.{name}={shown(getattr(config, name))}" for name in ("vocab_size", "d_model", "boom_dim")
        )
        raise ConfigError(f"a model of {sizes} is too large: one of its weights would pass 2^63 bytes") from None


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
    summary = read_summary(folder.parent.parent)  # the run holding checkpoints/step-N
    try:
        parts = [f"step {int(record['step'])}", f"epoch {float(record['epochs']):.2f}"]
        if "valid_bpc" in record:
            parts.append(f"valid {float(record['valid_bpc']):.4f} BPC")
        elif float(record["best_valid_bpc"]) < float("inf"):
            parts.append(f"best valid so far {float(record['best_valid_bpc']):.4f} BPC (step {record['best_step']})")
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f"{folder}: the training record in its model.safetensors is not sharnn's ({shown(e)})"
        ) from None
    if isinstance(summary, dict) and summary.get("best_step") == int(record["step"]):
        test = summary.get("test_bpc")
        if isinstance(test, bool) or not isinstance(test, (int, float)):
            raise CheckpointError(f"{folder.parent.parent / 'summary.json'}: test_bpc is not a number")
        parts.append(f"test {test:.4f} BPC")
    return f"checkpoint {folder}: " + ", ".join(parts)
