"""Where a model's bits fall within words, and what converting perplexities between
tokenizations hides (paper §6.1; docs/tokenization.md).

The paper argues that perplexities of different tokenizations are not comparable: a byte
model's bits per byte turned into a word perplexity with ``ppl = 2^(BPC * Nc / Nw)``
hides that the entropy sits on a word's first characters, teacher forcing handing the
model the rest. Here a model scores a split with the evaluation protocol of
:mod:`sharnn.evaluation`, keeping every token's surprisal and predictive entropy, and:

- a byte model's bits are binned by the position of their character in its word (words:
  maximal runs of non-whitespace characters, whitespace being ASCII's, as ``bytes.split``;
  a UTF-8 character's continuation bytes count with their character), and by the word's
  frequency in the train split; the naive conversion is set beside the exact word
  perplexity the same bits imply;
- a wordpiece (``bpe:N``) model's bits are grouped into words (a word starts at a piece
  whose bytes start with a space, or after a piece ending in a newline) and binned by the
  number of pieces;
- a words model gets its totals (each word is one token).

Counts over "the predicted text" count what begins at a predicted position: the first
token of each stream and the tail the streams drop are not predicted. A character or word
with an unpredicted byte or piece (at most one per stream) is left out of the per-position,
per-frequency and per-pieces tables.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .data.tokenizer import Tokenizer
from .errors import DataError
from .evaluation import score_windows
from .models.sharnn import SHARNN
from .progress import ProgressDisplay

LN2 = math.log(2)
WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)  # what bytes.split() splits on
MAX_POSITION = 8  # positions 8 and later share one row, "8+"
POSITION_LABELS = [str(p) for p in range(1, MAX_POSITION)] + [f"{MAX_POSITION}+", "whitespace"]
FREQUENCY_LABELS = ["1-9 (incl. unseen)", "10-99", "100-999", "1,000-9,999", "10,000+"]
PIECE_LABELS = ["1", "2", "3", "4+"]
NC_COUNTINGS = [  # the counts of characters Nc the naive conversion may use: (key of text_counts, name)
    ("bytes", "bytes"),
    ("characters", "characters (with whitespace)"),
    ("nonspace", "non-whitespace characters"),
]


# ----------------------------------------------------------------------------- scoring


@torch.no_grad()
def token_scores(
    model: SHARNN,
    data: np.ndarray,
    streams: int,
    bptt: int,
    autocast_dtype: torch.dtype | None = None,
    progress: ProgressDisplay | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every predicted token's surprisal and the entropy of the distribution it was drawn
    against, walking the split exactly as :func:`sharnn.evaluation.evaluate` does (``streams``
    streams, windows of ``bptt``, state and attention memory carried, cold start), so that
    ``nansum(surprisal) * ln 2`` is its total negative log-likelihood.

    Args:
        model: the model; it is put in eval mode and returned to its previous mode.
        data: token ids ``[N]``.
        streams, bptt, autocast_dtype, progress: as :func:`sharnn.evaluation.evaluate`.

    Returns:
        ``(surprisal, entropy)``, float64 ``[N]`` in bits, aligned with ``data``; NaN where
        no prediction is made (the first token of each stream, the last ``N mod streams``).

    Raises:
        DataError: if the split has fewer than 2 tokens per stream.
        ConfigError: a window longer than the model's attention span (from the model).
    """
    rows = len(data) // streams
    surprisal = np.full((streams, rows), np.nan)  # [B, rows]: stream b holds data[b*rows : (b+1)*rows]
    entropy = np.full((streams, rows), np.nan)

    def keep(row: int, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logp = F.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        predicted = slice(row + 1, row + 1 + len(targets))
        surprisal[:, predicted] = nll.t().double().cpu().numpy() / LN2
        entropy[:, predicted] = torch.special.entr(logp.exp()).sum(-1).t().double().cpu().numpy() / LN2

    score_windows(model, data, streams, bptt, keep, autocast_dtype, progress)
    return _pad(surprisal.reshape(-1), len(data)), _pad(entropy.reshape(-1), len(data))


def _pad(values: np.ndarray, length: int) -> np.ndarray:
    """``values`` followed by NaN up to ``length``."""
    return np.concatenate([values, np.full(length - len(values), np.nan)])


# ----------------------------------------------------------------------------- byte models


@dataclass
class ByteLabels:
    """The characters and words of a text of ``N`` bytes holding ``C`` characters.

    Attributes:
        character: int64 ``[N]``, the character each byte belongs to.
        start: int64 ``[C]``, each character's first byte.
        position: int64 ``[C]``, each character's position in its word (1, 2, ...); 0 for
            whitespace.
        word: int64 ``[C]``, each character's word (0, 1, ..., the words of
            ``text.split()``); -1 for whitespace.
    """

    character: np.ndarray
    start: np.ndarray
    position: np.ndarray
    word: np.ndarray


def label_bytes(text: bytes) -> ByteLabels:
    """Group a text's bytes into characters (a UTF-8 continuation byte, 0x80-0xBF, joins the
    character before it) and its characters into words: maximal runs of non-whitespace
    characters, whitespace being ASCII's (space, tab, newline, CR, VT, FF), as ``bytes.split``."""
    raw = np.frombuffer(text, dtype=np.uint8)
    is_start = (raw < 0x80) | (raw >= 0xC0)
    is_start[1:] |= raw[:-1] < 0x80  # a stray continuation byte after ASCII is a character of its own
    is_start[:1] = True
    start = np.flatnonzero(is_start)
    space = np.isin(raw[start], WHITESPACE)
    after_space = np.ones(len(start), dtype=bool)
    after_space[1:] = space[:-1]
    word_start = ~space & after_space
    index = np.arange(len(start))
    latest_start = np.maximum.accumulate(np.where(word_start, index, -1)) if len(start) else index
    position = np.where(space, 0, index - latest_start + 1)
    word = np.where(space, -1, np.cumsum(word_start) - 1)
    return ByteLabels(np.cumsum(is_start) - 1, start, position, word)


def per_character(values: np.ndarray, labels: ByteLabels) -> np.ndarray:
    """float64 ``[C]``: the sum of ``values`` ``[N]`` over each character's bytes (NaN if
    any of them is NaN)."""
    return np.bincount(labels.character, weights=values, minlength=len(labels.start))


def position_table(surprisal: np.ndarray, entropy: np.ndarray, labels: ByteLabels) -> list[dict]:
    """Bits by character position in the word: one row per position 1..7, ``8+`` and
    ``whitespace``, each with ``characters`` (count), ``surprisal`` and ``entropy`` (mean
    bits per character; a character's entropy is the sum of its bytes') and ``share`` (of
    all the counted characters' bits). Inputs: bits ``[N]``, NaN where not predicted."""
    bits, spread = per_character(surprisal, labels), per_character(entropy, labels)
    counted = ~np.isnan(bits) & ~np.isnan(spread)
    bins = np.where(labels.position == 0, len(POSITION_LABELS) - 1, np.minimum(labels.position, MAX_POSITION) - 1)[
        counted
    ]
    count = np.bincount(bins, minlength=len(POSITION_LABELS))
    bits_sum = np.bincount(bins, weights=bits[counted], minlength=len(POSITION_LABELS))
    spread_sum = np.bincount(bins, weights=spread[counted], minlength=len(POSITION_LABELS))
    total = bits_sum.sum()
    return [
        {
            "position": label,
            "characters": int(n),
            "surprisal": _mean(b, n),
            "entropy": _mean(e, n),
            "share": _mean(b, total),
        }
        for label, n, b, e in zip(POSITION_LABELS, count, bits_sum, spread_sum)
    ]


def word_counts(train: bytes, words: set[bytes] | None = None) -> Counter:
    """How often each whitespace-separated word occurs in ``train`` (only those in
    ``words``, when given)."""
    found = (m.group() for m in re.finditer(rb"[^ \t\n\r\x0b\x0c]+", train))
    return Counter(found if words is None else (w for w in found if w in words))


def frequency_table(surprisal: np.ndarray, text: bytes, labels: ByteLabels, train_counts: Counter) -> list[dict]:
    """Bits per word by the word's count in the train split: one row per bin of
    :data:`FREQUENCY_LABELS` (unseen words in the first), each with ``words``, ``characters``
    (mean per word), ``bits_per_word`` (mean) and ``first_share`` (mean over the words of
    the share of a word's bits on its first character). Words with an unpredicted byte are
    left out. ``surprisal``: bits ``[N]``."""
    bits = per_character(surprisal, labels)
    in_word = labels.word >= 0
    words, n_words = labels.word[in_word], int(labels.word.max(initial=-1)) + 1
    word_bits = np.bincount(words, weights=bits[in_word], minlength=n_words)
    first_bits = np.bincount(
        words, weights=np.where(labels.position[in_word] == 1, bits[in_word], 0.0), minlength=n_words
    )
    lengths = np.bincount(words, minlength=n_words)
    counts = np.array([train_counts.get(w, 0) for w in text.split()], dtype=np.int64)
    bins = np.clip(np.floor(np.log10(np.maximum(counts, 1))).astype(np.int64), 0, len(FREQUENCY_LABELS) - 1)
    counted = ~np.isnan(word_bits)
    rows = []
    for k, label in enumerate(FREQUENCY_LABELS):
        chosen = counted & (bins == k)
        n = int(chosen.sum())
        share = first_bits[chosen] / word_bits[chosen] if n else np.zeros(0)
        rows.append(
            {
                "frequency": label,
                "words": n,
                "characters": _mean(lengths[chosen].sum(), n),
                "bits_per_word": _mean(word_bits[chosen].sum(), n),
                "first_share": _mean(share.sum(), n),
            }
        )
    return rows


def text_counts(text: bytes, surprisal: np.ndarray, labels: ByteLabels) -> dict[str, int]:
    """What begins at a predicted byte (``surprisal`` ``[N]`` not NaN): ``bytes``,
    ``characters`` (whitespace included), ``nonspace`` (non-whitespace characters),
    ``words`` and ``lines`` (newline bytes)."""
    predicted = ~np.isnan(surprisal)
    at_start = predicted[labels.start]
    newline = np.frombuffer(text, dtype=np.uint8) == ord("\n")
    return {
        "bytes": int(predicted.sum()),
        "characters": int(at_start.sum()),
        "nonspace": int((at_start & (labels.position > 0)).sum()),
        "words": int((at_start & (labels.position == 1)).sum()),
        "lines": int((predicted & newline).sum()),
    }


def naive_conversion(total_bits: float, counts: dict[str, int]) -> list[dict]:
    """The paper's conversion of bits per byte to a word perplexity (paper §6.1),
    ``2^(BPC * Nc / Nw)`` with ``BPC = total_bits / bytes`` and ``Nw = words + lines`` (one
    ``<eos>`` per line, as WikiText counts), for ``Nc`` = bytes, characters and
    non-whitespace characters, then the exact figure the same bits imply,
    ``2^(total_bits / Nw)``. ``counts``: as :func:`text_counts`.

    Returns:
        rows of ``nc`` (the counting), ``count`` (``Nc``), ``per_word`` (``Nc / Nw``),
        ``perplexity`` and ``vs_exact`` (the ratio to the exact perplexity). With ``Nc`` =
        bytes the conversion is the exact figure by construction.

    Raises:
        DataError: no predicted byte or no word.
    """
    n_words = counts["words"] + counts["lines"]
    if counts["bytes"] == 0 or n_words == 0:
        raise DataError("no predicted word to compute a word perplexity over")
    bpc = total_bits / counts["bytes"]
    exact = _power2(total_bits / n_words)
    rows = []
    for key, name in NC_COUNTINGS:
        perplexity = _power2(bpc * counts[key] / n_words)
        rows.append(
            {
                "nc": name,
                "count": counts[key],
                "per_word": counts[key] / n_words,
                "perplexity": perplexity,
                "vs_exact": perplexity / exact,
            }
        )
    rows.append(
        {"nc": "exact: 2^(total bits / Nw)", "count": None, "per_word": None, "perplexity": exact, "vs_exact": 1.0}
    )
    return rows


def byte_report(text: bytes, surprisal: np.ndarray, entropy: np.ndarray, train_counts: Counter) -> dict:
    """The byte model's sections of the report: ``totals``, ``positions``
    (:func:`position_table`), ``first_character_share`` (of all the counted characters'
    bits), ``frequency`` (:func:`frequency_table`), ``counts`` (:func:`text_counts`) and
    ``conversion`` (:func:`naive_conversion`). Inputs: bits ``[N]``."""
    labels = label_bytes(text)
    positions = position_table(surprisal, entropy, labels)
    counts = text_counts(text, surprisal, labels)
    bits = float(np.nansum(surprisal))
    return {
        "totals": _totals(bits, counts["bytes"], counts["bytes"], counts["words"] + counts["lines"]),
        "positions": positions,
        "first_character_share": positions[0]["share"],
        "frequency": frequency_table(surprisal, text, labels, train_counts),
        "counts": counts,
        "conversion": naive_conversion(bits, counts),
    }


# ----------------------------------------------------------------------------- wordpiece and word models


def piece_words(token_bytes: list[bytes], ids: np.ndarray) -> np.ndarray:
    """int64 ``[N]``: the word each piece of ``ids`` ``[N]`` belongs to (0, 1, ...). A word
    starts at the first piece, at a piece whose bytes start with a space, and after a piece
    ending in a newline (so WikiText's ``" \\n"``, its ``<eos>``, is a word of its own)."""
    opens = np.array([b[:1] == b" " for b in token_bytes], dtype=bool)
    closes = np.array([b[-1:] == b"\n" for b in token_bytes], dtype=bool)
    ids = np.asarray(ids, dtype=np.int64)
    starts = opens[ids]
    starts[1:] |= closes[ids[:-1]]
    starts[:1] = True
    return np.cumsum(starts) - 1


def piece_table(surprisal: np.ndarray, words: np.ndarray) -> tuple[list[dict], float]:
    """Bits per word by its number of pieces (rows 1, 2, 3, 4+), each with ``words``,
    ``bits_per_word`` (mean), ``first_share`` (mean over the words of the share of a word's
    bits on its first piece) and ``share`` (of all the counted words' bits); and the share
    of all the counted words' bits on first pieces. Words with an unpredicted piece are
    left out. Inputs ``[N]``: bits, and the words of :func:`piece_words`."""
    n_words = int(words.max(initial=-1)) + 1
    word_bits = np.bincount(words, weights=surprisal, minlength=n_words)
    first = np.flatnonzero(np.diff(words, prepend=-1))
    first_bits = surprisal[first]
    pieces = np.bincount(words, minlength=n_words)
    counted = ~np.isnan(word_bits)
    total = word_bits[counted].sum()
    rows = []
    for k, label in enumerate(PIECE_LABELS, 1):
        chosen = counted & ((pieces == k) if k < len(PIECE_LABELS) else (pieces >= k))
        n = int(chosen.sum())
        rows.append(
            {
                "pieces": label,
                "words": n,
                "bits_per_word": _mean(word_bits[chosen].sum(), n),
                "first_share": _mean((first_bits[chosen] / word_bits[chosen]).sum(), n),
                "share": _mean(word_bits[chosen].sum(), total),
            }
        )
    return rows, _mean(first_bits[counted].sum(), total)


def piece_report(tokenizer: Tokenizer, ids: np.ndarray, surprisal: np.ndarray) -> dict:
    """A wordpiece model's sections of the report: ``totals``, ``pieces`` and
    ``first_piece_share`` (:func:`piece_table`). Inputs ``[N]``: token ids and bits."""
    words = piece_words(tokenizer.token_bytes, ids)
    rows, first_share = piece_table(surprisal, words)
    predicted = ~np.isnan(surprisal)
    first = np.flatnonzero(np.diff(words, prepend=-1))
    n_bytes = int(tokenizer.byte_lengths()[np.asarray(ids, dtype=np.int64)][predicted].sum())
    totals = _totals(float(np.nansum(surprisal)), int(predicted.sum()), n_bytes, int(predicted[first].sum()))
    return {"totals": totals, "pieces": rows, "first_piece_share": first_share}


def word_report(tokenizer: Tokenizer, ids: np.ndarray, surprisal: np.ndarray) -> dict:
    """A words model's ``totals``: each token is a word (or a line's ``<eos>``)."""
    predicted = ~np.isnan(surprisal)
    n_bytes = int(tokenizer.byte_lengths()[np.asarray(ids, dtype=np.int64)][predicted].sum())
    n_tokens = int(predicted.sum())
    return {"totals": _totals(float(np.nansum(surprisal)), n_tokens, n_bytes, n_tokens)}


def _totals(bits: float, tokens: int, n_bytes: int, words: int) -> dict:
    """Totals over the predicted text: bits per token, per byte and per word (words with
    one ``<eos>`` per line), and the word perplexity ``2^(bits per word)``."""
    return {
        "bits": bits,
        "tokens": tokens,
        "bytes": n_bytes,
        "words": words,
        "bits_per_token": _mean(bits, tokens),
        "bits_per_byte": _mean(bits, n_bytes),
        "bits_per_word": _mean(bits, words),
        "word_perplexity": _power2(_mean(bits, words)),
    }


# ----------------------------------------------------------------------------- the whole analysis


def kind(tokenizer: Tokenizer) -> str:
    """``bytes``, ``bpe`` or ``words``: which analysis a tokenizer gets. Raises
    :class:`DataError` for any other."""
    name = tokenizer.name.split(":")[0]
    if name not in ("bytes", "bpe", "words"):
        raise DataError(f"no tokenization analysis for the {tokenizer.name!r} tokenizer (bytes, words or bpe:N)")
    return name


def analyze(
    model: SHARNN,
    tokenizer: Tokenizer,
    data: np.ndarray,
    streams: int,
    bptt: int,
    train: np.ndarray | None = None,
    autocast_dtype: torch.dtype | None = None,
    progress: ProgressDisplay | None = None,
) -> dict:
    """Score ``data`` with :func:`token_scores` and report where the bits go (module
    docstring; paper §6.1).

    Args:
        model, streams, bptt, autocast_dtype, progress: as :func:`token_scores`.
        tokenizer: the model's tokenizer, which made ``data``.
        data: token ids ``[N]``.
        train: the train split's token ids (bytes models: word frequencies; None: every
            word counts as unseen).

    Returns:
        a JSON-serialisable dict: ``tokenizer``, ``kind``, ``tokens``, ``streams``,
        ``bptt``, then the sections of :func:`byte_report`, :func:`piece_report` or
        :func:`word_report`.

    Raises:
        DataError: a tokenizer with no analysis; a split too small for ``streams``.
    """
    what = kind(tokenizer)
    surprisal, entropy = token_scores(model, data, streams, bptt, autocast_dtype, progress)
    report = {"tokenizer": tokenizer.name, "kind": what, "tokens": len(data), "streams": streams, "bptt": bptt}
    if what == "bytes":
        text = bytes(np.asarray(data, dtype=np.uint8))
        counts = (
            word_counts(bytes(np.asarray(train, dtype=np.uint8)), set(text.split())) if train is not None else Counter()
        )
        report.update(byte_report(text, surprisal, entropy, counts))
    elif what == "bpe":
        report.update(piece_report(tokenizer, data, surprisal))
    else:
        report.update(word_report(tokenizer, data, surprisal))
    return report


def _mean(total: float, count: float) -> float | None:
    """``total / count``, None when ``count`` is 0."""
    return float(total) / float(count) if count else None


def _power2(exponent: float | None) -> float | None:
    """``2 ** exponent``, ``inf`` where that overflows a float."""
    if exponent is None:
        return None
    try:
        return 2.0**exponent
    except OverflowError:
        return math.inf
