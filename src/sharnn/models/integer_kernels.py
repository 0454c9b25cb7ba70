"""The integer step's operations between its products, fused into numba kernels
(docs/compression.md, "The integer step").

Each kernel computes, for every stream ``b`` in turn (``prange``: a stream's results by one
thread, in a fixed order), what the specification (tests/spec_integer_step.py) computes with
one torch call per operation, with the same roundings in the same order:

- :func:`block_input`: ``LN_start`` of the block's input, then the LSTM's ``h`` beside it
  (the fused gate product's input);
- :func:`recurrence`: the gates (a product's result, the table's row plus ``W_hh h``, or
  the LN-LSTM's normalised sums), their sigmoid and tanh from the tables, the cell update,
  ``h = o * tanh(c)``;
- :func:`attention_input` and :func:`attention`: ``LN_mem(u)`` into the memory ring in
  units of 2**-10, ``LN_mid(u)``; the query's LayerNorm and integers, the integer scores
  over the ring, their weights from the ``exp`` table, the exact weighted sum, the value gate;
- :func:`feed_forward_input`, :func:`boom`, :func:`gelu` and :func:`residual`: ``LN_ff``
  and ``LN_xff`` of one normalisation, the GELU from the sigmoid table, the Boom's chunks
  summed in order, the residual;
- :func:`output_weights`: the output's integer weights from the ``exp`` table, their
  logarithms in 1/256 nat and the probabilities over their exact sum;
- :func:`position`: a whole position, each block's kernels and products called in order
  from one kernel, so that no Python runs between them (its blocks: :func:`blocks_of`).

Float32 operations stay float32: every constant is a ``np.float32`` (a Python float would
make numba compute in float64 and round once at the end, which is another number). The
float64 ones (the LayerNorm, the attention's scales) are exactly the specification's.

The constants of :mod:`sharnn.models.exact` used here (the tables' ranges, the LayerNorm's
bits, ``TINY``) and the products of :mod:`sharnn.models.integer_products` are compiled in,
and numba's cache knows only this file: after changing one, delete the cache
(``__pycache__/*.nbi``) or touch this file.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange
from numba.typed import List

from ..compiled import inline, kernel
from .exact import EXP_ENTRIES, EXP_RESOLUTION, LAYER_NORM_BITS, SIGMOID_RANGE, TABLE_RESOLUTION, TANH_RANGE, TINY
from .integer_products import LANES, PRODUCT, pair_dot, product
from .step import GELU_SLOPE

MEMORY_FRACTION_BITS = 10  # the memory ring holds LN_mem's outputs in units of 2**-10 ...
MEMORY_LIMIT = 2**15  # ... clamped to [-32, 32]
QUERY_BITS = 15  # the query: integers below 2**15 per row

# How the recurrence finds its gates (the argument ``kind``):
FUSED = 0  # a product's result: [LN_start(x) ; h] @ [W_ih ; W_hh]^T + b
TABLE = 1  # the table's row of the token plus W_hh h
LN_TABLE = 2  # LN-LSTM: the table's row plus LN_hh(W_hh h)
LN_PRODUCT = 3  # LN-LSTM: LN_ih(W_ih LN_start(x)) + b plus LN_hh(W_hh h)

_SIGMOID_LIMIT = SIGMOID_RANGE * TABLE_RESOLUTION
_TANH_LIMIT = TANH_RANGE * TABLE_RESOLUTION
_RESOLUTION = np.float32(TABLE_RESOLUTION)
_SLOPE = np.float32(GELU_SLOPE)
_TINY = np.float32(TINY)

# ------------------------------------------------------------------ helpers, compiled into the kernels


@inline
def _largest(x):
    """``max |x|`` of ``x [n]`` float32, at least :data:`~sharnn.models.exact.TINY`."""
    largest = _TINY
    for value in x:
        largest = max(largest, abs(value))
    return largest


@inline
def _power_of_two(largest, bits):
    """The power of two (float64) that puts ``largest`` (float32) in ``[2**(bits-1), 2**bits)``,
    its exponent clamped to [-160, 160]."""
    exponent = bits - math.frexp(np.float64(largest))[1]
    return math.ldexp(1.0, min(max(exponent, -160), 160))


@inline
def _layer_norm(x, eps, out):
    """``out [n] = (x - mean) / sqrt(var + eps)`` of ``x [n]`` float32, without gain or bias:
    ``x`` scaled by a power of two and rounded to integers ``q`` below 2**bits (17, fewer for
    ``n`` > 512); ``(n q - sum q) / sqrt(n sum q^2 - (sum q)^2 + eps n^2 scale^2)`` in float64."""
    n = x.shape[0]
    log2 = 0  # ceil(log2(n))
    while (1 << log2) < n:
        log2 += 1
    scale = _power_of_two(_largest(x), min(LAYER_NORM_BITS, (52 - 2 * log2) // 2))
    whole, square_sum = 0, 0  # sums of integers, in int64 (vectors): below 2**53, exact as float64 too
    for value in x:
        q = np.int64(np.rint(np.float64(value) * scale))
        whole += q
        square_sum += q * q
    total, squares = np.float64(whole), np.float64(square_sum)
    spread = squares * n - total * total
    inverse = 1.0 / math.sqrt(spread + scale * scale * (eps * n * n))
    for j in range(n):
        out[j] = np.float32((np.rint(np.float64(x[j]) * scale) * n - total) * inverse)


@inline
def _affine(normed, norm, j):
    """``normed * gain + bias`` of feature ``j``, ``norm [2, n]`` the gain and bias: two roundings."""
    return normed * norm[0, j] + norm[1, j]


@inline
def _lookup(table, x, limit):
    """``table[limit + clamp(round(1024 x), -limit, limit)]`` for ``x`` float32."""
    index = min(max(np.rint(x * _RESOLUTION), np.float32(-limit)), np.float32(limit))
    return table[np.int64(index) + limit]


@inline
def _gelu(x, sigmoid):
    """The model's GELU ``x * sigmoid(1.702 x)`` from the sigmoid table."""
    return x * _lookup(sigmoid, x * _SLOPE, _SIGMOID_LIMIT)


