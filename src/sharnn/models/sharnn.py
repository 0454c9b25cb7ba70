"""The Single Headed Attention RNN (SHA-RNN; Merity 2019, arXiv:1911.11423), top to bottom.

``docs/model.md`` explains every equation below, its shapes, and where this code
differs from the original and why; § numbers are the paper's sections.

Tensors are time-major throughout: token ids ``[T, B]``, activations ``[T, B, d]``,
memory ``[M, B, d]``, where ``T`` is the window length (bptt), ``B`` the number of
independent streams and ``d`` the model width.

One window through the model (paper §3)::

    x = Drop_i(Emb[tokens])
    for every block:
        u = Drop_h(LSTM(LN_start(x)))                                # no residual around the LSTM
        y = LN_mid(u) + Drop_h(Attn(LN_mid(u), [mem ; LN_mem(u)]))   # attention blocks; else y = u
        x = LN_ff(y) + Drop_h(Boom(LN_xff(y)))
    logits = Drop_o(x) @ Emb^T + b                                   # tied weights, untied bias

Three settings swap one part each for the paper's ablations (docs/model.md, "Variants"):
``cell="ln_lstm"`` (:class:`LayerNormLSTM`), ``value_gate="vector"`` (``g_v = sigmoid(gate_v)``
in :class:`Attention`), ``feed_forward="mlp"`` (:class:`MLP` in place of the Boom).

How the attention is computed is chosen once per model, as Hugging Face modeling files
choose their attention implementation (:meth:`SHARNN.set_attn_implementation`):
``"eager"``, the reference (explicit scores and softmax), or ``"sdpa"``
(``F.scaled_dot_product_attention``, fused kernels on CUDA). Both compute the same
function. Compilation and activation recompute are applied to the sub-layers from
outside (:mod:`sharnn.runtime`); nothing here branches on them.

``SHARNN`` is a ``huggingface_hub.PyTorchModelHubMixin``: ``save_pretrained`` and
``from_pretrained`` write and read the Hub layout (``config.json``, ``model.safetensors``
with the SHA-256 of its weights, a model card), strictly, through
:class:`sharnn.models.hub.HubModel` (docs/sharing.md).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from .config import SHARNNConfig
from .hub import HubModel
from .lstm import LayerNormLSTM, run_lstm


@dataclass
class State:
    """Recurrent state carried from one window to the next (docs/model.md, "Memory").

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
        """Inverse of :meth:`tensors`. Raises ``KeyError`` when a block's ``(h, c)`` is missing."""
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
    """The sigmoid approximation of GELU the original code uses, ``x * sigmoid(1.702 x)``."""
    return _SigmoidGELU.apply(x)


class Boom(nn.Module):
    """The Boom layer (paper §3, "Boom"): ``Linear(d -> F)``, GELU, dropout, then the ``F``
    features cut into ``F/d`` consecutive chunks of ``d`` that are summed. No
    down-projection. Shapes: ``[T, B, d] -> [T, B, d]``."""

    def __init__(self, d_model: int, boom_dim: int, dropout: float):
        super().__init__()
        self.linear = nn.Linear(d_model, boom_dim)
        self.drop = nn.Dropout(dropout)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        h = self.drop(gelu(self.linear(x)))
        return h.unflatten(-1, (-1, self.d_model)).sum(-2)


