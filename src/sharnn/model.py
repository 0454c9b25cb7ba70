"""The Single Headed Attention RNN (SHA-RNN), Merity 2019, arXiv:1911.11423.

The whole model, top to bottom. Section numbers (§) refer to the project's
design note ``reference-implementation.md``, which describes what the original
code computes; the paper's section is given where it is the better source.

Tensors are time-major throughout: token ids ``[T, B]``, activations
``[T, B, d]``, memory ``[M, B, d]``, where ``T`` is the window length (BPTT),
``B`` the number of independent streams and ``d`` the model width.

One window through the model (§3.1-3.2)::

    x = Drop_i(Emb[tokens])
    for every block:
        u = Drop_h(LSTM(LN_start(x)))                          # no residual around the LSTM
        y = LN_mid(u) + Drop_h(Attn(LN_mid(u), [mem ; LN_mem(u)]))   # attention blocks only, else y = u
        x = LN_ff(y) + Drop_h(Boom(LN_xff(y)))
    logits = Drop_o(x) @ Emb^T + b                             # tied weights, untied bias

It runs two ways, computing the same function (:meth:`SHARNN.set_execution`): the eager
reference path, explicit scores and softmax; and the fast path, the attention through
``scaled_dot_product_attention`` with the memory in bf16, optionally with the Boom and
LayerNorms under ``torch.compile`` and with activations recomputed in the backward pass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right


@dataclass
class SHARNNConfig:
    """Everything that defines an SHA-RNN. Defaults are the paper's enwik8 model.

    Attributes:
        vocab_size: number of token ids (256 for bytes).
        d_model: width of the embedding, the LSTMs and the attention (paper: 1024).
        n_layers: number of blocks (paper: 4).
        boom_dim: width of the Boom's hidden layer; a multiple of ``d_model`` (paper: 4096).
        attention: which blocks have an attention head: ``"none"``, ``"single"``
            (block ``n_layers - 2``, the paper's single head), ``"all"``, or a list of
            block indices.
        attention_span: total positions a query window attends to, the current
            window included (paper: 5000). Memory keeps the last ``span - T``.
        dropouti: dropout on the embedding output (paper's "i").
        dropouth: dropout inside the blocks: LSTM output, query, values,
            attention probabilities, Boom hidden and both sub-layer outputs ("h").
        dropouto: dropout before the tied softmax ("o").
        layer_norm_eps: epsilon of every LayerNorm (1e-12, §3.2).
        collapsed: whether the value-gate network has been folded into a constant
            by :meth:`SHARNN.collapse` (§3.4).

    Raises:
        ValueError: from :meth:`validate` when a value is out of range.
    """

    vocab_size: int = 256
    d_model: int = 1024
    n_layers: int = 4
    boom_dim: int = 4096
    attention: Union[str, list[int]] = "single"
    attention_span: int = 5000
    dropouti: float = 0.1
    dropouth: float = 0.1
    dropouto: float = 0.1
    layer_norm_eps: float = 1e-12
    collapsed: bool = False

    def validate(self) -> None:
        """Check every value; raise ``ValueError`` naming the first bad one."""
        for name in ("vocab_size", "d_model", "n_layers", "boom_dim", "attention_span"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.boom_dim % self.d_model:
            raise ValueError(
                f"model.boom_dim ({self.boom_dim}) must be a multiple of model.d_model ({self.d_model})"
            )
        for name in ("dropouti", "dropouth", "dropouto"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {p}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"model.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        self.attention_blocks()  # raises on a bad placement

    def attention_blocks(self) -> list[int]:
        """Indices of the blocks that carry an attention head (SPEC §1, placement)."""
        placement = self.attention
        if isinstance(placement, str):
            if placement == "none":
                return []
            if placement == "single":
                return [max(self.n_layers - 2, 0)]
            if placement == "all":
                return list(range(self.n_layers))
            raise ValueError(
                f"model.attention must be 'none', 'single', 'all' or a list of block indices, got {placement!r}"
            )
        blocks = sorted(set(int(i) for i in placement))
        bad = [i for i in blocks if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(
                f"model.attention index {bad[0]} is out of range for {self.n_layers} layers (0..{self.n_layers - 1})"
            )
        return blocks


@dataclass
class State:
    """Recurrent state carried from one window to the next (§3.6).

    Attributes:
        lstm: per block, the LSTM's ``(h, c)``, each ``[1, B, d]``.
        memory: per block, the attention memory ``[M, B, d]`` (detached, post-dropout
            ``LN_mem`` outputs of earlier positions), or ``None`` for blocks without
            attention and before the first window.
    """

    lstm: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    memory: list[Tensor | None] = field(default_factory=list)

    def detach(self) -> State:
        """The same state cut from the autograd graph (truncated BPTT between windows)."""
        return State(
            lstm=[(h.detach(), c.detach()) for h, c in self.lstm],
            memory=[None if m is None else m.detach() for m in self.memory],
        )

    def tensors(self) -> dict[str, Tensor]:
        """Flat name -> tensor mapping, for saving (e.g. with safetensors)."""
        out = {}
        for i, (h, c) in enumerate(self.lstm):
            out[f"lstm.{i}.h"], out[f"lstm.{i}.c"] = h, c
        for i, m in enumerate(self.memory):
            if m is not None:
                out[f"memory.{i}"] = m
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], n_layers: int) -> State:
        """Inverse of :meth:`tensors`."""
        return cls(
            lstm=[(tensors[f"lstm.{i}.h"], tensors[f"lstm.{i}.c"]) for i in range(n_layers)],
            memory=[tensors.get(f"memory.{i}") for i in range(n_layers)],
        )


class _SigmoidGELU(torch.autograd.Function):
    """``x * sigmoid(1.702 x)`` with a one-kernel backward: it equals ``silu(1.702 x) / 1.702``,
    whose derivative is ``silu'(1.702 x)``."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        z = 1.702 * x
        ctx.save_for_backward(z)
        return x * torch.sigmoid(z)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (z,) = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad, z)


def gelu(x: Tensor) -> Tensor:
    """The sigmoid approximation of GELU used by the original, ``x * sigmoid(1.702 x)`` (§3.5)."""
    return _SigmoidGELU.apply(x)


class Boom(nn.Module):
    """Boom feed-forward layer (paper §4.2, §3.5): ``Linear(d -> F)``, GELU, dropout,
    then the F features split into ``F/d`` chunks of ``d`` and summed. No down-projection.

    Shapes: ``[T, B, d] -> [T, B, d]``.
    """

    def __init__(self, d_model: int, boom_dim: int, dropout: float):
        super().__init__()
        self.linear = nn.Linear(d_model, boom_dim)
        self.drop = nn.Dropout(dropout)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        h = self.drop(gelu(self.linear(x)))
        return h.unflatten(-1, (-1, self.d_model)).sum(-2)


class Attention(nn.Module):
    """The single attention head (§3.3-3.4).

    Keys and values are the memory itself, gated per feature; only the query has a
    learned projection::

        Q = Drop(sigmoid(theta_q) * LN_q(W_Q r + b_Q))
        K = sigmoid(theta_k) * kv                       (no dropout on keys)
        V = Drop(g_v * kv),   g_v = sigmoid(f) * tanh(c),   [c ; f] = W_o sigmoid(theta_v) + b_o
        out = Drop(softmax(Q K^T / sqrt(d) + mask)) V

    Because the gates are per-feature constants and keys and values are the same tensor,
    this is computed without gating the memory at all (the same function, exactly)::

        Q K^T = (Q * sigmoid(theta_k)) kv^T           the key gate folds into the query
        Drop(P) Drop(g_v * kv) = g_v * (Drop(P) Drop(kv))   the value gate commutes with the
                                                            (elementwise) dropout and the sum

    The value gate ``g_v`` depends only on parameters; :meth:`collapse` replaces its
    network by the constant it computes.
    """

    def __init__(self, d_model: int, dropout: float, eps: float, collapsed: bool = False):
        super().__init__()
        self.query = nn.Linear(d_model, d_model)
        self.ln_query = nn.LayerNorm(d_model, eps=eps)
        self.gate_q = nn.Parameter(torch.zeros(d_model))
        self.gate_k = nn.Parameter(torch.zeros(d_model))
        if collapsed:
            self.value_gate = nn.Parameter(torch.zeros(d_model))
        else:
            self.gate_v = nn.Parameter(torch.zeros(d_model))
            self.value_gate_net = nn.Linear(d_model, 2 * d_model)  # the "Overparam" network
        self.drop = nn.Dropout(dropout)
        self.scale = 1.0 / math.sqrt(d_model)

    def value_gate_vector(self) -> Tensor:
        """The value gate ``g_v``, a ``[d]`` vector in (-1, 1) (§3.4)."""
        if hasattr(self, "value_gate"):
            return self.value_gate
        c, f = self.value_gate_net(torch.sigmoid(self.gate_v)).chunk(2)
        return torch.sigmoid(f) * torch.tanh(c)

    @torch.no_grad()
    def collapse(self) -> None:
        """Fold the value-gate network into its constant output (§3.4); outputs are unchanged."""
        if hasattr(self, "value_gate"):
            return
        gate = self.value_gate_vector()
        del self.gate_v, self.value_gate_net
        self.value_gate = nn.Parameter(gate)

    def forward(self, r: Tensor, kv: Tensor, fast: bool = False) -> Tensor:
        """Attend from the window to memory plus window, bottom-right causal (§3.6): query
        ``t`` sees every memory position and window positions ``<= t``.

        Args:
            r: query input ``[T, B, d]``.
            kv: keys = values, ``[S, B, d]`` with ``S = M + T`` (memory, then the window).
            fast: compute the weighted sum with :func:`sdpa_attention` (fused kernels on
                CUDA, in ``kv``'s dtype) instead of explicit scores and softmax (the reference).

        Returns:
            ``[T, B, d]``.
        """
        q = self.drop(torch.sigmoid(self.gate_q) * self.ln_query(self.query(r)))
        q = q * (torch.sigmoid(self.gate_k) * self.scale)  # key gate and 1/sqrt(d), folded
        values = self.drop(kv)  # the value gate is applied after the weighted sum
        if fast:
            out = sdpa_attention(q.to(kv.dtype), kv, values, self.drop.p if self.training else 0.0)
        else:
            T, S = q.shape[0], kv.shape[0]
            scores = torch.einsum("tbd,sbd->bts", q, kv)
            scores = scores.masked_fill(~causal_mask(T, S - T, device=kv.device), float("-inf"))
            softmax_dtype = torch.promote_types(scores.dtype, torch.float32)  # fp32 at least
            probs = self.drop(torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(kv.dtype))
            out = torch.einsum("bts,sbd->tbd", probs, values)
        return self.value_gate_vector() * out


def causal_mask(window: int, memory: int, device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned causal mask ``[T, M + T]``: query ``t`` sees all ``M`` memory
    positions and window positions ``<= t`` (§3.6). True means "may attend"."""
    return torch.ones(window, memory + window, dtype=torch.bool, device=device).tril(diagonal=memory)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """``Drop(softmax(q k^T + mask)) v`` through ``F.scaled_dot_product_attention``, one head,
    with the bottom-right causal mask of :func:`causal_mask` and no further scaling (the
    caller has folded 1/sqrt(d) into ``q``).

    Args:
        q: ``[T, B, d]``; k, v: ``[S, B, d]``, ``S >= T``, all of one dtype. ``k`` and ``v``
            may be the same tensor; nothing is copied to change their layout.
        dropout_p: dropout on the attention probabilities.

    Returns:
        ``[T, B, d]`` in the inputs' dtype.
    """
    T, S = q.shape[0], k.shape[0]
    mask = causal_lower_right(T, S) if T > 1 else None  # one query sees everything
    heads = [x.permute(1, 0, 2).unsqueeze(1) for x in (q, k, v)]  # [L, B, d] -> [B, 1, L, d], views
    out = F.scaled_dot_product_attention(*heads, attn_mask=mask, dropout_p=dropout_p, scale=1.0)
    return out.squeeze(1).permute(1, 0, 2)


class Block(nn.Module):
    """One SHA-RNN block (§3.2), exactly::

        u = Drop(LSTM(LN_start(x)))                                  # no residual
        y = LN_mid(u) + Drop(Attn(LN_mid(u), [mem ; LN_mem(u)]))     # attention blocks only
        z = LN_ff(y) + Drop(Boom(LN_xff(y)))

    How it runs is set by :meth:`SHARNN.set_execution` (``fast``, ``compile``, ``recompute``).
    """

    def __init__(self, config: SHARNNConfig, has_attention: bool):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.span = config.attention_span
        self.ln_start = nn.LayerNorm(d, eps=eps)
        self.lstm = nn.LSTM(d, d)
        if has_attention:
            self.ln_mid = nn.LayerNorm(d, eps=eps)
            self.ln_mem = nn.LayerNorm(d, eps=eps)
            self.attention = Attention(d, config.dropouth, eps, collapsed=config.collapsed)
        else:
            self.attention = None
        self.ln_ff = nn.LayerNorm(d, eps=eps)
        self.ln_xff = nn.LayerNorm(d, eps=eps)
        self.boom = Boom(d, config.boom_dim, config.dropouth)
        self.drop = nn.Dropout(config.dropouth)
        self.fast = self.compile = self.recompute = False
        self.memory_dtype: torch.dtype | None = None

    def forward(
        self, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None, memory: Tensor | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Args: ``x [T, B, d]``, the LSTM's ``(h, c)`` (each ``[1, B, d]``, or None for
        zeros), the memory ``[M, B, d]`` or None. Returns ``(z [T, B, d], (h, c), memory)``,
        where the new memory is the detached ``[min(M + T, span), B, d]`` keys/values of this
        window (None in blocks without attention): bf16 on the fast path, else the dtype
        ``LN_mem`` computes in."""
        u, lstm_state = self.recurrence(self.ln_start(x), lstm_state)
        if self.attention is None:
            y, new_memory = self.drop(u), None
        else:
            y, new_memory = self._sublayer(Block.attend, u, memory)
        z = self._sublayer(self._compiled(Block.feed_forward), y)
        return z, lstm_state, new_memory

    def recurrence(self, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``u, (h, c) = LSTM(x, (h, c))``, ``[T, B, d]``; cuDNN's on CUDA.

        Under autocast the LSTM runs in the autocast dtype. (PyTorch's autocast would run
        cuDNN's LSTM in fp16 whatever the autocast dtype, and fp16 gradients underflow
        without loss scaling; bf16 has fp32's range.) ``(h, c)`` come back in the
        parameters' dtype, so a state reads the same on every path.
        """
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return self.lstm(x, lstm_state)
        dtype = torch.get_autocast_dtype(device)
        weights = {name: w.to(dtype) for name, w in self.lstm.named_parameters()}
        if lstm_state is not None:
            lstm_state = tuple(t.to(dtype) for t in lstm_state)
        with torch.autocast(device, enabled=False), warnings.catch_warnings():
            # the cast weights are not cuDNN's flat buffer: it packs them itself, once per call
            warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")
            u, (h, c) = torch.func.functional_call(self.lstm, weights, (x.to(dtype), lstm_state))
        param_dtype = self.lstm.weight_hh_l0.dtype
        return u, (h.to(param_dtype), c.to(param_dtype))

    def attend(self, u: Tensor, memory: Tensor | None) -> tuple[Tensor, Tensor]:
        """The attention sub-layer: ``(y, keys/values)`` from the LSTM output ``u [T, B, d]``.
        The memory is cut to its last ``span - T`` positions (the span counts the window)."""
        T = u.shape[0]
        r, s = self._compiled(Block.attention_inputs)(self, u)
        if memory is not None and self.span > T:
            kv = torch.cat([memory[-(self.span - T):].to(s.dtype), s])
        else:
            kv = s
        y = r + self.drop(self.attention(r, kv, fast=self.fast))
        return y, kv.detach()

    def attention_inputs(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """``(LN_mid(u), LN_mem(u))`` after the LSTM's dropout; the second, which becomes
        memory, in ``memory_dtype`` when that is set (bf16 on the fast path)."""
        u = self.drop(u)
        s = self.ln_mem(u)
        return self.ln_mid(u), s if self.memory_dtype is None else s.to(self.memory_dtype)

    def feed_forward(self, y: Tensor) -> Tensor:
        """``LN_ff(y) + Drop(Boom(LN_xff(y)))``, ``[T, B, d] -> [T, B, d]``."""
        return self.ln_ff(y) + self.drop(self.boom(self.ln_xff(y)))

    def _compiled(self, method):
        return _compile(method) if self.compile else method

    def _sublayer(self, method, *args):
        """Run a sub-layer; with ``recompute`` (and gradients on), keep only its inputs and
        recompute its activations in the backward pass."""
        if self.recompute and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(method, self, *args, use_reentrant=False)
        return method(self, *args)


@functools.cache
def _compile(function):
    """One ``torch.compile`` per function, shared by every block (modules are arguments)."""
    return torch.compile(function, dynamic=True)


class SHARNN(nn.Module):
    """The SHA-RNN language model: tied embedding, blocks, tied softmax with its own bias.

    Example::

        model = SHARNN(SHARNNConfig(d_model=256, n_layers=2, boom_dim=1024))
        logits, state = model(tokens)          # tokens [T, B] -> logits [T, B, V]
        logits, state = model(more, state)     # carries LSTM state and memory
    """

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        config.validate()
        self.config = config
        attention_blocks = set(config.attention_blocks())
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i in attention_blocks) for i in range(config.n_layers))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.drop_input = nn.Dropout(config.dropouti)
        self.drop_output = nn.Dropout(config.dropouto)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The original initialisation (§3.8): Embedding and Linear weights N(0, (0.1/sqrt(d))^2),
        biases 0; LayerNorm gain 1, bias 0; LSTMs PyTorch's default U(+-1/sqrt(d)); gate vectors 0."""
        std = 0.1 / math.sqrt(self.config.d_model)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.LSTM)):
                module.reset_parameters()
            elif isinstance(module, Attention):
                for name in ("gate_q", "gate_k", "gate_v"):
                    if hasattr(module, name):
                        nn.init.zeros_(getattr(module, name))
        nn.init.zeros_(self.output_bias)

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """Run one window.

        Args:
            tokens: ``[T, B]`` int64 token ids, ``1 <= T <= attention_span``.
            state: the state returned by the previous window of the same streams, or
                None to start from zeros and an empty memory.

        Returns:
            ``(logits [T, B, V], state)``: unnormalised next-token scores, and the state
            to pass with the next window.

        Raises:
            ValueError: if ``T`` exceeds the attention span or ``state`` has the wrong
                number of blocks.
        """
        T = tokens.shape[0]
        if T > self.config.attention_span:
            raise ValueError(f"window of {T} tokens exceeds attention_span {self.config.attention_span}")
        n = len(self.blocks)
        if state is None:
            state = State(lstm=[None] * n, memory=[None] * n)
        elif len(state.lstm) != n or len(state.memory) != n:
            raise ValueError(f"state has {len(state.lstm)} blocks, model has {n}")
        x = self.drop_input(self.embedding(tokens))
        lstm_states, memories = [], []
        for block, lstm_state, memory in zip(self.blocks, state.lstm, state.memory):
            x, lstm_state, memory = block(x, lstm_state, memory)
            lstm_states.append(lstm_state)
            memories.append(memory)
        logits = F.linear(self.drop_output(x), self.embedding.weight, self.output_bias)
        return logits, State(lstm=lstm_states, memory=memories)

    def set_execution(
        self,
        fast: bool = False,
        compile: bool = False,
        recompute: bool = False,
        memory_dtype: torch.dtype | None = torch.bfloat16,
    ) -> SHARNN:
        """Choose how the model runs; what it computes does not change (up to rounding).

        Args:
            fast: the fast path: attention through :func:`sdpa_attention` (fused
                kernels on CUDA) and the memory stored in ``memory_dtype``. Off, the reference path:
                explicit scores and softmax, memory in the dtype ``LN_mem`` computes in.
            compile: ``torch.compile`` each block's LayerNorm/Boom sub-layer and the
                attention's input LayerNorms; the LSTMs (cuDNN on CUDA) and the attention
                kernel stay outside the compiled graphs. The first windows of each shape
                pay the compilation.
            recompute: activation checkpointing of the attention and Boom sub-layers: their
                activations are recomputed in the backward pass instead of stored, for
                long spans or large batches (about one extra forward of those sub-layers).
            memory_dtype: the dtype the fast path stores the memory in (None: as computed,
                float32 under autocast). bf16 halves the memory's size and is what the
                attention kernel reads under bf16 autocast anyway.

        Returns:
            The model, for chaining.
        """
        for block in self.blocks:
            block.fast, block.compile, block.recompute = fast, compile, recompute
            block.memory_dtype = memory_dtype if fast else None
        return self

    def collapse(self) -> SHARNN:
        """Fold every value-gate network into its constant (§3.4), in place. Outputs are
        unchanged; the parameter count drops by ``2d^2 + 2d`` per attention block."""
        for block in self.blocks:
            if block.attention is not None:
                block.attention.collapse()
        self.config = dataclasses.replace(self.config, collapsed=True)
        return self

    def num_parameters(self, collapsed: bool = False) -> int:
        """Number of parameters, the tied embedding counted once. With ``collapsed``, the
        count after :meth:`collapse` (each value-gate network, ``2d^2 + 2d``, replaced by
        its ``d``-vector output in place of ``theta_v``)."""
        total = sum(p.numel() for p in self.parameters())
        if collapsed:
            for block in self.blocks:
                if block.attention is not None and hasattr(block.attention, "value_gate_net"):
                    total -= sum(p.numel() for p in block.attention.value_gate_net.parameters())
        return total
