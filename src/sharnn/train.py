"""The training recipe (paper §4.1 and Table 2; docs/training.md): Min-Trust LAMB, linear
warmup then a constant learning rate with halvings, global gradient clipping, truncated
BPTT over contiguous streams with the state and memory carried and detached between
windows.

What training carries from one step to the next is one object, :class:`TrainingState`
(model, optimizer, loss scaler, jitter RNG, progress with the stream position, recurrent
state); its ``state_dict()`` is what a checkpoint stores and what resume restores
(layout: :mod:`sharnn.checkpoint`). :func:`train` is the loop; :class:`Trainer` holds its
named steps and the run folder::

    config.yaml            the resolved TrainConfig
    metrics.jsonl, events.out.tfevents.*, bpc.png     (sharnn.metrics)
    checkpoints/step-N/, latest, best                 (sharnn.checkpoint)
    summary.json           final valid and test BPC, parameter counts, steps, time

A stopped run (Ctrl-C, SIGTERM, a ``should_stop`` hook, kill -9) continues from
``latest`` with ``train(..., resume=True)`` as if it had never stopped (a stop during a
validation abandons it within a window and saves the step; the resume validates it); a resume may also
change the settings in :data:`RESUMABLE` (a longer run, a lower learning rate), and a new
run may start from trained weights (``init_from``). A run that diverges stops without
saving (:class:`Divergence`).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import checkpoint
from .config import TrainConfig, load_config, to_yaml
from .data import batchify, get_batch, load_corpus, window_length
from .distributed import Distributed, launched_by_torchrun, launcher, launcher_as_typed
from .errors import CheckpointError, ConfigError, DataError, Interrupted, RunError, TrainingDiverged
from .evaluate import EvalResult, EvaluationStopped, evaluate
from . import files
from .files import Lock, write_atomically
from .generate import generate
from .metrics import MetricsLog
from .model import SHARNN, State
from .optim import MinTrustLAMB
from .progress import ProgressDisplay
from .tokenizer import Tokenizer, check_corpus_tokenizer
from .runtime import Runtime, autocast, resolve_device


# What a resumed run may change: settings that steer training without changing what its
# checkpoint holds (the model, the data and its streams, the optimizer's state).
RESUMABLE = frozenset({
    "epochs", "max_steps", "max_seconds", "lr", "warmup_steps", "lr_halve_epochs", "clip",
    "valid_every_steps", "checkpoint_every_steps", "log_every_steps", "progress_every_seconds",
    "sample_bytes", "compile", "recompute",
})
# What a run started from a checkpoint's weights (init_from) may change in its model.
INIT_CHANGES = frozenset({"dropouti", "dropouth", "dropouto"})


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch, 0-based
    row: int = 0  # the next window's first row in the train streams
    best_valid_bpc: float = math.inf
    best_step: int = 0
    elapsed: float = 0.0  # training seconds so far (wall clock, validations included)
    finished: bool = False  # all epochs (or max_steps, max_seconds) done and validated
    valid_due: bool = False  # this step's validation is still to do (a stop came before or during it)


def learning_rate(config: TrainConfig, step: int, epoch: int) -> float:
    """Linear warmup over ``warmup_steps`` (step counts from 1), then constant, halved once
    for every entry of ``lr_halve_epochs`` that is <= the 1-based ``epoch + 1``."""
    warmup = min(step / config.warmup_steps, 1.0) if config.warmup_steps else 1.0
    halvings = sum(1 for e in config.lr_halve_epochs if epoch + 1 >= e)
    return config.lr * warmup * 0.5**halvings


def out_of_budget(config: TrainConfig, progress: Progress) -> bool:
    """All epochs done, ``max_steps`` reached, or ``max_seconds`` of training spent."""
    return (
        progress.epoch >= config.epochs
        or (config.max_steps > 0 and progress.step >= config.max_steps)
        or (config.max_seconds > 0 and progress.elapsed >= config.max_seconds)
    )


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> MinTrustLAMB:
    """Min-Trust LAMB over every parameter, with the config's settings."""
    return MinTrustLAMB(
        model.parameters(), lr=config.lr, betas=tuple(config.betas), eps=config.eps,
        weight_decay=config.weight_decay, min_trust=config.min_trust,
    )


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    state: State | None,
    clip: float,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, State]:
    """One step of truncated BPTT: forward a window from the carried state, mean
    cross-entropy, backward, global grad-norm clip (``clip`` 0: none), optimizer step; the
    returned state is detached for the next window.

    Args:
        inputs, targets: ``[T, B]`` int64 token ids; targets are the inputs shifted by one.
        state: the previous window's detached state, or None to start cold.
        autocast_dtype: autocast dtype, or None for fp32.

    Returns:
        ``(loss, grad_norm, state)``: the loss in nats per token and the gradient norm
        before clipping, as 0-dim tensors left on the device (no host synchronisation).
    """
    with autocast(inputs.device.type, autocast_dtype):
        logits, state = model(inputs, state)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm, state.detach()


