"""Hostile resources: an address-space limit (``ulimit -v``, ``RLIMIT_AS``) too small for
the coding commands is one ``error:`` line and exit status 1, never an abort, a hang or a
half-written file.

Below about 1 GB, torch, OpenBLAS and numba's LLVM fail inside native code that no Python
can catch: LLVM aborts ("Buffer allocation failed", "Allocation failed"), scipy's OpenBLAS
retries its buffer for ever, numpy's exits with its own line. So the commands refuse such
a limit before any of them loads (:func:`sharnn.address_space.check_address_space`); past it,
what fails is an allocation the commands refuse in one line.

Limits are real limits in a subprocess (``preexec_fn``), or a patched ``getrlimit`` in
process; nothing exhausts this machine's memory.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import sharnn.address_space as address_space
import sharnn.runtime as runtime
from helpers import SUBPROCESS_ENV, write_small_corpus
from sharnn.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_FILE = ROOT / "tests" / "data" / "v5-shipped.shz"  # the shipped model's, with the context mixing


def _limited(kib: int):
    """``preexec_fn``: an address-space limit of ``kib`` KiB, as ``ulimit -v KIB``, on one
    CPU (what the libraries map grows with the CPUs: the limits below are one CPU's,
    whatever machine runs the tests)."""

    def limit() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        resource.setrlimit(resource.RLIMIT_AS, (kib << 10, kib << 10))

    return limit


ONE_CPU = SUBPROCESS_ENV | {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # numba counts the machine's CPUs


def _sharnn_under(kib: int, *args, cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-m", "sharnn", *map(str, args)],
            capture_output=True,
            text=True,
            env=ONE_CPU,
            preexec_fn=_limited(kib),
            cwd=cwd,
            timeout=300,
        )
    except subprocess.TimeoutExpired as e:  # scipy's OpenBLAS retrying its buffer for ever
        raise AssertionError(f"sharnn {' '.join(map(str, args))} hung under ulimit -v {kib}") from e


def _assert_one_error_line(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 1, f"exit {done.returncode} (negative: killed by that signal)\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def text(tmp_path) -> Path:
    """A few KB of English (the head of enwik8), alone in its folder."""
    folder = tmp_path / "work"
    folder.mkdir()
    return write_small_corpus(folder / "small.txt", 4_000)


# ----------------------------------------------------------------------------- the check, in process


@pytest.fixture()
def limit(monkeypatch):
    """Pretend this process's address-space limit is ``set(bytes)`` (None: unlimited), on
    ``cpus`` CPUs; OPENBLAS_NUM_THREADS unset, and put back after."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)

    def set_limit(size: int | None, cpus: int = 2) -> None:
        soft = resource.RLIM_INFINITY if size is None else size
        monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)

    return set_limit


def test_without_an_address_space_limit_nothing_is_checked_or_set(limit):
    limit(None)
    address_space.check_address_space("sharnn compress", need=1 << 60)
    assert "OPENBLAS_NUM_THREADS" not in os.environ


def test_a_limit_below_what_the_libraries_map_is_refused_in_one_line(limit):
    limit(1_000_000 << 10)  # ulimit -v 1000000, the issue's
    with pytest.raises(ConfigError) as refused:
        address_space.check_address_space("sharnn compress")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("sharnn compress needs an address space of at least 1.28 GiB")
    assert "address-space limit (0.95 GiB)" in message and "ulimit -v" in message
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"  # set before OpenBLAS loads: one thread, one buffer


def test_a_limit_past_what_the_libraries_map_passes(limit):
    limit(2 << 30)
    address_space.check_address_space("sharnn compress")
    with pytest.raises(ConfigError, match=r"at least 2\.28 GiB"):  # the context tables too
        address_space.check_address_space(
            "sharnn compress", address_space.LIBRARIES_ADDRESS_SPACE + address_space.CONTEXT_TABLES_ADDRESS_SPACE
        )


def test_the_need_grows_with_the_cpus_and_the_openblas_threads(limit, monkeypatch):
    limit(2 << 30, cpus=64)  # 1.25 GiB and 63 x 32 MiB: 3.22 GiB
    with pytest.raises(ConfigError, match=r"at least 3\.22 GiB"):
        address_space.check_address_space("sharnn compress")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")  # the user's: kept, and counted
    with pytest.raises(ConfigError, match=r"at least 3\.88 GiB"):
        address_space.check_address_space("sharnn compress")
    assert os.environ["OPENBLAS_NUM_THREADS"] == "8"


def test_a_mapping_the_system_refuses_is_out_of_memory():
    assert runtime.out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert not runtime.out_of_memory(OSError(errno.EACCES, "Permission denied"))
    with (
        pytest.raises(ConfigError, match=r"^coding ran out of memory$"),
        runtime.out_of_memory_as(ConfigError, "coding ran out of memory"),
    ):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    with pytest.raises(PermissionError), runtime.out_of_memory_as(ConfigError, "not this"):
        raise PermissionError(errno.EACCES, "Permission denied")


# ----------------------------------------------------------------------------- real processes under a limit


@pytest.mark.slow  # a real process
def test_the_check_loads_no_library():
    code = (
        "import sys; import sharnn.address_space; "
        "print(sorted(m for m in ('torch', 'numpy', 'numba', 'scipy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.slow  # real processes under a memory limit
@pytest.mark.parametrize("kib", [500_000, 1_000_000], ids=["500MB", "1GB"])
@pytest.mark.parametrize("online", [False, True], ids=["shipped", "online"])
def test_compress_under_a_small_address_space_is_one_line_and_nothing_is_left(text, kib, online):
    done = _sharnn_under(kib, "compress", "-q", *(["--online"] if online else []), text.name, cwd=text.parent)
    _assert_one_error_line(done, "sharnn compress needs an address space of at least", "ulimit -v")
    assert sorted(os.listdir(text.parent)) == [text.name]  # no .shz, no temporary file


@pytest.mark.slow  # real processes under a memory limit
def test_compress_past_the_libraries_but_short_of_the_coding_is_one_line_and_nothing_is_left(text):
    done = _sharnn_under(1_600_000, "compress", "-q", text.name, cwd=text.parent)  # the context tables do not fit
    _assert_one_error_line(done)
    assert sorted(os.listdir(text.parent)) == [text.name]


@pytest.mark.slow  # real processes under a memory limit
def test_decompress_under_a_small_address_space_is_one_line_and_nothing_is_left(tmp_path):
    compressed = tmp_path / SHIPPED_FILE.name
    compressed.write_bytes(SHIPPED_FILE.read_bytes())
    done = _sharnn_under(1_000_000, "decompress", "-q", compressed.name, cwd=tmp_path)
    _assert_one_error_line(done, "sharnn decompress needs an address space of at least")
    assert sorted(os.listdir(tmp_path)) == [compressed.name]


@pytest.mark.slow  # real processes under a memory limit
def test_under_a_limit_past_the_need_a_file_goes_both_ways_and_short_of_it_decoding_is_one_line(text):
    folder = text.parent
    assert _sharnn_under(3_000_000, "compress", "-q", text.name, cwd=folder).returncode == 0  # 2.1 GB measured
    done = _sharnn_under(3_000_000, "decompress", "-q", "-c", f"{text.name}.shz", cwd=folder)
    assert done.returncode == 0 and done.stdout == text.read_text(), done.stderr
    done = _sharnn_under(1_600_000, "decompress", "-q", f"{text.name}.shz", "-o", "back.txt", cwd=folder)
    _assert_one_error_line(done)  # past the libraries, short of the context tables
    assert sorted(os.listdir(folder)) == sorted([text.name, f"{text.name}.shz"])
