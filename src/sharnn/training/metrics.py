"""What a run records: ``metrics.jsonl`` (one JSON object per train log, validation,
test and settings change), the same numbers as TensorBoard events, and ``bpc.png``.

Every record has ``split`` (train, valid, test or config), ``step`` and ``epoch`` (the
epochs done, a float such as 0.667; an int in older files); train records add ``bpc``
(mean over the logged steps), ``lr``, ``grad_norm``, ``tokens_per_s`` and ``seconds``;
valid and test records ``bpc`` (bits per byte of text) and ``nats`` (per token). The test
record's step is that of the best checkpoint, the one tested; its ``run_step`` is the step
the run had reached when it tested (a run extended with ``--resume RUN max_steps=...``
keeps the test records of its earlier ends and adds one at its new end). On a words or wordpiece
corpus (docs/tokenization.md) train records add ``bits_per_token`` (their ``bpc`` is it
over the train split's mean bytes per token), and valid and test records add
``bits_per_token``, ``perplexity`` (per token) and, on WikiText, ``word_perplexity``.

A ``config`` record marks a resumed run whose settings were changed: ``changes`` maps
each changed setting to ``[old, new]``, e.g. ``{"split": "config", "step": 1200,
"epoch": 2.0, "changes": {"lr": [0.002, 0.001], "max_steps": [1200, 1500]}}``. It goes
to TensorBoard as the text ``config/changes`` ("lr: 0.002 -> 0.001", one line per
setting) at its step, and is not plotted.

A ``run`` record marks each start and resume of the run: ``command`` (the command line
that started this part of it, e.g. ``sharnn train --preset tiny``) and ``processes`` (1,
or the number of torchrun processes); it is neither plotted nor sent to TensorBoard.

TensorBoard also gets the resolved configuration as the text ``config`` (at the step of
each start or resume) and, at the end of a run, its settings as hyperparameters with the
metrics ``hparams/valid_bpc`` (the best) and ``hparams/test_bpc`` (the HParams tab), all
in the run folder's own event file: no sub-folder. TensorBoard keeps the first
hyperparameters a folder records: a run extended after its end shows its latest scores
there with the settings of its first end (its ``config`` text has the new ones).
"""

from __future__ import annotations

import io
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..evaluation import EvalResult
from ..files import write_atomically
from .recipe import Progress

UNIFORM_BPC = math.log2(256)  # 8 bits: the cost of guessing bytes uniformly
WARMUP_FRACTION = 0.1  # train points in this first part of the steps may lie above the plot
WARMUP_MIN_POINTS = 20  # ... when there are at least this many train points (a short run shows them all)


class MetricsLog:
    """The metrics of one run folder.

    Args:
        folder: the run folder.
        resume_step: when resuming from the checkpoint of this step, forget what a killed
            run logged after it, so that the log reads as if the run had never stopped.
            Test records of a run that had ended before this step stay; one of a run that
            ended at it stays only with ``ended_here`` (the run finished there and is
            extended), else the resumed run tests again.
        ended_here: whether the run had finished at ``resume_step`` (its summary.json says so).
    """

    def __init__(self, folder: Path, resume_step: int | None = None, ended_here: bool = False):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(folder)
        self.file = self.folder / "metrics.jsonl"
        self.history = read_records(self.folder)
        if resume_step is not None:
            self.history = [r for r in self.history if _kept(r, resume_step, ended_here)]
            write_atomically(self.file, "".join(json.dumps(r) + "\n" for r in self.history).encode())
        # TensorBoard forgets what was logged after the checkpoint's step (not at it: its validation stays)
        self.tensorboard = SummaryWriter(str(self.folder), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, record: dict, extra_scalars: dict[str, float] | None = None) -> None:
        """Append ``record`` to metrics.jsonl and its numbers (and ``extra_scalars``, such
        as trust ratios) to TensorBoard, as ``SPLIT/KEY`` at the record's step; a config
        record's changes as the text ``config/changes``."""
        self.history.append(record)
        with open(self.file, "a") as f:
            f.write(json.dumps(record) + "\n")
        if record["split"] == "run":
            return
        if record["split"] == "config":
            self.tensorboard.add_text("config/changes", _describe_changes(record.get("changes") or {}), record["step"])
        for key, value in record.items():
            if key not in ("step", "split", "epoch", "run_step", "prefix_bytes") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for key, value in (extra_scalars or {}).items():
            self.tensorboard.add_scalar(key, value, record["step"])
        self.tensorboard.flush()

    def log_config(self, yaml: str, step: int) -> None:
        """The resolved configuration ``yaml`` as the TensorBoard text ``config`` at ``step``."""
        self.tensorboard.add_text("config", f"```yaml\n{yaml}```", step)
        self.tensorboard.flush()

    def log_hparams(self, settings: dict, valid_bpc: float | None, test_bpc: float, step: int) -> None:
        """The run's ``settings`` (flat, ``model.d_model``-style keys) as TensorBoard
        hyperparameters, with its best valid and its test BPC as the metrics
        ``hparams/valid_bpc`` (when there is one) and ``hparams/test_bpc``, at ``step``. Written into the run
        folder's event file (``SummaryWriter.add_hparams`` would make a sub-folder)."""
        from torch.utils.tensorboard.summary import hparams

        metrics = {
            key: value
            for key, value in (("hparams/valid_bpc", valid_bpc), ("hparams/test_bpc", test_bpc))
            if value is not None
        }
        values = {
            key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
            for key, value in settings.items()
        }
        for summary in hparams(values, metrics):
            self.tensorboard.file_writer.add_summary(summary, step)
        for key, value in metrics.items():
            self.tensorboard.add_scalar(key, value, step)
        self.tensorboard.flush()

    def plot(self) -> None:
        """Write ``bpc.png``: train and valid BPC against steps, and the test BPC at the
        best checkpoint's step once there is one (atomically)."""
        plot_bpc(self.history, self.folder / "bpc.png", self.folder.name)

    def close(self) -> None:
        self.tensorboard.close()