class TrainingState:
    """Everything training carries from one optimizer step to the next: the model, the
    optimizer, the loss scaler, the RNG that draws window lengths, :class:`Progress`
    (with the stream position) and the recurrent state of the train streams.

    Building it seeds torch with ``config.seed`` and initialises the model, so two
    states built from one config start identical. In a multi-process run
    (:mod:`sharnn.distributed`) each process holds the recurrent state of its block of
    streams, and every process but the first then draws its own dropout masks (seed
    ``config.seed + rank``); the first continues as a single process would.
    """

    def __init__(self, config: TrainConfig, runtime: Runtime, distributed: Distributed = Distributed()):
        torch.manual_seed(config.seed)
        self.device = runtime.device
        self.model = runtime.prepare(SHARNN(config.model))
        self.optimizer = build_optimizer(self.model, config)
        self.scaler = runtime.grad_scaler()
        self.jitter_rng = np.random.default_rng(config.seed)
        self.progress = Progress()
        self.recurrent_state: State | None = None
        self.distributed, self.seed, self.n_layers = distributed, config.seed, config.model.n_layers
        self.streams = distributed.block(config.train_streams, "train_streams")
        if distributed.rank:
            torch.manual_seed(config.seed + distributed.rank)
        self.saved_processes = distributed.world_size  # how many processes the restored state came from

    def state_dict(self) -> dict:
        """``{"model": weights, "recurrent_state": State or None, "trainer": dict}``: what a
        checkpoint stores (the layout of ``trainer``: :mod:`sharnn.checkpoint`). The RNG
        states are the process's, so saving and restoring them resumes dropout exactly.

        In a multi-process run every process must call it: the main process gets the
        recurrent state of all the streams and every process's RNG states (one row per
        process); the others get a partial dict, not to be saved."""
        distributed = self.distributed
        trainer = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "jitter_rng": json.dumps(self.jitter_rng.bit_generator.state),
            "torch_rng": distributed.gather_rows(torch.get_rng_state()),
            "progress": json.dumps(dataclasses.asdict(self.progress)),
        }
        if self.device.type == "cuda":
            trainer["cuda_rng"] = distributed.gather_rows(torch.cuda.get_rng_state(self.device))
        recurrent_state = distributed.gather_streams(self.recurrent_state, self.n_layers)
        return {"model": self.model.state_dict(), "recurrent_state": recurrent_state, "trainer": trainer}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned, RNG states included: this process's
        streams and RNG row. A state saved by another number of processes restores all but
        the dropout RNG, which is then seeded afresh (``saved_processes`` says so).

        Raises:
            RuntimeError, KeyError, ValueError, TypeError: a state that does not fit this
                model or this version's layout.
        """
        trainer, rank = state["trainer"], self.distributed.rank
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(trainer["optimizer"])
        self.scaler.load_state_dict(trainer["scaler"])
        self.jitter_rng.bit_generator.state = json.loads(trainer["jitter_rng"])
        self.progress = Progress(**json.loads(trainer["progress"]))
        torch_rng = trainer["torch_rng"].cpu()
        torch_rng = torch_rng.view(-1, torch_rng.shape[-1])  # one row per process (a 1-D state: one process)
        self.saved_processes = len(torch_rng)
        if self.saved_processes != self.distributed.world_size:  # a seed of its own for this step and process
            torch.manual_seed(self.seed + 1_000_003 * self.progress.step + rank)
        else:  # a row of its own (clone): set_rng_state misreads a view into a larger tensor, and may crash
            torch.set_rng_state(torch_rng[rank].clone())
            if self.device.type == "cuda" and "cuda_rng" in trainer:
                cuda_rng = trainer["cuda_rng"].cpu()
                torch.cuda.set_rng_state(cuda_rng.view(len(torch_rng), -1)[rank].clone(), self.device)
        self.recurrent_state = self.distributed.own_streams(state["recurrent_state"], self.n_layers, self.streams)


def train(
    config: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    quiet: bool = False,
    should_stop: Callable[[Progress], bool] | None = None,
) -> dict:
    """Train an SHA-RNN; return the final summary.

    Args:
        config: the run's configuration. With ``resume``, the run's own (see
            :func:`resume_config`), where only the settings in :data:`RESUMABLE` may differ
            from what the run used so far; each change is recorded in ``metrics.jsonl``.
        run_dir: the run folder; must not exist unless ``resume``.
        resume: continue from ``run_dir/latest`` (a run killed before its first
            checkpoint starts again from step 0). A finished run goes on when the new
            settings give it more budget (``epochs``, ``max_steps``, ``max_seconds``).
        quiet: no progress bar or progress lines.
        should_stop: called with the :class:`Progress` after every optimizer step; when
            it returns True the run saves ``latest`` and stops as Ctrl-C does.

    Returns:
        The summary dict, also written to ``summary.json``: ``valid_bpc`` (best),
        ``test_bpc``, ``test_perplexity`` (per token) and ``test_word_perplexity``
        (WikiText, else None) of the best checkpoint, ``tokenizer`` (its name),
        ``best_step``, ``steps``, ``epochs`` (epochs of training done, a float),
        ``train_seconds``, ``parameters``, ``parameters_collapsed``, ``run_dir``, and
        ``valid_prefix_bytes`` / ``test_prefix_bytes`` (the bytes scored with
        ``valid_max_bytes`` / ``test_max_bytes``, else None) (docs/training.md lists them
        with their units).

    Raises:
        RunError: ``run_dir`` exists or cannot be created (without ``resume``), or is not
            a run folder (with it).
        LockError: another process is training in ``run_dir`` (the main process holds
            ``run_dir/.lock`` for the run's life, from before anything of the run is
            read; the kernel drops it when the process ends, ``kill -9`` too).
        ConfigError: a change of a setting a resume cannot change; an unusable device or
            precision; a ``valid_max_bytes`` or ``test_max_bytes`` prefix too short.
        Interrupted: Ctrl-C, SIGTERM or ``should_stop`` stopped the run (after saving
            ``latest``).
        DataError: the corpus is missing or smaller than one window, or its tokenizer is
            not the model's (another number of token ids; for a trained model, other bytes).
        CheckpointError: a ``latest`` or ``init_from`` checkpoint that cannot be read, or
            a checkpoint that cannot be written (the previous one stays).
        TrainingDiverged: the loss became NaN or infinite, or ran away far above the
            uniform baseline (nothing is saved from that state; the last good checkpoint stays).
    """
    lock = Lock(Path(run_dir) / LOCK_FILE, str(run_dir))
    try:
        return _train(Trainer(config, run_dir, resume=resume, quiet=quiet, lock=lock), config, should_stop)
    finally:
        lock.release()


def _train(trainer: Trainer, config: TrainConfig, should_stop: Callable[[Progress], bool] | None) -> dict:
    """The steps of :func:`train`, with ``trainer`` set up."""
    if trainer.summary is not None:  # resumed a run that had already finished
        return trainer.summary
    with _StopRequest(should_stop, trainer.distributed.active) as stop_requested:
        try:
            with trainer.display:
                _train_steps(trainer, stop_requested)
            summary = trainer.finish(stop_requested.signalled)
        except (EvaluationStopped, KeyboardInterrupt):  # a stop during the test (the training is
            # saved, a resume tests it), or a second signal outside a save: stop at once
            raise trainer.interrupted(stop_requested.signal) from None
    if config.sample_bytes and not trainer.quiet:
        trainer.print_sample()
    return summary


def _train_steps(trainer: Trainer, stop_requested: _StopRequest) -> None:
    """Train until the budget is spent; raise :class:`Interrupted` after saving the step a
    stop was asked at. A run stopped before its step's validation does that first."""
    config, progress = trainer.config, trainer.state.progress
    stop = progress.valid_due and trainer.agree(not _validate_resumed_step(trainer, stop_requested))
    while not (stop or progress.finished):
        epoch_ended = trainer.train_window()
        if epoch_ended:
            trainer.start_next_epoch()
        stop = trainer.agree(stop_requested(progress))
        progress.finished = out_of_budget(config, progress)
        validate = epoch_ended or progress.finished or trainer.due(config.valid_every_steps)
        if validate or stop or trainer.due(config.checkpoint_every_steps):
            stop = _end_step(trainer, stop_requested, validate, stop)
    if stop:
        raise trainer.interrupted(stop_requested.signal)


