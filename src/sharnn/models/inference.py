"""Which step computes one inference position: the one choice that generation and the
compressor both make (docs/compression.md, "The step").

- ``"forward"``: the model's own forward on one position (:class:`ReferenceStep`): a
  Transformer, and compressed files of format versions 1 and 2;
- ``"fp32"``, ``"bf16"``: the SHA-RNN's float step (:class:`Step`);
- ``"integer"``: the SHA-RNN's integer step (:class:`IntegerStep`), the same bits on
  every CPU.
"""

from __future__ import annotations

from ..errors import ConfigError
from .build import LanguageModel
from .integer_step import IntegerStep
from .sharnn import SHARNN
from .step import ReferenceStep, Step

STEP_KINDS = ("forward", "fp32", "bf16", "integer")


def inference_step(
    model: LanguageModel, streams: int, positions: int | None, kind: str
) -> ReferenceStep | Step | IntegerStep:
    """The step of ``kind`` (:data:`STEP_KINDS`) for ``streams`` streams over at most
    ``positions`` positions: ``step(tokens [B]) -> logits [B, V]``, ``step.refresh()``.

    Raises:
        ConfigError: an unknown ``kind``; a step other than ``"forward"`` for a model that
            is not an SHA-RNN (and as each step's constructor).
    """
    if kind not in STEP_KINDS:
        raise ConfigError(f"the inference step is one of {', '.join(STEP_KINDS)}, not {kind!r}")
    if kind == "forward":
        return ReferenceStep(model)
    if not isinstance(model, SHARNN):
        raise ConfigError(f"the {kind} step runs an SHA-RNN, not a {type(model).__name__}")
    if kind == "integer":
        return IntegerStep(model, streams, positions)
    return Step(model, streams, positions, kind)