def plot_bpc(records: list[dict], path: Path, title: str) -> None:
    """Write the ``bpc.png`` figure of a run's ``records`` (see :func:`read_records`) to
    ``path``, titled ``title``, atomically (a temporary file beside it, renamed)."""
    import matplotlib.pyplot as plt

    fig = _figure(records, title)
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    write_atomically(path, image.getvalue())


def read_records(folder: str | Path) -> list[dict]:
    """The records of a run folder's ``metrics.jsonl``, in order (none if it has none); a
    torn last line, left by a kill during its write, is skipped."""
    file = Path(folder) / "metrics.jsonl"
    if not file.exists():
        return []
    return [r for r in map(_parse_json, file.read_text().splitlines()) if r is not None]


def _points(history: list[dict], split: str) -> list[tuple[float, float]]:
    """The finite ``(step, bpc)`` of ``split``'s records, in order of step."""
    points = [(r["step"], r.get("bpc")) for r in history if r.get("split") == split]
    return sorted((s, b) for s, b in points if isinstance(b, (int, float)) and math.isfinite(b) and s is not None)


def _y_range(history: list[dict]) -> tuple[float, float]:
    """The BPC range worth seeing: from a little below the lowest train, valid or test
    point to a little above the highest valid or test point and train point after the
    first ``WARMUP_FRACTION`` of the steps (so a warm-up spike does not squash the rest; with
    fewer than ``WARMUP_MIN_POINTS`` train points, every one); ``(0, 8)`` when there is
    nothing to plot."""
    train, valid, test = (_points(history, split) for split in ("train", "valid", "test"))
    everything = train + valid + test
    if not everything:
        return 0.0, UNIFORM_BPC
    steps = [s for s, _ in everything]
    first, last = min(steps), max(steps)
    after_warmup = [b for s, b in train if s > first + WARMUP_FRACTION * (last - first)]
    if len(train) < WARMUP_MIN_POINTS or not (after_warmup or valid or test):
        after_warmup = [b for _, b in train]
    low = min(b for _, b in everything)
    high = max(after_warmup + [b for _, b in valid + test])
    margin = max(0.05 * (high - low), 0.02 * high, 0.01)
    return max(0.0, low - margin), high + margin


