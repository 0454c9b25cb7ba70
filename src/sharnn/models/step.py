"""One inference position of a trained model for ``B`` streams at once: what ``sharnn
compress``, ``decompress`` and ``generate`` run for every token (docs/compression.md,
"The step"). Two steps with one interface (``step(tokens [B]) -> logits [B, V]``,
``refresh()``), kept side by side: :class:`ReferenceStep`, the model's own forward on one
position, and :class:`Step`, the fast SHA-RNN step that computes the same function.

``model(tokens [1, B], state)`` runs one position through the code written for windows
of ``T`` positions: it copies the whole memory to append the new position, recomputes
the value gate from its network, and computes every product and LayerNorm as the
window does. :class:`Step` computes the same function for ``T = 1`` (the model in eval
mode: no dropout), with what is constant at inference prepared once from the weights:

- block 0's input-to-gates product (with ``LN_start`` and the biases) as a table of
  ``V`` rows, one per token, when ``V <= 256``: its input is a function of the token alone;
- in the other blocks, the LSTM's two gate products as one,
  ``[LN_start(x) ; h] @ [W_ih ; W_hh]^T + (b_ih + b_hh)``;
- the value gate as its constant; the query's two gates and ``1/sqrt(d)`` folded into
  the query LayerNorm's gain and bias; ``LN_xff``'s gain and bias folded into the first
  product of the Boom (or MLP), so that ``LN_ff`` and ``LN_xff`` share one normalisation;
- the memory as a ring buffer of ``span`` positions written in place: the one query
  attends to every memory position without a mask, so their order does not matter, and
  the attention is two batched matrix products over the ring.

Its probabilities agree with ``model(...)``'s up to rounding (within 1e-6: sums run in
another order). Both sides of a compressed file's round trip run the step, so their
probabilities are bitwise equal on one kind of machine with one thread count.

With ``precision="bf16"`` the matrices of the products (the gate products, the query's,
the Boom's or MLP's, the output projection) and the memory ring are held in bfloat16 and
multiplied in bfloat16 (oneDNN on a CPU), their results rounded to bfloat16 and widened
to float32; the table, the biases, the nonlinearities, the LayerNorms, the attention's
softmax, the cell state and the logits stay float32. It is as deterministic as fp32 on
one kind of machine with one thread count, and approximates the model instead of
computing it (docs/compression.md, "Precision").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from .build import LanguageModel
from .lstm import LayerNormLSTM
from .sharnn import SHARNN, Block, State

GELU_SLOPE = 1.702  # the model's GELU, x sigmoid(1.702 x) (sharnn.models.sharnn.gelu)
TABLE_MAX_ROWS = 256  # a larger vocabulary gathers its embeddings instead: its table would cost more than it saves
PRECISIONS = ("fp32", "bf16")  # fp32: the products in the parameters' dtype; bf16: in bfloat16


class ReferenceStep:
    """The model's forward on one position ``[1, B]``, its state carried: the reference the
    fast :class:`Step` is checked against, the step of a Transformer, and how compressed
    files of format versions 1 and 2 were coded. ``model`` in eval mode, as for :class:`Step`."""

    def __init__(self, model: LanguageModel):
        self.model, self.state = model, None

    def refresh(self) -> None:
        """Nothing to prepare: the forward reads the weights as they are."""

    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens [B]`` -> logits ``[B, V]``."""
        logits, self.state = self.model(tokens.view(1, -1), self.state)
        return logits[0]


