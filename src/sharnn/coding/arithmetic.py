"""How a compressed file's probabilities are computed: its :class:`Arithmetic`, read from
the header (or chosen by :func:`sharnn.coding.codec.compress`), and one :class:`Predictor`
per arithmetic behind one :func:`walk` over the positions, the same for both directions
(docs/compression.md, "How a file is coded").

============  =====================================================  ===============================
arithmetic    predictor                                              files
============  =====================================================  ===============================
``forward``   :class:`FloatPredictor` of the model's forward         versions 1, 2; a Transformer's
``float``     :class:`FloatPredictor` of the float step, fp32/bf16   versions 3 to 6 in fp32, bf16
``integer``   :class:`IntegerPredictor`: the integer step            versions 4 to 6 (``--no-adapt``)
``mixed``     :class:`MixedPredictor`: integer step, context models  versions 5, 6 (the default)
``online``    :class:`OnlinePredictor`: forward or float, trained    online mode, every version
============  =====================================================  ===============================

A new format is one predictor and one row of :attr:`Arithmetic.kind`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from ..config import TrainConfig, load_config
from ..errors import CheckpointError, DataError
from ..models.build import LanguageModel
from ..models.inference import inference_step
from ..models.integer_step import INTEGER_STEP_VERSION
from ..progress import ProgressDisplay
from .bitwise import BitMixer
from .coders import PROGRESS_EVERY, Coder
from .container import FORWARD_VERSIONS, Header
from .matching import MatchMixer
from .mixing import MIXING_VERSION, AdaptiveMixer
from .online import OnlineLearner

START_BYTE = 10  # every stream starts after a newline


MIXINGS = (1, 2, 3)  # the mixing versions this sharnn decodes (sharnn.coding.mixing, .matching, .bitwise)
DEFAULT_MIXING = 3  # what compress writes (docs/compression.md, "Adapting to the file")


@dataclass(frozen=True)
class Arithmetic:
    """What decides a file's probabilities, besides the model's weights and the machine.

    Attributes:
        version: the file's format version.
        precision: ``"integer"``, ``"fp32"`` or ``"bf16"``.
        integer_step: the integer step's version (precision integer), else None.
        mixing: the adaptive mixing's version (mixed files), else None.
        online: online mode's settings, else None.
        model_input: whether the model's predictions enter the mixing (false: the context
            models alone, for input that is not text).
    """

    version: int
    precision: str
    integer_step: int | None = None
    mixing: int | None = None
    online: TrainConfig | None = None
    model_input: bool = True

    @classmethod
    def of(cls, version: int, header: Header, name: str = "input") -> Arithmetic:
        """A coded file's arithmetic, from its ``header`` (format ``version``).

        Raises:
            DataError: an integer step or a mixing of another version than this sharnn's:
                it cannot repeat that arithmetic.
        """
        if header.integer_step is not None and header.integer_step != INTEGER_STEP_VERSION:
            raise DataError(
                f"{name} was coded by integer step version {header.integer_step}; this sharnn has version "
                f"{INTEGER_STEP_VERSION}: decompress it with the sharnn that made it"
            )
        if header.mixing is not None and header.mixing not in MIXINGS:
            raise DataError(
                f"{name} was mixed by mixing version {header.mixing}; this sharnn has versions "
                f"{', '.join(map(str, MIXINGS))}: decompress it with the sharnn that made it"
            )
        online = None if header.online is None else load_config(header.online)
        return cls(version, header.precision, header.integer_step, header.mixing, online, header.model_input)

    @classmethod
    def written(
        cls,
        version: int,
        precision: str,
        mixed: bool,
        online: TrainConfig | None,
        mixing: int = MIXING_VERSION,
        model_input: bool = True,
    ) -> Arithmetic:
        """The arithmetic :func:`~sharnn.coding.codec.compress` writes (checked there), a
        mixed one with mixing version ``mixing``, with the model's predictions or without."""
        integer = precision == "integer"
        step = INTEGER_STEP_VERSION if integer else None
        return cls(version, precision, step, mixing if mixed else None, online, model_input or not mixed)

    @property
    def kind(self) -> str:
        """The row of the module's table: ``forward``, ``float``, ``integer``, ``mixed`` or ``online``."""
        if self.online is not None:
            return "online"
        if self.version in FORWARD_VERSIONS:
            return "forward"
        if self.precision == "integer":
            return "mixed" if self.mixing is not None else "integer"
        return "float"

    @property
    def bitwise(self) -> bool:
        """Whether its bytes are coded bit by bit (mixing 3: :mod:`sharnn.coding.binary`),
        else each byte with its distribution (constriction's range coder)."""
        return self.mixing == 3

    @property
    def portable(self) -> bool:
        """Whether its files decode on every CPU kind and thread count (the integer step)."""
        return self.precision == "integer"

    def predictor(self, model: LanguageModel, streams: int, positions: int) -> Predictor:
        """The predictor that computes ``streams`` streams of at most ``positions`` positions with ``model``."""
        kind = self.kind
        if kind == "online":
            inner = dataclasses.replace(self, online=None).predictor(model, streams, positions)
            return OnlinePredictor(inner, model, self.online)
        if kind == "mixed" and not self.model_input:  # the context models alone: no step to build
            return MixedPredictor(None, device_of(model), self.mixing, streams, positions)
        kind_of_step = {"forward": "forward", "float": self.precision}.get(kind, "integer")
        step, device = inference_step(model, streams, positions, kind_of_step), device_of(model)
        if kind == "mixed":
            return MixedPredictor(step, device, self.mixing, streams, positions)
        return (IntegerPredictor if kind == "integer" else FloatPredictor)(step, device)