@inline
def _input_gates(from_input, ln_ih, bias, eps, out):
    """The LN-LSTM's gates from its input ``LN_ih(from_input) + b`` into ``out [4d]``."""
    _layer_norm(from_input, eps, out)
    for j in range(out.shape[0]):
        out[j] = _affine(out[j], ln_ih, j) + bias[j]


# ------------------------------------------------------------------ the LSTM

_F32_2D = "float32[:, ::1]"
_RECURRENCE = (
    f"void({_F32_2D}, {_F32_2D}, {_F32_2D}, int64[::1], int64, {_F32_2D}, {_F32_2D}, float32[::1], {_F32_2D},"
    f" float64, float32[::1], float32[::1], {_F32_2D}, {_F32_2D})"
)


@kernel(f"void({_F32_2D}, {_F32_2D}, float64, {_F32_2D}, {_F32_2D})", parallel=True)
def block_input(x, ln_start, eps, h, out):
    """``out[:, :d] = LN_start(x)`` for ``x [B, d]``; ``out [B, 2d]`` (the fused gate
    product's input) takes ``h [B, d]`` beside it."""
    d = x.shape[1]
    for b in prange(x.shape[0]):
        _layer_norm(x[b], eps, out[b, :d])
        for j in range(d):
            out[b, j] = _affine(out[b, j], ln_start, j)
        if out.shape[1] > d:
            out[b, d:] = h[b]


@kernel(f"void({_F32_2D}, {_F32_2D}, float32[::1], float64, {_F32_2D})", parallel=True)
def input_gates(from_input, ln_ih, bias, eps, out):
    """The LN-LSTM's gates from its input, ``LN_ih(from_input) + b`` for ``from_input [N,
    4d]`` (``W_ih LN_start(x)``) into ``out [N, 4d]``: block 0's table."""
    for b in prange(from_input.shape[0]):
        _input_gates(from_input[b], ln_ih, bias, eps, out[b])