def _end_step(trainer: Trainer, stop_requested: _StopRequest, validate: bool, stop: bool) -> bool:
    """Validate (unless a stop is asked already), save ``latest`` and return whether to
    stop. A stop asked during the validation abandons it: the step is saved with its
    validation due, which a resume does first (:func:`_validate_resumed_step`), so that
    the run stays exact."""
    progress = trainer.state.progress
    trainer.check_diverged(saving=True)
    valid_bpc = trainer.validate(stop_requested.signalled) if validate and not stop else None
    progress.valid_due = validate and valid_bpc is None
    with stop_requested.deferred():  # a second signal while saving only adds to the request
        trainer.save(valid_bpc)
    stop = trainer.agree(stop or stop_requested.signal is not None)  # a signal during the validation or the save
    if validate:  # it and the save took time too: max_seconds may be spent now
        progress.finished = out_of_budget(trainer.config, progress)
    return stop


def _validate_resumed_step(trainer: Trainer, stop_requested: _StopRequest) -> bool:
    """The validation a resumed step still owes (its run stopped before or during it).
    Its checkpoint, ``latest``, is then written again with the score, and ``best`` points
    to it if it improved. Returns whether it was done (not abandoned)."""
    progress = trainer.state.progress
    valid_bpc = trainer.validate(stop_requested.signalled)
    if valid_bpc is None:
        return False
    progress.valid_due = False
    with stop_requested.deferred():
        trainer.save(valid_bpc, again=True)
    progress.finished = out_of_budget(trainer.config, progress)
    return True