class Predictor(ABC):
    """The probabilities of every stream's next byte, one position at a time, from a step
    (:func:`~sharnn.models.inference.inference_step`) on ``device``.

    ``predict(grid, t)``: ``grid [rows + 1, B]`` int64 holds the start byte in row 0 and
    the bytes coded so far (row ``t`` is the byte before position ``t``); returns
    ``[B, 256]`` float64 probabilities of position ``t``. ``learn(coded [k])``: the bytes
    just coded at ``t`` (``k <= B``: the last position codes the longest streams only).
    ``code(grid, t, k, coder)``: both, through a coder (what :func:`walk` calls; mixing 3
    codes bits there instead, and has no distribution of bytes to predict).
    """

    def __init__(self, step, device: torch.device):
        self.step, self.device = step, device

    def logits(self, grid: np.ndarray, t: int) -> torch.Tensor:
        """The step's logits ``[B, V]`` of position ``t``."""
        return self.step(torch.from_numpy(grid[t]).to(self.device))

    @abstractmethod
    def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
        """``[B, 256]`` float64 probabilities of position ``t`` (each predictor's own)."""

    def learn(self, coded: np.ndarray) -> None:  # noqa: B027 (a default, not abstract: most predictors learn nothing)
        """Nothing to learn: the model is fixed."""

    def code(self, grid: np.ndarray, t: int, running: int, coder: Coder) -> np.ndarray:
        """Code position ``t`` of the first ``running`` streams through ``coder``, learn
        the bytes, and return them ``[running]``: :meth:`predict`, the coder's categorical
        coding of each byte, :meth:`learn`."""
        coded = coder.code(t, self.predict(grid, t)[:running])
        self.learn(coded)
        return coded

    def code_rows(self, grid: np.ndarray, start: int, stop: int, running: int, coder: Coder) -> None:
        """Code positions ``start .. stop - 1`` of the first ``running`` streams (what
        :func:`walk` calls), each position's bytes into ``grid``'s next row: :meth:`code`
        for each."""
        for t in range(start, stop):
            grid[t + 1, :running] = self.code(grid, t, running, coder)


class FloatPredictor(Predictor):
    """A float step (the model's forward, or the SHA-RNN's step in fp32 or bf16) and a
    float64 softmax."""

    def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
        return probabilities(self.logits(grid, t))


class IntegerPredictor(Predictor):
    """The integer step and its exactly specified softmax: the same bits on every CPU."""

    def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
        return self.step.weights(grid[t])[0]


