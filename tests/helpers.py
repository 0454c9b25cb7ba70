"""Shared helpers for tests/test_cli.py and tests/test_train.py: a tiny run configuration,
a small corpus, running the command line (in-process with click's CliRunner, or as a
real process), and comparing checkpoints; and for the mixings' tests (tests/test_matching.py,
tests/test_bitwise.py), their inputs and a digest of their probabilities.

Everything here is sized so that one training run takes a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from sharnn.cli import main
from sharnn.coding.codec import stream_lengths
from sharnn.coding.container import Header
from sharnn.data.corpus import bundled_wikitext2
from sharnn.models import exact

# WikiText-2 (tokenized v1), the copy bundled with the package: {train,valid,test}.txt.gz.
WIKITEXT2 = bundled_wikitext2()

# A tiny SHA-RNN (d 32, Boom 64, span 48) on windows of 16 bytes x 4 streams.
SMALL = [
    "model.d_model=32",
    "model.boom_dim=64",
    "model.attention_span=48",
    "bptt=16",
    "train_streams=4",
    "valid_streams=4",
    "test_streams=2",
    "max_steps=12",
    "log_every_steps=2",
    "checkpoint_every_steps=4",
    "sample_bytes=0",
    "warmup_steps=5",
]

# Longer, with dropout on (so that the torch RNG matters) and validation mid-run:
# for the exact-resume tests.
RESUMABLE = SMALL + [
    "max_steps=40",
    "checkpoint_every_steps=4",
    "valid_every_steps=8",
    "model.dropouti=0.1",
    "model.dropouth=0.1",
    "model.dropouto=0.1",
]

# Real processes run single-threaded: tiny models are fastest that way, and a loaded
# 2-core machine with OpenMP spinning on 2 threads is 10-20x slower.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def write_small_corpus(path: Path, size: int = 60_000) -> Path:
    """The first ``size`` bytes of the bundled enwik8 head, as a plain file."""
    from sharnn.data.corpus import load_corpus

    path.write_bytes(bytes(load_corpus("enwik8-head").train[:size]))
    return path


def cli(*args: str):
    """Run ``sharnn ARGS`` in-process; return click's Result (stdout, stderr, exit_code)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def assert_ok(result) -> None:
    assert result.exit_code == 0, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}\nexception: {result.exception!r}"
    )


def assert_user_error(result, *fragments: str) -> str:
    """A user error: non-zero exit, exactly one line on stderr starting with ``error:``
    (containing every fragment), no traceback, no unexpected exception. Returns the line."""
    assert result.exit_code != 0, f"expected failure, got exit 0; stdout: {result.stdout}"
    # An unexpected exception inside CliRunner is a traceback in a real process.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"unexpected exception (would be a traceback): {result.exception!r}\nstderr: {result.stderr}"
    )
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    line = lines[0]
    assert line.startswith("error:"), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def ctrl_c_as_at_a_terminal() -> None:
    """``preexec_fn`` of a process a test sends Ctrl-C to: SIGINT's default disposition,
    as a command typed at a terminal has. A test run started in the background (``cmd &``
    in a script) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sharnn_process(*args: str, preexec_fn=None, **popen_kwargs) -> subprocess.Popen:
    """Start ``python -m sharnn ARGS`` as a real process (stdout/stderr piped), with
    Ctrl-C as at a terminal (:func:`ctrl_c_as_at_a_terminal`), then ``preexec_fn``."""

    def before_start() -> None:
        ctrl_c_as_at_a_terminal()
        if preexec_fn is not None:
            preexec_fn()

    return subprocess.Popen(
        [sys.executable, "-m", "sharnn", *[str(a) for a in args]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
        preexec_fn=before_start,
        **popen_kwargs,
    )


def wait_for(predicate, process: subprocess.Popen | None = None, timeout: float = 120.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``process`` exits first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process is not None and process.poll() is not None:
            return predicate()
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s")


def signal_when(process: subprocess.Popen, predicate, sig: int, timeout: float = 120.0) -> tuple[str, str]:
    """Wait until ``predicate`` holds, send ``sig`` to ``process`` (unless it has already
    exited), and return its ``(stdout, stderr)``; the process is never left running."""
    try:
        assert wait_for(predicate, process), process.communicate()
        with contextlib.suppress(ProcessLookupError):  # finished already
            os.kill(process.pid, sig)
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(checkpoint) / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    """Every tensor of the two checkpoints' model.safetensors is exactly equal."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{a} and {b} differ in {different}"


def metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl but its ``run`` records (one per start or resume)."""
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r["split"] != "run"]


def checkpoint_step(link: Path) -> int:
    """The step of the checkpoint a ``latest`` / ``best`` link points to."""
    name = Path(link).resolve().name
    assert name.startswith("step-"), name
    return int(name[len("step-") :])


_SHARED: dict[str, Path] = {}


def shared_run(tmp_path_factory) -> Path:
    """One finished run of the SMALL config (made once per session, shared read-only by
    the tests that only read it; tests that change a run copy it first)."""
    if "run" not in _SHARED:
        base = tmp_path_factory.mktemp("shared-run")
        data = write_small_corpus(base / "small.txt")
        run_dir = base / "run"
        with single_thread():
            result = cli("train", "--preset", "tiny", "--out", run_dir, *SMALL, f"data={data}")
        assert_ok(result)
        _SHARED["run"] = run_dir
        _SHARED["stdout"] = result.stdout
        _SHARED["stderr"] = result.stderr
    return _SHARED["run"]


def shared_run_output() -> tuple[str, str]:
    return _SHARED["stdout"], _SHARED["stderr"]


class single_thread:
    """Context manager: torch on one intra-op thread (restored on exit)."""

    def __enter__(self):
        self.previous = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)


def random_log_weights(rows: int, streams: int, scale: float = 4.0) -> np.ndarray:
    """A model's log-weights ``[rows, B, 256]`` (int64, :func:`sharnn.models.exact.log_weights`)
    of normal logits times ``scale``, the same every run (seed 7)."""
    logits = torch.randn(rows, streams, 256, generator=torch.Generator().manual_seed(7)) * scale
    return exact.log_weights(logits).numpy()


def text_grid(text: bytes, rows: int, streams: int) -> np.ndarray:
    """``text`` repeated to ``rows * streams`` bytes and cut into ``streams`` streams: ``[rows, B]`` int64."""
    data = (text * (1 + rows * streams // len(text)))[: rows * streams]
    return np.frombuffer(data, np.uint8).reshape(streams, rows).T.astype(np.int64)


def mixer_digest(mixer, grid: np.ndarray, weights: np.ndarray) -> str:
    """SHA-256 of every probability ``mixer`` gives, walking ``grid [rows, B]`` with the
    model's ``weights [rows, B, 256]`` (the last position codes all streams but the last)."""
    rows, streams = grid.shape
    digest = hashlib.sha256()
    for t in range(rows):
        digest.update(mixer.mix(weights[t]).tobytes())
        mixer.update(grid[t, : streams - 1 if t == rows - 1 else streams])
    return digest.hexdigest()


def older_header(header: Header, data: bytes) -> Header:
    """A version-6 header of the coded ``data`` as versions 1 to 5 keep its CRC32s: one per stream."""
    starts = np.cumsum([0, *stream_lengths(len(data), header.streams)])
    return dataclasses.replace(header, stream_crc32=[zlib.crc32(data[a:b]) for a, b in pairwise(starts)], crc32=None)
