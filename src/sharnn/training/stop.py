"""When a run stops: Ctrl-C, SIGTERM (what cluster schedulers send before preempting a
job) or the caller's hook, turned into a flag read at step boundaries, so that the run saves
``latest`` and stops there (docs/training.md, "Stopping and resuming").
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager

from .recipe import Progress


class StopRequest:
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