@kernel(_RECURRENCE, parallel=True, allocates=True)
def recurrence(gates, from_input, table, tokens, kind, ln_ih, ln_hh, bias, ln_cell, eps, sigmoid, tanh, h, c):
    """One LSTM (or LN-LSTM) position: ``h [B, d]`` and ``c [B, d]`` updated in place.

    ``gates [B, 4d]`` is a product's result: the gates themselves (``kind`` :data:`FUSED`),
    or ``W_hh h`` (the others); ``from_input [B, 4d]`` is ``W_ih LN_start(x)`` for
    :data:`LN_PRODUCT`; ``table [V, 4d]`` is read at ``tokens [B]`` for :data:`TABLE` and
    :data:`LN_TABLE`. The gates come in the order ``f, i, o, g``; ``ln_ih``, ``ln_hh`` (``[2,
    4d]``) and ``ln_cell`` (``[2, d]``) are the LN-LSTM's gains and biases, ``bias [4d]`` its
    gates' bias."""
    d = h.shape[1]
    for b in prange(h.shape[0]):
        row = np.empty(4 * d, dtype=np.float32)
        if kind == FUSED:
            row[:] = gates[b]
        elif kind == TABLE:
            for j in range(4 * d):
                row[j] = table[tokens[b], j] + gates[b, j]
        else:
            _layer_norm(gates[b], eps, row)
            given = np.empty(4 * d, dtype=np.float32)
            if kind == LN_TABLE:
                given[:] = table[tokens[b]]
            else:
                _input_gates(from_input[b], ln_ih, bias, eps, given)
            for j in range(4 * d):
                row[j] = given[j] + _affine(row[j], ln_hh, j)
        for j in range(d):
            forget, remember = _lookup(sigmoid, row[j], _SIGMOID_LIMIT), _lookup(sigmoid, row[d + j], _SIGMOID_LIMIT)
            c[b, j] = forget * c[b, j] + remember * _lookup(tanh, row[3 * d + j], _TANH_LIMIT)
        cell = c[b]
        if kind >= LN_TABLE:
            cell = np.empty(d, dtype=np.float32)
            _layer_norm(c[b], eps, cell)
            for j in range(d):
                cell[j] = _affine(cell[j], ln_cell, j)
        for j in range(d):
            h[b, j] = _lookup(sigmoid, row[2 * d + j], _SIGMOID_LIMIT) * _lookup(tanh, cell[j], _TANH_LIMIT)


# ------------------------------------------------------------------ the attention


_RING = "int32[:, :, ::1], int16[:, :, ::1], boolean[:, ::1]"  # the ring, its int16 copy, the rows it cannot hold


@kernel(f"void({_F32_2D}, {_RING}, int64, {_F32_2D}, {_F32_2D}, float64, {_F32_2D})", parallel=True, allocates=True)
def attention_input(u, ring, narrow, wide, slot, ln_mem, ln_mid, eps, r):
    """From the LSTM's output ``u [B, d]``, one normalisation for two LayerNorms: ``LN_mem(u)``
    in units of 2**-10, rounded and clamped to ±2**15, into ``ring [B, R, d]`` (int32) at
    ``slot``; ``r [B, d] = LN_mid(u)``. The attention reads the ring's copy ``narrow [B, R,
    d]`` (int16: half the bytes), except where ``wide [B, R]`` marks a row with an entry of
    2**15, which int16 cannot hold (its copy holds 2**15 - 1 there)."""
    d = u.shape[1]
    unit, limit = np.float64(2**MEMORY_FRACTION_BITS), np.float64(MEMORY_LIMIT)
    for b in prange(u.shape[0]):
        normed = np.empty(d, dtype=np.float32)
        _layer_norm(u[b], eps, normed)
        over = False
        for j in range(d):
            key = np.int32(min(max(np.rint(np.float64(_affine(normed[j], ln_mem, j)) * unit), -limit), limit))
            over |= key == MEMORY_LIMIT
            ring[b, slot, j] = key
            narrow[b, slot, j] = np.int16(min(key, MEMORY_LIMIT - 1))
            r[b, j] = _affine(normed[j], ln_mid, j)
        wide[b, slot] = over