def resume_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The configuration to resume a run with: the one its ``latest`` checkpoint holds (or,
    for a run killed before its first checkpoint, its ``config.yaml``), with ``key=value``
    overrides applied.

    Raises:
        RunError: ``run_dir`` is not a run folder.
        CheckpointError: its stored configuration cannot be read.
        ConfigError: a bad override (whether a resume may change it is checked by :func:`train`).
    """
    run_dir = Path(run_dir)
    checkpoints = checkpoint.RunCheckpoints(run_dir)
    if checkpoints.has_latest():
        source = checkpoints.latest / checkpoint.CONFIG_FILE
    elif (run_dir / "config.yaml").is_file():
        source = run_dir / "config.yaml"
    elif run_dir.is_dir():
        raise RunError(f"{run_dir} is not a run folder (it has no config.yaml or checkpoint); "
                       f"start a run with --preset or --config")
    else:
        raise RunError(f"no run folder {run_dir} to resume")
    try:
        load_config(source)
    except ConfigError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return load_config(source, overrides)


def config_changes(old, new) -> dict[str, list]:
    """The settings that differ between two configurations of one kind (:class:`TrainConfig`
    or :class:`SHARNNConfig`), as ``{key: [old, new]}`` with dotted keys for the model."""
    before, after = _flatten(dataclasses.asdict(old)), _flatten(dataclasses.asdict(new))
    return {key: [before[key], after[key]] for key in before if before[key] != after[key]}


def _flatten(mapping: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


LOCK_FILE = ".lock"  # in a run folder: held by the process that trains in it (sharnn.files.Lock)


class Trainer:
    """One run of the recipe: its set-up (a new run, a resumed one, or one started from
    trained weights) and the named steps :func:`train` calls, around a :class:`TrainingState`."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, lock: Lock, resume: bool = False, quiet: bool = False):
        device = resolve_device(config.device)
        self.distributed = Distributed.from_environment(device.type)
        for name in ("train_streams", "valid_streams", "test_streams"):
            self.distributed.block(getattr(config, name), name)  # refuses streams the processes cannot share
        self.config, self.run_dir, self.lock = config, Path(run_dir), lock
        if resume:  # a new run's folder is locked as it is made (_create_run_folder)
            self.distributed.on_main(self._lock_run_folder)
        self.quiet = quiet or not self.distributed.is_main
        self.summary = None
        self.checkpoints = checkpoint.RunCheckpoints(self.run_dir)
        changes = self._check_resume_config() if resume else {}
        self.runtime = Runtime.for_training(config, self.distributed.device(device))
        self.corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
        check_corpus(config, self.corpus, self._trained_tokenizer(resume))
        self.eval_data = {split: split_prefix(self.corpus, split, limit)
                          for split, limit in (("valid", config.valid_max_bytes), ("test", config.test_max_bytes))}
        self.state = TrainingState(config, self.runtime, self.distributed)
        self.batched = batchify(self.corpus.train, config.train_streams)[:, self.state.streams]
        if resume and self.checkpoints.has_latest():
            self._resume(changes)
        else:
            self._start(restart=resume)
        if self.summary is not None:
            return  # nothing to train: train() returns the summary
        self.saved_step = self.state.progress.step if resume and self.checkpoints.has_latest() else None
        self.train_model = self.distributed.wrap(self.state.model)  # DDP in a multi-process run
        self.param_names = {p: n for n, p in self.state.model.state_dict(keep_vars=True).items()}
        device = self.runtime.device
        self.loss_sum = torch.zeros((), device=device)  # accumulated on the device; read at log steps
        self.divergence = Divergence(config.model.vocab_size, device)
        self.bytes_per_token = mean_bytes_per_token(self.corpus)
        self.log_steps = self.log_tokens = 0
        self.log_start = time.perf_counter()
        self.clock_start = time.perf_counter() - self.state.progress.elapsed
        self.display = ProgressDisplay("train", config.progress_every_seconds, enabled=not self.quiet, start=self.budget_used())

    def _check_resume_config(self) -> dict[str, list]:
        """The settings this resume changes; refuses any that would change what the
        checkpoint holds."""
        changes = config_changes(resume_config(self.run_dir), self.config)
        refused = [key for key in changes if key not in RESUMABLE]
        if refused:
            raise ConfigError(
                f"a resumed run cannot change {', '.join(refused)} (the model, the data or the optimizer state its "
                f"checkpoint holds); start a new run, from its weights with --init-from {self.run_dir} "
                f"(a resume may change: {', '.join(sorted(RESUMABLE))})"
            )
        return changes

    def _trained_tokenizer(self, resume: bool) -> Tokenizer | None:
        """The tokenizer of the trained model this run goes on with (its latest checkpoint)
        or starts from (``init_from``), checked against that model; None for a new model."""
        if resume and self.checkpoints.has_latest():
            return checkpoint.read_tokenizer(self.checkpoints.latest, self.config.model.vocab_size)
        if self.config.init_from:
            source = checkpoint.resolve(self.config.init_from)
            return checkpoint.read_tokenizer(source, checkpoint.read_config(source).model.vocab_size)
        return None

    def _lock_run_folder(self) -> None:
        """Take the run folder to resume for this process alone (a folder that is not a
        run, without ``config.yaml``, is refused by the resume, and gets no lock file)."""
        if (self.run_dir / "config.yaml").is_file():
            self.lock.acquire()

    def _start(self, restart: bool) -> None:
        """A new run, or (``restart``) a run folder that has no checkpoint yet, from step 0.
        The main process alone creates the run folder."""
        source = self._load_init_weights() if self.config.init_from else None
        if restart:
            self.say(f"{self.run_dir} has no checkpoint yet: starting it again from step 0")
        self.metrics = self.distributed.on_main(lambda: self._create_run_folder(restart)) or _NoMetrics()
        model = self.state.model
        self.say(f"model: {model.num_parameters() / 1e6:.2f}M parameters "
                 f"({model.num_parameters(collapsed=True) / 1e6:.2f}M collapsed), {self.runtime.describe()}"
                 + (f", {self.distributed.world_size} processes" if self.distributed.active else ""))
        if source is not None:
            self.say(f"weights from {source}; a new optimizer and schedule")

    def _create_run_folder(self, restart: bool) -> MetricsLog:
        """Create the run folder (with ``restart``, one that exists without a checkpoint),
        its ``config.yaml`` and its metrics, opened with this start's ``run`` record."""
        if not restart and self.run_dir.exists():
            raise RunError(f"run folder {self.run_dir} already exists; resume it with --resume or choose another --out")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=restart)
            self.lock.acquire()
            write_atomically(self.run_dir / "config.yaml", to_yaml(self.config))
        except OSError as e:
            raise RunError(f"cannot create the run folder {self.run_dir}: {e.strerror or e}") from None
        metrics = MetricsLog(self.run_dir, resume_step=0 if restart else None)
        metrics.log(self._run_record())
        metrics.log_config(to_yaml(self.config), 0)
        return metrics

    def _reopen_run_folder(self, changes: dict[str, list]) -> MetricsLog:
        """A resumed run's folder: ``best`` repaired, the metrics opened at the checkpoint's
        step with this resume's ``run`` record (and the test records of a finished run that
        is extended), the changed settings recorded."""
        progress = self.state.progress
        self.checkpoints.repair_best(progress.best_step)
        ended_here = (read_summary(self.run_dir) or {}).get("steps") == progress.step
        metrics = MetricsLog(self.run_dir, resume_step=progress.step, ended_here=ended_here)
        metrics.log(self._run_record())
        if changes:
            metrics.log({"split": "config", "step": progress.step, "epoch": round(self.epochs_done(), 4), "changes": changes})
            write_atomically(self.run_dir / "config.yaml", to_yaml(self.config))
        metrics.log_config(to_yaml(self.config), progress.step)
        return metrics

    def _run_record(self) -> dict:
        """The ``run`` record of this start or resume: the command line and the processes."""
        return {"split": "run", "step": self.state.progress.step, "command": command_line(),
                "processes": self.distributed.world_size}

    def _load_init_weights(self) -> Path:
        """Load the weights of ``init_from`` (its checkpoint folder, returned), whose model
        settings must be this run's but for the dropouts."""
        source = checkpoint.resolve(self.config.init_from)
        changes = config_changes(checkpoint.read_config(source).model, self.config.model)
        refused = [f"model.{key} {theirs} -> {ours}" for key, (theirs, ours) in changes.items() if key not in INIT_CHANGES]
        if refused:
            raise ConfigError(f"init_from {source}: the model must be the checkpoint's, but {', '.join(refused)} "
                              f"(only {', '.join(sorted(INIT_CHANGES))} may differ)")
        checkpoint.load_weights(self.state.model, source, self.runtime.device)
        return source

    def _resume(self, changes: dict[str, list]) -> None:
        self.distributed.on_main(self.checkpoints.remove_staging)  # a save killed by kill -9
        saved = self.checkpoints.load_latest(self.config.model.n_layers, self.runtime.device)
        try:
            self.state.load_state_dict(saved)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            detail = " ".join(str(e).split())[:300]
            raise CheckpointError(f"cannot resume from {self.checkpoints.latest.resolve()}: {detail}") from None
        progress = self.state.progress
        progress.finished = out_of_budget(self.config, progress)
        if progress.finished and "valid_bpc" not in checkpoint.read_info(self.checkpoints.latest):
            progress.valid_due = True  # the new budget ends the run here: its last step is validated, as always
        summary = read_summary(self.run_dir)
        if progress.finished and summary is not None and summary.get("steps") == progress.step:
            self.summary = summary
            self.say(f"{self.run_dir} has finished (step {progress.step}, epoch {self.epochs_done():.2f}); "
                     f"to train on, resume it with a larger max_steps, epochs or max_seconds")
            return
        self.metrics = self.distributed.on_main(lambda: self._reopen_run_folder(changes)) or _NoMetrics()
        self.say(f"resuming {self.run_dir} at step {progress.step} (epoch {self.epochs_done():.2f})")
        if self.state.saved_processes != self.distributed.world_size:
            self.say(f"the checkpoint was saved by {self.state.saved_processes} process(es), this run has "
                     f"{self.distributed.world_size}: the streams are shared out again, and dropout draws fresh masks")
        if changes:
            self.say("changed: " + ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changes.items()))

    def say(self, message: str) -> None:
        if not self.quiet:
            tqdm.write(message, file=sys.stderr)

    def due(self, every: int) -> bool:
        """Whether a periodic event of period ``every`` steps (0: never) falls on this step."""
        return every > 0 and self.state.progress.step % every == 0

    def epochs_done(self) -> float:
        """Epochs of training done: whole epochs plus the fraction of the current one."""
        progress = self.state.progress
        return progress.epoch + progress.row / (self.batched.shape[0] - 1)

    def budget_used(self) -> float:
        """The fraction of the run done, by whichever limit ends it first."""
        config, progress = self.config, self.state.progress
        used = [self.epochs_done() / config.epochs]
        if config.max_steps > 0:
            used.append(progress.step / config.max_steps)
        if config.max_seconds > 0:
            used.append(progress.elapsed / config.max_seconds)
        return min(max(used), 1.0)

    def train_window(self) -> bool:
        """One optimizer step on the next window of the train streams; logs every
        ``log_every_steps``. Returns whether it was the epoch's last window."""
        config, state, progress = self.config, self.state, self.state.progress
        rows = self.batched.shape[0]
        length = window_length(progress.row, rows, config.bptt, state.jitter_rng if config.bptt_jitter else None)
        progress.step += 1
        lr = learning_rate(config, progress.step, progress.epoch)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = get_batch(self.batched, progress.row, length, self.runtime.device)
        loss, grad_norm, state.recurrent_state = train_step(
            self.train_model, state.optimizer, state.scaler, inputs, targets, state.recurrent_state, config.clip,
            self.runtime.autocast_dtype,
        )
        loss = self.distributed.mean(loss)  # over all the streams: every process watches the same loss
        self.divergence.watch(loss, progress.step)
        self.loss_sum += loss
        self.log_steps += 1
        self.log_tokens += length * config.train_streams
        progress.row += length
        progress.elapsed = time.perf_counter() - self.clock_start
        if self.due(config.log_every_steps):
            self._log_training(lr, grad_norm)
        steps = f"{progress.step}/{config.max_steps}" if config.max_steps > 0 else progress.step
        self.display.update(self.budget_used(), step=steps, epoch=f"{self.epochs_done():.2f}/{config.epochs}")
        return progress.row >= rows - 1

    def _log_training(self, lr: float, grad_norm: torch.Tensor) -> None:
        self.check_diverged()
        progress, now = self.state.progress, time.perf_counter()
        bits_per_token = float(self.loss_sum) / self.log_steps / math.log(2)
        bpc = bits_per_token / self.bytes_per_token
        record = {
            "split": "train", "step": progress.step, "epoch": round(self.epochs_done(), 4),
            "seconds": round(progress.elapsed, 2), "bpc": bpc, "lr": lr, "grad_norm": float(grad_norm),
            "tokens_per_s": self.log_tokens / (now - self.log_start),  # training time only: see _paused
        }
        if self.bytes_per_token != 1:
            record["bits_per_token"] = bits_per_token
        trust = {f"trust_ratio/{self.param_names[p]}": float(r) for p, r in self.state.optimizer.trust_ratios.items()}
        self.metrics.log(record, trust)
        self.display.update(bpc=f"{bpc:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}", lr=f"{lr:.2e}")
        self.loss_sum.zero_()
        self.log_steps = self.log_tokens = 0
        self.log_start = now

    def agree(self, stop: bool) -> bool:
        """Whether any process asks to stop; every process takes the longest training time
        so far, so that all of them decide alike when to validate, save and finish."""
        progress = self.state.progress
        stop, progress.elapsed = self.distributed.agree(stop, progress.elapsed)
        return stop

    def start_next_epoch(self) -> None:
        """Back to the start of the train streams, cold (state and memory reset)."""
        progress = self.state.progress
        progress.epoch, progress.row, self.state.recurrent_state = progress.epoch + 1, 0, None

    def check_diverged(self, saving: bool = False) -> None:
        """Stop a run that has diverged (see :class:`Divergence`). Before a save (``saving``)
        the weights must be finite and the last loss not far above the uniform baseline,
        so that no checkpoint is written from a diverged state.

        Raises:
            TrainingDiverged: what happened and at which step, the last good checkpoint,
                and how to resume it.
        """
        problem = self.divergence.problem(self.state.progress.step if saving else None)
        if problem is None and saving and not all(bool(torch.isfinite(p).all()) for p in self.state.model.parameters()):
            problem = f"the weights became NaN or infinite at step {self.state.progress.step}"
        if problem is None:
            return
        if self.checkpoints.has_latest():
            step = checkpoint.read_info(self.checkpoints.latest).get("step", "?")
            kept = (f"the last good checkpoint, step {step}, is kept: resume it with a lower learning rate, "
                    f"e.g. {resume_command(self.run_dir)} lr={self.config.lr / 4:g}")
        else:
            kept = "no checkpoint was written; start again with a lower lr"
        raise TrainingDiverged(f"training diverged: {problem}; stopped without saving ({kept})")

    def validate(self, abandon: Callable[[], bool] | None = None) -> float | None:
        """Score the valid split (its first ``valid_max_bytes``), log it and return its
        BPC (a new best updates the progress); None if ``abandon`` asked to stop first."""
        with self._paused():
            progress = self.state.progress
            result = self._evaluate("valid", self.config.valid_streams, abandon)
            if result is None:
                self.say(f"step {progress.step}: validation abandoned")
                return None
            improved = result.bpc < progress.best_valid_bpc
            if improved:
                progress.best_valid_bpc, progress.best_step = result.bpc, progress.step
            self.distributed.on_main(lambda: self._record(
                {"split": "valid", "step": progress.step, "epoch": round(self.epochs_done(), 4),
                 "seconds": round(progress.elapsed, 2), **scores(result), **self._prefix("valid")}))
            self.say(f"step {progress.step} (epoch {self.epochs_done():.2f}): valid {describe_score(result)}"
                     + self._prefix_words("valid") + (" (best)" if improved else ""))
        return result.bpc

    def _prefix(self, split: str) -> dict:
        """``{"prefix_bytes": N}`` when only the first N bytes of ``split`` are scored, else {}."""
        size = self.eval_data[split][1]
        return {} if size is None else {"prefix_bytes": size}

    def _prefix_words(self, split: str) -> str:
        size = self.eval_data[split][1]
        return "" if size is None else f" on its first {size:,} bytes"

    def save(self, valid_bpc: float | None, again: bool = False) -> None:
        """Checkpoint the training state as ``latest`` (and ``best`` when ``valid_bpc``,
        this step's validation, is the best so far); ``again``: write the step's checkpoint
        again in place, with its validation done on resume."""
        with self._paused():
            progress = self.state.progress
            progress.elapsed = time.perf_counter() - self.clock_start
            info = {"step": str(progress.step), "epochs": f"{self.epochs_done():.4f}",
                    "best_valid_bpc": repr(progress.best_valid_bpc), "best_step": str(progress.best_step)}
            if valid_bpc is not None:
                info["valid_bpc"] = repr(valid_bpc)
            best = valid_bpc is not None and progress.best_step == progress.step
            state = self.state.state_dict()  # every process takes part; the main one writes it
            state["tokenizer"] = self.corpus.tokenizer
            write = self.checkpoints.rewrite if again else self.checkpoints.save
            self.distributed.on_main(lambda: write(progress.step, self.config, state, best=best, info=info))
            self.saved_step = progress.step

    def _record(self, record: dict) -> None:
        """Log a validation or test record and redraw the plot."""
        self.metrics.log(record)
        self.metrics.plot()

    def _evaluate(self, split: str, streams: int, abandon: Callable[[], bool] | None) -> EvalResult | None:
        """Score a split (or its prefix) with the paper's protocol, showing its progress;
        None when ``abandon`` asked to stop between two windows (in any process: all of
        them then abandon it)."""
        config = self.config
        with ProgressDisplay(split, config.progress_every_seconds, enabled=not self.quiet, leave=False) as display:
            try:
                result = evaluate(self.state.model, self.eval_data[split][0], streams, config.bptt,
                                  self.runtime.autocast_dtype, progress=display, block=self.distributed.block(streams, split),
                                  tokenizer=self.corpus.tokenizer, count_words=self.corpus.words is not None, stop=abandon)
            except EvaluationStopped:
                result = None
        if self.distributed.agree(result is None, 0.0)[0]:
            return None
        return self.distributed.combine(result)  # each process scored its block of the streams

    @contextmanager
    def _paused(self):
        """Time spent inside is not training time: it does not count in ``tokens_per_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.log_start += time.perf_counter() - start

    def interrupted(self, signum: int | None) -> Interrupted:
        """The error that ends a stopped run (exit status 128 + the signal: 130 for Ctrl-C),
        with the command that resumes it: from this step when it is saved, else (a second
        signal) from the last checkpoint, or from step 0 without one."""
        name = " by SIGTERM" if signum == signal.SIGTERM else ""
        step, saved = self.state.progress.step, self.saved_step
        if saved == step:
            where = f"at step {step}; continue with"
        elif saved is None:
            where = f"at step {step}, before the first checkpoint; start again from step 0 with"
        else:
            where = f"at step {step}, before saving it; continue from step {saved} with"
        return Interrupted(f"interrupted{name} {where}: {resume_command(self.run_dir)}",
                           exit_code=128 + (signum or signal.SIGINT))

    def finish(self, abandon: Callable[[], bool] | None = None) -> dict:
        """Test the best checkpoint (on the first ``test_max_bytes``), write ``summary.json``;
        the summary.

        Raises:
            EvaluationStopped: ``abandon`` asked to stop during the test (the training is
                saved: a resume tests it).
        """
        config, progress, model = self.config, self.state.progress, self.state.model
        checkpoint.load_weights(model, self.checkpoints.best, self.runtime.device)
        test = self._evaluate("test", config.test_streams, abandon)
        if test is None:
            raise EvaluationStopped
        summary = {
            "run_dir": str(self.run_dir),
            "valid_bpc": progress.best_valid_bpc,
            "valid_prefix_bytes": self.eval_data["valid"][1],
            "test_bpc": test.bpc,
            "test_prefix_bytes": self.eval_data["test"][1],
            "test_perplexity": test.perplexity,
            "test_word_perplexity": test.word_perplexity,
            "tokenizer": self.corpus.tokenizer.name,
            "best_step": progress.best_step,
            "steps": progress.step,
            "epochs": round(self.epochs_done(), 4),
            "train_seconds": round(progress.elapsed, 1),
            "parameters": model.num_parameters(),
            "parameters_collapsed": model.num_parameters(collapsed=True),
        }
        record = {"split": "test", "step": progress.best_step, "epoch": round(self.epochs_done(), 4),
                  "run_step": progress.step, **scores(test), **self._prefix("test")}

        def write_results() -> None:
            self._record(record)
            self.metrics.log_hparams(_flatten(dataclasses.asdict(config)), summary["valid_bpc"], test.bpc, progress.step)
            write_atomically(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")

        self.distributed.on_main(write_results)
        self.metrics.close()
        return summary

    def print_sample(self) -> None:
        """Print ``sample_bytes`` generated from the start of the test split."""
        tokenizer, n = self.corpus.tokenizer, self.config.sample_bytes
        unit = "bytes" if tokenizer.is_bytes else f"{tokenizer.name} tokens"
        prompt = torch.from_numpy(self.corpus.test[:256].astype(np.int64))
        steps = generate(self.state.model, prompt.view(-1, 1), n, temperature=0.8,
                         seed=self.config.seed, autocast_dtype=self.runtime.autocast_dtype)
        sample = [int(tokens[0]) for tokens in steps]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for header, ids, final in ((f"prompt: the first 256 {unit} of the test split", prompt.tolist(), False),
                                   (f"sample: {n} {unit} generated at temperature 0.8", sample, True)):
            print(f"\n--- {header} ---", file=sys.stderr, flush=True)
            print(decoder.decode(tokenizer.decode_bytes(ids), final=final), flush=True)
        print("---", file=sys.stderr)


class Divergence:
    """Watches the training loss on the device, without synchronising the host: a run has
    diverged when a loss is NaN or infinite, or when it stays above ``FACTOR`` times the
    uniform baseline (log2 of the vocabulary: 8 bits for bytes) for more than
    ``GRACE_STEPS`` steps in a row (docs/training.md, "Divergence")."""

    FACTOR = 2.0
    GRACE_STEPS = 20

    def __init__(self, vocab_size: int, device: torch.device):
        self.uniform_bits = math.log2(vocab_size)
        self.limit_nats = self.FACTOR * math.log(vocab_size)
        self.first_nonfinite = torch.zeros((), dtype=torch.long, device=device)
        self.first_runaway = torch.zeros((), dtype=torch.long, device=device)
        self.streak = torch.zeros((), dtype=torch.long, device=device)

    def watch(self, loss: torch.Tensor, step: int) -> None:
        """Note this step's loss (nats per token, a 0-dim tensor)."""
        self.streak = torch.where(loss > self.limit_nats, self.streak + 1, 0)
        for first, bad in ((self.first_nonfinite, ~torch.isfinite(loss)), (self.first_runaway, self.streak > self.GRACE_STEPS)):
            first.copy_(torch.where((first == 0) & bad, step, first))

    def problem(self, saving_step: int | None = None) -> str | None:
        """What went wrong, or None. At a save (``saving_step``), a loss above the limit
        is a problem even within the grace period."""
        nonfinite, runaway = int(self.first_nonfinite), int(self.first_runaway)
        limit = f"{self.FACTOR * self.uniform_bits:g} bits per token ({self.FACTOR:g} x the uniform {self.uniform_bits:g})"
        if nonfinite and not (runaway and runaway < nonfinite):
            return f"the loss became NaN or infinite at step {nonfinite}"
        if runaway:
            return f"the loss stayed above {limit} for {self.GRACE_STEPS} steps, up to step {runaway}"
        if saving_step is not None and int(self.streak) > 0:
            return f"the loss was above {limit} at step {saving_step}, where a checkpoint was due"
        return None


