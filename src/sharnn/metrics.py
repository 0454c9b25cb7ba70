"""What a run records: ``metrics.jsonl`` (one JSON object per train log, validation,
test and settings change), the same numbers as TensorBoard events, and ``bpc.png``.

Every record has ``split`` (train, valid, test or config), ``step`` and ``epoch`` (the
epochs done, a float such as 0.667; an int in older files); train records add ``bpc``
(mean over the logged steps), ``lr``, ``grad_norm``, ``tokens_per_s`` and ``seconds``;
valid and test records ``bpc`` (bits per byte of text) and ``nats`` (per token). The test
record's step is that of the best checkpoint, the one tested. On a words or wordpiece
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
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from .files import write_atomically

UNIFORM_BPC = math.log2(256)  # 8 bits: the cost of guessing bytes uniformly
WARMUP_FRACTION = 0.1  # train points in this first part of the steps may lie above the plot


class MetricsLog:
    """The metrics of one run folder.

    Args:
        folder: the run folder.
        resume_step: when resuming from the checkpoint of this step, forget what a killed
            run logged after it (and any test record), so that the log reads as if the
            run had never stopped.
    """

    def __init__(self, folder: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(folder)
        self.file = self.folder / "metrics.jsonl"
        self.history: list[dict] = []
        self.history = read_records(self.folder)
        if resume_step is not None:
            self.history = [r for r in self.history if r["step"] <= resume_step and r["split"] != "test"]
            self.file.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        self.tensorboard = SummaryWriter(str(self.folder), purge_step=resume_step)

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
            if key not in ("step", "split", "epoch") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for key, value in (extra_scalars or {}).items():
            self.tensorboard.add_scalar(key, value, record["step"])
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
    first ``WARMUP_FRACTION`` of the steps (so a warm-up spike does not squash the rest);
    ``(0, 8)`` when there is nothing to plot."""
    train, valid, test = (_points(history, split) for split in ("train", "valid", "test"))
    everything = train + valid + test
    if not everything:
        return 0.0, UNIFORM_BPC
    steps = [s for s, _ in everything]
    first, last = min(steps), max(steps)
    after_warmup = [b for s, b in train if s > first + WARMUP_FRACTION * (last - first)]
    if not after_warmup and not valid and not test:
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
        ax.plot([step], [bpc], "*", color="tab:red", markersize=13, markeredgecolor="black",
                markeredgewidth=0.6, zorder=5, label=f"test {bpc:.4f}")
    low, high = _y_range(history)
    if low <= UNIFORM_BPC <= high:
        ax.axhline(UNIFORM_BPC, color="grey", linestyle=":", label="uniform (8 bits)")
    ax.set(xlabel="step", ylabel="bits per byte", title=title)
    ax.set_ylim(low, high)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _describe_changes(changes: dict) -> str:
    """``{"lr": [0.002, 0.001]}`` as the Markdown list ``- lr: 0.002 -> 0.001``."""
    lines = [f"- {key}: {json.dumps(old)} -> {json.dumps(new)}" for key, (old, new) in changes.items()]
    return "\n".join(lines) or "(no changes)"


def _parse_json(line: str) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