class Step:
    """One position of ``model`` for ``streams`` streams, and their recurrent state.

    Example::

        step = Step(model, streams=8)        # a trained SHA-RNN
        logits = step(tokens)                # tokens [B] int64 -> logits [B, V] (float32)
        logits = step(next_tokens)           # the state carried, the memory in the ring

    Args:
        model: a trained :class:`~sharnn.models.sharnn.SHARNN` in the parameters' dtype (fp32);
            its weights are read, never changed; its mode does not matter (no dropout).
        streams: ``B``, the number of streams.
        positions: the most positions the step will run, those of a state given to
            :meth:`load_state` included (None: no limit). The memory holds
            ``min(attention_span, positions)`` positions, so a short input allocates
            no more than it needs.
        precision: ``"fp32"`` (the model's function), or ``"bf16"``: the products'
            matrices in bfloat16, everything else in float32 (the module's docstring).

    Attributes:
        position: positions run, the loaded state's memory included.
        lstm: per block, the LSTM state ``(h, c)``, each ``[B, d]``.
        memory: per block, the ring ``[B, R, d]`` (``R = min(attention_span,
            positions)``) of ``LN_mem`` outputs, position ``p`` in slot ``p % R``, in
            bfloat16 for precision bf16; None for blocks without attention.

    Raises:
        ConfigError: a model that is not an SHA-RNN (a Transformer), ``streams`` < 1, or
            a precision other than fp32 and bf16.
    """

    def __init__(self, model: SHARNN, streams: int, positions: int | None = None, precision: str = "fp32"):
        if not isinstance(model, SHARNN):
            raise ConfigError(f"the inference step runs an SHA-RNN, not a {type(model).__name__}")
        if streams < 1:
            raise ConfigError(f"streams must be >= 1, got {streams}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be {' or '.join(PRECISIONS)}, got {precision!r}")
        self.model, self.streams = model, streams
        self.dtype = torch.bfloat16 if precision == "bf16" else model.embedding.weight.dtype  # the products'
        self.limit = positions
        self.position = 0
        self.slots, self.lstm, self.memory = zero_state(model, streams, positions, self.dtype)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Prepare the weights again from the model's (after they changed: online mode's
        training); the state is kept."""
        model = self.model
        table = model.config.vocab_size <= TABLE_MAX_ROWS
        self.blocks = [
            _Block(block, model.embedding.weight if table and i == 0 else None, self.dtype)
            for i, block in enumerate(model.blocks)
        ]
        self.output_weight = model.embedding.weight.to(self.dtype)  # in fp32 the weight itself, not a copy

    @torch.no_grad()
    def load_state(self, state: State) -> None:
        """Continue from ``state``, what ``model(tokens, state)`` returned for these streams
        (after a prompt): ``(h, c)`` copied, the memory (``[M, B, d]``) copied in time order
        into the ring's first ``M`` slots, :attr:`position` set to ``M``.

        Raises:
            ValueError: a state of another number of blocks or streams, or a memory
                longer than the ring.
        """
        lengths = {memory.shape[0] for memory in state.memory if memory is not None}
        position = max(lengths, default=0)
        if len(state.lstm) != len(self.blocks) or len(lengths) > 1 or position > self.slots:
            raise ValueError(f"the state does not fit this step ({len(self.blocks)} blocks, {self.slots} slots)")
        if any(h.shape[1] != self.streams for h, _ in state.lstm):
            raise ValueError(f"the state is not of {self.streams} streams")
        dtype = self.model.embedding.weight.dtype
        self.lstm = [(h[0].to(dtype, copy=True), c[0].to(dtype, copy=True)) for h, c in state.lstm]
        for ring, memory in zip(self.memory, state.memory):
            if ring is not None and memory is not None:
                ring[:, :position] = memory.transpose(0, 1)
        self.position = position

    @torch.no_grad()
    def __call__(self, tokens: Tensor) -> Tensor:
        """Run one position: ``tokens [B]`` (int64, on the model's device), the token of
        every stream -> logits ``[B, V]``, the scores of every stream's next token.

        Raises:
            ValueError: more positions than ``positions``.
        """
        if self.limit is not None and self.position >= self.limit:
            raise ValueError(f"the step was made for {self.limit} positions")
        slot, filled = self.position % self.slots, min(self.position + 1, self.slots)
        x = None if self.blocks[0].table is not None else F.embedding(tokens, self.model.embedding.weight)
        for i, block in enumerate(self.blocks):
            self.lstm[i] = block.recurrence(x, tokens, self.lstm[i])
            u = self.lstm[i][0]  # the LSTM's output is its h
            x = block.feed_forward(u if self.memory[i] is None else block.attend(u, self.memory[i], slot, filled))
        self.position += 1
        return linear(x, self.output_weight, self.model.output_bias)


def _onednn_available() -> bool:
    """Whether this torch runs oneDNN's float32 linear (``torch.ops.mkldnn._linear_pointwise``)
    on the CPU: x86 builds do."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 1), torch.ones(1, 1), None, "none", [], "")
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


ONEDNN = _onednn_available()  # chosen once: float32 products on the CPU through oneDNN, else F.linear


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, silu: bool = False) -> Tensor:
    """The step's matrix product: ``x @ weight^T + bias`` for ``x [B, k]``, ``weight
    [n, k]`` and ``bias`` (``[n]`` or ``[B, n]``, or None): ``[B, n]`` in ``x``'s dtype (the
    parameters'); with ``silu``, ``silu`` of that.

    A float32 product on the CPU runs through oneDNN where torch has it (:data:`ONEDNN`),
    the silu in the product itself (oneDNN's ``swish`` post-op): ``F.linear`` calls MKL,
    which on this project's AMD CPU took 1.4 to 1.9 times as long at ``B`` = 8 to 128
    (docs/compression.md, "The step"). A bfloat16 ``weight`` multiplies ``x`` rounded to
    bfloat16, its result rounded to bfloat16, then widened and the bias added in float32."""
    if weight.dtype != x.dtype:
        product = F.linear(x.to(weight.dtype), weight)
        result = product.to(x.dtype) if bias is None else bias.add(product)
    elif not (ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32):
        result = F.linear(x, weight, bias)
    elif bias is not None and bias.dim() == 2:  # a bias per row: added after the product
        result = torch.ops.mkldnn._linear_pointwise.binary(x, bias, weight, None, "add")
    else:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "swish" if silu else "none", [], "")
    return F.silu(result) if silu else result


