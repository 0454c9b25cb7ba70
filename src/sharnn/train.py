"""The training recipe (SPEC §3, reference §5): Min-Trust LAMB, linear warmup then a
constant learning rate with halvings, global gradient clipping, truncated BPTT over
contiguous streams with the state and memory carried and detached between windows.

One run writes one folder::

    config.yaml            the resolved TrainConfig
    metrics.jsonl          one JSON object per train log / validation / test
    events.out.tfevents.*  the same scalars (and trust ratios) for TensorBoard
    bpc.png                train and valid BPC against steps
    checkpoints/step-N/    checkpoints (see sharnn.checkpoint); latest -> one, best -> one
    summary.json           final valid and test BPC, parameter counts, steps, time

A killed run (Ctrl-C or kill -9) continues from ``latest`` with :func:`train` and
``resume=True`` as if it had never stopped: model, optimizer, schedule, RNG streams,
stream position, LSTM state and memory are all restored.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import checkpoint
from .config import TrainConfig, to_yaml
from .data import ByteTokenizer, batchify, bptt_windows, get_batch, load_corpus
from .errors import ConfigError, DataError, Interrupted, RunError, TrainingDiverged
from .evaluate import evaluate
from .generate import generate
from .model import SHARNN, State
from .optim import MinTrustLAMB


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU. Raises ConfigError for an unusable device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for a precision setting (None: plain fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision fp16 needs CUDA; use bf16 or fp32 on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def use_fast_path(setting: str, device: torch.device) -> bool:
    """``fast_path`` auto -> on with CUDA, off elsewhere (the eager reference path)."""
    return device.type == "cuda" if setting == "auto" else setting == "on"


def learning_rate(config: TrainConfig, step: int, epoch: int) -> float:
    """Linear warmup over ``warmup_steps`` (step counts from 1), then constant, halved once
    for every entry of ``lr_halve_epochs`` that is <= the 1-based ``epoch + 1``."""
    warmup = min(step / config.warmup_steps, 1.0) if config.warmup_steps else 1.0
    halvings = sum(1 for e in config.lr_halve_epochs if epoch + 1 >= e)
    return config.lr * warmup * 0.5**halvings


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch, 0-based
    row: int = 0  # next window's first row in the batchified train split
    best_valid: float = math.inf  # best valid BPC so far
    best_step: int = 0
    elapsed: float = 0.0  # training seconds so far
    finished: bool = False  # all epochs (or max_steps) done and validated


class Run:
    """The files of one run folder: config, metrics (JSON lines + TensorBoard), plot and
    checkpoint links."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        self.metrics_file = folder / "metrics.jsonl"
        self.history: list[dict] = []
        if self.metrics_file.exists():
            lines = self.metrics_file.read_text().splitlines()
            self.history = [r for r in map(_parse_json, lines) if r is not None]  # skips a torn last line
        if resume_step is not None:  # forget what a killed run logged after its checkpoint
            self.history = [r for r in self.history if r["step"] <= resume_step and r["split"] != "test"]
            self.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        self.tensorboard = SummaryWriter(str(folder), purge_step=resume_step)

    def log(self, record: dict, extra_scalars: dict[str, float] | None = None) -> None:
        self.history.append(record)
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key not in ("step", "split", "epoch") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for key, value in (extra_scalars or {}).items():
            self.tensorboard.add_scalar(key, value, record["step"])
        self.tensorboard.flush()

    def plot(self) -> None:
        """Write ``bpc.png``: train and valid BPC against steps."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for split, style in (("train", "-"), ("valid", "o-")):
            points = [(r["step"], r["bpc"]) for r in self.history if r["split"] == split]
            if points:
                ax.plot(*zip(*points), style, label=split, markersize=4)
        ax.axhline(8.0, color="grey", linestyle=":", label="uniform (8 bits)")
        ax.set(xlabel="step", ylabel="bits per byte", title=self.folder.name)
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        tmp = self.folder / ".bpc.png.tmp"
        fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        tmp.replace(self.folder / "bpc.png")

    def save(self, model, config, progress: Progress, state, trainer: dict, best: bool) -> None:
        """Write checkpoint ``checkpoints/step-N``, point ``latest`` (and ``best``) at it,
        and delete checkpoints no link points to."""
        target = self.folder / "checkpoints" / f"step-{progress.step:08d}"
        if target.exists():
            if target.resolve() in self._linked():
                raise RunError(f"{target} is in use; refusing to overwrite it")
            shutil.rmtree(target)  # left over from a killed run after its last link
        checkpoint.write_checkpoint(target, model, config, state, trainer)
        checkpoint.point(self.folder / "latest", target)
        if best:
            checkpoint.point(self.folder / "best", target)
        linked = self._linked()
        for folder in (self.folder / "checkpoints").iterdir():
            if folder.resolve() not in linked and not folder.name.startswith("."):
                shutil.rmtree(folder)

    def _linked(self) -> set[Path]:
        return {(self.folder / n).resolve() for n in ("latest", "best") if (self.folder / n).exists()}


def _parse_json(line: str) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


class _StopRequest:
    """Turns Ctrl-C (SIGINT) into a flag checked between optimizer steps, so the run stops
    at a step boundary and saves ``latest``. A second Ctrl-C interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if _in_main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def train(config: TrainConfig, run_dir: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    """Train an SHA-RNN; return the final summary.

    Args:
        config: the run's configuration (for ``resume``, the one stored in the run).
        run_dir: the run folder; must not exist unless ``resume``.
        resume: continue from ``run_dir/latest``.
        quiet: no progress bar or progress lines.

    Returns:
        The summary dict, also written to ``summary.json``: ``valid_bpc`` (best),
        ``test_bpc`` (of the best checkpoint), ``steps``, ``epochs``, ``train_seconds``,
        ``parameters`` and ``parameters_collapsed``, ``best_step``, ``run_dir``.

    Raises:
        RunError: ``run_dir`` exists (without ``resume``) or has no checkpoint (with it);
        Interrupted: Ctrl-C stopped the run (after saving ``latest``).
        DataError: the corpus is missing or smaller than one window.
        ConfigError: an unusable device or precision.
        TrainingDiverged: the loss became NaN or infinite (the last good checkpoint stays).
    """
    run_dir = Path(run_dir)
    say = (lambda *a: None) if quiet else (lambda msg: tqdm.write(msg, file=sys.stderr))
    device = resolve_device(config.device)
    amp_dtype = autocast_dtype(config.precision, device)
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    _check_sizes(config, corpus)

    torch.manual_seed(config.seed)
    model = SHARNN(config.model).to(device)
    fast = use_fast_path(config.fast_path, device)
    model.set_execution(fast=fast, compile=fast and config.compile, recompute=config.recompute)
    optimizer = MinTrustLAMB(
        model.parameters(), lr=config.lr, betas=tuple(config.betas), eps=config.eps,
        weight_decay=config.weight_decay, min_trust=config.min_trust,
    )
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    jitter_rng = np.random.default_rng(config.seed)
    progress, state = Progress(), None

    if resume:
        latest = run_dir / "latest"
        if not (latest / checkpoint.MODEL_FILE).is_file():
            raise RunError(f"nothing to resume: {run_dir} has no latest checkpoint")
        checkpoint.load_weights(model, latest, device)
        trainer, state = checkpoint.load_training_state(latest.resolve(), config.model.n_layers, device)
        optimizer.load_state_dict(trainer["optimizer"])
        scaler.load_state_dict(trainer["scaler"])
        jitter_rng.bit_generator.state = json.loads(trainer["jitter_rng"])
        torch.set_rng_state(trainer["torch_rng"].cpu())
        if device.type == "cuda" and "cuda_rng" in trainer:
            torch.cuda.set_rng_state(trainer["cuda_rng"].cpu(), device)
        progress = Progress(**json.loads(trainer["progress"]))
        # A crash between repointing `latest` and `best` leaves `best` behind: repair it.
        best_folder = run_dir / "checkpoints" / f"step-{progress.best_step:08d}"
        if best_folder.is_dir() and (run_dir / "best").resolve() != best_folder.resolve():
            checkpoint.point(run_dir / "best", best_folder)
        run = Run(run_dir, resume_step=progress.step)
        say(f"resuming {run_dir} at step {progress.step} (epoch {progress.epoch + 1}, row {progress.row})")
    else:
        if run_dir.exists():
            raise RunError(f"run folder {run_dir} already exists; resume it with --resume or choose another --out")
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(to_yaml(config))
        run = Run(run_dir)

    n_params = model.num_parameters()
    n_collapsed = model.num_parameters(collapsed=True)
    if not resume:
        path = ("fast path" + (", compiled" if config.compile else "")) if fast else "eager reference path"
        say(f"model: {n_params / 1e6:.2f}M parameters ({n_collapsed / 1e6:.2f}M collapsed), device {device}, {path}")

    def trainer_state() -> dict:
        trainer = {
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "jitter_rng": json.dumps(jitter_rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
            "progress": json.dumps(progress.__dict__),
        }
        if device.type == "cuda":
            trainer["cuda_rng"] = torch.cuda.get_rng_state(device)
        return trainer

    def validate() -> bool:
        result = evaluate(model, corpus.valid, config.valid_streams, config.bptt, amp_dtype)
        improved = result.bits < progress.best_valid
        if improved:
            progress.best_valid, progress.best_step = result.bits, progress.step
        record = {"split": "valid", "step": progress.step, "epoch": progress.epoch, "seconds": round(progress.elapsed, 2)}
        run.log(record | {"bpc": result.bits, "nats": result.nats})
        run.plot()
        say(f"step {progress.step} epoch {progress.epoch + 1}: valid {result.bits:.4f} BPC" + (" (best)" if improved else ""))
        return improved

    param_names = {p: n for n, p in model.named_parameters()}
    batched = batchify(corpus.train, config.batch_size)
    rows = batched.shape[0]
    model.train()
    loss_sum = torch.zeros((), device=device)  # accumulated on the device; read at log steps
    first_bad_step = torch.zeros((), dtype=torch.long, device=device)
    log_steps = log_tokens = 0
    log_start = time.perf_counter()
    train_start = time.perf_counter() - progress.elapsed

    def check_finite(weights: bool = False) -> None:
        """Stop on a non-finite loss (and, before a save, non-finite weights)."""
        bad = int(first_bad_step)
        if not bad and weights and not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            bad = progress.step
        if bad:
            kept = f"the last good checkpoint is {run_dir / 'latest'}" if (run_dir / "latest").exists() else "no checkpoint was written"
            raise TrainingDiverged(f"loss or weights became NaN or infinite at step {bad}; stopped ({kept})")

    def save(best: bool) -> None:
        progress.elapsed = time.perf_counter() - train_start
        run.save(model, config, progress, state, trainer_state(), best=best)

    def interrupted() -> Interrupted:
        return Interrupted(f"interrupted at step {progress.step}; continue with: sharnn train --resume {run_dir}")

    bar = tqdm(total=config.epochs * (rows - 1), initial=progress.epoch * (rows - 1) + progress.row,
               unit="B", unit_scale=True, disable=True if quiet else None, desc="train", dynamic_ncols=True)
    with _StopRequest() as stop, bar:
        while not progress.finished:
            if _out_of_budget(config, progress):
                progress.finished = True
                break
            epoch_done = True
            for row, length in bptt_windows(rows, config.bptt, progress.row, jitter_rng if config.bptt_jitter else None):
                progress.step += 1
                lr = learning_rate(config, progress.step, progress.epoch)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                inputs, targets = get_batch(batched, row, length, device)
                loss, grad_norm, state = train_step(model, optimizer, scaler, inputs, targets, state, config.clip, amp_dtype)

                finite = torch.isfinite(loss)
                first_bad_step.copy_(torch.where((first_bad_step == 0) & ~finite, progress.step, first_bad_step))
                loss_sum += loss
                log_steps += 1
                log_tokens += length * config.batch_size
                progress.row = row + length
                progress.elapsed = time.perf_counter() - train_start
                bar.update(length)
                last_window = progress.row >= rows - 1
                out_of_steps = _out_of_budget(config, progress)

                if progress.step % config.log_every_steps == 0:
                    check_finite()
                    now = time.perf_counter()
                    bpc = float(loss_sum) / log_steps / math.log(2)
                    record = {
                        "split": "train", "step": progress.step, "epoch": progress.epoch, "seconds": round(progress.elapsed, 2), "bpc": bpc,
                        "lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": log_tokens / (now - log_start),
                    }
                    trust = {f"trust_ratio/{param_names[p]}": float(r) for p, r in optimizer.trust_ratios.items()}
                    run.log(record, trust)
                    bar.set_postfix(bpc=f"{bpc:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", lr=f"{lr:.2e}")
                    loss_sum.zero_()
                    log_steps = log_tokens = 0
                    log_start = now

                if last_window or out_of_steps:
                    epoch_done = last_window
                    break
                validated = config.valid_every_steps and progress.step % config.valid_every_steps == 0
                if validated or progress.step % config.checkpoint_every_steps == 0 or stop.requested:
                    check_finite(weights=True)
                    save(best=bool(validated) and validate())
                if stop.requested:
                    raise interrupted()

            # End of an epoch (or of max_steps): validate, checkpoint, move on.
            check_finite(weights=True)
            if epoch_done:
                progress.epoch, progress.row, state = progress.epoch + 1, 0, None
            progress.finished = _out_of_budget(config, progress)
            save(best=validate())
            if stop.requested:
                raise interrupted()

    # Test with the best checkpoint.
    checkpoint.load_weights(model, run_dir / "best", device)
    test = evaluate(model, corpus.test, config.test_streams, config.bptt, amp_dtype)
    run.log({"split": "test", "step": progress.best_step, "epoch": progress.epoch, "bpc": test.bits, "nats": test.nats})
    summary = {
        "run_dir": str(run_dir),
        "valid_bpc": progress.best_valid,
        "test_bpc": test.bits,
        "test_perplexity": test.perplexity,
        "best_step": progress.best_step,
        "steps": progress.step,
        "epochs": progress.epoch,
        "train_seconds": round(progress.elapsed, 1),
        "parameters": n_params,
        "parameters_collapsed": n_collapsed,
    }
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(run_dir / "summary.json")
    run.tensorboard.close()
    if config.sample_bytes and not quiet:
        _print_sample(model, corpus.test, config)
    return summary


def train_step(
    model: SHARNN,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    state: State | None,
    clip: float,
    amp_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, State]:
    """One step of truncated BPTT (reference §5.1): forward a window from the carried
    state, mean cross-entropy, backward, global grad-norm clip (``clip`` 0: none), optimizer
    step; the returned state is detached for the next window.

    Args:
        inputs, targets: ``[T, B]`` int64 token ids; targets are the inputs shifted by one.
        state: the previous window's detached state, or None to start cold.
        amp_dtype: autocast dtype, or None for fp32.

    Returns:
        ``(loss, grad_norm, state)``: the loss in nats per token and the gradient norm
        before clipping, as 0-dim tensors left on the device (no host synchronisation).
    """
    with torch.autocast(inputs.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        logits, state = model(inputs, state)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm, state.detach()


def _out_of_budget(config: TrainConfig, progress: Progress) -> bool:
    """All epochs done, ``max_steps`` reached, or ``max_seconds`` of training spent."""
    return (
        progress.epoch >= config.epochs
        or (config.max_steps > 0 and progress.step >= config.max_steps)
        or (config.max_seconds > 0 and progress.elapsed >= config.max_seconds)
    )


def _check_sizes(config: TrainConfig, corpus) -> None:
    need = config.batch_size * (config.bptt + 1)
    if len(corpus.train) < need:
        raise DataError(
            f"corpus {config.data}: the train split has {len(corpus.train):,} bytes, fewer than one window "
            f"({config.batch_size} streams x {config.bptt + 1} bytes = {need:,}); lower batch_size or bptt"
        )
    for split, streams in (("valid", config.valid_streams), ("test", config.test_streams)):
        size = len(corpus.split(split))
        if size < 2 * streams:
            raise DataError(f"corpus {config.data}: the {split} split has {size:,} bytes, too few for {streams} streams")


def _print_sample(model: SHARNN, test_bytes: np.ndarray, config: TrainConfig) -> None:
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode(bytes(test_bytes[:256]))
    device = next(model.parameters()).device
    sample = list(generate(model, prompt, config.sample_bytes, temperature=0.8, seed=config.seed,
                           autocast_dtype=autocast_dtype(config.precision, device)))
    print("\n--- sample (prompt: the first 256 bytes of the test split) ---", file=sys.stderr)
    print(tokenizer.decode(prompt.tolist() + sample))
    print("---", file=sys.stderr)
