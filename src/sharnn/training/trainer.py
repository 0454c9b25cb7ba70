"""Training (docs/training.md): :func:`train` runs the recipe (:mod:`sharnn.training.recipe`) step
by step in a run folder (:class:`~sharnn.training.run_folder.RunFolder`), validating, saving and
testing; :class:`Trainer` holds the named steps of its loop.

A stopped run (Ctrl-C, SIGTERM, a ``should_stop`` hook, kill -9) continues from
``latest`` with ``train(..., resume=True)`` as if it had never stopped (a stop during a
validation abandons it within a window and saves the step; the resume validates it); a
resume may also change the settings in :data:`~sharnn.training.run_start.RESUMABLE`, and a new run
may start from trained weights (``init_from``). A run that diverges stops without saving.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from ..config import TrainConfig
from ..data.corpus import batchify, get_batch, load_corpus, mean_bytes_per_token, split_prefix, window_length
from ..errors import TrainingDiverged
from ..evaluation import EvalResult, EvaluationStopped, evaluate
from ..progress import ProgressDisplay
from ..runtime import Runtime, resolve_device
from . import checkpoint, recipe, run_start
from .distributed import Distributed
from .metrics import TrainLog, describe_score, scores, where
from .recipe import Progress, learning_rate, out_of_budget
from .run_folder import RunFolder
from .stop import StopRequest


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
            :func:`resume_config`), where only the settings in :data:`~sharnn.training.run_start.RESUMABLE` may differ
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
            precision; a model whose weights, gradients and moments pass this process's memory
            (refused before it is built); a ``valid_max_bytes`` or ``test_max_bytes`` prefix too short.
        Interrupted: Ctrl-C, SIGTERM or ``should_stop`` stopped the run (after saving
            ``latest``).
        DataError: the corpus is missing or smaller than one window, or its tokenizer is
            not the model's (another number of token ids; for a trained model, other bytes).
        CheckpointError: a ``latest`` or ``init_from`` checkpoint that cannot be read, or
            a checkpoint that cannot be written (the previous one stays).
        TrainingDiverged: the loss became NaN or infinite, or ran away far above the
            uniform baseline (nothing is saved from that state; the last good checkpoint stays).
    """
    device = resolve_device(config.device)
    distributed = Distributed.from_environment(device.type)
    for name in ("train_streams", "valid_streams", "test_streams"):
        distributed.block(getattr(config, name), name)  # refuses streams the processes cannot share
    with RunFolder(run_dir, distributed) as run:
        trainer = Trainer(config, run, device, resume=resume, quiet=quiet)
        if trainer.summary is not None:  # resumed a run that had already finished
            return trainer.summary
        return _train(trainer, config, should_stop)


def _train(trainer: Trainer, config: TrainConfig, should_stop: Callable[[Progress], bool] | None) -> dict:
    """The steps of :func:`train`, with ``trainer`` set up."""
    with StopRequest(should_stop, trainer.distributed.active) as stop_requested:
        try:
            with trainer.display:
                _train_steps(trainer, stop_requested)
            summary = trainer.finish(stop_requested.signalled)
        except (EvaluationStopped, KeyboardInterrupt):  # a stop during the test (the training is
            # saved, a resume tests it), or a second signal outside a save: stop at once
            raise trainer.run.interrupted(stop_requested.signal, trainer.state.progress.step) from None
    return summary


def _train_steps(trainer: Trainer, stop_requested: StopRequest) -> None:
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
        raise trainer.run.interrupted(stop_requested.signal, trainer.state.progress.step)


def _end_step(trainer: Trainer, stop_requested: StopRequest, validate: bool, stop: bool) -> bool:
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


def _validate_resumed_step(trainer: Trainer, stop_requested: StopRequest) -> bool:
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


