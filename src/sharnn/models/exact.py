"""Exactly specified arithmetic: the tables and prepared weights of
:class:`~sharnn.models.integer_step.IntegerStep`, whose results are the same bits on every
CPU, thread count and torch version (docs/compression.md, "The integer step").

A float result differs between machines only where the order of a sum, or the
approximation of a function, is left to the kernel: a matrix product's blocking, a
reduction's vector width, ``exp`` or ``tanh`` from a vector library. Everything else IEEE 754
fixes to the last bit. So the integer step computes only with:

- elementwise ``+ - *``, ``reciprocal`` and ``sqrt`` (each correctly rounded, never fused),
  ``round``, ``abs``, ``max``, comparisons, gathers;
- sums and matrix products of **integers** whose every partial sum stays at most
  :data:`FP32_EXACT` (float32) or :data:`FP64_EXACT` (float64) in magnitude: every such
  partial sum is representable, so the result is the exact sum in any order;
- tables of ``sigmoid``, ``tanh`` and ``exp`` computed once with Python's :mod:`decimal`,
  whose ``exp`` is correctly rounded by its specification, then rounded to float (shipped
  computed: :mod:`sharnn.tables`).

This module holds its constants, the tables, the weights' quantization
(:class:`QuantizedWeights`), the output's log weights (:func:`log_weights`, the mixer's
input) and correctly rounded scalar functions for the constants prepared from the
weights. The operations themselves are specified in torch by tests/spec_integer_step.py
and computed by :mod:`sharnn.models.integer_products` and
:mod:`sharnn.models.integer_kernels`.
"""

from __future__ import annotations

import decimal
import math
from functools import cache

import numpy as np
import torch
from torch import Tensor

from ..tables import decimal_table

FP32_EXACT = 2**24  # every integer of at most this magnitude is a float32
FP64_EXACT = 2**53  # ... a float64

WEIGHT_LEVELS = 127  # a quantized weight is an integer in [-127, 127], one scale per output row
MAX_ACTIVATION_LEVELS = 2**15  # a quantized product input is an integer in [-levels, levels]

TABLE_RESOLUTION = 1024  # table entries per unit of the argument: sigmoid and tanh
SIGMOID_RANGE = 16  # sigmoid(x) for |x| <= 16 (beyond, the end entries: 1e-7 from the limit)
TANH_RANGE = 8  # tanh(x) for |x| <= 8 (beyond: 2e-7 from the limit)

EXP_RESOLUTION = 256  # entries per nat: exp(-x) for x = i / 256
EXP_ONE = 2**24  # exp(0) in the table; every entry is an integer >= 1, so no weight is ever zero
EXP_ENTRIES = math.ceil(math.log(2 * EXP_ONE) * EXP_RESOLUTION) + 1  # past the last entry, exp(-x) * EXP_ONE < 0.5

LAYER_NORM_BITS = 17  # LayerNorm's input is rounded to integers below 2**17 per row (fewer for n > 512)

TINY = 2.0**-100  # a row whose largest entry is below this is scaled as if it were this


# ------------------------------------------------------------------ tables


SATURATED = 1000  # past +-1000, sigmoid and tanh round to the same float64 as at +-1000: 0.0, 1.0 or -1.0


def _decimal_sigmoid(x: decimal.Decimal) -> decimal.Decimal:
    """``1 / (1 + exp(-x))``, ``x`` clamped to ``[-SATURATED, SATURATED]``: ``sigmoid(-1000)``,
    about 5e-435, is below float64's smallest number, and ``1 - sigmoid(1000)`` vanishes at 30
    digits, so every result rounds as it would unclamped; but ``exp`` of more than about 2.3e6
    (a weight of a hostile model) would pass decimal's largest exponent, ``decimal.Overflow``."""
    return 1 / (1 + (-min(max(x, decimal.Decimal(-SATURATED)), decimal.Decimal(SATURATED))).exp())


@cache
def _sigmoid_decimals() -> tuple[decimal.Decimal, ...]:
    """``sigmoid(i / TABLE_RESOLUTION)`` for ``i = 0 .. 2 * SIGMOID_RANGE * TABLE_RESOLUTION``
    in 30-digit decimals (the upper half is what tanh's table needs)."""
    with decimal.localcontext() as context:
        context.prec = 30
        step = decimal.Decimal(1) / TABLE_RESOLUTION
        return tuple(_decimal_sigmoid(i * step) for i in range(2 * SIGMOID_RANGE * TABLE_RESOLUTION + 1))


@cache
def sigmoid_table() -> Tensor:
    """``sigmoid(i / 1024)`` for ``i = -16384 .. 16384``: float32 ``[32769]``."""
    return torch.from_numpy(_sigmoid_values())


@decimal_table
def _sigmoid_values() -> np.ndarray:
    half = _sigmoid_decimals()[: SIGMOID_RANGE * TABLE_RESOLUTION + 1]
    values = [float(1 - s) for s in reversed(half[1:])] + [float(s) for s in half]
    return torch.tensor(values, dtype=torch.float64).float().numpy()