def check_corpus(config: TrainConfig, corpus, trained: Tokenizer | None = None) -> None:
    """Refuse a corpus the run cannot use: a tokenizer that is not the model's (another
    number of token ids than ``model.vocab_size``, bytes being 256; for a trained model,
    ``trained``, other bytes behind its ids: :func:`~sharnn.tokenizer.check_corpus_tokenizer`),
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
    for split, streams, limit in (("valid", config.valid_streams, config.valid_max_bytes),
                                  ("test", config.test_streams, config.test_max_bytes)):
        size = len(split_prefix(corpus, split, limit)[0])
        if size < 2 * streams and limit and size < len(corpus.split(split)):
            raise ConfigError(f"{split}_max_bytes={limit}: the first {limit:,} bytes of the {split} split hold {size:,} "
                              f"tokens, too few for {streams} streams; raise {split}_max_bytes or lower {split}_streams")
        if size < 2 * streams:
            raise DataError(f"corpus {config.data}: the {split} split has {size:,} tokens, too few for {streams} streams")


def split_prefix(corpus, split: str, max_bytes: int) -> tuple[np.ndarray, int | None]:
    """``(ids, bytes)``: the longest prefix of a split whose text is at most ``max_bytes``
    bytes (whole tokens: for a byte corpus, ``max_bytes`` of them) and the bytes of its
    text; the whole split and None when ``max_bytes`` is 0 or the split is no longer."""
    ids = corpus.split(split)
    if max_bytes <= 0:
        return ids, None
    if corpus.tokenizer.is_bytes:
        count = min(max_bytes, len(ids))
        size = count
    else:
        ends = np.cumsum(corpus.tokenizer.byte_lengths()[ids])  # where each token's text ends
        count = int(np.searchsorted(ends, max_bytes, side="right"))
        size = int(ends[count - 1]) if count else 0
    return (ids, None) if count == len(ids) else (ids[:count], size)


def mean_bytes_per_token(corpus) -> float:
    """The train split's bytes per token (1 for bytes): training logs its loss in bits
    per token over this, an estimate of its bits per byte (evaluations count exactly)."""
    if corpus.tokenizer.is_bytes:
        return 1.0
    counts = np.bincount(corpus.train, minlength=corpus.tokenizer.vocab_size)  # no int64 copy of the split
    return float(counts @ corpus.tokenizer.byte_lengths() / len(corpus.train))


def scores(result: EvalResult) -> dict:
    """A split's figures for metrics.jsonl: ``bpc`` (bits per byte of text), ``nats`` (per
    token), and for token corpora ``bits_per_token``, ``perplexity`` (per token) and
    ``word_perplexity`` (WikiText)."""
    figures = {"bpc": result.bpc, "nats": result.nats}
    if result.bytes != result.tokens:
        figures.update(bits_per_token=result.bits_per_token, perplexity=result.perplexity)
    if result.word_perplexity is not None:
        figures["word_perplexity"] = result.word_perplexity
    return figures


def describe_score(result: EvalResult) -> str:
    """``1.2345 BPC`` and, for WikiText, ``, word perplexity 123.4``."""
    words = f", word perplexity {result.word_perplexity:.1f}" if result.word_perplexity is not None else ""
    return f"{result.bpc:.4f} BPC{words}"


def command_line() -> str:
    """This process's command line as a user would type it: under torchrun the launcher's
    command (:func:`sharnn.distributed.launcher`) and ``ARGS``, else
    :func:`sharnn.files.command_line` (``sharnn ARGS`` for the command-line tool)."""
    if launched_by_torchrun():
        command = shlex.join([*launcher(), *sys.argv[1:]])
        return command if launcher_as_typed() else command + "  # torchrun's own options (such as --standalone) not recorded"
    return files.command_line()


def resume_command(run_dir: Path) -> str:
    """The command that resumes ``run_dir`` with this run's processes."""
    return shlex.join([*launcher(), "train", "--resume", str(run_dir)])


