"""Progress shown while training, evaluating and coding: a tqdm bar on a terminal; elsewhere
(a log file, a scheduler's output) one plain line every ``every_seconds``, the first one
only once that much time has passed, so that short work prints nothing.

Progress is a fraction of the whole job, so that the bar and its estimate of the time
left follow whichever limit ends it (epochs, ``max_steps`` or ``max_seconds`` for
training; the windows of a split for evaluation).
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

_STEPS = 1000  # resolution of the bar: tenths of a percent


class _Bar(tqdm):
    """tqdm's bar with the fields as ``{fields}`` in its format: tqdm's own ``{postfix}``
    always opens with a comma."""

    fields = ""

    @property
    def format_dict(self):
        return {**super().format_dict, "fields": f" {self.fields}" if self.fields else ""}


class ProgressDisplay:
    """Progress of one job, as a fraction done in [0, 1] and a few named fields.

    Args:
        label: what is running ("train", "valid", "eval").
        every_seconds: without a terminal, the period of the plain lines (none before it
            has passed once).
        enabled: False shows nothing.
        start: the fraction already done (a resumed run), so that the estimate of the
            time left counts only what this process did.
        leave: keep the bar on screen after :meth:`close` (False for a nested bar).
    """

    def __init__(
        self, label: str, every_seconds: float = 5.0, *, enabled: bool = True, start: float = 0.0, leave: bool = True
    ):
        self.label, self.every_seconds, self.enabled = label, every_seconds, enabled
        self.fraction = self.start = min(max(start, 0.0), 1.0)
        self.fields: dict[str, str] = {}
        self.clock = self.last_line = time.perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = _Bar(
                total=_STEPS,
                initial=round(self.start * _STEPS),
                desc=label,
                leave=leave,
                file=sys.stderr,
                dynamic_ncols=True,
                bar_format="{desc} {percentage:3.0f}%|{bar}|{fields} [{elapsed}<{remaining}]",
            )

    def update(self, fraction: float | None = None, *, done: int | None = None, **fields) -> None:
        """Set the fraction done and any fields (shown as ``name value``); a plain line is
        due only when the fraction is given. ``done``: the tokens processed so far, shown
        as their rate (field ``tok_s``, tokens per second since the display opened)."""
        if done is not None:
            fields["tok_s"] = f"{done / max(time.perf_counter() - self.clock, 1e-9):,.0f}"
        self.fields.update({k: str(v) for k, v in fields.items()})
        if self.bar is not None:
            self.bar.fields = self._fields()
            if fraction is None:
                self.bar.refresh()
        if fraction is None:
            return
        self.fraction = min(max(fraction, 0.0), 1.0)
        if self.bar is not None:
            self.bar.update(round(self.fraction * _STEPS) - self.bar.n)
        elif self.enabled and time.perf_counter() - self.last_line >= self.every_seconds:
            self.last_line = time.perf_counter()
            print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        """The plain progress line: ``label 42% | fields | elapsed 02:10, left 03:00`` (without
        fields: ``label 42% | elapsed ...``)."""
        spent = time.perf_counter() - self.clock
        done = self.fraction - self.start
        left = tqdm.format_interval(spent * (1 - self.fraction) / done) if done > 0 else "?"
        fields = f" | {self._fields()}" if self.fields else ""
        return f"{self.label} {self.fraction:4.0%}{fields} | elapsed {tqdm.format_interval(spent)}, left {left}"

    def finish(self, **fields) -> None:
        """The work is done: the bar's last frame at 100%, with ``fields`` (no plain line is
        added for it: a short job prints none)."""
        self.fields.update({k: str(v) for k, v in fields.items()})
        self.fraction = 1.0
        if self.bar is not None:
            self.bar.fields = self._fields()
            self.bar.update(_STEPS - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fields(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.fields.items())