class Trainer:
    """One run of the recipe in a :class:`RunFolder`: its set-up (a new run, a resumed one,
    or one started from trained weights: :mod:`sharnn.training.run_start`; ``summary`` is set when
    a resumed run had finished already) and the named steps :func:`train` calls, around a
    :class:`~sharnn.training.recipe.TrainingState`.

    Collective: every process of a run calls :meth:`train_window`, :meth:`agree`,
    :meth:`check_diverged`, :meth:`validate`, :meth:`save` and :meth:`finish` at the
    same steps (they average the loss, agree on when to stop, combine the scores, gather
    the checkpoint and raise the main process's errors on all); guarding one of them with
    "main process only" hangs the run. The run folder writes on the main process alone.
    """

    def __init__(self, config: TrainConfig, run: RunFolder, device: torch.device, *, resume: bool, quiet: bool):
        self.config, self.run, self.distributed = config, run, run.distributed
        if resume:  # a new run's folder is locked as it is made (RunFolder.create)
            run.lock_for_resume()
        self.quiet = quiet or not self.distributed.is_main
        changes = run_start.resume_changes(run.path, config) if resume else {}
        self.runtime = Runtime.for_training(config, self.distributed.device(device))
        self.corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
        resumed = resume and run.checkpoints.has_latest()
        run_start.check_corpus(config, self.corpus, run_start.trained_tokenizer(config, run, resumed))
        self.eval_data = {
            split: split_prefix(self.corpus, split, limit)
            for split, limit in (("valid", config.valid_max_bytes), ("test", config.test_max_bytes))
        }
        self.state = state = recipe.TrainingState(config, self.runtime, self.distributed)
        self.batched = batchify(self.corpus.train, config.train_streams)[:, state.streams]
        self.summary = None
        if resumed:
            self.summary = run_start.resume(run, config, state, self.batched.shape[0], changes, self.say)
        else:
            run_start.start(run, config, state.model, self.runtime, resume, self.say)
        if self.summary is not None:
            return  # nothing to train: train() returns the summary
        self.train_model = self.distributed.wrap(state.model)  # DDP in a multi-process run
        self.param_names = {p: n for n, p in state.model.state_dict(keep_vars=True).items()}
        self.divergence = recipe.Divergence(config.model.vocab_size, self.runtime.device)
        self.log = TrainLog(self.runtime.device, mean_bytes_per_token(self.corpus))
        self.clock_start = time.perf_counter() - state.progress.elapsed
        start = recipe.budget_used(config, state.progress, self.epochs_done())
        self.display = ProgressDisplay("train", config.progress_every_seconds, enabled=not self.quiet, start=start)

    def say(self, message: str) -> None:
        if not self.quiet:
            tqdm.write(message, file=sys.stderr)

    def due(self, every: int) -> bool:
        """Whether a periodic event of period ``every`` steps (0: never) falls on this step."""
        return every > 0 and self.state.progress.step % every == 0

    def epochs_done(self) -> float:
        """Epochs of training done: whole epochs plus the fraction of the current one."""
        return self.state.progress.epochs_done(self.batched.shape[0])

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
        loss, grad_norm, state.recurrent_state = recipe.train_step(
            self.train_model,
            state.optimizer,
            state.scaler,
            inputs,
            targets,
            state.recurrent_state,
            config.clip,
            self.runtime.autocast_dtype,
        )
        loss = self.distributed.mean(loss)  # over all the streams: every process watches the same loss
        self.divergence.watch(loss, progress.step)
        self.log.add(loss, length * config.train_streams)
        progress.row += length
        progress.elapsed = time.perf_counter() - self.clock_start
        if self.due(config.log_every_steps):  # a train record, of the steps since the last one
            self.check_diverged()
            record = self.log.record(where("train", progress, self.epochs_done()), lr, grad_norm)
            ratios = getattr(state.optimizer, "trust_ratios", {})  # LAMB's; AdamW has none
            trust = {f"trust_ratio/{self.param_names[p]}": float(r) for p, r in ratios.items()}
            self.run.log(record, trust)
            self.display.update(bpc=f"{record['bpc']:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}", lr=f"{lr:.2e}")
        epochs = self.epochs_done()
        steps = f"{progress.step}/{config.max_steps}" if config.max_steps > 0 else progress.step
        self.display.update(
            recipe.budget_used(config, progress, epochs), step=steps, epoch=f"{epochs:.2f}/{config.epochs}"
        )
        return progress.row >= rows - 1

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
        """Stop a run that has diverged (see :class:`~sharnn.training.recipe.Divergence`). Before a
        save (``saving``) the weights must be finite and the last loss not far above the
        uniform baseline, so that no checkpoint is written from a diverged state.

        Raises:
            TrainingDiverged: what happened and at which step, the last good checkpoint,
                and how to resume it.
        """
        problem = self.divergence.problem(self.state.progress.step if saving else None)
        if problem is None and saving and not all(bool(torch.isfinite(p).all()) for p in self.state.model.parameters()):
            problem = f"the weights became NaN or infinite at step {self.state.progress.step}"
        if problem is not None:
            raise TrainingDiverged(
                f"training diverged: {problem}; stopped without saving ({self.run.kept(self.config.lr)})"
            )

    def validate(self, abandon: Callable[[], bool] | None = None) -> float | None:
        """Score the valid split (its first ``valid_max_bytes``), log it and return its
        BPC (a new best updates the progress); None if ``abandon`` asked to stop first."""
        with self.log.paused():
            progress, size = self.state.progress, self.eval_data["valid"][1]
            result = self._evaluate("valid", self.config.valid_streams, abandon)
            if result is None:
                self.say(f"step {progress.step}: validation abandoned")
                return None
            improved = result.bpc < progress.best_valid_bpc
            if improved:
                progress.best_valid_bpc, progress.best_step = result.bpc, progress.step
            self.run.record({**where("valid", progress, self.epochs_done()), **scores(result, size)})
            self.say(
                f"step {progress.step} (epoch {self.epochs_done():.2f}): valid {describe_score(result)}"
                + ("" if size is None else f" on its first {size:,} bytes")
                + (" (best)" if improved else "")
            )
        return result.bpc

    def save(self, valid_bpc: float | None, again: bool = False) -> None:
        """Checkpoint the training state as ``latest`` (and ``best`` when ``valid_bpc``,
        this step's validation, is the best so far); ``again``: write the step's checkpoint
        again in place, with its validation done on resume."""
        with self.log.paused():
            progress = self.state.progress
            progress.elapsed = time.perf_counter() - self.clock_start
            state = self.state.state_dict()  # every process takes part; the main one writes it
            state["tokenizer"] = self.corpus.tokenizer
            self.run.save(self.config, state, progress, self.epochs_done(), valid_bpc, again=again)

    def _evaluate(self, split: str, streams: int, abandon: Callable[[], bool] | None) -> EvalResult | None:
        """Score a split (or its prefix) with the paper's protocol, showing its progress;
        None when ``abandon`` asked to stop between two windows (in any process: all of
        them then abandon it)."""
        config = self.config
        with ProgressDisplay(split, config.progress_every_seconds, enabled=not self.quiet, leave=False) as display:
            try:
                result = evaluate(
                    self.state.model,
                    self.eval_data[split][0],
                    streams,
                    config.bptt,
                    self.runtime.autocast_dtype,
                    progress=display,
                    block=self.distributed.block(streams, split),
                    tokenizer=self.corpus.tokenizer,
                    count_words=self.corpus.words is not None,
                    stop=abandon,
                )
            except EvaluationStopped:
                result = None
        if self.distributed.agree(result is None, 0.0)[0]:
            return None
        if self.distributed.world_size == 1:
            return result
        return EvalResult.from_totals(self.distributed.sum(result.totals()), words=result.words is not None)

    def finish(self, abandon: Callable[[], bool] | None = None) -> dict:
        """Test the best checkpoint (on the first ``test_max_bytes``), write ``summary.json``;
        the summary.

        Raises:
            EvaluationStopped: ``abandon`` asked to stop during the test (the training is
                saved: a resume tests it).
        """
        checkpoint.load_weights(self.state.model, self.run.checkpoints.best, self.runtime.device)
        test = self._evaluate("test", self.config.test_streams, abandon)
        if test is None:
            raise EvaluationStopped
        prefix_bytes = {split: size for split, (_, size) in self.eval_data.items()}
        return self.run.finish(
            self.config, self.state, test, self.corpus.tokenizer.name, self.epochs_done(), prefix_bytes
        )
