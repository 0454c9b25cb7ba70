"""The coders a walk codes through (:func:`sharnn.coding.arithmetic.walk`), one per
direction: constriction's range coder for a byte's distribution, and mixing 3's binary coder
for its bits (:mod:`sharnn.coding.binary`; docs/compression.md, "How a file is coded").
"""

from __future__ import annotations

from typing import Protocol

import constriction
import numpy as np

from ..progress import ProgressDisplay
from .binary import BinaryDecoder, BinaryEncoder

PROGRESS_EVERY = 256  # positions between progress updates
_FAMILY = constriction.stream.model.Categorical(perfect=False)


class Coder(Protocol):
    """What a walk codes through, either direction: ``code(t, probs [k, 256])`` codes the
    ``k`` bytes of position ``t`` with their distributions (encodes them, or decodes them)
    and returns them ``[k]``; ``bits``, the binary coder of mixing 3; ``symbols(t, k)``,
    the ``k`` bytes to encode at ``t`` (an :class:`Encoder`) or ``k`` (a :class:`Decoder`:
    the bytes are to be decoded), and ``symbols(t, k, stop)`` those of positions ``t ..
    stop - 1``, ``[n, k]`` (or ``(n, k)``)."""

    bits: BinaryEncoder | BinaryDecoder

    def code(self, t: int, probs: np.ndarray) -> np.ndarray: ...

    def symbols(self, t: int, k: int, stop: int | None = None) -> np.ndarray | int | tuple[int, int]: ...


class Encoder:
    """The encoder's :class:`Coder`: the bytes of ``grid [rows, B]`` into constriction's
    range coder, or bit by bit into the binary one; ``progress`` is shown the bits per byte
    so far."""

    def __init__(self, grid: np.ndarray, progress: ProgressDisplay | None = None):
        self.grid, self.progress = grid, progress
        self.range, self.bits = constriction.stream.queue.RangeEncoder(), BinaryEncoder()

    def symbols(self, t: int, k: int, stop: int | None = None) -> np.ndarray:
        self._report(t, self.bits.bits)
        return self.grid[t, :k] if stop is None else self.grid[t:stop, :k]

    def code(self, t: int, probs: np.ndarray) -> np.ndarray:
        symbols = self.grid[t, : len(probs)]
        self.range.encode(symbols.astype(np.int32), _FAMILY, probs)
        self._report(t, self.range.num_bits())
        return symbols

    def _report(self, t: int, bits: int) -> None:
        if self.progress is not None and t % PROGRESS_EVERY == 0:
            self.progress.update(bpc=f"{bits / max(t * self.grid.shape[1], 1):.4f}")

    def payload(self, bitwise: bool) -> bytes:
        """The coded bytes: the binary coder's (``bitwise``), else the range coder's
        32-bit words, little-endian; none for an empty grid."""
        if not self.grid.size:
            return b""
        return self.bits.finish() if bitwise else self.range.get_compressed().astype("<u4").tobytes()


class Decoder:
    """The decoder's :class:`Coder` over a ``payload``: the binary coder's bytes
    (``bitwise``), else the range coder's words."""

    def __init__(self, payload: bytes, bitwise: bool):
        if bitwise:
            self.bits = BinaryDecoder(payload)
        else:
            self.range = constriction.stream.queue.RangeDecoder(np.frombuffer(payload, dtype="<u4").astype(np.uint32))

    def symbols(self, t: int, k: int, stop: int | None = None) -> int | tuple[int, int]:
        return k if stop is None else (stop - t, k)

    def code(self, t: int, probs: np.ndarray) -> np.ndarray:
        return self.range.decode(_FAMILY, probs)
