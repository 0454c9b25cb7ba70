"""The configuration of a model (as Hugging Face's ``configuration_*.py``): :class:`SHARNNConfig`
describes an SHA-RNN completely, and the Transformer baseline built from the same settings;
:data:`VARIANTS` lists the choices of the paper's ablations (docs/model.md, "Variants").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..config_check import shown, typed
from ..errors import ConfigError


@dataclass
class SHARNNConfig:
    """Everything that defines an SHA-RNN. Defaults are the paper's enwik8 model (Table 2).

    Attributes:
        vocab_size: number of token ids (256 for bytes).
        d_model: width of the embedding, the LSTMs and the attention (paper: 1024).
        n_layers: number of blocks (paper: 4).
        boom_dim: width of the Boom's hidden layer, a multiple of ``d_model`` (paper: 4096).
        attention: which blocks have an attention head: ``"none"``, ``"single"`` (block
            ``n_layers - 2``, the paper's single head), ``"all"``, or a list of block indices.
        attention_span: positions one window attends to, the window itself included
            (paper: 5000). The memory keeps the last ``span - T``; in a model with
            attention a window may not be longer than the span.
        dropouti: dropout on the embedding output (Table 2's "i").
        dropouth: dropout inside the blocks: LSTM output, query, values, attention
            probabilities, Boom hidden layer and both sub-layer outputs ("h").
        dropouto: dropout before the tied softmax ("o").
        layer_norm_eps: epsilon of every LayerNorm (1e-12, as the original code).
        collapsed: whether the value-gate network has been folded into its constant
            output by :meth:`SHARNN.collapse` (docs/model.md, "Collapse").

    Variants (docs/ablations.md; the defaults are the paper's model):
        architecture: ``"sha-rnn"``, or ``"transformer"``: the decoder-only baseline of
            :mod:`sharnn.models.transformer` built from the same settings (``n_layers`` blocks of
            width ``d_model``, a feed-forward of ``boom_dim``, a context of
            ``attention_span`` positions, ``n_heads`` heads); the SHA-RNN-only settings
            (``attention``, ``cell``, ``value_gate``, ``feed_forward``) keep their defaults.
        cell: ``"lstm"``, or ``"ln_lstm"``: LayerNorm on the gate pre-activations and on
            the cell (Ba et al. 2016, §3.1; paper §6.2's open question).
        value_gate: ``"overparam"``, the paper's gate computed by a network from a vector
            (§6.4), or ``"vector"``: a plain learned vector through a sigmoid.
        feed_forward: ``"boom"`` (§3.2), or ``"mlp"``: up-projection, GELU and a
            down-projection, the Transformer's feed-forward, at the same hidden width.
        n_heads: attention heads of the Transformer (its width a multiple of it); the
            SHA-RNN's head is single by design and ignores it.

    Raises:
        ConfigError (a ``ValueError``): from :meth:`validate` and :meth:`check_window`.
    """

    vocab_size: int = 256
    d_model: int = 1024
    n_layers: int = 4
    boom_dim: int = 4096
    attention: str | list[int] = "single"
    attention_span: int = 5000
    dropouti: float = 0.1
    dropouth: float = 0.1
    dropouto: float = 0.1
    layer_norm_eps: float = 1e-12
    collapsed: bool = False
    architecture: str = "sha-rnn"
    cell: str = "lstm"
    value_gate: str = "overparam"
    feed_forward: str = "boom"
    n_heads: int = 4

    @classmethod
    def from_dict(cls, fields: dict) -> SHARNNConfig:
        """The config a mapping of its settings describes (``config.json``'s object);
        settings it lacks take their defaults. Raises :class:`ConfigError`: a key that is
        not a setting, or a value of the wrong type or out of range."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown model setting {shown(unknown[0])}")
        config = cls(**fields)
        config.validate()
        return config

    def to_dict(self) -> dict:
        """The settings as a mapping (``config.json``'s object, the compressor's fingerprint),
        the variants' settings left out where they hold their defaults: the paper's model
        is described, saved and fingerprinted as it was before variants existed."""
        fields = dataclasses.asdict(self)
        for name, default in VARIANT_DEFAULTS.items():
            if fields[name] == default:
                del fields[name]
        return fields

    def validate(self) -> None:
        """Check every value: its type (:func:`typed`, OmegaConf's, as for YAML), then its
        range and how the values fit together. Changes nothing.

        Raises:
            ConfigError: naming the first bad value.
        """
        typed(self, "model.").check_values()

    def check_values(self) -> None:
        """Check the range of every value of this typed config (:meth:`validate` types
        it first) and how the values fit together. Raises :class:`ConfigError`."""
        for name in ("vocab_size", "d_model", "n_layers", "boom_dim", "attention_span", "n_heads"):
            if getattr(self, name) < 1:  # n_heads too, though the SHA-RNN ignores it
                raise ConfigError(f"model.{name} must be >= 1, got {shown(getattr(self, name))}")
        if self.boom_dim % self.d_model:
            raise ConfigError(
                f"model.boom_dim ({shown(self.boom_dim)}) must be a multiple of model.d_model ({shown(self.d_model)})"
            )
        for name in ("dropouti", "dropouth", "dropouto"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {shown(p)}")
        if not 0 < self.layer_norm_eps < math.inf:
            raise ConfigError(f"model.layer_norm_eps must be > 0 and finite, got {shown(self.layer_norm_eps)}")
        for name, choices in VARIANTS.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"model.{name} must be one of {', '.join(choices)}, got {shown(getattr(self, name))}")
        self.attention_count()  # raises on a bad placement
        if self.architecture == "transformer":
            self._check_transformer()

    def _check_transformer(self) -> None:
        """The Transformer's constraints: heads that divide the width, and none of the
        SHA-RNN's own settings changed from their defaults (they would silently do nothing)."""
        if self.n_heads < 1 or self.d_model % self.n_heads:
            raise ConfigError(
                f"model.n_heads ({shown(self.n_heads)}) must be >= 1 and divide model.d_model ({shown(self.d_model)})"
            )
        for name in ("attention", "cell", "value_gate", "feed_forward", "collapsed"):
            if getattr(self, name) != SHARNN_ONLY_DEFAULTS[name]:
                raise ConfigError(f"model.{name} is a setting of the SHA-RNN; the Transformer has no use for it")

    def attention_blocks(self) -> list[int]:
        """Indices of the blocks that carry an attention head (``attention`` typed: a word or a
        list of integers). Raises :class:`ConfigError`: an unknown word, an index out of range."""
        placement = self.attention
        words = {
            "none": lambda: [],
            "single": lambda: [max(self.n_layers - 2, 0)],
            "all": lambda: list(range(self.n_layers)),
        }
        if isinstance(placement, str):
            if placement in words:  # built for the word given alone: "all" of a huge n_layers is refused later
                return words[placement]()
            raise ConfigError(
                f"model.attention must be 'none', 'single', 'all' or a list of block indices, got {shown(placement)}"
            )
        blocks = sorted(set(placement))
        bad = [i for i in blocks if not 0 <= i < self.n_layers]
        if bad:
            raise ConfigError(
                f"model.attention index {shown(bad[0])} is out of range for {shown(self.n_layers)} layers "
                f"(0..{shown(self.n_layers - 1)})"
            )
        return blocks

    def attention_count(self) -> int:
        """How many blocks carry an attention head, counted without listing them (``"all"`` of a
        huge ``n_layers``). Raises :class:`ConfigError` as :meth:`attention_blocks`."""
        return self.n_layers if self.attention == "all" else len(self.attention_blocks())

    def weight_sizes(self) -> tuple[int, int]:
        """The tensors of the model this config describes and the numbers they hold (its
        parameters, the tied embedding once), by arithmetic: what ``meta_model(config)``'s
        state dict holds, found without building anything, however large the config (a
        million blocks take minutes to build even on the meta device). Raises
        :class:`ConfigError`: a bad attention placement."""
        d, f, v, n = self.d_model, self.boom_dim, self.vocab_size, self.n_layers
        if self.architecture == "transformer":  # embedding, positions, ln_f; per block ln_1, qkv, proj, ln_2, mlp
            return 4 + 12 * n, v * d + self.attention_span * d + 2 * d + n * (4 * d * d + 2 * f * d + f + 9 * d)
        cell = (4, 8 * d * d + 8 * d) if self.cell == "lstm" else (9, 8 * d * d + 22 * d)  # LN-LSTM: 3 LayerNorms
        feed_forward = (2, f * d + f) if self.feed_forward == "boom" else (4, 2 * f * d + f + d)
        gate = (1, d) if self.collapsed or self.value_gate == "vector" else (3, 2 * d * d + 3 * d)  # its network
        block = [2 + cell[0] + 4 + feed_forward[0], 2 * d + cell[1] + 4 * d + feed_forward[1]]  # + 3 LayerNorms
        attention = [10 + gate[0], d * d + 9 * d + gate[1]]  # 3 LayerNorms, gate_q, gate_k and the query
        blocks = self.attention_count()
        return 2 + n * block[0] + blocks * attention[0], v + v * d + n * block[1] + blocks * attention[1]

    def check_window(self, length: int) -> None:
        """Refuse a window the model cannot take: with attention, one longer than the
        attention span (the memory would have to hold a negative number of positions).
        Without attention any length is fine. Raises :class:`ConfigError`."""
        if (self.architecture == "transformer" or self.attention_blocks()) and length > self.attention_span:
            raise ConfigError(
                f"windows of {shown(length)} tokens exceed model.attention_span ({shown(self.attention_span)}), "
                "the positions one window may attend to"
            )


# The variants' settings, their choices (the first is the paper's) and defaults.
VARIANTS = {
    "architecture": ("sha-rnn", "transformer"),
    "cell": ("lstm", "ln_lstm"),
    "value_gate": ("overparam", "vector"),
    "feed_forward": ("boom", "mlp"),
}
VARIANT_DEFAULTS = {name: choices[0] for name, choices in VARIANTS.items()} | {"n_heads": 4}
SHARNN_ONLY_DEFAULTS = {
    "attention": "single",
    "cell": "lstm",
    "value_gate": "overparam",
    "feed_forward": "boom",
    "collapsed": False,
}
