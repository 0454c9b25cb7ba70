"""The integer step: one inference position of an SHA-RNN for ``B`` streams, computed so
that its results are the same bits on every CPU kind, thread count and torch version
(docs/compression.md, "The integer step"). ``sharnn compress`` codes with it by default
(format versions 4 on), so that a file decodes on any machine.

It is the quantized twin of :class:`~sharnn.models.step.Step`, specified operation by
operation in torch (tests/spec_integer_step.py) and computed by numba kernels that give
the same bits (:mod:`sharnn.compiled`'s rules):

- every matrix product: weights rounded to 8-bit integers per output row, inputs to
  integers per row, their products summed exactly in int32
  (:mod:`sharnn.models.integer_products`);
- everything between the products, in a few kernels per block
  (:mod:`sharnn.models.integer_kernels`): the exact LayerNorms (inputs rounded to
  integers, their sums exact in float64), sigmoid and tanh from tables, the cell update,
  the attention over the memory in fixed point (integer scores, integer weights from a
  table of ``exp``, an exact weighted sum), the Boom's GELU and chunk sum, and the
  output's probabilities, integer weights from the same ``exp`` table over their exact sum.

Every constant prepared from the weights (the value gate, the query's gates) is computed
with correctly rounded scalar functions.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .. import compiled
from ..errors import CheckpointError, ConfigError
from . import exact, integer_kernels as kernels
from .exact import QuantizedWeights
from .integer_kernels import MEMORY_LIMIT
from .integer_products import NO_PRODUCT, IntegerLinear
from .lstm import LayerNormLSTM
from .sharnn import SHARNN, Block
from .step import TABLE_MAX_ROWS, gate_weights

INTEGER_STEP_VERSION = (
    1  # what a format-4 file records; a change to any number of the specification makes a new version
)

MAX_SPAN = exact.FP64_EXACT // (exact.EXP_ONE * MEMORY_LIMIT)  # 16,384 positions: the weighted sum stays exact


_EMPTY = np.zeros((0, 0), dtype=np.float32)  # what a block without a part holds there
_NO_WEIGHTS = (np.zeros((0, 0)), np.zeros((0, 0), np.int32))  # a position whose output's weights are not wanted


@cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sigmoid and tanh tables (float32) and the ``exp`` table (int64), as the kernels take them."""
    return exact.sigmoid_table().numpy(), exact.tanh_table().numpy(), exact.exp_table().numpy().astype(np.int64)


def _numpy(tensor: Tensor) -> np.ndarray:
    """A parameter as a C-contiguous float32 array on the CPU."""
    return np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)


def _norm(norm: torch.nn.LayerNorm) -> np.ndarray:
    """A LayerNorm's gain and bias: ``[2, n]`` float32."""
    return np.stack([_numpy(norm.weight), _numpy(norm.bias)])


def _exactly(function, values: Tensor) -> Tensor:
    """``function`` (correctly rounded, on Python floats) of every entry: float64, same shape."""
    flat = [function(v) for v in values.detach().double().flatten().tolist()]
    return torch.tensor(flat, dtype=torch.float64).view(values.shape)


RANGE = float(np.finfo(np.float32).max) / 2  # where the step's values are kept: float32's largest, less the roundings


def check_range(model: SHARNN, source: str | Path) -> None:
    """Refuse a model whose weights are out of the range the integer step represents: one
    of the float32 values it computes could pass :data:`RANGE` (then an infinity, a NaN,
    and a NaN rounded to an integer indexes past the kernels' tables: garbage or a crash),
    as :func:`value_bounds` finds from the weights before anything runs. A trained model is
    far within (the shipped one's largest bound is near 1e7, its logits'); every weight of it times 1e20
    is not.

    Raises:
        CheckpointError: naming ``source`` and the first value that could pass.
    """
    for what, bound in value_bounds(model):
        if not bound <= RANGE:  # an infinite bound too
            raise CheckpointError(
                f"{source}: the weights are out of the range the integer step represents: {what} could reach "
                f"{bound:.2g}, and it keeps its float32 values within {RANGE:.2g}"
            )