def read_summary(run_dir: str | Path) -> dict | None:
    """A run's ``summary.json`` (written when it finished), or None."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


class _NoMetrics:
    """The metrics of a process other than the main one: it records nothing."""

    def log(self, record: dict, extra_scalars: dict | None = None) -> None:
        pass

    def plot(self) -> None:
        pass

    def close(self) -> None:
        pass


class _StopRequest:
    """Whether to stop after this step: Ctrl-C or SIGTERM (the signal schedulers send
    before preempting a job), turned into a flag so that the run stops at a step boundary
    (or abandons a validation or test between two windows) and saves ``latest``; or the
    caller's ``should_stop``. A second signal interrupts at once (KeyboardInterrupt),
    but not while a checkpoint is written (:meth:`deferred`: it stops after it) nor under
    torchrun, which passes a signal on to processes that may have had it already."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, should_stop: Callable[[Progress], bool] | None, under_torchrun: bool = False):
        self.should_stop = should_stop
        self.under_torchrun = under_torchrun
        self.signal: int | None = None  # the first signal received
        self._saving = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __call__(self, progress: Progress) -> bool:
        asked = self.should_stop is not None and bool(self.should_stop(progress))
        return asked or self.signal is not None

    def signalled(self) -> bool:
        """Whether a signal asked to stop (evaluations ask this between two windows)."""
        return self.signal is not None

    @contextmanager
    def deferred(self):
        """Inside, a second signal only adds to the request: a checkpoint being written is
        completed (its files staged, flushed and renamed) before the run stops."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signum
        elif not (self.under_torchrun or self._saving):
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