class MLP(nn.Module):
    """The Transformer's feed-forward in place of the Boom (``model.feed_forward = "mlp"``,
    the ablation of paper §3.2): ``Linear(d -> F)``, the same GELU and dropout, then the
    down-projection ``Linear(F -> d)`` the Boom does without. Shapes: ``[T, B, d] -> [T, B, d]``."""

    def __init__(self, d_model: int, boom_dim: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(d_model, boom_dim)
        self.down = nn.Linear(boom_dim, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.drop(gelu(self.up(x))))  # [T, B, d] -> [T, B, F] -> [T, B, d]


# ------------------------------------------------------------------ attention implementations
#
# Each computes ``Drop(softmax(q k^T + mask)) v`` for one head with the bottom-right causal
# mask of :func:`causal_mask` and no further scaling (the caller folds 1/sqrt(d) into q).
# q: [T, B, d]; k, v: [S, B, d] with S = M + T >= T; returns [T, B, d].


def causal_mask(window: int, memory: int, device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned causal mask ``[T, M + T]``: query ``t`` sees all ``M`` memory
    positions and window positions ``<= t``. True means "may attend"."""
    return torch.ones(window, memory + window, dtype=torch.bool, device=device).tril(diagonal=memory)


def eager_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """The reference: explicit scores, mask and softmax (in fp32 at least)."""
    T, S = q.shape[0], k.shape[0]
    scores = torch.einsum("tbd,sbd->bts", q, k)
    scores = scores.masked_fill(~causal_mask(T, S - T, device=k.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return torch.einsum("bts,sbd->tbd", F.dropout(probs, dropout_p), v)


@torch.compiler.disable  # the mask object (CausalBias) cannot be traced; the kernel gains nothing from it
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` (fused kernels on CUDA), in ``k``'s dtype. ``k``
    and ``v`` may be the same tensor; nothing is copied to change their layout."""
    T, S = q.shape[0], k.shape[0]
    mask = causal_lower_right(T, S) if T > 1 else None  # one query sees everything
    heads = [x.permute(1, 0, 2).unsqueeze(1) for x in (q.to(k.dtype), k, v)]  # [L, B, d] -> [B, 1, L, d], views
    out = F.scaled_dot_product_attention(*heads, attn_mask=mask, dropout_p=dropout_p, scale=1.0)
    return out.squeeze(1).permute(1, 0, 2)


ATTENTION_FUNCTIONS = {"eager": eager_attention, "sdpa": sdpa_attention}


def check_attn_implementation(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is one of :data:`ATTENTION_FUNCTIONS` (both
    architectures' ``set_attn_implementation``)."""
    if name not in ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation must be one of {', '.join(ATTENTION_FUNCTIONS)}, got {name!r}")


class Attention(nn.Module):
    """The single attention head (paper §3; docs/model.md, "Attention").

    Keys and values are the memory itself, gated per feature; only the query has a
    learned projection::

        Q = Drop(sigmoid(gate_q) * ln_query(query(r)))
        K = sigmoid(gate_k) * kv                                    (no dropout on keys)
        V = Drop(g_v * kv),  g_v = sigmoid(f) * tanh(c),  [c ; f] = value_gate_net(sigmoid(gate_v))
        out = Drop(softmax(Q K^T / sqrt(d) + mask)) V

    With ``value_gate="vector"`` (the ablation of paper §6.4) the gate is a plain learned
    vector, ``g_v = sigmoid(gate_v)``: ``gate_v`` starts at zeros, so ``g_v`` starts at 0.5
    (the network's ``g_v`` starts near 0).

    Because the gates are per-feature constants and keys and values are the same tensor,
    this is computed without gating the memory at all (the same function, up to
    floating-point rounding)::

        Q K^T = (Q * sigmoid(gate_k)) kv^T                  the key gate folds into the query
        Drop(P) Drop(g_v * kv) = g_v * (Drop(P) Drop(kv))   the value gate commutes with the
                                                            (elementwise) dropout and the sum

    ``g_v`` depends only on parameters; :meth:`collapse` replaces its network by the
    constant it computes (parameter ``value_gate``).
    """

    attn_implementation = "eager"  # a key of ATTENTION_FUNCTIONS; set by SHARNN.set_attn_implementation

    def __init__(
        self, d_model: int, dropout: float, eps: float, collapsed: bool = False, value_gate: str = "overparam"
    ):
        super().__init__()
        self.query = nn.Linear(d_model, d_model)
        self.ln_query = nn.LayerNorm(d_model, eps=eps)
        self.gate_q = nn.Parameter(torch.zeros(d_model))
        self.gate_k = nn.Parameter(torch.zeros(d_model))
        if collapsed:
            self.value_gate = nn.Parameter(torch.zeros(d_model))
        else:
            self.gate_v = nn.Parameter(torch.zeros(d_model))
            if value_gate == "overparam":
                self.value_gate_net = nn.Linear(d_model, 2 * d_model)  # the "over-parameterised" gate
        self.drop = nn.Dropout(dropout)
        self.scale = 1.0 / math.sqrt(d_model)

    def value_gate_vector(self) -> Tensor:
        """The value gate ``g_v``, a ``[d]`` vector in (-1, 1) (in (0, 1) for the vector gate)."""
        if hasattr(self, "value_gate"):
            return self.value_gate
        if not hasattr(self, "value_gate_net"):
            return torch.sigmoid(self.gate_v)
        c, f = self.value_gate_net(torch.sigmoid(self.gate_v)).chunk(2)
        return torch.sigmoid(f) * torch.tanh(c)

    @torch.no_grad()
    def collapse(self) -> None:
        """Fold the value gate (its network, or the vector's sigmoid) into its constant
        output; outputs are unchanged."""
        if hasattr(self, "value_gate"):
            return
        gate = self.value_gate_vector()
        del self.gate_v
        if hasattr(self, "value_gate_net"):
            del self.value_gate_net
        self.value_gate = nn.Parameter(gate)

    def forward(self, r: Tensor, kv: Tensor) -> Tensor:
        """Attend from the window to memory plus window, bottom-right causal: query ``t``
        sees every memory position and window positions ``<= t``.

        Args:
            r: query input ``[T, B, d]``.
            kv: keys = values, ``[S, B, d]`` with ``S = M + T`` (memory, then the window).

        Returns:
            ``[T, B, d]``, in ``kv``'s dtype on the "sdpa" implementation.
        """
        q = self.drop(torch.sigmoid(self.gate_q) * self.ln_query(self.query(r)))
        q = q * (torch.sigmoid(self.gate_k) * self.scale)  # key gate and 1/sqrt(d), folded
        attend = ATTENTION_FUNCTIONS[self.attn_implementation]
        out = attend(q, kv, self.drop(kv), self.drop.p if self.training else 0.0)
        return self.value_gate_vector() * out


class AttentionSublayer(nn.Module):
    """``y = LN_mid(u) + Drop(Attn(LN_mid(u), [mem ; LN_mem(u)]))``, and the new memory.

    The incoming memory is cut to its last ``span - T`` positions (the span counts the
    window); the new memory is the detached keys/values ``[min(M + T, span), B, d]``.
    """

    memory_dtype: torch.dtype | None = None  # None: as LN_mem computes; set by SHARNN.set_attn_implementation

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.ln_mid = nn.LayerNorm(d, eps=eps)
        self.ln_mem = nn.LayerNorm(d, eps=eps)
        self.head = Attention(d, config.dropouth, eps, collapsed=config.collapsed, value_gate=config.value_gate)
        self.drop = nn.Dropout(config.dropouth)
        self.span = config.attention_span

    def forward(self, u: Tensor, memory: Tensor | None) -> tuple[Tensor, Tensor]:
        """``u [T, B, d]`` (the LSTM output after dropout), ``memory [M, B, d]`` or None ->
        ``(y [T, B, d], new memory)``."""
        T = u.shape[0]
        s = self.ln_mem(u)
        if self.memory_dtype is not None:
            s = s.to(self.memory_dtype)
        kv = torch.cat([memory[-(self.span - T) :].to(s.dtype), s]) if memory is not None and self.span > T else s
        r = self.ln_mid(u)
        return r + self.drop(self.head(r, kv)), kv.detach()


class FeedForward(nn.Module):
    """``z = LN_ff(y) + Drop(Boom(LN_xff(y)))``: two different LayerNorms of the same ``y``,
    one the Boom's input, one the residual base. ``[T, B, d] -> [T, B, d]``. With
    ``feed_forward="mlp"`` an :class:`MLP` takes the Boom's place (``boom`` is then None)."""

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.ln_ff = nn.LayerNorm(d, eps=eps)
        self.ln_xff = nn.LayerNorm(d, eps=eps)
        self.boom = Boom(d, config.boom_dim, config.dropouth) if config.feed_forward == "boom" else None
        self.mlp = MLP(d, config.boom_dim, config.dropouth) if config.feed_forward == "mlp" else None
        self.drop = nn.Dropout(config.dropouth)

    def forward(self, y: Tensor) -> Tensor:
        inner = self.boom if self.mlp is None else self.mlp
        return self.ln_ff(y) + self.drop(inner(self.ln_xff(y)))


class Block(nn.Module):
    """One SHA-RNN block (paper §3)::

    u = Drop(LSTM(LN_start(x)))                                  # no residual
    y = LN_mid(u) + Drop(Attn(LN_mid(u), [mem ; LN_mem(u)]))     # attention blocks only, else y = u
    z = LN_ff(y) + Drop(Boom(LN_xff(y)))
    """

    def __init__(self, config: SHARNNConfig, has_attention: bool):
        super().__init__()
        d = config.d_model
        self.ln_start = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.lstm = nn.LSTM(d, d) if config.cell == "lstm" else LayerNormLSTM(d, config.layer_norm_eps)
        self.attention = AttentionSublayer(config) if has_attention else None
        self.feed_forward = FeedForward(config)
        self.drop = nn.Dropout(config.dropouth)

    def forward(
        self, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None = None, memory: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Args: ``x [T, B, d]``, the LSTM's ``(h, c)`` (each ``[1, B, d]``, or None for
        zeros), the memory ``[M, B, d]`` or None. Returns ``(z [T, B, d], (h, c), memory)``;
        the memory is None in blocks without attention."""
        u, lstm_state = self.recurrence(self.ln_start(x), lstm_state)
        u = self.drop(u)
        y, memory = (u, None) if self.attention is None else self.attention(u, memory)
        return self.feed_forward(y), lstm_state, memory

    def recurrence(self, x: Tensor, lstm_state: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``u, (h, c) = LSTM(x, (h, c))``, ``[T, B, d]``, run by :func:`run_lstm` (the
        LSTM or the LN-LSTM, as ``model.cell`` says)."""
        return run_lstm(self.lstm, x, lstm_state)


class SHARNN(
    nn.Module,
    HubModel,
    library_name="sharnn",
    paper_url="https://arxiv.org/abs/1911.11423",
    tags=["sha-rnn", "byte-level", "language-modeling", "arxiv:1911.11423"],
):
    """The SHA-RNN language model: tied embedding, blocks, tied softmax with its own bias.

    Example::

        model = SHARNN(SHARNNConfig(d_model=256, n_layers=2, boom_dim=1024))
        logits, state = model(tokens)          # tokens [T, B] -> logits [T, B, V]
        logits, state = model(more, state)     # carries LSTM state and memory
        model.save_pretrained("my-model")      # config.json, model.safetensors, README.md
        model = SHARNN.from_pretrained("my-model")   # or a Hub repo id; in eval mode

    Raises:
        ConfigError: an invalid ``config``.
    """

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        config.validate()
        self.config = config = copy.deepcopy(config)  # the model's own: collapse() changes it
        attention_blocks = set(config.attention_blocks())
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i in attention_blocks) for i in range(config.n_layers))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.drop_input = nn.Dropout(config.dropouti)
        self.drop_output = nn.Dropout(config.dropouto)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The original initialisation (docs/model.md, "Initialisation"): Embedding and
        Linear weights N(0, (0.1/sqrt(d))^2), biases 0; LayerNorm gain 1, bias 0; LSTMs
        PyTorch's default U(+-1/sqrt(d)), the LN-LSTM's weights and bias too; gate vectors 0."""
        std = 0.1 / math.sqrt(self.config.d_model)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.LSTM, LayerNormLSTM)):
                module.reset_parameters()
            elif isinstance(module, Attention):
                for name in ("gate_q", "gate_k", "gate_v"):
                    if hasattr(module, name):
                        nn.init.zeros_(getattr(module, name))
        nn.init.zeros_(self.output_bias)

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """Run one window.

        Args:
            tokens: ``[T, B]`` int64 token ids; with attention ``T <= attention_span``.
            state: the state returned by the previous window of the same streams, or
                None to start from zeros and an empty memory.

        Returns:
            ``(logits [T, B, V], state)``: unnormalised next-token scores, and the state
            to pass with the next window.

        Raises:
            ConfigError: a window longer than the attention span.
            ValueError: ``state`` has the wrong number of blocks.
        """
        self.config.check_window(tokens.shape[0])
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

    def set_attn_implementation(self, name: str = "eager", memory_dtype: torch.dtype | None = None) -> SHARNN:
        """Choose how every attention head computes; what it computes does not change
        (up to rounding). Hugging Face models make the same choice with
        ``attn_implementation``.

        Args:
            name: ``"eager"``, explicit scores and softmax (the reference), or ``"sdpa"``,
                ``F.scaled_dot_product_attention`` (fused kernels on CUDA).
            memory_dtype: the dtype the memory is stored in (None: as ``LN_mem`` computes
                it). The fast path stores bf16, which halves the memory and is what the
                kernels read under bf16 autocast anyway.

        Returns:
            The model, for chaining.

        Raises:
            ValueError: an unknown ``name``.
        """
        check_attn_implementation(name)
        for module in self.modules():
            if isinstance(module, Attention):
                module.attn_implementation = name
            elif isinstance(module, AttentionSublayer):
                module.memory_dtype = memory_dtype
        return self

    def set_attention_span(self, span: int) -> SHARNN:
        """Attend to ``span`` positions (the window included) from the next window on,
        whatever span the model trained with. The head has no position encoding, so a
        trained model reads a memory of any length (paper §3.1: "you can extend your
        memory window indefinitely with minimal overhead"; measured in
        docs/ablations.md, "A longer memory at test time"). A memory carried in from a
        longer span is cut to the last ``span - T`` positions at the next window.

        Returns:
            The model, for chaining.

        Raises:
            ConfigError: ``span`` is not a positive integer.
        """
        config = replace(self.config, attention_span=span)
        config.validate()
        self.config = config
        for module in self.modules():
            if isinstance(module, AttentionSublayer):
                module.span = config.attention_span
        return self

    def sublayers(self) -> list[nn.Module]:
        """The attention and feed-forward sub-layers of every block, in order: the units
        that :mod:`sharnn.runtime` compiles and recomputes."""
        return [m for m in self.modules() if isinstance(m, (AttentionSublayer, FeedForward))]

    def collapse(self) -> SHARNN:
        """Fold every value gate into its constant, in place. Outputs are unchanged; the
        parameter count drops by ``2d^2 + 2d`` per attention block of the over-parameterised
        gate (its network), and stays as it was with the vector gate."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.collapse()
        self.config.collapsed = True
        return self

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part: the embedding with the output bias, the LSTMs (named by
        ``model.cell``: ``lstm``, or ``ln_lstm`` with its LayerNorms), the attention heads
        (their query LayerNorm and value gate included), the feed-forwards (named by
        ``model.feed_forward``: ``boom`` or ``mlp``) and the other LayerNorms. They add up
        to :meth:`num_parameters`."""
        counts, seen = {}, set()
        parts = (
            (self.config.cell, (nn.LSTM, LayerNormLSTM)),
            ("attention", Attention),
            (self.config.feed_forward, (Boom, MLP)),
            ("layernorm", nn.LayerNorm),
        )
        for part, kind in parts:
            params = [p for m in self.modules() if isinstance(m, kind) for p in m.parameters() if id(p) not in seen]
            seen.update(id(p) for p in params)
            counts[part] = sum(p.numel() for p in params)
        rest = sum(p.numel() for p in self.parameters() if id(p) not in seen)
        return {"embedding + output bias": rest} | counts

    def num_parameters(self, collapsed: bool = False) -> int:
        """Number of parameters, the tied embedding counted once. With ``collapsed``, the
        count after :meth:`collapse` (each value-gate network, ``2d^2 + 2d``, replaced by
        its ``d``-vector output in place of ``gate_v``; the vector gate's count is unchanged)."""
        total = sum(p.numel() for p in self.parameters())
        if collapsed:
            for module in self.modules():
                if isinstance(module, Attention) and hasattr(module, "value_gate_net"):
                    total -= sum(p.numel() for p in module.value_gate_net.parameters())
        return total

    def model_card_fields(self) -> dict:
        """What the model card (``save_pretrained``'s README.md) says of this model: its
        config, attention blocks and parameter counts (trainable and collapsed), the paper."""
        with torch.device("meta"):
            trained = SHARNN(replace(self.config, collapsed=False))
        return {
            "config": self.config.to_dict(),
            "attention_blocks": self.config.attention_blocks(),
            "parameters": trained.num_parameters(),
            "parameters_collapsed": trained.num_parameters(collapsed=True),
            "paper_url": self._hub_mixin_info.paper_url,
        }
