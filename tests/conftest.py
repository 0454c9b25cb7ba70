"""Tests run torch on one thread: the models here are tiny, and on a loaded 2-core
machine two OpenMP threads spinning against each other are many times slower."""

import pytest

from helpers import single_thread


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield
