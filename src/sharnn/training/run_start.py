"""How a training run starts (docs/training.md, "Resume" and "Starting from trained
weights"): :func:`start` sets up a new run, a run folder that has no checkpoint yet
(started again from step 0) or a run from trained weights (``init_from``:
:func:`load_init_weights`); :func:`resume` a run from its ``latest`` checkpoint, with the
settings in :data:`RESUMABLE` changed or not (:func:`resume_config`,
:func:`resume_changes`). :func:`trained_tokenizer` gives the tokenizer of the trained
model a run goes on with or starts from. :class:`sharnn.training.trainer.Trainer` calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..config import TrainConfig, config_changes, load_config
from ..data.corpus import split_prefix
from ..data.tokenizer import Tokenizer, check_corpus_tokenizer
from ..errors import CheckpointError, ConfigError, DataError, RunError
from ..models.sharnn import SHARNN
from ..runtime import Runtime
from . import checkpoint
from .checkpoint import CONFIG_FILE, RunCheckpoints
from .recipe import TrainingState, out_of_budget
from .run_folder import RunFolder

# What a resumed run may change: settings that steer training without changing what its
# checkpoint holds (the model, the data and its streams, the optimizer and its state). The
# schedule's settings are recomputed from the step at every step, so they may change.
RESUMABLE = frozenset(
    {
        "epochs",
        "max_steps",
        "max_seconds",
        "lr",
        "warmup_steps",
        "lr_halve_epochs",
        "lr_decay_steps",
        "min_lr",
        "clip",
        "valid_every_steps",
        "checkpoint_every_steps",
        "log_every_steps",
        "progress_every_seconds",
        "sample_bytes",
        "compile",
        "recompute",
    }
)
# What a run started from a checkpoint's weights (init_from) may change in its model.
INIT_CHANGES = frozenset({"dropouti", "dropouth", "dropouto"})


def start(
    run: RunFolder, config: TrainConfig, model: SHARNN, runtime: Runtime, restart: bool, say: Callable[[str], None]
) -> None:
    """Set up a new run, or (``restart``) a run folder that has no checkpoint yet, from
    step 0; ``say`` prints a message. The main process alone creates the run folder."""
    source = load_init_weights(config, model, runtime.device) if config.init_from else None
    if restart:
        say(f"{run.path} has no checkpoint yet: starting it again from step 0")
    run.create(config, restart)
    say(
        f"model: {model.num_parameters() / 1e6:.2f}M parameters "
        f"({model.num_parameters(collapsed=True) / 1e6:.2f}M collapsed), {runtime.describe()}"
        + (f", {run.distributed.world_size} processes" if run.distributed.active else "")
    )
    if source is not None:
        say(f"weights from {source}; a new optimizer and schedule")


def resume(
    run: RunFolder,
    config: TrainConfig,
    state: TrainingState,
    rows: int,
    changes: dict[str, list],
    say: Callable[[str], None],
) -> dict | None:
    """Set up a resumed run from its ``latest`` checkpoint (``rows``: the rows of its
    train streams; ``changes``: :func:`resume_changes`; ``say`` prints a message); the
    summary of a run that had finished there already (nothing to train), else None."""
    run.restore(state, config.model.n_layers, state.device)
    progress = state.progress
    progress.finished = out_of_budget(config, progress)
    if progress.finished and "valid_bpc" not in checkpoint.read_info(run.checkpoints.latest):
        progress.valid_due = True  # the new budget ends the run here: its last step is validated, as always
    summary, epochs = run.summary(), progress.epochs_done(rows)
    if progress.finished and summary is not None and summary.get("steps") == progress.step:
        say(
            f"{run.path} has finished (step {progress.step}, epoch {epochs:.2f}); "
            f"to train on, resume it with a larger max_steps, epochs or max_seconds"
        )
        return summary
    run.reopen(config, progress.step, progress.best_step, epochs, changes)
    say(f"resuming {run.path} at step {progress.step} (epoch {epochs:.2f})")
    if state.saved_processes != run.distributed.world_size:
        say(
            f"the checkpoint was saved by {state.saved_processes} process(es), this run has "
            f"{run.distributed.world_size}: the streams are shared out again, and dropout draws fresh masks"
        )
    if changes:
        say("changed: " + ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changes.items()))
    return None


def resume_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The configuration to resume a run with: the one its ``latest`` checkpoint holds (or,
    for a run killed before its first checkpoint, its ``config.yaml``), with ``key=value``
    overrides applied.

    Raises:
        RunError: ``run_dir`` is not a run folder.
        CheckpointError: its stored configuration cannot be read.
        ConfigError: a bad override (whether a resume may change it is checked by
            :func:`sharnn.training.trainer.train`).
    """
    run_dir = Path(run_dir)
    checkpoints = RunCheckpoints(run_dir)
    if checkpoints.has_latest():
        source = checkpoints.latest / CONFIG_FILE
    elif (run_dir / "config.yaml").is_file():
        source = run_dir / "config.yaml"
    elif run_dir.is_dir():
        raise RunError(
            f"{run_dir} is not a run folder (it has no config.yaml or checkpoint); "
            f"start a run with --preset or --config"
        )
    else:
        raise RunError(f"no run folder {run_dir} to resume")
    try:
        load_config(source)
    except ConfigError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return load_config(source, overrides)


def resume_changes(run_dir: Path, config: TrainConfig) -> dict[str, list]:
    """The settings a resume of ``run_dir`` with ``config`` changes, as
    :func:`~sharnn.config.config_changes` gives them.

    Raises:
        ConfigError: a change of a setting not in :data:`RESUMABLE` (one that would change
            what the checkpoint holds).
        RunError, CheckpointError: see :func:`resume_config`.
    """
    changes = config_changes(resume_config(run_dir), config)
    refused = [key for key in changes if key not in RESUMABLE]
    if refused:
        raise ConfigError(
            f"a resumed run cannot change {', '.join(refused)} (the model, the data or the optimizer state its "
            f"checkpoint holds); start a new run, from its weights with --init-from {run_dir} "
            f"(a resume may change: {', '.join(sorted(RESUMABLE))})"
        )
    return changes


def trained_tokenizer(config: TrainConfig, run: RunFolder, resumed: bool) -> Tokenizer | None:
    """The tokenizer of the trained model this run goes on with (its latest checkpoint)
    or starts from (``init_from``), checked against that model; None for a new model."""
    if resumed:
        return checkpoint.read_tokenizer(run.checkpoints.latest, config.model.vocab_size)
    if config.init_from:
        source = checkpoint.resolve(config.init_from)
        return checkpoint.read_tokenizer(source, checkpoint.read_config(source).model.vocab_size)
    return None


def load_init_weights(config: TrainConfig, model: torch.nn.Module, device: torch.device) -> Path:
    """Load the weights of ``init_from`` (its checkpoint folder, returned), whose model
    settings must be this run's but for the dropouts."""
    source = checkpoint.resolve(config.init_from)
    changes = config_changes(checkpoint.read_config(source).model, config.model)
    refused = [f"model.{key} {theirs} -> {ours}" for key, (theirs, ours) in changes.items() if key not in INIT_CHANGES]
    if refused:
        raise ConfigError(
            f"init_from {source}: the model must be the checkpoint's, but {', '.join(refused)} "
            f"(only {', '.join(sorted(INIT_CHANGES))} may differ)"
        )
    checkpoint.load_weights(model, source, device)
    return source


def check_corpus(config: TrainConfig, corpus, trained: Tokenizer | None = None) -> None:
    """Refuse a corpus the run cannot use: a tokenizer that is not the model's (another
    number of token ids than ``model.vocab_size``, bytes being 256; for a trained model,
    ``trained``, other bytes behind its ids: :func:`~sharnn.data.tokenizer.check_corpus_tokenizer`),
    a train split shorter than one window of every stream, or evaluation splits (or their
    prefixes, ``valid_max_bytes``, ``test_max_bytes``) too short for their streams.

    Raises:
        DataError: the tokenizer, or a split too short.
        ConfigError: a ``valid_max_bytes`` or ``test_max_bytes`` prefix too short.
    """
    check_corpus_tokenizer(config.model.vocab_size, corpus.tokenizer, config.data, trained)
    need = config.train_streams * (config.bptt + 1)
    if len(corpus.train) < need:
        raise DataError(
            f"corpus {config.data}: the train split has {len(corpus.train):,} tokens, fewer than one window "
            f"({config.train_streams} streams x {config.bptt + 1} tokens = {need:,}); lower train_streams or bptt"
        )
    for split, streams, limit in (
        ("valid", config.valid_streams, config.valid_max_bytes),
        ("test", config.test_streams, config.test_max_bytes),
    ):
        size = len(split_prefix(corpus, split, limit)[0])
        if size < 2 * streams and limit and size < len(corpus.split(split)):
            raise ConfigError(
                f"{split}_max_bytes={limit}: the first {limit:,} bytes of the {split} split hold {size:,} "
                f"tokens, too few for {streams} streams; raise {split}_max_bytes or lower {split}_streams"
            )
        if size < 2 * streams:
            raise DataError(
                f"corpus {config.data}: the {split} split has {size:,} tokens, too few for {streams} streams"
            )
