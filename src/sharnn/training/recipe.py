"""The training recipe (paper §4.1 and Table 2; docs/training.md): what one optimizer step
does and what training carries from one step to the next.

- :func:`learning_rate`: linear warmup, then constant or a cosine decay, with halvings;
- :func:`build_optimizer` and :func:`train_step`: Min-Trust LAMB (or AdamW), one window of
  truncated BPTT with global gradient clipping, the state and memory carried and detached;
- :class:`Progress`, :func:`out_of_budget`, :func:`budget_used`: where training stands,
  and when it ends;
- :class:`Divergence`: when a run has diverged;
- :class:`TrainingState`: everything a step carries to the next (its ``state_dict()`` is
  what a checkpoint stores and what resume restores; layout: :mod:`sharnn.training.checkpoint`).

The loop that runs the recipe and writes the run folder is :func:`sharnn.training.trainer.train`;
compression's online mode (:mod:`sharnn.coding.codec`) and the benchmarks take their steps here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..models.build import state_from_tensors
from ..models.sharnn import State
from ..runtime import TRAINING_BYTES_PER_PARAMETER, Runtime, autocast, build_within_memory
from .distributed import Distributed
from .optim import MinTrustLAMB


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

    def epochs_done(self, rows: int) -> float:
        """Epochs of training done: whole epochs plus the fraction of the current one, in
        train streams of ``rows`` rows."""
        return self.epoch + self.row / (rows - 1)


def learning_rate(config: TrainConfig, step: int, epoch: int) -> float:
    """The learning rate of optimizer step ``step`` (counted from 1) in the 0-based ``epoch``.

    Linear warmup over ``warmup_steps`` (``lr * step / warmup_steps``); then constant at
    ``lr``, or with ``lr_decay_steps`` > 0 nanoGPT's cosine decay from ``lr`` at the end of
    the warmup to ``min_lr`` at step ``lr_decay_steps``, and ``min_lr`` after it. The result
    is halved once for every entry of ``lr_halve_epochs`` that is <= the 1-based ``epoch + 1``.
    It depends on the step and epoch only, never on the wall clock."""
    warmup = config.warmup_steps
    if config.lr_decay_steps and step > warmup:
        progress = min((step - warmup) / (config.lr_decay_steps - warmup), 1.0)
        base = config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.min_lr)
    else:
        base = config.lr * (min(step / warmup, 1.0) if warmup else 1.0)
    halvings = sum(1 for e in config.lr_halve_epochs if epoch + 1 >= e)
    return base * 0.5**halvings


def out_of_budget(config: TrainConfig, progress: Progress) -> bool:
    """All epochs done, ``max_steps`` reached, or ``max_seconds`` of training spent."""
    return (
        progress.epoch >= config.epochs
        or (config.max_steps > 0 and progress.step >= config.max_steps)
        or (config.max_seconds > 0 and progress.elapsed >= config.max_seconds)
    )


def budget_used(config: TrainConfig, progress: Progress, epochs: float) -> float:
    """The fraction of the run done, by whichever limit ends it first; ``epochs``: the
    epochs of training done (a float)."""
    used = [epochs / config.epochs]
    if config.max_steps > 0:
        used.append(progress.step / config.max_steps)
    if config.max_seconds > 0:
        used.append(progress.elapsed / config.max_seconds)
    return min(max(used), 1.0)


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, with the config's ``lr``, ``betas``, ``eps``
    and ``weight_decay``: ``lamb``, :class:`~sharnn.training.optim.MinTrustLAMB` over every parameter
    (``min_trust`` 0: plain LAMB); ``adamw``, ``torch.optim.AdamW`` in two groups as nanoGPT
    builds it: ``weight_decay`` on the parameters of 2 or more dimensions (matrices and
    embeddings), none on the others (biases, gains, gate vectors)."""
    if config.optimizer == "lamb":
        return MinTrustLAMB(
            model.parameters(),
            lr=config.lr,
            betas=tuple(config.betas),
            eps=config.eps,
            weight_decay=config.weight_decay,
            min_trust=config.min_trust,
        )
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=config.lr, betas=tuple(config.betas), eps=config.eps
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
        for first, bad in (
            (self.first_nonfinite, ~torch.isfinite(loss)),
            (self.first_runaway, self.streak > self.GRACE_STEPS),
        ):
            first.copy_(torch.where((first == 0) & bad, step, first))

    def problem(self, saving_step: int | None = None) -> str | None:
        """What went wrong, or None. At a save (``saving_step``), a loss above the limit
        is a problem even within the grace period."""
        nonfinite, runaway = int(self.first_nonfinite), int(self.first_runaway)
        limit = (
            f"{self.FACTOR * self.uniform_bits:g} bits per token ({self.FACTOR:g} x the uniform {self.uniform_bits:g})"
        )
        if nonfinite and not (runaway and runaway < nonfinite):
            return f"the loss became NaN or infinite at step {nonfinite}"
        if runaway:
            return f"the loss stayed above {limit} for {self.GRACE_STEPS} steps, up to step {runaway}"
        if saving_step is not None and int(self.streak) > 0:
            return f"the loss was above {limit} at step {saving_step}, where a checkpoint was due"
        return None


class TrainingState:
    """Everything training carries from one optimizer step to the next: the model, the
    optimizer, the loss scaler, the RNG that draws window lengths, :class:`Progress`
    (with the stream position) and the recurrent state of the train streams.

    Building it seeds torch with ``config.seed`` and initialises the model, so two
    states built from one config start identical. In a multi-process run
    (:mod:`sharnn.training.distributed`) each process holds the recurrent state of its block of
    streams, and every process but the first then draws its own dropout masks (seed
    ``config.seed + rank``); the first continues as a single process would.
    """

    def __init__(self, config: TrainConfig, runtime: Runtime, distributed: Distributed = Distributed()):
        torch.manual_seed(config.seed)
        self.device = runtime.device
        self.model = runtime.prepare(build_within_memory(config.model, TRAINING_BYTES_PER_PARAMETER, "training"))
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
        checkpoint stores (the layout of ``trainer``: :mod:`sharnn.training.checkpoint`). The RNG
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
        recurrent_state = self.recurrent_state
        if distributed.active and recurrent_state is not None:  # cold streams carry nothing to gather
            tensors = distributed.gather_streams(recurrent_state.tensors())
            recurrent_state = None if tensors is None else state_from_tensors(tensors, self.n_layers)
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
        self.recurrent_state = block_of_streams(state["recurrent_state"], self.streams, self.n_layers)


def block_of_streams(state: State | None, streams: slice, n_layers: int) -> State | None:
    """A process's ``streams`` of a recurrent state saved for all of them (every tensor
    ``[..., B, ...]``, the streams on dim 1), copied; None for cold streams."""
    if state is None:
        return None
    return state_from_tensors({name: t[:, streams].contiguous() for name, t in state.tensors().items()}, n_layers)
