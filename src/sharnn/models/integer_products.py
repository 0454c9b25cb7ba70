"""The integer step's matrix products as exact integer sums, in numba kernels
(docs/compression.md, "The integer step").

A product ``x @ weight^T + bias`` of :class:`~sharnn.models.exact.QuantizedWeights` is,
for each stream ``b`` and output ``n``::

    q[b]      = round(x[b] * (1 / max|x[b]| * L))                 integers in [-L, L]
    acc[b, n] = sum_k q[b, k] w[n, k]                              exact: |partial sums| <= 2**24
    out[b, n] = acc[b, n] * weight_scale[n] * (max|x[b]| * (1/L))  (+ bias[n])

each float operation rounded once to float32, in that order (what the specification,
tests/spec_integer_step.py, computes with torch and a float32 product of integers). The sum
is an integer below 2**24, so summed in int32 it is the same number the float32 product
gives, in any order, on any CPU.

The sum runs on the dot products of :func:`_dot_block`: ``ROWS`` weight rows against
``STREAMS`` input rows at once (each weight vector loaded once for four streams, each
input vector once for four rows), 16-bit integers multiplied in pairs and summed in 32-bit
lanes, the pattern LLVM turns into ``vpmaddwd`` (SSE2, AVX2) or ``vpdpwssd`` (AVX-512
VNNI). On this project's AMD EPYC (Zen 5) the step's products take 0.17x (B=1) to 0.58x
(B=32) the time of oneDNN's float32 products of the same integers
(benchmarks/integer_step_speed.py). Inputs of more than 15 bits (``L = 2**15``, rows of
small weights) take :func:`linear32`, plain loops in int32.

Every kernel keeps the rules of :mod:`sharnn.compiled`; each output is computed by one
thread, so the thread count does not change a bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..compiled import inline, kernel, prefetch_ahead
from .exact import TINY, QuantizedWeights

LANES = 32  # 16-bit integers per vector: one AVX-512 register, two AVX2 ones
ROWS = 4  # weight rows per block
STREAMS = 4  # input rows per block (fewer streams take blocks of one)
AHEAD = 16  # the weight rows of the block this far ahead are asked for (prefetch_ahead) before a block is read

_I32 = ir.IntType(32)
_PRODUCTS = ir.VectorType(_I32, LANES)
_PAIRS = ir.VectorType(_I32, LANES // 2)
_EVEN = ir.Constant(ir.VectorType(_I32, LANES // 2), list(range(0, LANES, 2)))
_ODD = ir.Constant(ir.VectorType(_I32, LANES // 2), list(range(1, LANES, 2)))


def _load(builder, base, offset, bits: int):
    """``LANES`` integers of ``bits`` bits from ``base + offset`` (unaligned)."""
    vector = ir.VectorType(ir.IntType(bits), LANES)
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vector.as_pointer()), align=1)


def _pair_sums(builder, a, b):
    """``a * b`` widened to 32 bits, adjacent products summed: ``[LANES // 2]`` int32."""
    products = builder.mul(builder.sext(a, _PRODUCTS), builder.sext(b, _PRODUCTS))
    even, odd = (builder.shuffle_vector(products, products, lanes) for lanes in (_EVEN, _ODD))
    return builder.add(even, odd)


def _halves(builder, vectors: list, group: int):
    """One or two vectors (taken end to end) whose lanes are groups of ``group`` partial
    sums -> one vector of half as many lanes, the groups in order, each the sum of its
    first and second half."""
    count = vectors[0].type.count * len(vectors)
    low = [start + i for start in range(0, count, group) for i in range(group // 2)]
    high = [lane + group // 2 for lane in low]
    lanes = ir.VectorType(_I32, len(low))
    first, second = vectors[0], vectors[-1]
    return builder.add(*(builder.shuffle_vector(first, second, ir.Constant(lanes, pick)) for pick in (low, high)))


def _lane_sums(builder, vectors: list) -> list:
    """The sum of each vector's lanes (int32): pairs of vectors, then halves of the one
    left, so that every shuffle and add works on whole vectors (a power of two of vectors,
    at most as many as their lanes)."""
    group = vectors[0].type.count  # the lanes holding one vector's partial sums
    while len(vectors) > 1:
        vectors = [_halves(builder, pair, group) for pair in zip(vectors[::2], vectors[1::2])]
        group //= 2
    (sums,) = vectors
    while group > 1:
        sums, group = _halves(builder, [sums], group), group // 2
    return [builder.extract_element(sums, ir.Constant(_I32, i)) for i in range(sums.type.count)]


def _check_matrices(name: str, *arrays) -> None:
    """At compile time: each ``(array, dtype)`` a C-contiguous matrix of that dtype."""
    for array, dtype in arrays:
        if not (isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"):
            raise TypingError(f"{name} takes C-contiguous matrices")
        if array.dtype != dtype:
            raise TypingError(f"{name} takes {dtype} here, not {array.dtype}")


def _dot_block(rows: int, streams: int):
    """An intrinsic ``block(q, weight, b, n)``: the ``rows x streams`` dot products of
    weight rows ``n .. n + rows - 1`` (``weight [N, K]`` int8) with input rows ``b .. b +
    streams - 1`` (``q [B, K]`` int16), both C-contiguous with ``K`` a multiple of
    :data:`LANES`, as a tuple of int32, row by row (``rows * streams`` entries)."""

    @intrinsic
    def block(typingctx, q, weight, b, n):
        _check_matrices("a dot block", (q, types.int16), (weight, types.int8))
        signature = types.UniTuple(types.int32, rows * streams)(q, weight, b, n)

        def codegen(context, builder, signature, args):
            q_array = context.make_array(signature.args[0])(context, builder, args[0])
            w_array = context.make_array(signature.args[1])(context, builder, args[1])
            width = builder.extract_value(q_array.shape, 1)

            def start(first, offset):  # the flat index of row first + offset
                return builder.mul(builder.add(first, ir.Constant(width.type, offset)), width)

            sums = [
                cgutils.alloca_once_value(builder, ir.Constant(_PAIRS, [0] * (LANES // 2)))
                for _ in range(rows * streams)
            ]
            with cgutils.for_range(builder, builder.udiv(width, ir.Constant(width.type, LANES))) as loop:
                k = builder.mul(loop.index, ir.Constant(width.type, LANES))
                weights = [_load(builder, w_array.data, builder.add(start(args[3], r), k), 8) for r in range(rows)]
                for s in range(streams):
                    inputs = _load(builder, q_array.data, builder.add(start(args[2], s), k), 16)
                    for r in range(rows):
                        total = sums[r * streams + s]
                        builder.store(builder.add(builder.load(total), _pair_sums(builder, inputs, weights[r])), total)
            values = _lane_sums(builder, [builder.load(total) for total in sums])
            return context.make_tuple(builder, signature.return_type, values)

        return signature, codegen

    return block


_block = _dot_block(ROWS, STREAMS)
_column = _dot_block(ROWS, 1)

_WIDE = ir.VectorType(ir.IntType(64), LANES // 2)


@intrinsic
def pair_dot(typingctx, a, b, i, j):
    """``pair_dot(a, b, i, j)`` in a kernel: ``sum_k a[i, k] b[j, k]`` (int64) over the first
    ``K - K % LANES`` columns of ``a [*, K]`` and ``b [*, K]`` (int16, C-contiguous),
    adjacent products summed in int32 (``vpmaddwd``) and those sums in int64. Exact when
    one of the two has no entry -2**15 (a pair is then at most ``2 * (2**15 - 1) * 2**15
    < 2**31``); the caller sums the last ``K % LANES`` columns."""
    _check_matrices("pair_dot", (a, types.int16), (b, types.int16))
    signature = types.int64(a, b, i, j)

    def codegen(context, builder, signature, args):
        a_array = context.make_array(signature.args[0])(context, builder, args[0])
        b_array = context.make_array(signature.args[1])(context, builder, args[1])
        width = builder.extract_value(a_array.shape, 1)
        a_row, b_row = builder.mul(args[2], width), builder.mul(args[3], width)
        total = cgutils.alloca_once_value(builder, ir.Constant(_WIDE, [0] * (LANES // 2)))
        with cgutils.for_range(builder, builder.udiv(width, ir.Constant(width.type, LANES))) as loop:
            k = builder.mul(loop.index, ir.Constant(width.type, LANES))
            x = _load(builder, a_array.data, builder.add(a_row, k), 16)
            y = _load(builder, b_array.data, builder.add(b_row, k), 16)
            builder.store(builder.add(builder.load(total), builder.sext(_pair_sums(builder, x, y), _WIDE)), total)
        reduce = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_WIDE.element, [_WIDE]), "llvm.vector.reduce.add.v16i64"
        )
        return builder.call(reduce, [builder.load(total)])

    return signature, codegen


@inline
def _quantize(x, levels, unit, q):
    """``x [K]`` float32 rounded to integers in ``[-levels, levels]`` into ``q[:K]``;
    returns its scale ``max|x| * unit`` (``unit = float32(1 / levels)``)."""
    largest = np.float32(TINY)
    for value in x:
        largest = max(largest, abs(value))
    factor = (np.float32(1.0) / largest) * levels
    for k in range(x.shape[0]):
        q[k] = np.rint(x[k] * factor)
    return largest * unit


@inline
def _scaled(total, weight_scale, x_scale, bias, has_bias):
    """``total * weight_scale * x_scale (+ bias)``, each operation rounded to float32."""
    value = (np.float32(total) * weight_scale) * x_scale
    return value + bias if has_bias else value


_SIGNATURE = (
    "void(float32[:, ::1], float32, float32, int8[:, ::1], float32[::1], float32[::1], boolean, {q}[:, ::1],"
    " float32[::1], float32[:, ::1])"
)


@kernel(_SIGNATURE.format(q="int16"), parallel=True)
def linear16(x, levels, unit, weight, weight_scale, bias, has_bias, q, x_scale, out):
    """``out [B, N] = x [B, K] @ weight^T (+ bias)`` for ``levels`` <= 32767: ``x``
    quantized into ``q [B, Kp]`` (int16, zero past ``K``) with scales ``x_scale [B]``, then
    the integer sums by blocks of :data:`ROWS` x :data:`STREAMS`, the weight rows of the
    block :data:`AHEAD` blocks on asked for before each. ``weight [Np, Kp]``: int8, zero
    rows and columns padding ``N`` to a multiple of :data:`ROWS` and ``K`` to one of
    :data:`LANES`."""
    streams, outputs = out.shape
    blocks, block_size = weight.shape[0] // ROWS, ROWS * weight.shape[1]
    for line in range(0, min(AHEAD, blocks) * block_size, 64):  # the first blocks, asked for while x is quantized
        prefetch_ahead(weight, line)
    for b in prange(streams):
        x_scale[b] = _quantize(x[b], levels, unit, q[b])
    for block in prange(blocks):
        n = block * ROWS
        if block + AHEAD < blocks:
            for line in range(0, block_size, 64):
                prefetch_ahead(weight, (block + AHEAD) * block_size + line)
        rows = min(ROWS, outputs - n)
        b = 0
        while b + STREAMS <= streams:
            sums = _block(q, weight, b, n)
            for r in range(rows):
                for s in range(STREAMS):
                    out[b + s, n + r] = _scaled(
                        sums[r * STREAMS + s], weight_scale[n + r], x_scale[b + s], bias[n + r], has_bias
                    )
            b += STREAMS
        while b < streams:
            sums = _column(q, weight, b, n)
            for r in range(rows):
                out[b, n + r] = _scaled(sums[r], weight_scale[n + r], x_scale[b], bias[n + r], has_bias)
            b += 1


@kernel(_SIGNATURE.format(q="int32"), parallel=True)
def linear32(x, levels, unit, weight, weight_scale, bias, has_bias, q, x_scale, out):
    """:func:`linear16` for ``levels`` up to 2**15 (inputs of 16 bits and a sign): the
    integer sums in plain loops, in int32 (every partial sum is within 2**24)."""
    streams, outputs = out.shape
    for b in prange(streams):
        x_scale[b] = _quantize(x[b], levels, unit, q[b])
    for n in prange(outputs):
        for b in range(streams):
            total = np.int32(0)
            for k in range(q.shape[1]):
                total = np.int32(total + np.int32(q[b, k]) * np.int32(weight[n, k]))
            out[b, n] = _scaled(total, weight_scale[n], x_scale[b], bias[n], has_bias)


PRODUCT = (
    "Tuple((float32, float32, int8[:, ::1], float32[::1], float32[::1], boolean, int16[:, ::1], int32[:, ::1],"
    " float32[::1], float32[:, ::1]))"
)  # IntegerLinear.arguments: levels, unit, weight, weight_scale, bias, has_bias, q (int16 or int32), x_scale, out
_NONE16, _NONE32 = np.zeros((0, 0), np.int16), np.zeros((0, 0), np.int32)  # the q an IntegerLinear does not use
NO_PRODUCT = (np.float32(1), np.float32(1), np.zeros((0, 0), np.int8), np.zeros(0, np.float32), np.zeros(0, np.float32))
NO_PRODUCT += (False, _NONE16, _NONE32, np.zeros(0, np.float32), np.zeros((0, 0), np.float32))  # where there is none


@inline
def product(arguments, x):
    """In a kernel, an :class:`IntegerLinear` of its ``arguments`` (:data:`PRODUCT`) applied
    to ``x [B, K]``: :func:`linear16`, or :func:`linear32` where its int32 ``q`` is the one
    it uses. Returns its ``out [B, N]``."""
    levels, unit, weight, weight_scale, bias, has_bias, q16, q32, x_scale, out = arguments
    if q32.shape[0]:
        linear32(x, levels, unit, weight, weight_scale, bias, has_bias, q32, x_scale, out)
    else:
        linear16(x, levels, unit, weight, weight_scale, bias, has_bias, q16, x_scale, out)
    return out


class IntegerLinear:
    """An exact product prepared for the kernels, with its buffers for ``B`` streams.

    Example::

        up = IntegerLinear(QuantizedWeights(weight, bias), streams=8)
        out = up(x)          # x [8, K] float32 (numpy, C-contiguous) -> [8, N] float32

    Args:
        weights: the quantized weights (on any device; copied to the CPU).
        streams: ``B``, the rows of every input.

    Attributes:
        arguments: the product as a kernel calls it, :func:`product` (:data:`PRODUCT`).
    """

    def __init__(self, weights: QuantizedWeights, streams: int):
        self.shape = n, k = weights.weight.shape  # [N, K]
        padded = (-(-n // ROWS) * ROWS, -(-k // LANES) * LANES)
        self.weight = np.zeros(padded, dtype=np.int8)
        self.weight[:n, :k] = weights.weight.cpu().numpy()
        self.weight_scale = weights.weight_scale.detach().cpu().numpy().astype(np.float32)
        self.has_bias = weights.bias is not None
        bias = weights.bias.detach().cpu().numpy() if self.has_bias else np.zeros(n)
        self.bias = np.ascontiguousarray(bias, dtype=np.float32)
        self.levels, self.unit = np.float32(weights.levels), np.float32(1 / weights.levels)
        self.kernel = linear16 if weights.levels <= np.iinfo(np.int16).max else linear32
        self.q = np.zeros((streams, padded[1]), dtype=np.int16 if self.kernel is linear16 else np.int32)
        self.x_scale = np.zeros(streams, dtype=np.float32)
        self.out = np.zeros((streams, n), dtype=np.float32)
        q16, q32 = (self.q, _NONE32) if self.kernel is linear16 else (_NONE16, self.q)
        self.arguments = (self.levels, self.unit, self.weight, self.weight_scale, self.bias, self.has_bias)
        self.arguments += (q16, q32, self.x_scale, self.out)  # what product() takes (PRODUCT)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``x [B, K]`` float32 -> ``[B, N]`` float32 (its own buffer, overwritten by the next call)."""
        self.kernel(
            x,
            self.levels,
            self.unit,
            self.weight,
            self.weight_scale,
            self.bias,
            self.has_bias,
            self.q,
            self.x_scale,
            self.out,
        )
        return self.out
