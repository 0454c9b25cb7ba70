"""The compiled core's rules (sharnn.compiled, docs/compression.md "The compiled core"), kept
by reading every registered kernel: fastmath off, cached, declared signatures, no libm
transcendental; parallel kernels giving the same bits on one and two threads; the first
use on a machine saying in one line that it compiles; torch's thread count left as set."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
import torch

import sharnn.coding.codec  # noqa: F401  (registers the coder's kernels)
from sharnn import compiled
from sharnn.coding.environment import coding_threads

# Functions whose results differ between libm implementations (and numba calls libm for them).
TRANSCENDENTALS = {
    "exp", "expm1", "exp2", "log", "log2", "log10", "log1p", "pow", "power", "float_power",
    "tanh", "sinh", "cosh", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "asin", "acos", "atan",
    "atan2", "arctan2", "erf", "erfc", "gamma", "lgamma", "cbrt", "hypot",
}  # fmt: skip


def test_kernels_are_registered():
    assert compiled.KERNELS, "importing the coder registers its kernels"


@pytest.mark.parametrize("kernel", compiled.KERNELS, ids=lambda k: k.py_func.__qualname__)
def test_every_kernel_keeps_the_rules(kernel):
    assert kernel.stats.cache_path is not None, "cache=True: compiled once per CPU, then loaded"
    assert kernel.declared_signatures, "a kernel declares its signatures (ensure_compiled compiles them)"
    _keeps_the_arithmetic_rules(kernel)


@pytest.mark.parametrize("helper", compiled.INLINED, ids=lambda k: k.py_func.__qualname__)
def test_every_inlined_helper_keeps_the_rules(helper):
    assert helper.targetoptions.get("inline") == "always", "compiled into its callers"
    _keeps_the_arithmetic_rules(helper)


def test_the_helpers_of_the_coder_are_inlined():
    """Mixing 3's node and what it calls are compiled into their kernels, not called."""
    names = {helper.py_func.__qualname__ for helper in compiled.INLINED}
    assert {"_node", "_slots", "_split", "_masses", "_squash", "_clip", "_fetch_slots", "_fetch_apms"} <= names
    assert not names & {kernel.py_func.__qualname__ for kernel in compiled.KERNELS}


def _keeps_the_arithmetic_rules(dispatcher) -> None:
    """fastmath off; no libm transcendental or ``**`` with a variable exponent in its source."""
    options = dispatcher.targetoptions
    assert not options.get("fastmath"), "fastmath reorders sums and fuses products: bits differ between CPUs"
    tree = ast.parse(textwrap.dedent(inspect.getsource(dispatcher.py_func)))
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert not called & TRANSCENDENTALS, f"libm differs between systems: use a table ({called & TRANSCENDENTALS})"
    powers = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _constant(node.right)
    ]
    assert not powers, "x ** y with a variable exponent calls libm's pow"


def _constant(node: ast.expr) -> bool:
    """A literal, or a module constant (an upper-case name, folded when the kernel compiles)."""
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id.isupper())


def test_the_rules_test_sees_what_it_forbids():
    def bad(x):
        return np.exp(x) + math_like.tanh(x)  # noqa: F821

    tree = ast.parse(textwrap.dedent(inspect.getsource(bad)))
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert called & TRANSCENDENTALS == {"exp", "tanh"}


def test_coding_threads_leave_torchs_count_as_set():
    """numba's OpenMP layer would reset torch's thread count when its pool starts; a float
    file records the count it was coded with, so the coding threads must be what they say."""
    previous = torch.get_num_threads()
    for count in (1, 2):
        with coding_threads(count):
            assert torch.get_num_threads() == count
    assert torch.get_num_threads() == previous


FIRST_USE = """
from sharnn import compiled

@compiled.kernel("int64(int64)")
def plus_one(x):
    return x + 1

compiled.ensure_compiled()
print(plus_one(41))
"""


def test_the_first_use_says_it_compiles_and_the_second_loads_the_cache(tmp_path):
    """Two processes with one cache folder: the first compiles and says so in one line,
    naming the folder; the second loads the cache and says nothing. (A kernel of its own,
    in a file of its own: numba caches only what a file defines.)"""
    script = tmp_path / "first_use.py"
    script.write_text(FIRST_USE)
    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    assert first.stderr.count("compiling its kernels") == 1 and first.stdout.strip() == "42", first.stderr
    assert str(tmp_path / "cache") in first.stderr
    second = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    assert "compiling" not in second.stderr and second.stdout.strip() == "42", second.stderr


