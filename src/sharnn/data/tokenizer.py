"""Tokenizers: bytes, WikiText words and byte-level BPE wordpieces, behind one interface
(docs/tokenization.md).

Every tokenizer here is exactly invertible on the text it was prepared for: each token id
stands for a fixed byte string (:attr:`Tokenizer.token_bytes`) and decoding concatenates
them. That is what makes a model's total negative log-likelihood a code length for the
text's bytes, whatever the tokenization (paper §6.1), and what :func:`check_round_trip`
checks when a corpus is prepared.

- ``bytes``: token id = byte value, vocabulary 256.
- ``words``: the WikiText protocol of the PyTorch word_language_model example and
  AWD-LSTM: each line split on whitespace, plus one ``<eos>`` per line; vocabulary from
  the train split. WikiText's lines are ``" " + " ".join(words) + " \\n"``, so word ``w``
  stands for the bytes ``" w"`` and ``<eos>`` for ``" \\n"``.
- ``bpe:N``: byte-level BPE (GPT-2's byte alphabet and pre-tokenizer) of ``N`` tokens,
  trained with Hugging Face ``tokenizers`` on the train split, each line encoded alone.

A tokenizer is saved as ``tokenizer.json`` beside a prepared corpus and in every
checkpoint of a run on one (no file means bytes). For ``bpe:N`` the file is Hugging Face's
own format (``tokenizers.Tokenizer.from_file`` reads it); for ``words`` it is
``{"type": "words", "vocab": [...]}``, the id of a word being its index.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..files import write_atomically

TOKENIZER_FILE = "tokenizer.json"
EOS = "<eos>"


class Tokenizer(ABC):
    """What every tokenizer provides. ``name``: ``bytes``, ``words`` or ``bpe:N``;
    ``vocab_size``: the number of token ids; ``token_bytes``: the bytes each id stands for."""

    name: str
    vocab_size: int
    token_bytes: list[bytes]

    @abstractmethod
    def ids(self, data: bytes) -> np.ndarray:
        """Text bytes -> int64 token ids ``[N]``. Raises :class:`DataError` for text this
        tokenizer cannot represent (a word outside the vocabulary; invalid UTF-8 for bpe)."""

    def encode(self, text: str | bytes) -> Tensor:
        """``str`` (UTF-8 encoded) or ``bytes`` -> int64 token ids ``[N]``."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return torch.from_numpy(self.ids(data))

    def decode_bytes(self, ids: Tensor | np.ndarray | list[int]) -> bytes:
        """Token ids ``[N]`` -> the bytes they stand for."""
        values = ids.tolist() if isinstance(ids, (Tensor, np.ndarray)) else ids
        table = self.token_bytes
        return b"".join(table[i] for i in values)

    def decode(self, ids: Tensor | np.ndarray | list[int]) -> str:
        """Token ids ``[N]`` -> text, with U+FFFD for invalid UTF-8 (a byte model's sample
        may stop inside a character)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    @property
    def is_bytes(self) -> bool:
        return self.name == "bytes"

    def byte_lengths(self) -> np.ndarray:
        """int64 ``[vocab_size]``: how many bytes each token id stands for."""
        return np.array([len(b) for b in self.token_bytes], dtype=np.int64)

    def space_counts(self) -> np.ndarray:
        """int64 ``[vocab_size]``: how many space characters each token id stands for
        (in WikiText, one for each word and each ``<eos>``)."""
        return np.array([b.count(b" ") for b in self.token_bytes], dtype=np.int64)

    @abstractmethod
    def to_json(self) -> str | None:
        """The contents of ``tokenizer.json`` (None for bytes: no file)."""


class ByteTokenizer(Tokenizer):
    """Bytes <-> token ids, vocabulary 256: id = byte value."""

    name = "bytes"
    vocab_size = 256
    token_bytes: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)]

    def ids(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode_bytes(self, ids: Tensor | np.ndarray | list[int]) -> bytes:
        values = ids.tolist() if isinstance(ids, (Tensor, np.ndarray)) else ids
        return bytes(values)

    def to_json(self) -> None:
        return None


class WordTokenizer(Tokenizer):
    """WikiText words plus one ``<eos>`` per line (module docstring). ``vocab``: the
    words, the index of each being its id."""

    name = "words"

    def __init__(self, vocab: list[str]):
        self.vocab = list(vocab)
        self.index = {word: i for i, word in enumerate(self.vocab)}
        if len(self.index) != len(self.vocab) or EOS not in self.index:
            raise DataError(f"a words vocabulary needs {EOS} and no repeated word")
        self.vocab_size = len(self.vocab)
        self.token_bytes = [b" \n" if w == EOS else b" " + w.encode("utf-8") for w in self.vocab]

    @classmethod
    def train(cls, data: bytes) -> WordTokenizer:
        """The vocabulary of ``data`` (the train split), in order of first appearance."""
        vocab = dict.fromkeys(word for line in _utf8(data).split("\n") for word in line.split())
        vocab[EOS] = None
        return cls(list(vocab))

    def ids(self, data: bytes) -> np.ndarray:
        """Each line's words, then ``<eos>``; the words of a last line without ``\n``
        (a prompt) get no ``<eos>``."""
        index, eos, out = self.index, self.index[EOS], []
        lines = _utf8(data).split("\n")
        for number, line in enumerate(lines, 1):
            try:
                out.extend(index[word] for word in line.split())
            except KeyError as e:
                raise DataError(
                    f"line {number}: the word {e.args[0]!r} is not in the words vocabulary "
                    f"({self.vocab_size:,} words from the train split)"
                ) from None
            if number < len(lines):
                out.append(eos)
        return np.array(out, dtype=np.int64)

    def to_json(self) -> str:
        return json.dumps({"type": "words", "vocab": self.vocab}, ensure_ascii=False)


class BPETokenizer(Tokenizer):
    """Byte-level BPE through Hugging Face ``tokenizers`` (module docstring)."""

    def __init__(self, hf):
        self.hf = hf
        self.vocab_size = hf.get_vocab_size()
        self.name = f"bpe:{self.vocab_size}"
        decode = {c: b for b, c in _gpt2_byte_alphabet().items()}
        table = [b""] * self.vocab_size
        for piece, i in hf.get_vocab().items():
            table[i] = bytes(decode[c] for c in piece)
        self.token_bytes = table

    @classmethod
    def train(cls, data: bytes, vocab_size: int) -> BPETokenizer:
        """A BPE of at most ``vocab_size`` tokens (the 256 bytes, then merges) trained on
        ``data``; fewer when the text has fewer pairs worth merging."""
        from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        hf.train_from_iterator(_text_lines(data), trainer)
        return cls(hf)

    def ids(self, data: bytes) -> np.ndarray:
        encodings = self.hf.encode_batch(_text_lines(data), add_special_tokens=False)
        return np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64)

    def to_json(self) -> str:
        return self.hf.to_str()


def check_spec(spec: str, words: bool = True) -> None:
    """Refuse, with :class:`DataError`, a tokenizer ``spec`` that is not ``bytes``,
    ``words`` (unless ``words`` is False) or ``bpe:N`` with ``N`` from 257 to 1,048,576:
    checked before any data is read."""
    match = re.fullmatch(r"bpe:([0-9]+)", spec)
    if spec == "bytes" or (words and spec == "words") or (match and 257 <= int(match[1]) <= 1 << 20):
        return
    choices = "bytes, words or bpe:N" if words else "bytes or bpe:N"
    raise DataError(f"unknown tokenizer {spec!r}: choose {choices} (N from 257 to 1,048,576, e.g. bpe:8000)")


def make_tokenizer(spec: str, train: bytes) -> Tokenizer:
    """The tokenizer ``spec`` (``bytes``, ``words`` or ``bpe:N``), trained on ``train``.
    ``bpe:N`` may make fewer than ``N`` ids (:meth:`BPETokenizer.train`); its name is then
    ``bpe:`` and the number made. Raises :class:`DataError` for an unknown spec."""
    check_spec(spec)
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "words":
        return WordTokenizer.train(train)
    return BPETokenizer.train(train, int(spec[len("bpe:") :]))


def check_round_trip(tokenizer: Tokenizer, data: bytes, ids: np.ndarray, what: str) -> None:
    """Raise :class:`DataError` unless ``ids`` decode to exactly ``data``, naming the first
    byte that differs."""
    decoded = tokenizer.decode_bytes(ids)
    if decoded == data:
        return
    at = next((i for i, (a, b) in enumerate(zip(decoded, data)) if a != b), min(len(decoded), len(data)))
    raise DataError(
        f"{what}: the {tokenizer.name} tokenizer does not give back the text exactly (first "
        f"difference at byte {at:,} of {len(data):,}); this corpus cannot be prepared with it"
    )


def check_vocabulary(vocab_size: int, tokenizer: Tokenizer, where: str) -> None:
    """Raise :class:`DataError` unless a model of ``vocab_size`` token ids fits
    ``tokenizer`` (the one found in the folder ``where``)."""
    if vocab_size != tokenizer.vocab_size:
        found = "no tokenizer.json, so bytes" if tokenizer.name == "bytes" else f"tokenizer.json: {tokenizer.name}"
        raise DataError(
            f"{where}: the model has {vocab_size:,} token ids but its tokenizer ({found}) has "
            f"{tokenizer.vocab_size:,}; put the tokenizer.json of its run beside it"
        )


def check_corpus_tokenizer(vocab_size: int, corpus: Tokenizer, data: str, model: Tokenizer | None = None) -> None:
    """Refuse, with :class:`DataError`, a corpus (``data``, tokenized with ``corpus``) that
    a model of ``vocab_size`` token ids cannot be trained or scored on: one of another
    number of ids (bytes being 256) or, when the model's own tokenizer ``model`` is known
    (a trained model), one whose ids stand for other bytes than the model's."""
    if vocab_size != corpus.vocab_size:
        if model is None:  # a new model: its vocabulary is a setting
            wanted = "a bytes corpus" if vocab_size == 256 else f"a corpus of {vocab_size:,} token ids"
            fix = f"set model.vocab_size={corpus.vocab_size} or give {wanted}"
        else:
            fix = f"give a corpus tokenized with the model's own tokenizer ({model.name})"
        raise DataError(
            f"the model has {vocab_size:,} token ids but data={data} is {corpus.name} ({corpus.vocab_size:,}); {fix}"
        )
    if model is not None and model.token_bytes != corpus.token_bytes:
        raise DataError(
            f"data={data} is tokenized with {corpus.name}, not with the model's tokenizer ({model.name}): "
            f"give the model's own corpus, or prepare one with its tokenizer"
        )