def _figure(history: list[dict], title: str):
    """The ``bpc.png`` figure of ``history`` (records of other splits, such as config,
    are ignored)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for split, style in (("train", "-"), ("valid", "o-")):
        points = _points(history, split)
        if points:
            ax.plot(*zip(*points), style, label=split, markersize=4)
    last_test = [r for r in history if r.get("split") == "test"][-1:]  # the test of the best checkpoint
    for step, bpc in _points(last_test, "test"):
        ax.plot(
            [step],
            [bpc],
            "*",
            color="tab:red",
            markersize=13,
            markeredgecolor="black",
            markeredgewidth=0.6,
            zorder=5,
            label=f"test {bpc:.4f}",
        )
    low, high = _y_range(history)
    if low <= UNIFORM_BPC <= high:
        ax.axhline(UNIFORM_BPC, color="grey", linestyle=":", label="uniform (8 bits)")
    ax.set(xlabel="step", ylabel="bits per byte", title=title)
    ax.set_ylim(low, high)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _kept(record: dict, resume_step: int, ended_here: bool) -> bool:
    """Whether a resume at ``resume_step`` keeps ``record`` (see :class:`MetricsLog`); a
    test record without ``run_step`` (older files) counts as made at its own step."""
    if record["split"] != "test":
        return record["step"] <= resume_step
    run_step = record.get("run_step", record["step"])
    return run_step < resume_step or (run_step == resume_step and ended_here)


def _describe_changes(changes: dict) -> str:
    """``{"lr": [0.002, 0.001]}`` as the Markdown list ``- lr: 0.002 -> 0.001``."""
    lines = [f"- {key}: {json.dumps(old)} -> {json.dumps(new)}" for key, (old, new) in changes.items()]
    return "\n".join(lines) or "(no changes)"


def _parse_json(line: str) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def where(split: str, progress: Progress, epochs: float) -> dict:
    """The first fields of a train or valid record: its split and where the run stands
    (``epochs``: the epochs of training done; ``seconds``: of training)."""
    return {"split": split, "step": progress.step, "epoch": round(epochs, 4), "seconds": round(progress.elapsed, 2)}


def scores(result: EvalResult, prefix_bytes: int | None = None) -> dict:
    """A split's figures for metrics.jsonl: ``bpc`` (bits per byte of text), ``nats`` (per
    token), and for token corpora ``bits_per_token``, ``perplexity`` (per token) and
    ``word_perplexity`` (WikiText); ``prefix_bytes`` too when the split was scored on its
    first ``prefix_bytes`` bytes only (None: the whole split)."""
    figures = {"bpc": result.bpc, "nats": result.nats}
    if result.bytes != result.tokens:
        figures.update(bits_per_token=result.bits_per_token, perplexity=result.perplexity)
    if result.word_perplexity is not None:
        figures["word_perplexity"] = result.word_perplexity
    if prefix_bytes is not None:
        figures["prefix_bytes"] = prefix_bytes
    return figures


def describe_score(result: EvalResult) -> str:
    """``1.2345 BPC`` and, for WikiText, ``, word perplexity 123.4``."""
    words = f", word perplexity {result.word_perplexity:.1f}" if result.word_perplexity is not None else ""
    return f"{result.bpc:.4f} BPC{words}"


class TrainLog:
    """The train records of a run, one every ``log_every_steps``: the mean loss of the
    steps since the previous record, summed on the device so that only a record waits for
    it, and the training throughput, without the time spent inside :meth:`paused`.

    Args:
        device: where the losses are.
        bytes_per_token: the train split's mean bytes per token (1 for bytes): the
            record's ``bpc`` is its bits per token over this.
    """

    def __init__(self, device: torch.device, bytes_per_token: float):
        self.bytes_per_token = bytes_per_token
        self.loss_sum = torch.zeros((), device=device)  # accumulated on the device; read at log steps
        self.steps, self.tokens, self.start = 0, 0, time.perf_counter()

    def add(self, loss: torch.Tensor, tokens: int) -> None:
        """Count one step: its loss (nats per token, a 0-dim tensor) and its tokens."""
        self.loss_sum += loss
        self.steps += 1
        self.tokens += tokens

    def record(self, where: dict, lr: float, grad_norm: torch.Tensor) -> dict:
        """The train record of the steps since the previous one (``where``: its split,
        step, epoch and seconds), with this step's ``lr`` and ``grad_norm``; the next
        record counts from here."""
        now = time.perf_counter()
        bits_per_token = float(self.loss_sum) / self.steps / math.log(2)
        record = {
            **where,
            "bpc": bits_per_token / self.bytes_per_token,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_s": self.tokens / (now - self.start),  # training time only: see paused
        }
        if self.bytes_per_token != 1:
            record["bits_per_token"] = bits_per_token
        self.loss_sum.zero_()
        self.steps = self.tokens = 0
        self.start = now
        return record

    @contextmanager
    def paused(self):
        """Time spent inside is not training time: it does not count in ``tokens_per_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - start
