"""Tests run torch on one thread: the models here are tiny, and on a loaded 2-core
machine two OpenMP threads spinning against each other are many times slower. The suite
runs two pytest-xdist workers (pyproject.toml), so the few tests that code or train on two threads
share the cores with another worker: their OpenMP threads sleep when they wait
(``OMP_WAIT_POLICY=PASSIVE``, set before torch loads, as the ``sharnn`` command sets it)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from helpers import single_thread, write_small_corpus


def pytest_sessionstart(session):
    """Compile the kernels (or load them from numba's cache) before any test runs: the first
    use on a machine says so on standard error, which a test of a command's output would read."""
    import sharnn.coding.codec  # noqa: F401  (registers every kernel: the step's and the mixing's)
    from sharnn.compiled import ensure_compiled

    ensure_compiled()


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """The first 60,000 bytes of the bundled enwik8 head as a plain file, one per test module."""
    return write_small_corpus(tmp_path_factory.mktemp("data") / "small.txt")