def save_tokenizer(tokenizer: Tokenizer, folder: str | Path) -> None:
    """Write ``folder/tokenizer.json`` atomically (nothing for bytes)."""
    text = tokenizer.to_json()
    if text is not None:
        write_atomically(Path(folder) / TOKENIZER_FILE, text)


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer a ``tokenizer.json`` holds. Raises :class:`DataError` if it holds none."""
    try:
        loaded = json.loads(text)
        if loaded.get("type") == "words":
            return WordTokenizer(loaded["vocab"])
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    except DataError:
        raise
    except Exception as e:  # JSON, key and tokenizers errors: the file is not one we wrote
        raise DataError(f"not a sharnn tokenizer ({type(e).__name__}: {str(e)[:120]})") from None


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer saved in ``folder`` (a prepared corpus, a checkpoint or an exported
    model): its ``tokenizer.json``, or bytes when there is none.

    Raises:
        DataError: an unreadable or invalid ``tokenizer.json``.
    """
    file = Path(folder) / TOKENIZER_FILE
    if not file.is_file():
        return ByteTokenizer()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {file}: {e}") from None
    try:
        return tokenizer_from_json(text)
    except DataError as e:
        raise DataError(f"{file}: {e}") from None


def _text_lines(data: bytes) -> list[str]:
    """The text cut after each ``\\n`` (the newlines kept), for encoding line by line."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", _utf8(data))


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"the text is not UTF-8 (byte {e.start:,}); words and bpe need UTF-8 text") from None


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters, which byte-level BPE
    pieces are spelled in (Radford et al. 2019, ``bytes_to_unicode`` in its encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