class MixedPredictor(Predictor):
    """The integer step's log-weights mixed with context models that learn the file:
    mixing version 1 (:class:`~sharnn.coding.mixing.AdaptiveMixer`), 2 (its match model
    and APMs, :class:`~sharnn.coding.matching.MatchMixer`) or 3 (context models of bits,
    each bit coded through the coder's binary one: :class:`~sharnn.coding.bitwise.BitMixer`,
    :meth:`code` only), for ``streams`` streams. Without a step (None: input that is not
    text) the model never runs: the mixers take log-weights of 0, a constant that changes
    neither their prediction nor their learning, and the context models code alone.
    ``positions``, the most a stream codes, sizes the match model's buffer and mixing 3's
    table: both directions give the same (:meth:`Arithmetic.predictor`: the longest
    stream's length)."""

    def __init__(self, step, device: torch.device, mixing: int, streams: int, positions: int = 4096):
        super().__init__(step, device)
        if mixing == 1:
            self.mixer = AdaptiveMixer(streams)
        else:
            self.mixer = {2: MatchMixer, 3: BitMixer}[mixing](streams, positions)
        self.model_input = step is not None
        self.flat = np.zeros((streams, 256), dtype=np.int64)

    def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
        if not self.model_input:
            return self.mixer.mix(self.flat)
        return self.mixer.mix(self.step.weights(grid[t])[1])

    def learn(self, coded: np.ndarray) -> None:
        self.mixer.update(coded)

    def code(self, grid: np.ndarray, t: int, running: int, coder: Coder) -> np.ndarray:
        if not isinstance(self.mixer, BitMixer):
            return super().code(grid, t, running, coder)
        weights = self.flat if not self.model_input else self.step.weights(grid[t])[1]
        return self.mixer.code(weights, coder.bits, coder.symbols(t, running))

    def code_rows(self, grid: np.ndarray, start: int, stop: int, running: int, coder: Coder) -> None:
        """Mixing 3 without the model: the positions in one kernel call (no step runs
        between them, and every position's log-weights are 0)."""
        if self.model_input or not isinstance(self.mixer, BitMixer):
            return super().code_rows(grid, start, stop, running, coder)
        rows = coder.symbols(start, running, stop)
        grid[start + 1 : stop + 1, :running] = self.mixer.code_positions(self.flat, coder.bits, rows)


class OnlinePredictor(Predictor):
    """Online mode: ``inner`` (forward or float) predicts; every ``bptt`` positions the
    model takes one optimizer step on the window just coded, and the step is prepared
    again from the new weights."""

    def __init__(self, inner: FloatPredictor, model: LanguageModel, config: TrainConfig):
        super().__init__(inner.step, inner.device)
        self.inner, self.config = inner, config
        self.learner = OnlineLearner(model, config, self.device)

    def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
        bptt = self.config.bptt
        if t > 0 and t % bptt == 0:
            self.learner.learn(torch.from_numpy(grid[t - bptt : t + 1]).to(self.device))
            self.step.refresh()
        return self.inner.predict(grid, t)


@torch.no_grad()
def walk(
    predictor: Predictor,
    lengths: list[int],
    coder: Coder,
    progress: ProgressDisplay | None = None,
) -> np.ndarray:
    """Walk the streams of ``lengths`` bytes in lockstep, one position at a time, for both
    directions: at position ``t`` the predictor codes the bytes of the ``k`` streams still
    running through ``coder`` (encodes them, or decodes them: :meth:`Predictor.code`) and
    learns them. The predictor is given :data:`~sharnn.coding.coders.PROGRESS_EVERY`
    positions at a time (:meth:`Predictor.code_rows`: one call for them where nothing runs
    between positions), and ``progress`` the fraction done after each run.

    Returns:
        ``[max(lengths), B]`` uint8: column ``b`` holds stream ``b`` (zeros past its end).
    """
    rows = max(lengths, default=0)
    grid = np.zeros((rows + 1, len(lengths)), dtype=np.int64)  # row 0: the start byte; row t + 1: byte t
    grid[0] = START_BYTE
    longer = lengths.count(rows)  # the streams one byte longer than the rest, which come first
    full = rows if longer == len(lengths) else rows - 1  # the positions every stream codes
    for start in range(0, full, PROGRESS_EVERY):
        predictor.code_rows(grid, start, min(start + PROGRESS_EVERY, full), len(lengths), coder)
        if progress is not None:
            progress.update(start / rows)
    if full < rows:
        predictor.code_rows(grid, full, rows, longer, coder)
    return grid[1:].astype(np.uint8)


def probabilities(logits: torch.Tensor) -> np.ndarray:
    """Logits ``[B, V]`` -> float64 probabilities ``[B, V]`` for the coder: the same
    deterministic computation on both sides. Raises :class:`CheckpointError` where they
    are not numbers (weights too large for the float step's arithmetic)."""
    probs = torch.softmax(logits.to(torch.float64), dim=-1).cpu().numpy()
    if not np.isfinite(probs).all():
        raise CheckpointError(
            "the model's predictions are not numbers (NaN or infinity): its weights are too large for "
            "this precision's arithmetic (the integer step takes them), or broken; nothing was written"
        )
    return probs


def device_of(model: LanguageModel) -> torch.device:
    """The device ``model``'s parameters are on."""
    return next(model.parameters()).device