def zero_state(model: SHARNN, streams: int, positions: int | None, ring_dtype: torch.dtype):
    """A step's starting state: ``(R, lstm, memory)``, ``R = min(attention_span,
    positions)`` slots; per block ``(h, c)`` zeros ``[B, d]`` in the weights' dtype, and the
    memory ring zeros ``[B, R, d]`` in ``ring_dtype`` (None for a block without attention)."""
    span, weight, d = model.config.attention_span, model.embedding.weight, model.config.d_model
    slots = span if positions is None else max(1, min(span, positions))
    lstm = [tuple(weight.new_zeros(streams, d) for _ in "hc") for _ in model.blocks]
    memory = [
        None if block.attention is None else weight.new_zeros(streams, slots, d, dtype=ring_dtype)
        for block in model.blocks
    ]
    return slots, lstm, memory


def gate_weights(lstm: torch.nn.LSTM | LayerNormLSTM) -> tuple[Tensor, Tensor, Tensor]:
    """A block's LSTM weights with the gates in the order ``f, i, o, g`` (the LN-LSTM's;
    ``nn.LSTM``'s rows are ``i, f, g, o`` and are permuted): ``W_ih [4d, d]``, ``W_hh [4d,
    d]`` and the bias ``[4d]`` (``nn.LSTM``'s two biases summed)."""
    if isinstance(lstm, LayerNormLSTM):
        return lstm.weight_ih, lstm.weight_hh, lstm.bias
    d = lstm.hidden_size
    order = torch.cat([torch.arange(d, 2 * d), torch.arange(d), torch.arange(3 * d, 4 * d), torch.arange(2 * d, 3 * d)])
    order = order.to(lstm.weight_hh_l0.device)
    return lstm.weight_ih_l0[order], lstm.weight_hh_l0[order], (lstm.bias_ih_l0 + lstm.bias_hh_l0)[order]