def test_coding_compiles_nothing_beyond_ensure_compiled():
    """Every kernel is called with the types it declares: after :func:`ensure_compiled`,
    coding text and a binary with the shipped model at each mixing version, and steps of
    an LN-LSTM and of a model whose input is gathered, add no signature (a kernel called
    otherwise compiles in the middle of coding, seconds, without the line that says so)."""
    import sharnn
    from sharnn.coding import codec
    from sharnn.models.build import build_model
    from sharnn.models.config import SHARNNConfig
    from sharnn.models.integer_step import IntegerStep

    compiled.ensure_compiled()
    before = {kernel: len(kernel.signatures) for kernel in compiled.KERNELS}
    model = sharnn.load().model
    for data in (b"Calls with the declared types only.\n" * 8, bytes(range(256))):
        for mixing in (1, 2, 3):
            assert codec.decompress(codec.compress(data, model, mixing=mixing), model) == data
    for settings in ({"cell": "ln_lstm"}, {"vocab_size": 300, "cell": "ln_lstm"}, {"feed_forward": "mlp"}):
        config = SHARNNConfig(d_model=32, n_layers=2, boom_dim=64, attention_span=4, **settings)
        step = IntegerStep(build_model(config).eval(), 3)
        for t in range(6):
            step.log_weights(step(torch.arange(3) + t))
    grown = [kernel.py_func.__qualname__ for kernel in compiled.KERNELS if len(kernel.signatures) > before[kernel]]
    assert not grown, f"compiled while coding: {grown}"


def test_only_a_kernel_that_says_it_allocates_may_allocate(monkeypatch):
    """Kernels run without numba's reference counting unless they allocate (sharnn.compiled.kernel):
    one that allocates without saying so does not compile, rather than run without it."""
    monkeypatch.setattr(compiled, "KERNELS", [])  # these two stay out of the registry

    def ones(n):
        return np.ones(n)

    with pytest.raises(numba.core.errors.TypingError):
        compiled.kernel("float64[::1](int64)")(ones).compile("float64[::1](int64)")
    assert compiled.kernel("float64[::1](int64)", allocates=True)(ones)(3).tolist() == [1.0, 1.0, 1.0]


def test_a_kernel_without_signatures_is_refused():
    with pytest.raises(ValueError, match="declares the signatures"):
        compiled.kernel()(lambda x: x)


@pytest.mark.parametrize("hint", ["prefetch", "prefetch_ahead"])
def test_prefetch_asks_for_lines_of_any_array_and_changes_no_number(monkeypatch, hint):
    """``compiled.prefetch`` and ``prefetch_ahead`` compile for arrays of any element type
    and any flat index within them (what mixing 3 asks for: int32 context rows, uint16 APM
    rows; the products: int8 weights), and the kernel's result is what it is without
    them; an array that is not C-contiguous is refused when the kernel compiles."""
    monkeypatch.setattr(compiled, "KERNELS", [])  # these stay out of the registry
    ask = getattr(compiled, hint)

    def gathered(values, rows):
        for k in range(len(rows)):
            ask(values, rows[k] * values.shape[1])
        total = 0
        for k in range(len(rows)):
            total += values[rows[k], 0] * (k + 1)
        return total

    rows = np.array([5, 0, 9, 3, 9], dtype=np.int64)
    for dtype in (np.int8, np.int32, np.uint16, np.float64):
        values = np.arange(10 * 16, dtype=dtype).reshape(10, 16)
        signature = f"int64({numba.from_dtype(dtype)}[:, ::1], int64[::1])"
        kernel = compiled.kernel(signature)(gathered)
        assert kernel(values, rows) == sum(int(values[r, 0]) * (k + 1) for k, r in enumerate(rows))
    with pytest.raises(numba.core.errors.TypingError, match="C-contiguous"):
        compiled.kernel("int64(int32[:, :], int64[::1])")(gathered).compile("int64(int32[:, :], int64[::1])")