def value_bounds(model: SHARNN) -> list[tuple[str, float]]:
    """Bounds of the magnitudes of the float32 values one position of the integer step
    computes, each with what it bounds, in the order it computes them, from the largest
    magnitude of each weight (as Python floats, which may pass float32's range). The
    kernels' arithmetic gives them:

    - a LayerNorm's integers and sums are scale-free: whatever its input, its normalised
      values are within ``sqrt(n - 1)``, so its output within ``sqrt(n) max|gain| + max|bias|``;
    - a product of ``K`` inputs within ``x``: each rounded input times its scale is within
      ``x``, each weight's integer times its row's scale within ``max|W|``, so its output is
      within ``K max|W| x + max|b|``; before that, its integer sums (at most 2**24) times
      their row's scale, ``max|W| / 127``;
    - sigmoid and tanh come from tables, which clamp any argument (an infinity too): ``h =
      o tanh(c)`` is within 1, the GELU ``x sigmoid(1.702 x)`` within ``|x|``, the attention's
      average of the memory within 32 (:data:`~sharnn.models.integer_kernels.MEMORY_LIMIT`
      units of 2**-10);
    - the cell ``c`` grows by at most 1 a position; the logits' gaps to their largest, which
      may overflow, are clamped to the ``exp`` table.
    """
    bounds = _Bounds()
    x = _largest(model.embedding.weight)
    for i, block in enumerate(model.blocks):
        at, d = f"block {i}'s", block.ln_start.weight.shape[0]
        start = bounds.norm(f"{at} LN_start", block.ln_start)
        w_ih, w_hh, bias = (_largest(weight) for weight in gate_weights(block.lstm))
        if isinstance(block.lstm, LayerNormLSTM):
            bounds.product(f"{at} input gates", d, w_ih, 0.0, start)
            bounds.product(f"{at} recurrent gates", d, w_hh, 0.0, 1.0)
            gates = bounds.norm(f"{at} LN_ih", block.lstm.ln_ih) + bias + bounds.norm(f"{at} LN_hh", block.lstm.ln_hh)
            bounds.value(f"{at} gates", gates)
            bounds.norm(f"{at} LN_cell", block.lstm.ln_cell)
        else:  # one product of [LN_start(x) ; h], or block 0's table plus W_hh h: no larger
            bounds.product(f"{at} gates", 2 * d, max(w_ih, w_hh), bias, max(start, 1.0))
        if block.attention is not None:  # its output, the feed-forward's input, only normalised
            head = block.attention.head
            bounds.norm(f"{at} LN_mem", block.attention.ln_mem)
            r = bounds.norm(f"{at} LN_mid", block.attention.ln_mid)
            bounds.product(f"{at} query", d, _largest(head.query.weight), _largest(head.query.bias), r)
            bounds.norm(f"{at} LN_query", head.ln_query, head.scale)  # times its gates' sigmoids and 1/sqrt(d)
            gate = _largest(head.value_gate) if hasattr(head, "value_gate") else 1.0  # else sigmoid (* tanh)
            bounds.value(f"{at} attention", r + gate * MEMORY_LIMIT / 2**kernels.MEMORY_FRACTION_BITS)
        x = _feed_forward_bounds(bounds, at, d, block.feed_forward)
    embedding, output_bias = _largest(model.embedding.weight), _largest(model.output_bias)
    bounds.product("the logits", model.config.d_model, embedding, output_bias, x)
    return bounds.found


