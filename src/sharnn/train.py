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

A stopped run (Ctrl-C, a ``should_stop`` hook, kill -9) continues from ``latest`` with
``train(..., resume=True)`` as if it had never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import checkpoint
from .config import TrainConfig, to_yaml
from .data import ByteTokenizer, batchify, get_batch, load_corpus, window_length
from .errors import CheckpointError, ConfigError, DataError, Interrupted, RunError, TrainingDiverged
from .evaluate import evaluate
from .generate import generate
from .metrics import MetricsLog
from .model import SHARNN, State
from .optim import MinTrustLAMB
from .runtime import Runtime, autocast


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
    states built from one config start identical.
    """

    def __init__(self, config: TrainConfig, runtime: Runtime):
        torch.manual_seed(config.seed)
        self.device = runtime.device
        self.model = runtime.prepare(SHARNN(config.model))
        self.optimizer = build_optimizer(self.model, config)
        self.scaler = runtime.grad_scaler()
        self.jitter_rng = np.random.default_rng(config.seed)
        self.progress = Progress()
        self.recurrent_state: State | None = None

    def state_dict(self) -> dict:
        """``{"model": weights, "recurrent_state": State or None, "trainer": dict}``: what a
        checkpoint stores (the layout of ``trainer``: :mod:`sharnn.checkpoint`). The RNG
        states are the process's, so saving and restoring them resumes dropout exactly."""
        trainer = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "jitter_rng": json.dumps(self.jitter_rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
            "progress": json.dumps(dataclasses.asdict(self.progress)),
        }
        if self.device.type == "cuda":
            trainer["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return {"model": self.model.state_dict(), "recurrent_state": self.recurrent_state, "trainer": trainer}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned, RNG states included.

        Raises:
            RuntimeError, KeyError, ValueError, TypeError: a state that does not fit this
                model or this version's layout.
        """
        trainer = state["trainer"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(trainer["optimizer"])
        self.scaler.load_state_dict(trainer["scaler"])
        self.jitter_rng.bit_generator.state = json.loads(trainer["jitter_rng"])
        torch.set_rng_state(trainer["torch_rng"].cpu())
        if self.device.type == "cuda" and "cuda_rng" in trainer:
            torch.cuda.set_rng_state(trainer["cuda_rng"].cpu(), self.device)
        self.progress = Progress(**json.loads(trainer["progress"]))
        self.recurrent_state = state["recurrent_state"]


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
        config: the run's configuration (for ``resume``, the one stored in the run).
        run_dir: the run folder; must not exist unless ``resume``.
        resume: continue from ``run_dir/latest``.
        quiet: no progress bar or progress lines.
        should_stop: called with the :class:`Progress` after every optimizer step; when
            it returns True the run saves ``latest`` and stops as Ctrl-C does.

    Returns:
        The summary dict, also written to ``summary.json``: ``valid_bpc`` (best),
        ``test_bpc`` and ``test_perplexity`` (of the best checkpoint), ``best_step``,
        ``steps``, ``epochs``, ``train_seconds``, ``parameters``,
        ``parameters_collapsed``, ``run_dir``.

    Raises:
        RunError: ``run_dir`` exists (without ``resume``) or has no checkpoint (with it).
        Interrupted: Ctrl-C or ``should_stop`` stopped the run (after saving ``latest``).
        DataError: the corpus is missing or smaller than one window.
        ConfigError: an unusable device or precision, or a model the corpus does not fit.
        CheckpointError: a ``latest`` checkpoint that cannot be read.
        TrainingDiverged: the loss became NaN or infinite (the last good checkpoint stays).
    """
    trainer = Trainer(config, run_dir, resume=resume, quiet=quiet)
    progress = trainer.state.progress
    with _StopRequest(should_stop) as stop_requested, trainer.bar:
        while not progress.finished:
            epoch_ended = trainer.train_window()
            if epoch_ended:
                trainer.start_next_epoch()
            progress.finished = out_of_budget(config, progress)
            stop = stop_requested(progress)
            validate = epoch_ended or progress.finished or trainer.due(config.valid_every_steps)
            if validate or stop or trainer.due(config.checkpoint_every_steps):
                trainer.check_finite(weights=True)
                improved = trainer.validate() if validate else False
                trainer.save(best=improved)
                if validate:  # it and the save took time too: max_seconds may be spent now
                    progress.finished = out_of_budget(config, progress)
                stop = stop or stop_requested.sigint  # Ctrl-C during the validation or the save
            if stop:
                raise trainer.interrupted()
    return trainer.finish()


class Trainer:
    """One run of the recipe: its set-up (or resume) and the named steps :func:`train`
    calls, around a :class:`TrainingState`."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, resume: bool = False, quiet: bool = False):
        self.config, self.run_dir, self.quiet = config, Path(run_dir), quiet
        self.runtime = Runtime.for_training(config)
        self.corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
        check_corpus(config, self.corpus)
        self.state = TrainingState(config, self.runtime)
        self.checkpoints = checkpoint.RunCheckpoints(self.run_dir)
        if resume:
            self._resume()
        else:
            self._create_run_folder()
        self.batched = batchify(self.corpus.train, config.train_streams)
        self.param_names = {p: n for n, p in self.state.model.state_dict(keep_vars=True).items()}
        device = self.runtime.device
        self.loss_sum = torch.zeros((), device=device)  # accumulated on the device; read at log steps
        self.first_bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.log_steps = self.log_tokens = 0
        self.log_start = time.perf_counter()
        self.clock_start = time.perf_counter() - self.state.progress.elapsed
        rows, progress = self.batched.shape[0], self.state.progress
        self.bar = tqdm(total=config.epochs * (rows - 1), initial=progress.epoch * (rows - 1) + progress.row,
                        unit="B", unit_scale=True, disable=True if quiet else None, desc="train", dynamic_ncols=True)

    def _create_run_folder(self) -> None:
        if self.run_dir.exists():
            raise RunError(f"run folder {self.run_dir} already exists; resume it with --resume or choose another --out")
        self.run_dir.mkdir(parents=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.config))
        self.metrics = MetricsLog(self.run_dir)
        model = self.state.model
        self.say(f"model: {model.num_parameters() / 1e6:.2f}M parameters "
                 f"({model.num_parameters(collapsed=True) / 1e6:.2f}M collapsed), {self.runtime.describe()}")

    def _resume(self) -> None:
        saved = self.checkpoints.load_latest(self.config.model.n_layers, self.runtime.device)
        try:
            self.state.load_state_dict(saved)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            detail = " ".join(str(e).split())[:300]
            raise CheckpointError(f"cannot resume from {self.checkpoints.latest.resolve()}: {detail}") from None
        progress = self.state.progress
        progress.finished = progress.finished or out_of_budget(self.config, progress)
        self.checkpoints.repair_best(progress.best_step)
        self.metrics = MetricsLog(self.run_dir, resume_step=progress.step)
        self.say(f"resuming {self.run_dir} at step {progress.step} (epoch {progress.epoch + 1}, row {progress.row})")

    def say(self, message: str) -> None:
        if not self.quiet:
            tqdm.write(message, file=sys.stderr)

    def due(self, every: int) -> bool:
        """Whether a periodic event of period ``every`` steps (0: never) falls on this step."""
        return every > 0 and self.state.progress.step % every == 0

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
            state.model, state.optimizer, state.scaler, inputs, targets, state.recurrent_state, config.clip,
            self.runtime.autocast_dtype,
        )
        self.first_bad_step.copy_(torch.where((self.first_bad_step == 0) & ~torch.isfinite(loss), progress.step, self.first_bad_step))
        self.loss_sum += loss
        self.log_steps += 1
        self.log_tokens += length * config.train_streams
        progress.row += length
        progress.elapsed = time.perf_counter() - self.clock_start
        self.bar.update(length)
        if self.due(config.log_every_steps):
            self._log_training(lr, grad_norm)
        return progress.row >= rows - 1

    def _log_training(self, lr: float, grad_norm: torch.Tensor) -> None:
        self.check_finite()
        progress, now = self.state.progress, time.perf_counter()
        bpc = float(self.loss_sum) / self.log_steps / math.log(2)
        record = {
            "split": "train", "step": progress.step, "epoch": progress.epoch, "seconds": round(progress.elapsed, 2),
            "bpc": bpc, "lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": self.log_tokens / (now - self.log_start),
        }
        trust = {f"trust_ratio/{self.param_names[p]}": float(r) for p, r in self.state.optimizer.trust_ratios.items()}
        self.metrics.log(record, trust)
        self.bar.set_postfix(bpc=f"{bpc:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", lr=f"{lr:.2e}")
        self.loss_sum.zero_()
        self.log_steps = self.log_tokens = 0
        self.log_start = now

    def start_next_epoch(self) -> None:
        """Back to the start of the train streams, cold (state and memory reset)."""
        progress = self.state.progress
        progress.epoch, progress.row, self.state.recurrent_state = progress.epoch + 1, 0, None

    def check_finite(self, weights: bool = False) -> None:
        """Stop on a non-finite loss (and, before a save, non-finite weights).

        Raises:
            TrainingDiverged: naming the first bad step and the last good checkpoint.
        """
        bad = int(self.first_bad_step)
        if not bad and weights and not all(bool(torch.isfinite(p).all()) for p in self.state.model.parameters()):
            bad = self.state.progress.step
        if bad:
            kept = (f"the last good checkpoint is {self.checkpoints.latest}" if self.checkpoints.latest.exists()
                    else "no checkpoint was written")
            raise TrainingDiverged(f"loss or weights became NaN or infinite at step {bad}; stopped ({kept})")

    def validate(self) -> bool:
        """Score the valid split; log it; return whether it is the best so far."""
        config, progress = self.config, self.state.progress
        result = evaluate(self.state.model, self.corpus.valid, config.valid_streams, config.bptt, self.runtime.autocast_dtype)
        improved = result.bpc < progress.best_valid_bpc
        if improved:
            progress.best_valid_bpc, progress.best_step = result.bpc, progress.step
        self.metrics.log({"split": "valid", "step": progress.step, "epoch": progress.epoch,
                          "seconds": round(progress.elapsed, 2), "bpc": result.bpc, "nats": result.nats})
        self.metrics.plot()
        self.say(f"step {progress.step} epoch {progress.epoch + 1}: valid {result.bpc:.4f} BPC" + (" (best)" if improved else ""))
        return improved

    def save(self, best: bool) -> None:
        """Checkpoint the training state as ``latest`` (and ``best``)."""
        self.state.progress.elapsed = time.perf_counter() - self.clock_start
        self.checkpoints.save(self.state.progress.step, self.config, self.state.state_dict(), best=best)

    def interrupted(self) -> Interrupted:
        return Interrupted(f"interrupted at step {self.state.progress.step}; continue with: sharnn train --resume {self.run_dir}")

    def finish(self) -> dict:
        """Test the best checkpoint, write ``summary.json``, print a sample; the summary."""
        config, progress, model = self.config, self.state.progress, self.state.model
        checkpoint.load_weights(model, self.checkpoints.best, self.runtime.device)
        test = evaluate(model, self.corpus.test, config.test_streams, config.bptt, self.runtime.autocast_dtype)
        self.metrics.log({"split": "test", "step": progress.best_step, "epoch": progress.epoch, "bpc": test.bpc, "nats": test.nats})
        summary = {
            "run_dir": str(self.run_dir),
            "valid_bpc": progress.best_valid_bpc,
            "test_bpc": test.bpc,
            "test_perplexity": test.perplexity,
            "best_step": progress.best_step,
            "steps": progress.step,
            "epochs": progress.epoch,
            "train_seconds": round(progress.elapsed, 1),
            "parameters": model.num_parameters(),
            "parameters_collapsed": model.num_parameters(collapsed=True),
        }
        tmp = self.run_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(self.run_dir / "summary.json")
        self.metrics.close()
        if config.sample_bytes and not self.quiet:
            self._print_sample()
        return summary

    def _print_sample(self) -> None:
        tokenizer = ByteTokenizer()
        prompt = tokenizer.encode(bytes(self.corpus.test[:256]))
        steps = generate(self.state.model, prompt.view(-1, 1), self.config.sample_bytes, temperature=0.8,
                         seed=self.config.seed, autocast_dtype=self.runtime.autocast_dtype)
        sample = [int(tokens[0]) for tokens in steps]
        print("\n--- sample (prompt: the first 256 bytes of the test split) ---", file=sys.stderr)
        print(tokenizer.decode(prompt.tolist() + sample))
        print("---", file=sys.stderr)


def check_corpus(config: TrainConfig, corpus) -> None:
    """Refuse a corpus the run cannot use: a train split shorter than one window of every
    stream, evaluation splits too short for their streams, or more byte values than the
    model's vocabulary.

    Raises:
        DataError, ConfigError.
    """
    if config.model.vocab_size < ByteTokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size ({config.model.vocab_size}) is smaller than the corpus's "
                          f"vocabulary ({ByteTokenizer.vocab_size} byte values)")
    need = config.train_streams * (config.bptt + 1)
    if len(corpus.train) < need:
        raise DataError(
            f"corpus {config.data}: the train split has {len(corpus.train):,} bytes, fewer than one window "
            f"({config.train_streams} streams x {config.bptt + 1} bytes = {need:,}); lower train_streams or bptt"
        )
    for split, streams in (("valid", config.valid_streams), ("test", config.test_streams)):
        size = len(corpus.split(split))
        if size < 2 * streams:
            raise DataError(f"corpus {config.data}: the {split} split has {size:,} bytes, too few for {streams} streams")


class _StopRequest:
    """Whether to stop after this step: Ctrl-C (SIGINT, turned into a flag so that the
    run stops at a step boundary and saves ``latest``; a second Ctrl-C interrupts at
    once), or the caller's ``should_stop``."""

    def __init__(self, should_stop: Callable[[Progress], bool] | None):
        self.should_stop = should_stop
        self.sigint = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __call__(self, progress: Progress) -> bool:
        asked = self.should_stop is not None and bool(self.should_stop(progress))
        return asked or self.sigint

    def _handle(self, signum, frame):
        if self.sigint:
            raise KeyboardInterrupt
        self.sigint = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
