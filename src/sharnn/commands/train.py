"""``sharnn train``: :func:`train_run` trains or resumes a run, :func:`format_summary` is
the line the command prints for its summary, :func:`budget_note` what it adds when a
limit the user did not expect ended the run, and :func:`training_sample` the sample it
prints at the end (``sample_bytes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from ..config import TrainConfig, load_config
from ..data.corpus import load_corpus
from ..errors import ConfigError
from ..generation import training_sample as sample_of
from ..loading import read_config
from ..runtime import Runtime, resolve_device
from .arguments import check_overrides, check_path
from .loading import load


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
        the run's summary (``summary.json``): valid and test BPC, steps, seconds, ``run_dir``
        (printed by the command, with :func:`budget_note` and :func:`training_sample`).

    Raises:
        ConfigError: neither or both of ``preset`` and ``config_file``; ``resume`` with
            another source; bad settings. Interrupted: stopped by Ctrl-C or SIGTERM after
            saving. RunError, DataError, CheckpointError, TrainingDiverged: see
            :func:`sharnn.training.trainer.train`.
    """
    from ..training.distributed import Distributed
    from ..training.run_start import resume_config
    from ..training.trainer import train

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


def budget_note(summary: dict, config: TrainConfig) -> str | None:
    """A note for a run that ended before the ``max_steps`` it was given, because another
    limit (``epochs``, ``max_seconds``) came first: None when ``max_steps`` is 0 or was reached."""
    steps = summary["steps"]
    if not config.max_steps or steps >= config.max_steps:
        return None
    if summary["epochs"] >= config.epochs:
        ended, more = f"epochs={config.epochs:g}", "epochs"
    elif config.max_seconds and summary["train_seconds"] >= config.max_seconds:
        ended, more = f"max_seconds={config.max_seconds:g}", "max_seconds"
    else:
        return None
    return (
        f"note: {ended} ended the run at step {steps:,}, before max_steps={config.max_steps:,}: "
        f"raise {more} to train longer"
    )


def run_config(summary: dict) -> TrainConfig:
    """The configuration of the run a summary describes (its ``config.yaml``)."""
    return load_config(str(summary["run_dir"]))


def training_sample(summary: dict, config: TrainConfig) -> list[tuple[str, str]]:
    """What ``sharnn train`` prints at its end, ``(header, text)`` pairs: the first 256
    tokens of the test split and ``sample_bytes`` generated from them by the run's best
    checkpoint (:func:`sharnn.generation.training_sample`); none when ``sample_bytes`` is 0."""
    if not config.sample_bytes:
        return []
    model, _, _ = load(summary["run_dir"])
    runtime = Runtime.resolve(config.device, config.precision, config.fast_path)
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    return sample_of(runtime.prepare(model), corpus, config.sample_bytes, config.seed, runtime.autocast_dtype)