@inline
def _attend(query, memory, narrow, wide, exp_table, total):
    """The attention of one stream over ``memory [n, d]`` (int32, units of 2**-10) from
    ``query [d]`` (float32): the weighted sum of the memory into ``total [d]`` (int64,
    exact); returns the sum of the weights. The query is rounded to integers below 2**15 (a
    power of two per row), each score ``sum q m`` is an exact integer, and each weight is
    the ``exp`` table's entry at the score's gap to the largest, in 1/256 nat. The sums read
    the int16 copy ``narrow [n, d]``, and add ``memory - narrow`` for the rows ``wide [n]``
    (an entry of 2**15, one more than the copy holds): integers, exact in any order."""
    n, d = memory.shape
    scale = _power_of_two(_largest(query), QUERY_BITS)
    q = np.empty((1, d), dtype=np.int16)  # a row for pair_dot; ...
    q_wide = np.empty(d, dtype=np.int64)  # ... and each of its entries, one of them 2**15 perhaps
    largest = np.int64(0)
    for j in range(d):
        q_wide[j] = np.int64(np.rint(np.float64(query[j]) * scale))
        q[0, j] = np.int16(q_wide[j])
        largest = max(largest, abs(q_wide[j]))
    paired = d - d % LANES if largest < MEMORY_LIMIT else 0  # the columns pair_dot sums
    scores = np.empty(n, dtype=np.int64)
    for t in range(n):
        score = pair_dot(narrow, q, t, 0) if paired else np.int64(0)
        for j in range(paired, d):
            score += q_wide[j] * np.int64(narrow[t, j])
        if wide[t]:
            for j in range(d):
                score += q_wide[j] * np.int64(memory[t, j] - narrow[t, j])
        scores[t] = score
    top = scores.max()
    unit = 1.0 / (scale * 2.0**MEMORY_FRACTION_BITS)  # a score's value in nats: a power of two
    weight = np.empty(n, dtype=np.int64)
    for t in range(n):
        gap = np.rint(np.float64(top - scores[t]) * unit * EXP_RESOLUTION)
        weight[t] = exp_table[np.int64(min(gap, EXP_ENTRIES - 1))]
    total[:] = 0
    fours = n - n % 4
    for t in range(0, fours, 4):  # four rows at a time: a quarter of the loads and stores of total
        w0, w1, w2, w3 = weight[t], weight[t + 1], weight[t + 2], weight[t + 3]
        r0, r1, r2, r3 = narrow[t], narrow[t + 1], narrow[t + 2], narrow[t + 3]
        for j in range(d):
            total[j] += (w0 * np.int64(r0[j]) + w1 * np.int64(r1[j])) + (w2 * np.int64(r2[j]) + w3 * np.int64(r3[j]))
    for t in range(fours, n):
        for j in range(d):
            total[j] += weight[t] * np.int64(narrow[t, j])
    for t in range(n):
        if wide[t]:
            for j in range(d):
                total[j] += weight[t] * np.int64(memory[t, j] - narrow[t, j])
    return weight.sum()


@kernel(
    f"void({_F32_2D}, {_RING}, int64, {_F32_2D}, float32[::1], {_F32_2D}, float64, int64[::1], {_F32_2D})",
    parallel=True,
    allocates=True,
)
def attention(query, ring, narrow, wide, filled, ln_query, value_gate, r, eps, exp_table, y):
    """``y = r + g_v * Attn(query)`` for ``r [B, d]`` (``LN_mid(u)``) and the query
    product's result ``query [B, d]``, over the first ``filled`` slots of the ring
    (:func:`attention_input`'s three arrays): the query normalised with ``ln_query [2, d]``
    (its gates and ``1/sqrt(d)`` folded into the gain and bias), the weighted sum over the
    sum of the weights, in units of the memory, the value gate ``value_gate [d]``."""
    d = r.shape[1]
    for b in prange(r.shape[0]):
        normed = np.empty(d, dtype=np.float32)
        _layer_norm(query[b], eps, normed)
        for j in range(d):
            normed[j] = _affine(normed[j], ln_query, j)
        total = np.empty(d, dtype=np.int64)
        weights = _attend(normed, ring[b, :filled], narrow[b, :filled], wide[b, :filled], exp_table, total)
        per_unit = (1.0 / np.float64(weights)) * 2.0**-MEMORY_FRACTION_BITS
        for j in range(d):
            y[b, j] = r[b, j] + value_gate[j] * np.float32(np.float64(total[j]) * per_unit)