@cache
def tanh_table() -> Tensor:
    """``tanh(i / 1024) = 2 sigmoid(2i / 1024) - 1`` for ``i = -8192 .. 8192``: float32 ``[16385]``."""
    return torch.from_numpy(_tanh_values())


@decimal_table
def _tanh_values() -> np.ndarray:
    sigmoid = _sigmoid_decimals()
    half = [2 * sigmoid[2 * i] - 1 for i in range(TANH_RANGE * TABLE_RESOLUTION + 1)]
    values = [float(-t) for t in reversed(half[1:])] + [float(t) for t in half]
    return torch.tensor(values, dtype=torch.float64).float().numpy()


@cache
def exp_table() -> Tensor:
    """``max(1, round(EXP_ONE exp(-i / 256)))`` for ``i = 0 .. EXP_ENTRIES - 1``: integers
    in float64 ``[EXP_ENTRIES]``, from 2**24 down to 1."""
    return torch.from_numpy(_exp_values())


@decimal_table
def _exp_values() -> np.ndarray:
    with decimal.localcontext() as context:
        context.prec = 30
        step = decimal.Decimal(1) / EXP_RESOLUTION
        values = [max(1, int((EXP_ONE * (-i * step).exp()).to_integral_value())) for i in range(EXP_ENTRIES)]
    return np.array(values, dtype=np.float64)


@cache
def _on(table, device: torch.device) -> Tensor:
    """``table()`` on ``device``, copied there once."""
    return table().to(device)


def exp_index(gaps: Tensor) -> Tensor:
    """Each gap ``>= 0`` in nats rounded to a multiple of 1/256, in 1/256 nat, clamped to the
    table's last entry: int32, same shape."""
    return torch.round(gaps * EXP_RESOLUTION).clamp_(0, EXP_ENTRIES - 1).int()


def exp_weights(gaps: Tensor) -> Tensor:
    """``EXP_ONE * exp(-gap)`` as integers (float64) for ``gaps >= 0`` in nats, each gap
    rounded to a multiple of 1/256; a gap past the table weighs 1."""
    index = exp_index(gaps)
    return _on(exp_table, gaps.device).index_select(0, index.view(-1)).view(gaps.shape)


def log_weights(logits: Tensor) -> Tensor:
    """``-gap`` of each logit to the largest of its row (``[..., V]`` float32), in 1/256 nat as
    the output's probabilities round it: the logarithms of its weights up to a constant, int32."""
    return -exp_index((logits.amax(-1, keepdim=True) - logits).double())


def scalar_sigmoid(x: float) -> float:
    """``sigmoid(x)`` of one float, correctly rounded to float64 (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        return float(_decimal_sigmoid(decimal.Decimal(x)))


def scalar_tanh(x: float) -> float:
    """``tanh(x)`` of one float, correctly rounded to float64 (:mod:`decimal`)."""
    with decimal.localcontext() as context:
        context.prec = 30
        return float(2 * _decimal_sigmoid(2 * decimal.Decimal(x)) - 1)


# ------------------------------------------------------------------ products and LayerNorm


def layer_norm_bits(n: int) -> int:
    """The bits of the integers a LayerNorm of ``n`` features rounds its input to:
    :data:`LAYER_NORM_BITS`, fewer for ``n`` > 512, so that ``n^2 q^2 < 2**53``."""
    return min(LAYER_NORM_BITS, (52 - 2 * math.ceil(math.log2(n))) // 2)


class QuantizedWeights:
    """The weights of an exact product ``x @ weight^T + bias``: ``weight`` rounded to
    integers in [-127, 127] per output row, and the levels ``L`` its input is rounded to.

    ``L`` is the largest that keeps every partial sum of every row within 2**24:
    ``L * max_row(sum |w_q|) <= 2**24`` (at most :data:`MAX_ACTIVATION_LEVELS`), so the
    product of the integers is exact however it is summed. The product's result is ``acc *
    weight_scale * x_scale + bias``, each operation rounded once (docs/compression.md, "The
    integer step"; :mod:`sharnn.models.integer_products` computes it).

    Args:
        weight: ``[N, K]`` float32.
        bias: ``[N]`` float32, or None.

    Attributes:
        weight: ``[N, K]`` float32 integers in [-127, 127].
        weight_scale: ``[N]`` float32, ``max_row |weight| / 127``.
        bias: as given.
        levels: ``L``.

    Raises:
        ValueError: a row so long that fewer than 2 levels remain for ``x``.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        largest = weight.abs().amax(1).clamp_min(TINY)
        self.weight = torch.round(weight * (largest.reciprocal() * WEIGHT_LEVELS)[:, None]).contiguous()  # [N, K]
        self.weight_scale = largest * (1 / WEIGHT_LEVELS)  # [N]
        self.bias = bias
        row_sum = int(self.weight.double().abs().sum(1).max().item())
        self.levels = min(MAX_ACTIVATION_LEVELS, FP32_EXACT // max(row_sum, 1))
        if self.levels < 2:
            raise ValueError(f"a product with rows of {weight.shape[1]} inputs is too long to sum exactly in float32")
