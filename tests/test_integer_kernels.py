"""The integer step's numba kernels (sharnn.models.integer_step, integer_kernels,
integer_products) against its specification, the torch code they replaced
(tests/spec_integer_step.py): the same bits, compared with ``torch.equal``, for the products
alone, the LayerNorm alone, and whole steps of every variant the step supports, over enough
positions that the memory ring wraps, on 1 and 2 threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

import sharnn
import spec_integer_step as spec
from sharnn.models import exact, integer_kernels
from sharnn.models.build import build_model
from sharnn.models.config import SHARNNConfig
from sharnn.models.integer_products import LANES, IntegerLinear, linear16, linear32, pair_dot
from sharnn.models.integer_step import INTEGER_STEP_VERSION, MAX_SPAN, IntegerStep
from sharnn.models.step import linear

# ---------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize("n, k", [(300, 700), (37, 50), (1, 1), (2048, 1024)])
def test_a_product_is_the_specification_s(n, k):
    """Rows and inputs that fill no whole block (37 rows, 5 streams), a single input, inputs
    of every magnitude and a zero row: the kernel's result is the specification's."""
    generator = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
    for product in (spec.ExactLinear(weight, bias), spec.ExactLinear(weight)):
        for streams in (1, 3, 4, 5, 8):
            x = torch.randn(streams, k, generator=generator) * torch.logspace(-4, 4, streams)[:, None]
            x[-1] = 0
            kernel = IntegerLinear(product, streams)
            assert kernel.kernel is (linear16 if k > 1 else linear32)  # one weight of 127 leaves 2**15 levels
            assert torch.equal(torch.from_numpy(kernel(x.numpy())), product(x, linear)), (streams, product.bias is None)


def test_inputs_of_sixteen_bits_take_the_int32_kernel():
    """Rows whose weights sum to at most 512 leave the input 2**15 levels, one more than
    int16 holds: :func:`linear32` computes them, to the same bits."""
    weight = torch.zeros(6, 40)
    weight[:, 0] = 1.0
    weight[:, 1:4] = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)) * 0.01
    product = spec.ExactLinear(weight, torch.ones(6))
    assert product.levels == exact.MAX_ACTIVATION_LEVELS
    for streams in (1, 5):
        x = torch.randn(streams, 40, generator=torch.Generator().manual_seed(streams))
        kernel = IntegerLinear(product, streams)
        assert kernel.kernel is linear32 and kernel.q.dtype == np.int32
        assert torch.equal(torch.from_numpy(kernel(x.numpy())), product(x, linear))


@numba.njit(cache=False)
def _pair_dots(a, b, out):
    for i in range(a.shape[0]):
        for j in range(b.shape[0]):
            out[i, j] = pair_dot(a, b, i, j)


@pytest.mark.parametrize("k", [32, 100, 512])
def test_pair_dot_is_the_int64_sum_at_the_int16_extremes(k):
    """:func:`pair_dot` (the attention's scores) sums the first ``k - k % 32`` columns
    exactly, with one operand at -2**15 and the other at ±(2**15 - 1) in every column: pairs
    at the edge of int32."""
    generator = np.random.default_rng(k)
    a = generator.integers(-(2**15), 2**15, (5, k), dtype=np.int16)
    a[0] = -(2**15)
    b = generator.integers(-(2**15) + 1, 2**15, (3, k), dtype=np.int16)
    b[0], b[1] = 2**15 - 1, -(2**15) + 1
    out = np.empty((5, 3), dtype=np.int64)
    _pair_dots(a, b, out)
    paired = k - k % LANES
    assert np.array_equal(out, a[:, :paired].astype(np.int64) @ b[:, :paired].astype(np.int64).T)


@pytest.mark.parametrize("n", [1, 8, 100, 512, 2048, 4096])
def test_the_layer_norm_is_the_specification_s(n):
    """The LayerNorm (through the LN-LSTM's input gates, ``LN(x) * gain + bias + b``) on rows
    of every magnitude, a zero row among them, and every width's integer bits."""
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(7, n, generator=generator) * torch.tensor([1e-30, 1e-6, 1e-3, 1.0, 3.0, 1e5, 0.0])[:, None]
    norm = torch.nn.LayerNorm(n, eps=1e-5)
    torch.nn.init.normal_(norm.weight, generator=generator)
    torch.nn.init.normal_(norm.bias, generator=generator)
    bias = torch.randn(n, generator=generator)
    out = np.empty((7, n), dtype=np.float32)
    gain_and_bias = np.stack([norm.weight.detach().numpy(), norm.bias.detach().numpy()])
    integer_kernels.input_gates(x.numpy(), gain_and_bias, bias.numpy(), 1e-5, out)
    with torch.no_grad():
        expected = spec._affine(spec.layer_norm(x, 1e-5), norm) + bias
    assert torch.equal(torch.from_numpy(out), expected)


def test_the_output_weights_are_the_specification_s():
    """Probabilities and log weights of logits with gaps past the ``exp`` table, ties and
    a row of equal logits."""
    logits = (
        torch.randn(5, 256, generator=torch.Generator().manual_seed(0)) * torch.tensor([0.1, 1, 10, 100, 0])[:, None]
    )
    logits[1, 7] = logits[1, 9] = logits[1].max()
    assert np.array_equal(IntegerStep.probabilities(logits), spec.softmax(logits).numpy())
    assert np.array_equal(IntegerStep.log_weights(logits), exact.log_weights(logits).numpy())


def test_the_constants_are_the_specification_s():
    assert INTEGER_STEP_VERSION == spec.INTEGER_STEP_VERSION and MAX_SPAN == spec.MAX_SPAN
    for name in ("MEMORY_FRACTION_BITS", "MEMORY_LIMIT", "QUERY_BITS"):
        assert getattr(integer_kernels, name) == getattr(spec, name), name


# ---------------------------------------------------------------------------- whole steps


def _assert_same_steps(model, streams: int, positions: int, limit: int | None = None) -> None:
    """The kernels' step and the specification's, fed the same tokens (each position's
    most probable byte, scrambled): logits, probabilities, log weights, ``(h, c)`` and the
    memory bitwise equal at every position; and a third step's :meth:`IntegerStep.weights`
    (the coder's call: the output's weights in the position's kernel call) the same
    probabilities and log weights."""
    ours, theirs = IntegerStep(model, streams, limit), spec.IntegerStep(model, streams, limit)
    coder = IntegerStep(model, streams, limit)
    tokens = torch.arange(streams) * 37 % model.config.vocab_size
    for t in range(positions):
        logits, expected = ours(tokens), theirs(tokens)
        assert torch.equal(logits, expected), f"logits at position {t}"
        probabilities = ours.probabilities(logits)
        assert np.array_equal(probabilities, theirs.probabilities(expected)), f"probabilities at position {t}"
        assert np.array_equal(ours.log_weights(logits), exact.log_weights(expected).numpy())
        coded, coded_log_weights = coder.weights(tokens.numpy())
        assert np.array_equal(coded, probabilities) and np.array_equal(coded_log_weights, ours.log_weights(logits))
        for i, ((h, c), (h_spec, c_spec)) in enumerate(zip(ours.lstm, theirs.lstm)):
            assert torch.equal(h, h_spec) and torch.equal(c, c_spec), f"(h, c) of block {i} at position {t}"
        for i, (ring, ring_spec) in enumerate(zip(ours.memory, theirs.memory)):
            assert (ring is None and ring_spec is None) or torch.equal(ring, ring_spec), f"memory {i} at {t}"
        tokens = torch.from_numpy(probabilities.argmax(1) * 7 + t) % model.config.vocab_size
    assert ours.position == theirs.position == positions


def _random_model(seed: int, **settings) -> sharnn.SHARNN:
    """A small SHA-RNN (d 32, Boom 64, span 16) with every parameter moved off its
    initialisation (LayerNorm gains off 1, biases off 0)."""
    config = SHARNNConfig(d_model=32, n_layers=2, boom_dim=64, attention_span=16, **settings)
    model = build_model(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model


def _extreme_model() -> sharnn.SHARNN:
    """Attention in every block with a memory past its clamp (``LN_mem`` gains of 50: values
    beyond ±32) and queries whose score gaps run past the ``exp`` table."""
    model = _random_model(7, attention="all")
    with torch.no_grad():
        for block in model.blocks:
            block.attention.ln_mem.weight.mul_(50)
            block.attention.head.ln_query.weight.mul_(40)
    return model


VARIANTS = {
    "paper": {},
    "ln_lstm": {"cell": "ln_lstm"},
    "no attention": {"attention": "none"},
    "mlp": {"feed_forward": "mlp"},
    "gathered input": {"vocab_size": 300},
    "gathered input, ln_lstm": {"vocab_size": 300, "cell": "ln_lstm"},
    "vector gate, attention everywhere": {"value_gate": "vector", "attention": "all"},
    "collapsed": {"collapsed": True},
}


@pytest.mark.parametrize("settings", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("streams", [1, 3, 8])
def test_every_variant_is_the_specification_bit_for_bit(settings, streams):
    """60 positions, the span of 16 wrapped almost four times."""
    _assert_same_steps(_random_model(streams, **settings), streams, 60)


def test_a_memory_past_its_clamp_and_gaps_past_the_table_are_the_specification_s():
    model = _extreme_model()
    ring = IntegerStep(model, 2)
    for t in range(20):
        ring(torch.tensor([t, 3 * t]))
    # the clamp is reached both ways: +2**15 is what the ring's int16 copy cannot hold
    assert ring.memory[0].max() == integer_kernels.MEMORY_LIMIT == -ring.memory[0].min()
    _assert_same_steps(model, 2, 40)


def test_a_ring_shorter_than_the_span_is_the_specification_s():
    _assert_same_steps(_random_model(1), 3, 10, limit=10)


@pytest.mark.slow  # a few seconds: out of the working loop
@pytest.mark.parametrize("streams", [1, 3, 8])
def test_the_shipped_model_is_the_specification_bit_for_bit(streams):
    """250 positions of the shipped model: its span of 192 wrapped."""
    _assert_same_steps(sharnn.load().model, streams, 250)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba has one thread here")
@pytest.mark.parametrize("streams", [1, 8])
def test_two_threads_compute_the_same_bits_as_one(streams):
    """torch's thread count is the kernels' (``kernel_threads``): every parallel kernel runs
    its streams or output rows on two threads, to the same bits."""
    model = _random_model(3, attention="all")
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        step = IntegerStep(model, streams)
        tokens = torch.arange(streams)
        runs.append(torch.stack([step(tokens + t) for t in range(30)]))
    assert torch.equal(*runs)