# ------------------------------------------------------------------ the feed-forward


@kernel(f"void({_F32_2D}, {_F32_2D}, float64, {_F32_2D}, {_F32_2D})", parallel=True)
def feed_forward_input(y, ln_xff, eps, normed, inner):
    """One normalisation of ``y [B, d]`` for two LayerNorms: ``normed [B, d]`` (``LN_ff``'s,
    before its gain and bias) and ``inner = LN_xff(y)`` (the Boom's or MLP's input)."""
    for b in prange(y.shape[0]):
        _layer_norm(y[b], eps, normed[b])
        for j in range(y.shape[1]):
            inner[b, j] = _affine(normed[b, j], ln_xff, j)


@kernel(f"void({_F32_2D}, {_F32_2D}, {_F32_2D}, float32[::1], {_F32_2D})", parallel=True)
def boom(pre, normed, ln_ff, sigmoid, z):
    """``z = LN_ff(y) + Boom``: the GELU of the up-projection ``pre [B, F]``, its ``F/d``
    chunks of ``d`` summed in order (one rounding each), added to ``normed [B, d]`` under
    ``LN_ff``'s gain and bias ``ln_ff [2, d]``."""
    d = z.shape[1]
    for b in prange(z.shape[0]):
        inner = z[b]  # each feature's sum, chunk after chunk (loops over features: vectors)
        for j in range(d):
            inner[j] = _gelu(pre[b, j], sigmoid)
        for chunk in range(1, pre.shape[1] // d):
            for j in range(d):
                inner[j] = inner[j] + _gelu(pre[b, chunk * d + j], sigmoid)
        for j in range(d):
            z[b, j] = _affine(normed[b, j], ln_ff, j) + inner[j]


@kernel(f"void({_F32_2D}, float32[::1], {_F32_2D})", parallel=True)
def gelu(pre, sigmoid, hidden):
    """The MLP's ``hidden [B, F] = GELU(pre)``."""
    for b in prange(pre.shape[0]):
        for j in range(pre.shape[1]):
            hidden[b, j] = _gelu(pre[b, j], sigmoid)


@kernel(f"void({_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_2D})", parallel=True)
def residual(inner, normed, ln_ff, z):
    """The MLP's ``z = LN_ff(y) + inner``, ``inner [B, d]`` its down-projection."""
    for b in prange(z.shape[0]):
        for j in range(z.shape[1]):
            z[b, j] = _affine(normed[b, j], ln_ff, j) + inner[b, j]


# ------------------------------------------------------------------ the output


@kernel("void(float32[:, ::1], int64[::1], float64[:, ::1], int32[:, ::1])", parallel=True, allocates=True)
def output_weights(logits, exp_table, probabilities, log_weights):
    """From ``logits [B, V]`` (float32): each logit's gap to its row's largest, rounded to
    1/256 nat, ``-gap`` into ``log_weights [B, V]``; the ``exp`` table's integer weights at
    the gaps over their exact sum into ``probabilities [B, V]`` (float64)."""
    for b in prange(logits.shape[0]):
        top = logits[b].max()
        weights = np.empty(logits.shape[1], dtype=np.int64)
        for v in range(logits.shape[1]):
            index = np.int64(min(np.rint(np.float64(top - logits[b, v]) * EXP_RESOLUTION), EXP_ENTRIES - 1))
            log_weights[b, v] = -index
            weights[v] = exp_table[index]
        inverse = 1.0 / np.float64(weights.sum())
        for v in range(logits.shape[1]):
            probabilities[b, v] = np.float64(weights[v]) * inverse


# ------------------------------------------------------------------ a position, all blocks

_F32_1D = "float32[::1]"
BLOCK = (
    f"Tuple((int64, float64, boolean, boolean, {_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_1D}, {_F32_2D}, {_F32_2D},"
    f" {_F32_2D}, {PRODUCT}, {PRODUCT}, Tuple(({_RING})), {_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_1D}, {PRODUCT},"
    f" {_F32_2D}, {_F32_2D}, {PRODUCT}, {PRODUCT}, {_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_2D}, {_F32_2D}))"
)  # one block's weights and buffers as position() reads them (sharnn.models.integer_step: _IntegerBlock.arguments)


@kernel(f"ListType({BLOCK})({BLOCK})", allocates=True)
def blocks_of(first):
    """A list of blocks for :func:`position` holding ``first`` (:func:`append_block` adds
    the others). Made in a kernel: a typed list made from Python has its methods compiled
    in every process (1.4 s here), a kernel's code comes from the cache."""
    blocks = List()
    blocks.append(first)
    return blocks


@kernel(f"void(ListType({BLOCK}), {BLOCK})", allocates=True)
def append_block(blocks, block):
    """``block`` added to ``blocks`` (:func:`blocks_of`)."""
    blocks.append(block)


@kernel(
    f"void(ListType({BLOCK}), int64[::1], {_F32_2D}, {_F32_2D}, float32[:, :, ::1], float32[:, :, ::1], int64, int64,"
    f" {PRODUCT}, float32[::1], float32[::1], int64[::1], float64[:, ::1], int32[:, ::1])",
    allocates=True,
)
def position(
    blocks, tokens, embedding, x, h, c, slot, filled, output, sigmoid, tanh, exp_table, probabilities, log_weights
):
    """One position of the integer step, every block and the output product, in one call
    (each kernel of this module and each product called from here, in the order of
    :class:`~sharnn.models.integer_step.IntegerStep`): ``tokens [B]`` in; ``h`` and ``c``
    (``[L, B, d]``), the blocks' rings and buffers updated; the logits in ``output``'s
    ``out [B, V]``, and, unless they are empty, their :func:`output_weights` in
    ``probabilities`` and ``log_weights`` (``[B, V]``). ``x [B, d]`` takes block 0's input,
    gathered from ``embedding [V, d]`` where block 0 has no table. A block (:data:`BLOCK`)
    without attention, a table, a second product or the MLP's down projection holds empty
    arrays there."""
    if blocks[0][10].shape[0] == 0:  # block 0 has no table: its input is gathered
        for b in range(tokens.shape[0]):
            x[b] = embedding[tokens[b]]
    for i in range(len(blocks)):
        block = blocks[i]
        kind, eps, attends, mlp, ln_start, ln_ih, ln_hh, bias, ln_cell, staged, table, gate, from_input = block[:13]
        ring, ln_mem, ln_mid, ln_query, value_gate, query, r, y = block[13:21]
        up, down, ln_xff, ln_ff, normed, inner, z, hidden = block[21:]
        if kind == FUSED:
            block_input(x, ln_start, eps, h[i], staged)
            gates = given = product(gate, staged)
        else:
            gates = given = product(gate, h[i])
            if kind == LN_PRODUCT:
                block_input(x, ln_start, eps, h[i], staged)
                given = product(from_input, staged)
        read = gates if table.shape[0] == 0 else table
        recurrence(gates, given, read, tokens, kind, ln_ih, ln_hh, bias, ln_cell, eps, sigmoid, tanh, h[i], c[i])
        out = h[i]
        if attends:
            attention_input(h[i], ring[0], ring[1], ring[2], slot, ln_mem, ln_mid, eps, r)
            queried = product(query, r)
            attention(queried, ring[0], ring[1], ring[2], filled, ln_query, value_gate, r, eps, exp_table, y)
            out = y
        feed_forward_input(out, ln_xff, eps, normed, inner)
        pre = product(up, inner)
        if mlp:
            gelu(pre, sigmoid, hidden)
            residual(product(down, hidden), normed, ln_ff, z)
        else:
            boom(pre, normed, ln_ff, sigmoid, z)
        x = z
    logits = product(output, x)
    if probabilities.shape[0]:
        output_weights(logits, exp_table, probabilities, log_weights)