def _feed_forward_bounds(bounds: _Bounds, at: str, d: int, ff) -> float:
    """:func:`value_bounds` of a block's feed-forward (Boom or MLP): the bound of its output."""
    up = ff.boom.linear if ff.mlp is None else ff.mlp.up
    hidden = up.weight.shape[0]
    x = bounds.norm(f"{at} LN_xff", ff.ln_xff)
    pre = bounds.product(f"{at} up-projection", d, _largest(up.weight), _largest(up.bias), x)
    if ff.mlp is None:  # the Boom's chunks of GELUs, summed
        out = bounds.value(f"{at} Boom", hidden // d * pre)
    else:
        down = ff.mlp.down
        out = bounds.product(f"{at} down-projection", hidden, _largest(down.weight), _largest(down.bias), pre)
    return bounds.value(f"{at} output", bounds.norm(f"{at} LN_ff", ff.ln_ff) + out)


class _Bounds:
    """The bounds :func:`value_bounds` has found, in order, and the rules that find them."""

    def __init__(self):
        self.found: list[tuple[str, float]] = []

    def value(self, what: str, bound: float) -> float:
        self.found.append((what, bound))
        return bound

    def norm(self, what: str, layer_norm: torch.nn.LayerNorm, scale: float = 1.0) -> float:
        """A LayerNorm's output: ``sqrt(n) max|gain| + max|bias|`` (times ``scale``)."""
        features = layer_norm.weight.shape[0]
        return self.value(what, (math.sqrt(features) * _largest(layer_norm.weight) + _largest(layer_norm.bias)) * scale)

    def product(self, what: str, inputs: int, weight: float, bias: float, x: float) -> float:
        """A product of ``inputs`` inputs within ``x``: its integer sums times the weights'
        scales, then ``inputs max|W| x + max|b|``."""
        sums = exact.FP32_EXACT * weight / exact.WEIGHT_LEVELS
        self.value(f"{what} (their integer sums times the weights' scales)", sums)
        return self.value(what, inputs * weight * x + bias)


def _largest(tensor: Tensor | None) -> float:
    """``max |tensor|`` as a Python float; 0 for None or no entries."""
    if tensor is None or not tensor.numel():
        return 0.0
    return float(tensor.detach().abs().max())


def _exact_affine(weight: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    """``weight @ x + bias`` (float64) for a constant, each row summed correctly rounded
    (``math.fsum``) from its products (each an IEEE float64 product, as Python's)."""
    products = (weight.double() * x.double()).tolist()
    return torch.tensor([math.fsum([*row, b]) for row, b in zip(products, bias.double().tolist())], dtype=torch.float64)


class IntegerStep:
    """One position of ``model`` for ``streams`` streams in exactly specified arithmetic.

    Example::

        step = IntegerStep(model, streams=8)
        probs = step.probabilities(step(tokens))   # tokens [B] int64 -> [B, 256] float64
        probs, log_weights = step.weights(tokens.numpy())   # the same, without the logits: one call

    The kernels run on the CPU (the model may be on a GPU: its weights are copied), on
    torch's thread count (``torch.set_num_threads``), which changes no bit.

    Args:
        model: a trained :class:`~sharnn.models.sharnn.SHARNN` (float32), on the CPU or a
            GPU; its weights are read, never changed.
        streams: ``B``.
        positions: the most positions it will run (None: no limit); the memory holds
            ``min(attention_span, positions)`` of them.

    Attributes:
        position: positions run.
        lstm: per block ``(h, c)``, each ``[B, d]`` float32 on the CPU, updated in place.
        memory: per block the ring ``[B, R, d]`` float64 of integers (``LN_mem`` in units
            of 2**-10), position ``p`` in slot ``p % R``; None without attention. A copy.

    Raises:
        ConfigError: a model that is not an SHA-RNN, ``streams`` < 1, or an attention span
            over :data:`MAX_SPAN`.
        CheckpointError: weights out of the range it represents (:func:`check_range`).
    """

    def __init__(self, model: SHARNN, streams: int, positions: int | None = None):
        if not isinstance(model, SHARNN):
            raise ConfigError(f"the integer step runs an SHA-RNN, not a {type(model).__name__}")
        if streams < 1:
            raise ConfigError(f"streams must be >= 1, got {streams}")
        span = model.config.attention_span
        if span > MAX_SPAN:
            raise ConfigError(f"the integer step holds at most {MAX_SPAN:,} positions of memory, not {span:,}")
        compiled.ensure_compiled()
        self.model, self.streams, self.limit = model, streams, positions
        self.device = model.embedding.weight.device
        self.position = 0
        self.slots = span if positions is None else max(1, min(span, positions))
        d, layers = model.config.d_model, len(model.blocks)
        self._h, self._c = np.zeros((layers, streams, d), np.float32), np.zeros((layers, streams, d), np.float32)
        self.lstm = [(torch.from_numpy(self._h[i]), torch.from_numpy(self._c[i])) for i in range(layers)]  # views
        self._rings = [  # per block the ring (int32), its int16 copy, the rows it cannot hold (empty: no attention)
            (
                np.zeros((streams, rows, d), dtype=np.int32),
                np.zeros((streams, rows, d), dtype=np.int16),
                np.zeros((streams, rows), dtype=np.bool_),
            )
            for rows in (0 if block.attention is None else self.slots for block in model.blocks)
        ]
        self.refresh()

    @property
    def memory(self) -> list[Tensor | None]:
        """Per block the memory ring as float64 (a copy; the kernels hold it in int32)."""
        return [None if not ring[0].size else torch.from_numpy(ring[0].astype(np.float64)) for ring in self._rings]

    @torch.no_grad()
    def refresh(self) -> None:
        """Prepare the weights from the model's (again, after they changed); the state is kept.
        Raises :class:`CheckpointError`: weights out of its range (:func:`check_range`)."""
        model = self.model
        check_range(model, "the model")
        table = model.config.vocab_size <= TABLE_MAX_ROWS
        with compiled.kernel_threads(torch.get_num_threads()):  # block 0's table
            self.blocks = [
                _IntegerBlock(block, model.embedding.weight if table and i == 0 else None, self.streams)
                for i, block in enumerate(model.blocks)
            ]
        self.embedding = _numpy(model.embedding.weight)
        self.gathered = np.zeros((self.streams, model.config.d_model), dtype=np.float32)
        output = QuantizedWeights(model.embedding.weight.detach().cpu(), model.output_bias)  # quantized on the CPU
        self.output = IntegerLinear(output, self.streams)
        vocabulary = model.config.vocab_size
        self._weights = (np.zeros((self.streams, vocabulary)), np.zeros((self.streams, vocabulary), np.int32))
        arguments = [block.arguments(ring) for block, ring in zip(self.blocks, self._rings)]
        self._blocks = kernels.blocks_of(arguments[0])
        for block in arguments[1:]:
            kernels.append_block(self._blocks, block)

    @torch.no_grad()
    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens [B]`` (int64, on the model's device) -> logits ``[B, V]`` float32 (there).

        Raises:
            ValueError: more positions than ``positions``.
        """
        self._position(np.ascontiguousarray(tokens.cpu().numpy(), dtype=np.int64), _NO_WEIGHTS)
        logits = torch.from_numpy(self.output.out.copy())
        return logits if self.device.type == "cpu" else logits.to(self.device)

    def weights(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``tokens [B]`` (int64, numpy) -> what :meth:`probabilities` and
        :meth:`log_weights` give of this position's logits: ``[B, V]`` float64 and int32,
        in the same kernel call as the position (the coder's way: no logits through torch).
        The arrays are the step's own, overwritten by its next position.

        Raises:
            ValueError: more positions than ``positions``.
        """
        self._position(np.ascontiguousarray(tokens, dtype=np.int64), self._weights)
        return self._weights

    def _position(self, tokens: np.ndarray, weights: tuple[np.ndarray, np.ndarray]) -> None:
        """Run the position of ``tokens [B]`` (:func:`kernels.position`), ``weights`` filled unless empty."""
        if self.limit is not None and self.position >= self.limit:
            raise ValueError(f"the step was made for {self.limit} positions")
        slot, filled = self.position % self.slots, min(self.position + 1, self.slots)
        sigmoid, tanh, exp_table = _tables()
        with compiled.kernel_threads(torch.get_num_threads()):
            kernels.position(
                self._blocks, tokens, self.embedding, self.gathered, self._h, self._c, slot, filled,
                self.output.arguments, sigmoid, tanh, exp_table, *weights,
            )  # fmt: skip
        self.position += 1

    @staticmethod
    def probabilities(logits: Tensor) -> np.ndarray:
        """Logits ``[B, V]`` -> probabilities ``[B, V]`` float64 for the coder, exactly
        specified: the ``exp`` table's weights of the logits' gaps to the largest (in 1/256
        nat) over their exact sum."""
        return _output_weights(logits)[0]

    @staticmethod
    def log_weights(logits: Tensor) -> np.ndarray:
        """Logits ``[B, V]`` -> the logarithms of their weights in 1/256 nat, int32 ``[B, V]``:
        what :func:`sharnn.models.exact.log_weights` computes, the mixer's input."""
        return _output_weights(logits)[1]


def _output_weights(logits: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~sharnn.models.integer_kernels.output_weights` of ``logits [B, V]``."""
    values = np.ascontiguousarray(logits.detach().cpu().numpy(), dtype=np.float32)
    probabilities = np.empty(values.shape, dtype=np.float64)
    log_weights = np.empty(values.shape, dtype=np.int32)
    with compiled.kernel_threads(torch.get_num_threads()):
        kernels.output_weights(values, _tables()[2], probabilities, log_weights)
    return probabilities, log_weights


class _IntegerBlock:
    """One block's weights as the kernels take them, and its buffers for ``streams`` streams;
    with ``embedding`` (``[V, d]``, block 0's input), its input-to-gates table, computed by
    the same kernels."""

    def __init__(self, block: Block, embedding: Tensor | None, streams: int):
        self.eps = block.ln_start.eps
        self.d = block.ln_start.weight.shape[0]
        self._prepare_recurrence(block, embedding, streams)
        self.attends = block.attention is not None
        if self.attends:
            self._prepare_attention(block, streams)
        self._prepare_feed_forward(block, streams)

    def arguments(self, ring: tuple) -> tuple:
        """What :func:`kernels.position` takes for this block (:data:`kernels.BLOCK`), with
        its ``ring`` (the three arrays of :func:`kernels.attention_input`): empty arrays
        and :data:`NO_PRODUCT` where the block has no such part."""
        if self.kind == kernels.FUSED:
            gate, from_input = self.fused.arguments, NO_PRODUCT
        else:
            gate = self.from_h.arguments
            from_input = NO_PRODUCT if self.from_input is None else self.from_input.arguments
        recurrence = (self.ln_start, self.ln_ih, self.ln_hh, self.bias, self.ln_cell, self.staged)
        recurrence += (_EMPTY if self.table is None else self.table, gate, from_input)
        if self.attends:
            attention = (ring, self.ln_mem, self.ln_mid, self.ln_query, self.value_gate, self.query.arguments)
            attention += (self.r, self.y)
        else:
            attention = (ring, _EMPTY, _EMPTY, _EMPTY, _EMPTY.reshape(0), NO_PRODUCT, _EMPTY, _EMPTY)
        down, hidden = (NO_PRODUCT, _EMPTY) if self.down is None else (self.down.arguments, self.hidden)
        feed_forward = (self.up.arguments, down, self.ln_xff, self.ln_ff, self.normed, self.inner, self.z, hidden)
        return (self.kind, self.eps, self.attends, self.down is not None, *recurrence, *attention, *feed_forward)

    def _prepare_recurrence(self, block: Block, embedding: Tensor | None, streams: int) -> None:
        """The gate products, the LN-LSTM's LayerNorms and the kind of gates (:data:`kernels.FUSED`, ...)."""
        ln_lstm = isinstance(block.lstm, LayerNormLSTM)
        w_ih, w_hh, bias = (weight.detach().cpu() for weight in gate_weights(block.lstm))
        self.bias, self.ln_start = _numpy(bias), _norm(block.ln_start)
        unused = np.zeros((2, 4 * self.d), dtype=np.float32)
        self.ln_ih, self.ln_hh = (_norm(block.lstm.ln_ih), _norm(block.lstm.ln_hh)) if ln_lstm else (unused, unused)
        self.ln_cell = _norm(block.lstm.ln_cell) if ln_lstm else np.zeros((2, self.d), dtype=np.float32)
        from_input = QuantizedWeights(w_ih, None if ln_lstm else bias)
        if embedding is None and not ln_lstm:  # the two products as one
            self.kind, self.fused = (
                kernels.FUSED,
                IntegerLinear(QuantizedWeights(torch.cat([w_ih, w_hh], 1), bias), streams),
            )
        else:
            self.from_h = IntegerLinear(QuantizedWeights(w_hh), streams)
            self.from_input = IntegerLinear(from_input, streams) if embedding is None else None
            self.kind = [kernels.TABLE, kernels.LN_TABLE][ln_lstm] if embedding is not None else kernels.LN_PRODUCT
        self.staged = np.zeros((streams, (2 if self.kind == kernels.FUSED else 1) * self.d), dtype=np.float32)
        self.table = None if embedding is None else self._gates_from_input(_numpy(embedding), from_input, ln_lstm)

    def _gates_from_input(self, x: np.ndarray, weights: QuantizedWeights, ln_lstm: bool) -> np.ndarray:
        """The gates' part from the block's input ``x [N, d]``, the bias included: ``[N, 4d]``."""
        staged = np.zeros_like(x)
        kernels.block_input(x, self.ln_start, self.eps, x, staged)
        gates = IntegerLinear(weights, x.shape[0])(staged)
        if not ln_lstm:
            return gates
        table = np.empty_like(gates)
        kernels.input_gates(gates, self.ln_ih, self.bias, self.eps, table)
        return table

    def _prepare_attention(self, block: Block, streams: int) -> None:
        """The value gate's constant; the query's gates and ``1/sqrt(d)`` in ``ln_query``'s
        gain and bias (as :class:`Step`'s), with correctly rounded scalar functions."""
        sublayer = block.attention
        head = sublayer.head
        if hasattr(head, "value_gate"):  # collapsed
            gate = head.value_gate.detach().cpu().double()
        elif not hasattr(head, "value_gate_net"):
            gate = _exactly(exact.scalar_sigmoid, head.gate_v)
        else:
            net = head.value_gate_net
            c, f = _exact_affine(net.weight, _exactly(exact.scalar_sigmoid, head.gate_v), net.bias).chunk(2)
            gate = _exactly(exact.scalar_sigmoid, f) * _exactly(exact.scalar_tanh, c)
        self.value_gate = _numpy(gate.float())
        scale = _exactly(exact.scalar_sigmoid, head.gate_q) * _exactly(exact.scalar_sigmoid, head.gate_k) * head.scale
        gain, bias = (
            head.ln_query.weight.detach().cpu().double() * scale,
            head.ln_query.bias.detach().cpu().double() * scale,
        )
        self.ln_query = np.stack([_numpy(gain.float()), _numpy(bias.float())])
        self.ln_mem, self.ln_mid = _norm(sublayer.ln_mem), _norm(sublayer.ln_mid)
        self.query = IntegerLinear(QuantizedWeights(head.query.weight.detach().cpu(), head.query.bias), streams)
        self.r, self.y = (np.zeros((streams, self.d), dtype=np.float32) for _ in "ry")

    def _prepare_feed_forward(self, block: Block, streams: int) -> None:
        """The Boom's (or MLP's) products and ``LN_xff`` and ``LN_ff``."""
        ff = block.feed_forward
        up = ff.boom.linear if ff.mlp is None else ff.mlp.up
        self.up = IntegerLinear(QuantizedWeights(up.weight.detach().cpu(), up.bias), streams)
        self.down = (
            None
            if ff.mlp is None
            else IntegerLinear(QuantizedWeights(ff.mlp.down.weight.detach().cpu(), ff.mlp.down.bias), streams)
        )
        self.ln_xff, self.ln_ff = _norm(ff.ln_xff), _norm(ff.ln_ff)
        self.normed, self.inner, self.z = (np.zeros((streams, self.d), dtype=np.float32) for _ in "niz")
        self.hidden = None if self.down is None else np.zeros((streams, up.weight.shape[0]), dtype=np.float32)
