"""The binary arithmetic coder of mixing version 3: each byte as its 8 bits, each bit coded
with the probability the mixing gives it (docs/compression.md, "Coding bits").

A carry-less range coder over 32 bits. The state is an interval ``[low, high]`` of 32-bit
integers; a bit whose probability of a 1 is ``p`` (units of 2**-16, 1 .. 65535) splits it
at ``mid = low + floor((high - low) p / 2**16)``, computed in two halves so that nothing
overflows: a 1 keeps ``[low, mid]``, a 0 ``[mid + 1, high]``. Where ``low`` and ``high``
share their top byte, that byte is settled: it is written, and both shift left by 8
(``high`` filling with ones). At the end, ``low``'s top byte is written; the decoder reads
ones past the end, so its value lies in the last interval. Integers only: the same bits on
every machine.

A bit costs ``-log2`` of its probability, plus what the 32 bits' rounding loses (measured:
under 0.01% of a file; docs/compression.md).

The coders' state lives in numpy arrays that the kernels of :mod:`sharnn.coding.bitwise`
take: ``state [4]`` int64 (:data:`LOW`, :data:`HIGH`, :data:`CODE`: the decoder's value,
:data:`AT`: the next byte's place) and ``buffer`` uint8.
"""

from __future__ import annotations

import numpy as np

from ..compiled import inline

PRECISION = 16  # a bit's probability in units of 2**-PRECISION, 1 .. 2**PRECISION - 1
LOW, HIGH, CODE, AT = 0, 1, 2, 3  # the places of the state
_WORD = 0xFFFFFFFF
_TOP = 0xFF000000
_SPARE = 4  # bytes the decoder may read past the end: the 4 of its first value, less the 1 of the end


@inline
def _middle(state, p):
    """Where a bit of probability ``p`` (2**-16) of a 1 splits ``state``'s interval."""
    width = state[HIGH] - state[LOW]
    return state[LOW] + (width >> PRECISION) * p + (((width & 0xFFFF) * p) >> PRECISION)


@inline
def encode_bit(state, buffer, bit, p):
    """Write ``bit`` (0 or 1) of probability ``p`` of a 1 (2**-16, 1 .. 65535) into
    ``buffer`` at ``state[AT]`` (which has room: :meth:`BinaryEncoder.reserve`)."""
    middle = _middle(state, p)
    if bit:
        state[HIGH] = middle
    else:
        state[LOW] = middle + 1
    while ((state[LOW] ^ state[HIGH]) & _TOP) == 0:
        buffer[state[AT]] = state[HIGH] >> 24
        state[AT] += 1
        state[LOW] = (state[LOW] << 8) & _WORD
        state[HIGH] = ((state[HIGH] << 8) & _WORD) | 255


@inline
def _next_byte(state, buffer):
    """The next byte of ``buffer`` (255 past its end).

    Raises:
        ValueError: more than the coder's end was read: the bits differ from the encoder's.
    """
    at = state[AT]
    state[AT] += 1
    if at < len(buffer):
        return np.int64(buffer[at])
    if at >= len(buffer) + _SPARE:
        raise ValueError("out of data: the bits decoded are not those encoded")
    return np.int64(255)


@inline
def decode_bit(state, buffer, p):
    """The next bit (0 or 1) of ``buffer``, coded with probability ``p`` of a 1 (2**-16)."""
    middle = _middle(state, p)
    bit = 1 if state[CODE] <= middle else 0
    if bit:
        state[HIGH] = middle
    else:
        state[LOW] = middle + 1
    while ((state[LOW] ^ state[HIGH]) & _TOP) == 0:
        state[LOW] = (state[LOW] << 8) & _WORD
        state[HIGH] = ((state[HIGH] << 8) & _WORD) | 255
        state[CODE] = ((state[CODE] << 8) & _WORD) | _next_byte(state, buffer)
    return bit


class BinaryEncoder:
    """Bits into bytes: the kernels call :func:`encode_bit` on :attr:`state` and :attr:`buffer`."""

    def __init__(self):
        self.state = np.array([0, _WORD, 0, 0], dtype=np.int64)
        self.buffer = np.zeros(1 << 16, dtype=np.uint8)

    def reserve(self, bits: int) -> None:
        """Room in :attr:`buffer` for ``bits`` more bits (at most 4 bytes each)."""
        needed = int(self.state[AT]) + 4 * bits + 1
        if needed > len(self.buffer):
            self.buffer = np.concatenate([self.buffer, np.zeros(max(needed, 2 * len(self.buffer)), np.uint8)])

    @property
    def bits(self) -> int:
        """The bits written so far."""
        return 8 * int(self.state[AT])

    def finish(self) -> bytes:
        """The coded bytes, ended (the encoder is done)."""
        self.reserve(0)
        self.buffer[self.state[AT]] = self.state[LOW] >> 24
        return self.buffer[: self.state[AT] + 1].tobytes()


class BinaryDecoder:
    """Bytes back into bits: the kernels call :func:`decode_bit` on :attr:`state` and :attr:`buffer`."""

    def __init__(self, payload: bytes):
        self.buffer = np.frombuffer(payload, dtype=np.uint8).copy()  # the kernels take a writable array
        self.state = np.array([0, _WORD, 0, 0], dtype=np.int64)
        for at in range(4):
            self.state[CODE] = (self.state[CODE] << 8) | (int(self.buffer[at]) if at < len(self.buffer) else 255)
        self.state[AT] = 4
