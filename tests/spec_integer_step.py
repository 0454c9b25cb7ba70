"""The specification of the integer step: the torch implementation of
:class:`sharnn.models.integer_step.IntegerStep` as it was written for format version 5
(``INTEGER_STEP_VERSION = 1``), kept verbatim. The step now runs on numba kernels
(:mod:`sharnn.models.integer_kernels`, :mod:`sharnn.models.integer_products`); the tests
compare them with this, bit for bit (tests/test_integer_kernels.py), and
benchmarks/integer_formats.py puts its pieces back to floating point one at a time.

Each operation is one torch call whose result IEEE 754 fixes to the last bit (docs/compression.md,
"The integer step"): elementwise ``+ - *``, ``reciprocal`` and ``sqrt``, ``round``, gathers,
and sums of integers that are exact in any order. What the package still uses of it (the
tables, the exp index of the output's log weights, the weights' quantization,
correctly rounded scalar functions) lives in :mod:`sharnn.models.exact`; the rest is here.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from torch import Tensor

from sharnn.errors import ConfigError
from sharnn.models import exact
from sharnn.models.exact import (
    SIGMOID_RANGE,
    TABLE_RESOLUTION,
    TANH_RANGE,
    TINY,
    QuantizedWeights,
    sigmoid_table,
    tanh_table,
)
from sharnn.models.lstm import LayerNormLSTM
from sharnn.models.sharnn import SHARNN, Block
from sharnn.models.step import GELU_SLOPE, TABLE_MAX_ROWS, gate_weights, linear, zero_state

LAYER_NORM_BITS = exact.LAYER_NORM_BITS

INTEGER_STEP_VERSION = 1  # what a format-4 file records; a change to any number below makes a new version

MEMORY_FRACTION_BITS = 10  # the memory ring holds LN_mem's outputs in units of 2**-10 ...
MEMORY_LIMIT = 2**15  # ... clamped to [-32, 32]
QUERY_BITS = 15  # the query: integers below 2**15 per row
MAX_SPAN = exact.FP64_EXACT // (exact.EXP_ONE * MEMORY_LIMIT)  # 16,384 positions: the weighted sum stays exact

# ------------------------------------------------------------------ from sharnn.models.exact


@cache
def _on(table, device: torch.device) -> Tensor:
    """``table()`` on ``device``, copied there once."""
    return table().to(device)


def lookup(
    table: Tensor, x: Tensor, resolution: float, limit: int | Tensor, centre: int | Tensor | None = None
) -> Tensor:
    """``table`` at ``x``: the entry of ``round(x * resolution)``, clamped to ``[-limit,
    limit]``, counted from entry ``centre`` (default ``limit``: a table of ``2 * limit + 1``
    entries centred on 0). ``limit`` and ``centre`` may be tensors that broadcast against
    ``x`` (several tables in one). Same shape as ``x``."""
    index = torch.round(x * resolution)
    index = index.clamp_(-limit, limit) if isinstance(limit, int) else torch.clamp(index, -limit, limit)
    index = index.add_(limit if centre is None else centre).int()
    return table.index_select(0, index.view(-1)).view(x.shape)


def largest_magnitude(x: Tensor) -> Tensor:
    """``max |x|`` over the last dimension, at least :data:`TINY`: ``[..., 1]``."""
    return x.abs().amax(-1, keepdim=True).clamp_min_(TINY)  # exact; vector_norm(x, inf) takes 4-13x as long


def sigmoid(x: Tensor) -> Tensor:
    """``sigmoid(x)`` of ``x`` rounded to a multiple of 1/1024 (within 2.5e-4 of the exact one)."""
    return lookup(_on(sigmoid_table, x.device), x, TABLE_RESOLUTION, SIGMOID_RANGE * TABLE_RESOLUTION)


def tanh(x: Tensor) -> Tensor:
    """``tanh(x)`` of ``x`` rounded to a multiple of 1/1024 (within 5e-4 of the exact one)."""
    return lookup(_on(tanh_table, x.device), x, TABLE_RESOLUTION, TANH_RANGE * TABLE_RESOLUTION)


@cache
def _gate_tables(columns: int, split: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """The sigmoid and tanh tables end to end, and per column its limit and centre."""
    sigmoid_limit, tanh_limit = SIGMOID_RANGE * TABLE_RESOLUTION, TANH_RANGE * TABLE_RESOLUTION
    table = torch.cat([sigmoid_table(), tanh_table()]).to(device)
    is_tanh = torch.arange(columns, device=device) >= split
    limit = torch.where(is_tanh, tanh_limit, sigmoid_limit).float()
    centre = torch.where(is_tanh, 2 * sigmoid_limit + 1 + tanh_limit, sigmoid_limit).float()
    return table, limit, centre


def sigmoid_and_tanh(x: Tensor, split: int) -> Tensor:
    """:func:`sigmoid` of ``x[:, :split]`` and :func:`tanh` of ``x[:, split:]`` (``x [B, n]``), in one lookup."""
    table, limit, centre = _gate_tables(x.shape[-1], split, x.device)
    return lookup(table, x, TABLE_RESOLUTION, limit, centre)


def softmax(logits: Tensor) -> Tensor:
    """Probabilities ``[..., V]`` float64 from float32 ``logits [..., V]``: weights from
    :func:`exact.exp_weights` of each logit's gap to the largest, divided by their exact sum."""
    weights = exact.exp_weights((logits.amax(-1, keepdim=True) - logits).double())
    return weights * weights.sum(-1, keepdim=True).reciprocal()


_POWERS_OF_TWO = torch.tensor([2.0**k for k in range(-160, 161)], dtype=torch.float64)


def power_of_two(exponent: Tensor) -> Tensor:
    """``2 ** exponent`` for integer ``exponent`` in [-160, 160], exactly (float64)."""
    index = exponent.clamp(-160, 160).add_(160).int()
    return _POWERS_OF_TWO.to(exponent.device).index_select(0, index.view(-1)).view(exponent.shape)


def layer_norm(x: Tensor, eps: float) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the last dimension of ``x [B, n]`` (float32),
    without gain or bias: ``[B, n]`` float32.

    Each row is scaled by a power of two so its largest entry lies in [2**(b-1), 2**b) (``b`` =
    17, fewer for ``n`` > 512, so that ``n^2 q^2 < 2**53``) and
    rounded to integers ``q``; ``sum q`` and ``sum q^2`` are then exact in float64, and
    ``(n q - sum q) / sqrt(n sum q^2 - (sum q)^2 + eps n^2 scale^2)`` is a few correctly
    rounded operations.
    """
    n = x.shape[-1]
    bits = min(LAYER_NORM_BITS, (52 - 2 * math.ceil(math.log2(n))) // 2)  # n^2 q^2 stays below 2**53
    largest = largest_magnitude(x)
    scale = power_of_two(bits - torch.frexp(largest).exponent)  # largest * scale in [2**(bits-1), 2**bits)
    q = torch.round(x.double() * scale)
    total = q.sum(-1, keepdim=True)
    centred = q * n - total
    spread = (q * q).sum(-1, keepdim=True) * n - total * total  # n^2 times the variance of q, exactly
    return (centred * torch.sqrt(spread + scale * scale * (eps * n * n)).reciprocal()).float()


class ExactLinear(QuantizedWeights):
    """``x @ weight^T + bias`` with ``weight`` rounded to integers in [-127, 127] per output
    row, ``x`` to integers in [-L, L] per row (``L``: :attr:`levels`), and their product
    summed exactly in float32.

    ``L`` is the largest that keeps every partial sum of every row within 2**24:
    ``L * max_row(sum |w_q|) <= 2**24`` (at most :data:`MAX_ACTIVATION_LEVELS`), so the
    product is exact whatever kernel computes it. The result is ``acc * w_scale * x_scale +
    bias``, each operation rounded once.

    Args:
        weight: ``[N, K]`` float32.
        bias: ``[N]`` float32, or None.

    Raises:
        ValueError: a row so long that fewer than 2 levels remain for ``x``.
    """

    def __call__(self, x: Tensor, product) -> Tensor:
        """``x [B, K]`` float32 -> ``[B, N]`` float32; ``product(a, w)`` is the float32 matrix
        product ``a @ w^T`` (any kernel: the sums are exact)."""
        largest = largest_magnitude(x)
        q = torch.round(x * (largest.reciprocal() * self.levels))
        result = product(q, self.weight) * self.weight_scale * (largest * (1 / self.levels))
        return result if self.bias is None else result + self.bias


def products_are_exact(product) -> bool:
    """Whether ``product`` (as :class:`ExactLinear`'s) sums integers exactly in float32 on
    this machine: false where it rounds its inputs to bfloat16 or TF32 (for example
    under ``ONEDNN_DEFAULT_FPMATH_MODE=BF16``), which would make the integer step's results
    differ between machines."""
    a = torch.tensor([[4097.0, 1.0, -3.0]])
    w = torch.tensor([[4095.0, 3.0, 1.0], [1.0, 4097.0, 255.0]])
    return product(a, w).tolist() == [[4097.0 * 4095 + 3 - 3, 4097.0 + 4097 - 765]]


# ------------------------------------------------------------------ the step


def _exactly(function, values: Tensor) -> Tensor:
    """``function`` (correctly rounded, on Python floats) of every entry: float64, same shape."""
    flat = [function(v) for v in values.detach().double().flatten().tolist()]
    return torch.tensor(flat, dtype=torch.float64, device=values.device).view(values.shape)


def _exact_affine(weight: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    """``weight @ x + bias`` (float64) for a constant, each row summed correctly rounded (``math.fsum``)."""
    xs, rows = x.double().tolist(), weight.double().tolist()
    return torch.tensor(
        [math.fsum([*(w * v for w, v in zip(row, xs)), b]) for row, b in zip(rows, bias.double().tolist())],
        dtype=torch.float64,
        device=x.device,
    )


def _affine(normed: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
    """A LayerNorm's gain and bias on its normalised input ``[B, n]``: a product, then a sum."""
    return normed * norm.weight + norm.bias


class IntegerStep:
    """One position of ``model`` for ``streams`` streams in exactly specified arithmetic.

    Example::

        step = IntegerStep(model, streams=8)
        probs = step.probabilities(step(tokens))   # tokens [B] int64 -> [B, 256] float64

    Args:
        model: a trained :class:`~sharnn.models.sharnn.SHARNN` (float32), on the CPU or a
            GPU; its weights are read, never changed.
        streams: ``B``.
        positions: the most positions it will run (None: no limit); the memory holds
            ``min(attention_span, positions)`` of them.

    Attributes:
        position: positions run.
        lstm: per block ``(h, c)``, each ``[B, d]`` float32.
        memory: per block the ring ``[B, R, d]`` float64 of integers (``LN_mem`` in units
            of 2**-10), position ``p`` in slot ``p % R``; None without attention.

    Raises:
        ConfigError: a model that is not an SHA-RNN, ``streams`` < 1, an attention span over
            :data:`MAX_SPAN`, or a machine whose float32 products round their inputs
            (:func:`products_are_exact`).
    """

    def __init__(self, model: SHARNN, streams: int, positions: int | None = None):
        if not isinstance(model, SHARNN):
            raise ConfigError(f"the integer step runs an SHA-RNN, not a {type(model).__name__}")
        if streams < 1:
            raise ConfigError(f"streams must be >= 1, got {streams}")
        span = model.config.attention_span
        if span > MAX_SPAN:
            raise ConfigError(f"the integer step holds at most {MAX_SPAN:,} positions of memory, not {span:,}")
        if not products_are_exact(linear):
            raise ConfigError(
                "this machine's float32 matrix products round their inputs (ONEDNN_DEFAULT_FPMATH_MODE or "
                "TF32?), so the integer step cannot be exact here"
            )
        self.model, self.streams, self.limit = model, streams, positions
        self.position = 0
        self.slots, self.lstm, self.memory = zero_state(model, streams, positions, torch.float64)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Prepare the weights from the model's (again, after they changed); the state is kept."""
        model = self.model
        table = model.config.vocab_size <= TABLE_MAX_ROWS
        self.blocks = [
            _IntegerBlock(block, model.embedding.weight if table and i == 0 else None)
            for i, block in enumerate(model.blocks)
        ]
        self.output = ExactLinear(model.embedding.weight, model.output_bias)

    @torch.no_grad()
    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens [B]`` (int64, on the model's device) -> logits ``[B, V]`` float32.

        Raises:
            ValueError: more positions than ``positions``.
        """
        if self.limit is not None and self.position >= self.limit:
            raise ValueError(f"the step was made for {self.limit} positions")
        slot, filled = self.position % self.slots, min(self.position + 1, self.slots)
        x = None if self.blocks[0].table is not None else self.model.embedding.weight[tokens]
        for i, block in enumerate(self.blocks):
            self.lstm[i] = block.recurrence(x, tokens, self.lstm[i])
            u = self.lstm[i][0]
            x = block.feed_forward(u if self.memory[i] is None else block.attend(u, self.memory[i], slot, filled))
        self.position += 1
        return self.output(x, linear)

    @staticmethod
    def probabilities(logits: Tensor) -> np.ndarray:
        """Logits ``[B, V]`` -> probabilities ``[B, V]`` float64 for the coder, exactly
        specified (:func:`softmax`)."""
        return softmax(logits).cpu().numpy()


class _IntegerBlock:
    """One block's weights as the integer step uses them; with ``embedding`` (``[V, d]``,
    block 0's input), its input-to-gates table, computed by the same exact arithmetic."""

    def __init__(self, block: Block, embedding: Tensor | None):
        self.block = block
        self.eps = block.ln_start.eps
        self.ln_lstm = isinstance(block.lstm, LayerNormLSTM)
        w_ih, w_hh, self.bias = gate_weights(block.lstm)
        if embedding is not None or self.ln_lstm:
            self.from_input = ExactLinear(w_ih, None if self.ln_lstm else self.bias)
            self.from_h = ExactLinear(w_hh)
        else:  # the two products as one
            self.fused = ExactLinear(torch.cat([w_ih, w_hh], dim=1), self.bias)
        self.table = None if embedding is None else self._gates_from_input(embedding)
        if block.attention is not None:
            self._prepare_attention()
        ff = block.feed_forward
        up = ff.boom.linear if ff.mlp is None else ff.mlp.up
        self.up = ExactLinear(up.weight, up.bias)
        self.down = None if ff.mlp is None else ExactLinear(ff.mlp.down.weight, ff.mlp.down.bias)

    def _gates_from_input(self, x: Tensor) -> Tensor:
        """The gates' part from the block's input ``x [N, d]``, the bias included: ``[N, 4d]``."""
        gates = self.from_input(_affine(layer_norm(x, self.eps), self.block.ln_start), linear)
        if self.ln_lstm:
            return _affine(layer_norm(gates, self.eps), self.block.lstm.ln_ih) + self.bias
        return gates

    def recurrence(self, x: Tensor | None, tokens: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The LSTM (or LN-LSTM) of one position, as :class:`Step`'s, in exact arithmetic."""
        h, c = state
        d = h.shape[1]
        if self.table is None and not self.ln_lstm:
            gates = self.fused(torch.cat([_affine(layer_norm(x, self.eps), self.block.ln_start), h], 1), linear)
        else:
            from_input = self._gates_from_input(x) if self.table is None else self.table[tokens]
            from_h = self.from_h(h, linear)
            if self.ln_lstm:
                from_h = _affine(layer_norm(from_h, self.eps), self.block.lstm.ln_hh)
            gates = from_input + from_h
        f, i, o, g = sigmoid_and_tanh(gates, 3 * d).chunk(4, dim=1)
        c = f * c + i * g
        cell = _affine(layer_norm(c, self.eps), self.block.lstm.ln_cell) if self.ln_lstm else c
        return o * tanh(cell), c

    def _prepare_attention(self) -> None:
        """The value gate's constant; the query's gates and ``1/sqrt(d)`` in ``ln_query``'s
        gain and bias (as :class:`Step`'s), with correctly rounded scalar functions."""
        head = self.block.attention.head
        if hasattr(head, "value_gate"):  # collapsed
            gate = head.value_gate.double()
        elif not hasattr(head, "value_gate_net"):
            gate = _exactly(exact.scalar_sigmoid, head.gate_v)
        else:
            net = head.value_gate_net
            c, f = _exact_affine(net.weight, _exactly(exact.scalar_sigmoid, head.gate_v), net.bias).chunk(2)
            gate = _exactly(exact.scalar_sigmoid, f) * _exactly(exact.scalar_tanh, c)
        self.value_gate = gate.float()
        scale = _exactly(exact.scalar_sigmoid, head.gate_q) * _exactly(exact.scalar_sigmoid, head.gate_k) * head.scale
        self.query_gain = (head.ln_query.weight.double() * scale).float()
        self.query_bias = (head.ln_query.bias.double() * scale).float()
        self.query = ExactLinear(head.query.weight, head.query.bias)

    def attend(self, u: Tensor, ring: Tensor, slot: int, filled: int) -> Tensor:
        """``y = LN_mid(u) + g_v * Attn(LN_mid(u), memory)`` for ``u [B, d]``, ``LN_mem(u)``
        written into ``ring`` at ``slot`` first. Returns ``y [B, d]`` float32."""
        sublayer = self.block.attention
        normed = layer_norm(u, self.eps)  # shared by LN_mem and LN_mid
        key = torch.round(_affine(normed, sublayer.ln_mem).double() * 2.0**MEMORY_FRACTION_BITS)
        ring[:, slot] = key.clamp_(-MEMORY_LIMIT, MEMORY_LIMIT)
        r = _affine(normed, sublayer.ln_mid)
        query = layer_norm(self.query(r, linear), self.eps) * self.query_gain + self.query_bias
        largest = largest_magnitude(query)
        scale = power_of_two(QUERY_BITS - torch.frexp(largest).exponent)  # [B, 1]
        query = torch.round(query.double() * scale)  # integers below 2**15
        memory = ring[:, :filled]  # [B, n, d]
        scores = torch.bmm(query.unsqueeze(1), memory.transpose(1, 2))  # [B, 1, n] integers, exact
        unit = (scale * 2.0**MEMORY_FRACTION_BITS).reciprocal().unsqueeze(1)  # a score's value in nats
        weights = exact.exp_weights((scores.amax(-1, keepdim=True) - scores) * unit)  # [B, 1, n]
        total = torch.bmm(weights, memory).squeeze(1)  # [B, d] integers, exact
        per_unit = weights.sum(-1).reciprocal() * 2.0**-MEMORY_FRACTION_BITS  # [B, 1]
        return r + self.value_gate * (total * per_unit).float()

    def feed_forward(self, y: Tensor) -> Tensor:
        """``z = LN_ff(y) + Boom(LN_xff(y))`` (or the MLP) for ``y [B, d]``, one exact
        normalisation shared by both LayerNorms. Returns ``z [B, d]`` float32."""
        ff = self.block.feed_forward
        normed = layer_norm(y, self.eps)
        pre = self.up(_affine(normed, ff.ln_xff), linear)  # [B, F]
        hidden = pre * sigmoid(pre * GELU_SLOPE)  # the model's GELU
        if self.down is not None:
            inner = self.down(hidden, linear)
        else:  # the Boom: the F/d chunks summed in order, one rounding each
            chunks = hidden.unflatten(-1, (-1, y.shape[1])).unbind(1)
            inner = chunks[0]
            for chunk in chunks[1:]:
                inner = inner + chunk
        return _affine(normed, ff.ln_ff) + inner
