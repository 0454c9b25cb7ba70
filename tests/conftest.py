"""Tests run torch on one thread: the models here are tiny, and on a loaded 2-core
machine two OpenMP threads spinning against each other are many times slower."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import single_thread  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield
