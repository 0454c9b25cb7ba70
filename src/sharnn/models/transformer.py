"""The decoder-only byte-level Transformer baseline (docs/transformer.md), read like
nanoGPT's model.py: pre-LayerNorm blocks, causal multi-head attention through
``F.scaled_dot_product_attention``, a GELU MLP, learned positions and tied embeddings.

It is built from the same :class:`sharnn.models.config.SHARNNConfig` as the SHA-RNN
(``architecture: transformer``): ``n_layers`` blocks of width ``d_model``, an MLP of hidden
width ``boom_dim``, ``n_heads`` heads, a context of ``attention_span`` positions. Tensors
are time-major like the SHA-RNN's (token ids ``[T, B]``, activations ``[S, B, d]``)::

    context = [memory tokens ; window tokens]                      # [S, B], S = M + T <= span
    x = Drop_i(Emb[context] + Pos[0..S-1])
    for every block:
        x = x + Drop_h(Proj(Attn(LN_1(x))))                        # causal, n_heads heads
        x = x + Drop_h(Down(GELU(Up(LN_2(x)))))
    logits = Drop_o(LN_f(x)[last T]) @ Emb^T                       # tied, no output bias

The recurrent state (:class:`TokenState`) is the stream's last token ids, so that every
command that carries a state from one window to the next (training, evaluation,
generation, compression) runs it unchanged: each window is run with the memory's tokens
in front of it, and a query sees up to ``attention_span`` positions.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config_check import shown
from ..errors import ConfigError
from .config import SHARNNConfig
from .hub import HubModel
from .sharnn import check_attn_implementation


@dataclass
class TokenState:
    """The Transformer's recurrent state: the stream's last token ids ``tokens`` ``[M, B]``
    (int64, ``M <= attention_span``), the context the next window is run with. The same
    interface as :class:`sharnn.models.sharnn.State`."""

    tokens: Tensor

    def detach(self) -> TokenState:
        """The same state (token ids carry no graph); a new object, as ``State.detach``."""
        return TokenState(self.tokens.detach())

    def tensors(self) -> dict[str, Tensor]:
        """``{"tokens": [M, B]}``, for saving (e.g. with safetensors)."""
        return {"tokens": self.tokens}

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], n_layers: int) -> TokenState:
        """Inverse of :meth:`tensors` (``n_layers``, the interface's, is not needed).
        Raises ``KeyError`` when ``tokens`` is missing."""
        return cls(tensors["tokens"])


class CausalSelfAttention(nn.Module):
    """``n_heads`` heads of causal self-attention, one ``qkv`` Linear and an output
    projection followed by dropout: ``[S, B, d] -> [S, B, d]``. Position ``s`` sees
    positions ``<= s``; the probabilities are dropped out with the ``dropouth`` rate."""

    attn_implementation = "sdpa"  # "eager" or "sdpa"; set by Transformer.set_attn_implementation

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(config.dropouth)

    def forward(self, x: Tensor) -> Tensor:
        S, B, d = x.shape
        q, k, v = (t.view(S, B, self.n_heads, -1).permute(1, 2, 0, 3) for t in self.qkv(x).split(d, dim=-1))
        p = self.drop.p if self.training else 0.0
        if self.attn_implementation == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            out = eager_attention(q, k, v, p)
        return self.drop(self.proj(out.permute(2, 0, 1, 3).reshape(S, B, d)))


def eager_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """The reference of the fused kernel: ``Drop(softmax(q k^T / sqrt(h) + causal)) v`` on
    ``[B, H, S, h]``, explicit scores and softmax (in fp32 at least)."""
    S = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return F.dropout(probs, dropout_p) @ v


class MLP(nn.Module):
    """``Drop(Down(GELU(Up(x))))``, hidden width ``boom_dim``, torch's exact GELU:
    ``[S, B, d] -> [S, B, d]``."""

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.boom_dim)
        self.down = nn.Linear(config.boom_dim, config.d_model)
        self.drop = nn.Dropout(config.dropouth)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class TransformerBlock(nn.Module):
    """``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`` (pre-LayerNorm), ``[S, B, d]``."""

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(
    nn.Module,
    HubModel,
    library_name="sharnn",
    tags=["transformer", "byte-level", "language-modeling"],
):
    """The decoder-only Transformer baseline, with the SHA-RNN's interface.

    Example::

        model = Transformer(SHARNNConfig(architecture="transformer", d_model=256, n_layers=2,
                                         boom_dim=1024, n_heads=4, attention_span=256))
        logits, state = model(tokens)          # tokens [T, B] -> logits [T, B, V]
        logits, state = model(more, state)     # the earlier tokens as context
        model.save_pretrained("my-model")      # config.json, model.safetensors, README.md

    Raises:
        ConfigError: an invalid ``config``, or one whose ``architecture`` is not ``transformer``.
    """

    def __init__(self, config: SHARNNConfig):
        super().__init__()
        config.validate()
        if config.architecture != "transformer":
            raise ConfigError(f"a Transformer needs model.architecture transformer, got {config.architecture!r}")
        self.config = config = copy.deepcopy(config)
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.positions = nn.Embedding(config.attention_span, config.d_model)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.drop_input = nn.Dropout(config.dropouti)
        self.drop_output = nn.Dropout(config.dropouto)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nanoGPT's initialisation: Linear and Embedding weights N(0, 0.02^2), biases 0,
        LayerNorm gain 1 and bias 0; the residual projections (attention ``proj``, MLP
        ``down``) N(0, (0.02 / sqrt(2 n_layers))^2)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for block in self.blocks:
            for linear in (block.attn.proj, block.mlp.down):
                nn.init.normal_(linear.weight, 0.0, 0.02 / math.sqrt(2 * self.config.n_layers))

    def forward(self, tokens: Tensor, state: TokenState | None = None) -> tuple[Tensor, TokenState]:
        """Run one window after the memory's tokens.

        Args:
            tokens: ``[T, B]`` int64 token ids, ``T <= attention_span``.
            state: the state returned by the previous window of the same streams, or None
                to start with no context.

        Returns:
            ``(logits [T, B, V], state)``: the next-token scores of the window's positions,
            and the state for the next window (the last ``min(M + T, span)`` token ids).

        Raises:
            ConfigError: a window longer than the attention span.
            ValueError: a state of another number of streams.
        """
        self.config.check_window(tokens.shape[0])
        T, span = tokens.shape[0], self.config.attention_span
        if state is not None and state.tokens.shape[1:] != tokens.shape[1:]:
            raise ValueError(f"state has {state.tokens.shape[1]} streams, the window {tokens.shape[1]}")
        memory = state.tokens[max(len(state.tokens) - (span - T), 0) :] if state is not None else tokens[:0]
        context = torch.cat([memory.to(tokens.device), tokens])
        positions = self.positions(torch.arange(len(context), device=tokens.device))
        x = self.drop_input(self.embedding(context) + positions.unsqueeze(1))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.drop_output(self.ln_f(x[-T:])), self.embedding.weight)
        return logits, TokenState(context)

    def set_attn_implementation(self, name: str = "eager", memory_dtype: torch.dtype | None = None) -> Transformer:
        """Choose how attention computes: ``"eager"`` (explicit scores and softmax) or
        ``"sdpa"`` (``F.scaled_dot_product_attention``, fused kernels on CUDA; the default).
        ``memory_dtype`` is the SHA-RNN's and has no effect here (the memory is token ids).

        Raises:
            ValueError: an unknown ``name``.
        """
        check_attn_implementation(name)
        for module in self.modules():
            if isinstance(module, CausalSelfAttention):
                module.attn_implementation = name
        return self

    def set_attention_span(self, span: int) -> Transformer:
        """Attend to ``span`` positions (the window included) from the next window on. The
        learned positions stop at the span the model trained with, so ``span`` may shorten
        the context but not lengthen it (the SHA-RNN's head has no positions and may:
        :meth:`sharnn.models.SHARNN.set_attention_span`).

        Raises:
            ConfigError: ``span`` is not a positive integer, or exceeds the learned positions.
        """
        trained = self.positions.num_embeddings
        if isinstance(span, int) and span > trained:
            raise ConfigError(
                f"attention span {shown(span)} exceeds this Transformer's {trained:,} learned positions; "
                f"it can read at most {trained:,}"
            )
        config = replace(self.config, attention_span=span)
        config.validate()
        self.config = config
        return self

    def sublayers(self) -> list[nn.Module]:
        """The attention and MLP sub-layers of every block, in order: the units that
        :mod:`sharnn.runtime` compiles and recomputes."""
        return [m for m in self.modules() if isinstance(m, (CausalSelfAttention, MLP))]

    def collapse(self) -> Transformer:
        """Nothing to fold (the Transformer has no value gate): the model, unchanged."""
        return self

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part: the tied embedding, the learned positions, the attention
        layers, the MLPs and the LayerNorms. They add up to :meth:`num_parameters`."""
        kinds = {"attention": CausalSelfAttention, "mlp": MLP, "layernorm": nn.LayerNorm}
        counts = {
            "embedding": self.embedding.weight.numel(),
            "positions": self.positions.weight.numel(),
        }
        for part, kind in kinds.items():
            counts[part] = sum(p.numel() for m in self.modules() if isinstance(m, kind) for p in m.parameters())
        return counts

    def num_parameters(self, collapsed: bool = False) -> int:
        """Number of parameters, the tied embedding counted once; ``collapsed`` changes
        nothing (see :meth:`collapse`)."""
        return sum(p.numel() for p in self.parameters())

    def model_card_fields(self) -> dict:
        """What the model card says of this model: the SHA-RNN's template, which describes a
        Transformer by its ``config.architecture`` (and ``heads``)."""
        total = self.num_parameters()
        return {
            "config": self.config.to_dict(),
            "attention_blocks": list(range(self.config.n_layers)),
            "heads": self.config.n_heads,
            "parameters": total,
            "parameters_collapsed": total,
            "paper_url": "https://arxiv.org/abs/1911.11423",
        }