class _Block:
    """One block's weights as the step computes with them, prepared from ``block``; with
    ``embedding`` (``[V, d]``, block 0's input), its input-to-gates table (float32). The
    matrices of the products are then held in ``dtype``."""

    def __init__(self, block: Block, embedding: Tensor | None, dtype: torch.dtype):
        self.block = block
        self.ln_lstm = isinstance(block.lstm, LayerNormLSTM)
        self._prepare_recurrence()
        self.table = None if embedding is None else self._from_input(embedding)
        if block.attention is not None:
            self._prepare_attention()
        self._prepare_feed_forward()
        for name in ("w_ih", "w_hh", "w_fused", "query_weight", "up_weight", "down_weight"):
            if hasattr(self, name):
                setattr(self, name, getattr(self, name).to(dtype))

    def _prepare_recurrence(self) -> None:
        """The gate weights (:func:`gate_weights`), the products fused for a plain LSTM."""
        self.w_ih, self.w_hh, self.bias = gate_weights(self.block.lstm)
        if not self.ln_lstm:
            self.w_fused = torch.cat([self.w_ih, self.w_hh], dim=1)  # [4d, 2d]

    def _from_input(self, x: Tensor) -> Tensor:
        """The gates' part from the block's input ``x [N, d]``, the bias included: ``[N, 4d]``."""
        normed = self.block.ln_start(x)
        if self.ln_lstm:
            return self.block.lstm.ln_ih(linear(normed, self.w_ih)) + self.bias
        return linear(normed, self.w_ih, self.bias)

    def recurrence(self, x: Tensor | None, tokens: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The LSTM (or LN-LSTM) of one position: input ``x [B, d]`` (None in a block with
        a table, which reads ``tokens [B]``), ``(h, c)`` -> the new ``(h, c)``, each ``[B, d]``."""
        h, c = state
        d = h.shape[1]
        gates = self._gates(x, tokens, h)  # [B, 4d]: f, i, o, g
        f, i, o = torch.sigmoid(gates[:, : 3 * d]).chunk(3, dim=1)
        c = torch.addcmul(f * c, i, torch.tanh(gates[:, 3 * d :]))
        h = o * torch.tanh(self.block.lstm.ln_cell(c) if self.ln_lstm else c)
        return h, c

    def _gates(self, x: Tensor | None, tokens: Tensor, h: Tensor) -> Tensor:
        """The gates' pre-activations ``[B, 4d]``: from the table or the input, and from ``h``."""
        if self.table is None and not self.ln_lstm:  # the two products as one
            return linear(torch.cat([self.block.ln_start(x), h], dim=1), self.w_fused, self.bias)
        from_input = self._from_input(x) if self.table is None else self.table.index_select(0, tokens)
        if self.ln_lstm:
            return self.block.lstm.ln_hh(linear(h, self.w_hh)).add_(from_input)
        return linear(h, self.w_hh, from_input)

    def _prepare_attention(self) -> None:
        """The value gate's constant; the query's gates and ``1/sqrt(d)`` in ``ln_query``'s gain and bias."""
        head = self.block.attention.head
        self.value_gate = head.value_gate_vector()
        scale = torch.sigmoid(head.gate_q) * torch.sigmoid(head.gate_k) * head.scale
        self.query_gain, self.query_bias = head.ln_query.weight * scale, head.ln_query.bias * scale
        self.query_weight = head.query.weight

    def attend(self, u: Tensor, ring: Tensor, slot: int, filled: int) -> Tensor:
        """``y = LN_mid(u) + Attn(LN_mid(u), memory)`` for ``u [B, d]``: ``LN_mem(u)``
        written into ``ring [B, R, d]`` at ``slot``, attention over its first ``filled``
        slots. Returns ``y [B, d]``."""
        sublayer = self.block.attention
        ring[:, slot] = sublayer.ln_mem(u)
        r = sublayer.ln_mid(u)
        query = F.layer_norm(
            linear(r, self.query_weight, sublayer.head.query.bias),
            r.shape[1:],
            self.query_gain,
            self.query_bias,
            sublayer.head.ln_query.eps,
        )
        memory = ring[:, :filled]  # [B, n, d], in the ring's dtype (bf16 for precision bf16)
        # Both products as a row [B, 1, .] times a matrix: torch.bmm of a matrix times a
        # column [B, ., 1] is far slower on the CPU (docs/compression.md, "The step").
        scores = torch.bmm(query.unsqueeze(1).to(ring.dtype), memory.transpose(1, 2)).to(r.dtype)  # [B, 1, n]
        probs = torch.softmax(scores, dim=2).to(ring.dtype)
        return torch.addcmul(r, self.value_gate, torch.bmm(probs, memory).squeeze(1).to(r.dtype))

    def _prepare_feed_forward(self) -> None:
        """``LN_xff``'s gain and bias folded into the first product (``up``: the Boom's or
        the MLP's), and the GELU's slope: ``gelu(z) = silu(1.702 z) / 1.702``, the product
        scaled by 1.702, the ``1 / 1.702`` after the Boom's sum (or in the MLP's ``down``)."""
        ff = self.block.feed_forward
        up = ff.boom.linear if ff.mlp is None else ff.mlp.up
        self.up_weight = up.weight * ff.ln_xff.weight * GELU_SLOPE
        self.up_bias = F.linear(ff.ln_xff.bias, up.weight, up.bias) * GELU_SLOPE
        if ff.mlp is not None:
            self.down_weight = ff.mlp.down.weight / GELU_SLOPE

    def feed_forward(self, y: Tensor) -> Tensor:
        """``z = LN_ff(y) + Boom(LN_xff(y))`` (or the MLP) for ``y [B, d]``, one normalisation
        of ``y`` shared by both LayerNorms. Returns ``z [B, d]``."""
        ff = self.block.feed_forward
        normed = F.layer_norm(y, y.shape[1:], eps=ff.ln_ff.eps)
        hidden = linear(normed, self.up_weight, self.up_bias, silu=True)  # 1.702 gelu(up(LN_xff(y)))
        if ff.mlp is None:
            inner = hidden.unflatten(-1, (-1, y.shape[1])).sum(-2).div_(GELU_SLOPE)
        else:
            inner = linear(hidden, self.down_weight, ff.mlp.down.bias)
        return torch.addcmul(ff.ln_ff.bias, normed, ff.ln_ff.weight).add_(inner)
