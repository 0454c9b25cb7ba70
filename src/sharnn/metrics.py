"""What a run records: ``metrics.jsonl`` (one JSON object per train log, validation and
test), the same scalars as TensorBoard events, and ``bpc.png``.

Every record has ``split`` (train, valid or test), ``step`` and ``epoch``; train records
add ``bpc`` (mean over the logged steps), ``lr``, ``grad_norm``, ``tokens_per_s`` and
``seconds``; valid and test records ``bpc`` and ``nats`` (per byte).
"""

from __future__ import annotations

import json
from pathlib import Path


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
        if self.file.exists():
            lines = self.file.read_text().splitlines()
            self.history = [r for r in map(_parse_json, lines) if r is not None]  # skips a torn last line
        if resume_step is not None:
            self.history = [r for r in self.history if r["step"] <= resume_step and r["split"] != "test"]
            self.file.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        self.tensorboard = SummaryWriter(str(self.folder), purge_step=resume_step)

    def log(self, record: dict, extra_scalars: dict[str, float] | None = None) -> None:
        """Append ``record`` to metrics.jsonl and its numbers (and ``extra_scalars``, such
        as trust ratios) to TensorBoard, as ``SPLIT/KEY`` at the record's step."""
        self.history.append(record)
        with open(self.file, "a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key not in ("step", "split", "epoch") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for key, value in (extra_scalars or {}).items():
            self.tensorboard.add_scalar(key, value, record["step"])
        self.tensorboard.flush()

    def plot(self) -> None:
        """Write ``bpc.png``: train and valid BPC against steps (atomically)."""
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

    def close(self) -> None:
        self.tensorboard.close()


def _parse_json(line: str) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
