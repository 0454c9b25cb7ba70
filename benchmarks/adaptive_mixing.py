"""What each part of the adaptive stage gives, in bits per byte (docs/compression.md,
"Adapting to the file").

For each file: the integer step's logits of every position (the shipped model or
``--model``; the file cut into streams as ``sharnn compress`` cuts it and walked as it walks
it, one thread), computed once; then the ideal code length (the sum of ``-log2 p``, no coder, no header) under

- ``model alone``: the integer step's distribution (``--no-adapt``);
- ``one mixer, model start``: context models and one mixer (weight sets by the contexts
  seen), every weight starting at zero but the model's at one;
- ``two mixers, model start``: and the second mixer (weight sets by the previous byte);
- ``mixing 1``: and the starting weights of :mod:`sharnn.coding.mixing` (mixing version 1);
- ``+ match``, ``+ APMs``, ``+ contexts``: mixing version 2 (:mod:`sharnn.coding.matching`)
  with one of its parts alone (its ``PARTS``), ``+ match, APMs`` with two, ``mixing 2``
  with all three;
- ``mixing 3``: version 2 refined bit by bit (:mod:`sharnn.coding.bitwise`);

beside PPMd (``pyppmd``, order 8, 16 MiB) on the same bytes. Each file is coded as ``sharnn
compress`` codes it: its CRLF line ends folded, and input that is not text (``binary``)
without the model. Besides the enwik8 head, WikiText-2 and the Canterbury texts, the files
of ``benchmarks/data/other``: ``json``, ``log`` and ``binary``. The variants change the
module's constants for their run alone (a measurement, not a mode of the package).

    python benchmarks/adaptive_mixing.py                         # alice29, the shipped model
    python benchmarks/adaptive_mixing.py --files alice29 lcet10 enwik8-head-test --markdown ablation.md
    python benchmarks/adaptive_mixing.py --files lcet10 --cache logits/   # the model's logits kept for a rerun
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from common import missing_extra, print_table, write_json
from compressors import CANTERBURY, WIKITEXT, read_file
from sharnn.coding import bitwise, matching, mixing
from sharnn.coding.arithmetic import IntegerPredictor, MixedPredictor, Predictor, walk
from sharnn.coding.binary import BinaryEncoder
from sharnn.coding.bitwise import BitMixer
from sharnn.coding.codec import default_streams, fold_line_ends, looks_binary, stream_lengths
from sharnn.loading import load_model
from sharnn.models.inference import inference_step
from sharnn.models.integer_step import IntegerStep
from sharnn.models.shipped import DEFAULT_MODEL

try:
    import pyppmd
except ModuleNotFoundError as e:  # not a dependency of sharnn itself: the extra "bench" installs it
    missing_extra(e, __name__)

CPU = torch.device("cpu")
OTHER = {"json": "span1024-results.json", "log": "pytest.log", "binary": "matching-mix.o"}  # benchmarks/data/other
FILES = ("enwik8-head-test", "wikitext2-test", *CANTERBURY, *OTHER)
UNIT = mixing.WEIGHT_UNIT
VARIANTS = {  # name: the mixing version and the module constants it changes
    "one mixer, model start": (1, {"SELECTORS": mixing.SELECTORS[:1], "MODEL_PRIOR": UNIT, "COUNT_PRIOR": 0}),
    "two mixers, model start": (1, {"MODEL_PRIOR": UNIT, "COUNT_PRIOR": 0}),
    "mixing 1": (1, {}),
    "+ match": (2, {"PARTS": (1, 0, 0)}),
    "+ APMs": (2, {"PARTS": (0, 1, 0)}),
    "+ contexts": (2, {"PARTS": (0, 0, 1)}),
    "+ match, APMs": (2, {"PARTS": (1, 1, 0)}),
    "mixing 2": (2, {}),
    "mixing 3": (3, {}),
    **{f"mixing 3, {k} slots a byte": (3, {"SLOTS_PER_BYTE": k}) for k in (8, 16, 24)},
    "mixing 3, the whole table": (3, {"SLOTS_PER_BYTE": bitwise.SLOTS}),  # 552 MiB whatever the input
}


class Replay:
    """A step that gives back logits recorded from another walk, one position per call,
    as the integer step's :meth:`~sharnn.models.integer_step.IntegerStep.weights` of them
    (the mixers take the log weights)."""

    def __init__(self, logits: list[torch.Tensor], streams: int):
        self.logits, self.streams, self.position = logits, streams, 0

    def weights(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.position += 1
        logits = self.logits[self.position - 1]
        return IntegerStep.probabilities(logits), IntegerStep.log_weights(logits)


def ideal_bits(predictor: Predictor, data: bytes) -> float:
    """The sum of ``-log2 p`` of every byte of ``data`` under ``predictor`` (of every bit
    under mixing 3's, which codes bits), walked as ``sharnn compress`` walks it
    (:func:`sharnn.coding.arithmetic.walk`), no coder."""
    lengths = stream_lengths(len(data), default_streams(len(data)))
    grid, starts = np.zeros((max(lengths), len(lengths)), dtype=np.int64), np.cumsum([0, *lengths])
    for b, n in enumerate(lengths):
        grid[:n, b] = np.frombuffer(data[starts[b] : starts[b] + n], dtype=np.uint8)
    coder = IdealCoder(grid)
    walk(Costed(predictor), lengths, coder)
    return coder.spent


class IdealCoder:
    """A walk's encoder (:class:`sharnn.coding.arithmetic.Coder`) that writes nothing and
    adds up what each byte costs (:attr:`spent`, bits); mixing 3's bits go into a
    :class:`~sharnn.coding.binary.BinaryEncoder` and are costed by :class:`Costed`."""

    def __init__(self, grid: np.ndarray):
        self.grid, self.spent, self.bits = grid, 0.0, BinaryEncoder()

    def symbols(self, t: int, k: int) -> np.ndarray:
        return self.grid[t, :k]

    def code(self, t: int, probs: np.ndarray) -> np.ndarray:
        symbols = self.grid[t, : len(probs)]
        self.spent -= np.log2(probs[np.arange(len(probs)), symbols]).sum()
        return symbols


class Costed:
    """``predictor``, with the probabilities of mixing 3's coded bits added to the coder's
    cost, a position at a time (a predictor's own loop, never a run of positions in one call)."""

    code_rows = Predictor.code_rows

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def code(self, grid: np.ndarray, t: int, running: int, coder: IdealCoder) -> np.ndarray:
        coded = self.predictor.code(grid, t, running, coder)
        mixer = getattr(self.predictor, "mixer", None)
        if isinstance(mixer, BitMixer):
            coder.spent -= np.log2(mixer.coded_probabilities[:running] / 65536).sum()
        return coded


def model_alone(model, data: bytes) -> tuple[float, list[torch.Tensor], int]:
    """The integer step alone (``--no-adapt``): its ideal bits, and its logits at every position."""
    streams = default_streams(len(data))
    recorded = []

    class Recording(IntegerPredictor):
        def predict(self, grid: np.ndarray, t: int) -> np.ndarray:
            recorded.append(self.logits(grid, t))
            return self.step.probabilities(recorded[-1])

    rows = -(-len(data) // streams)
    bits = ideal_bits(Recording(inference_step(model, streams, rows, "integer"), CPU), data)
    return bits, recorded, streams


def cached_model_alone(model, data: bytes, cache: Path | None) -> tuple[float, list[torch.Tensor], int]:
    """:func:`model_alone`, its results kept in the file ``cache`` (when given) and read
    from it when there: ``{"logits": [positions, B, 256], "streams": B, "alone": bits per byte}``."""
    if cache is not None and cache.is_file():
        saved = torch.load(cache, weights_only=False)
        return saved["alone"] * len(data), list(saved["logits"]), saved["streams"]
    bits, logits, streams = model_alone(model, data)
    if cache is not None:
        torch.save({"logits": torch.stack(logits), "streams": streams, "alone": bits / len(data)}, cache)
    return bits, logits, streams


def read(name: str) -> bytes:
    """The bytes of one of :data:`FILES`."""
    if name in OTHER:
        return (Path(__file__).parent / "data" / "other" / OTHER[name]).read_bytes()
    return read_file(name, WIKITEXT)


def measure(name: str, model, limit: int | None, cache: Path | None = None, variants=tuple(VARIANTS)) -> dict:
    data = fold_line_ends(read(name))[0][:limit]  # as compress codes it (docs/compression.md)
    started = time.perf_counter()
    cached = None if cache is None or limit is not None else cache / f"{name}.pt"
    bits, logits, streams = cached_model_alone(model, data, cached)
    row = {"file": name, "bytes": len(data), "streams": streams, "model_seconds": time.perf_counter() - started}
    row["model alone"] = bits / len(data)
    for variant in variants:
        version, constants = VARIANTS[variant]
        with ExitStack() as stack:
            for constant, value in constants.items():
                stack.enter_context(mock.patch.object({1: mixing, 2: matching, 3: bitwise}[version], constant, value))
            started = time.perf_counter()
            positions = max(stream_lengths(len(data), streams))  # as compress sizes the mixer
            step = None if looks_binary(data) else Replay(logits, streams)  # not text: the context models alone
            predictor = MixedPredictor(step, CPU, version, streams, positions)
            row[variant] = ideal_bits(predictor, data) / len(data)
            row[f"{variant} seconds"] = time.perf_counter() - started
    row["PPMd"] = 8 * len(pyppmd.compress(data, variant="H", max_order=8, mem_size=16 << 20)) / len(data)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="run, checkpoint or shipped model [%(default)s]")
    parser.add_argument("--files", nargs="+", choices=FILES, default=["alice29"])
    parser.add_argument("--limit", type=int, default=None, help="keep each file's first N bytes")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--cache", type=Path, default=None, help="keep each whole file's logits in this folder")
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/adaptive_mixing.json]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model)[0]
    rows = [measure(name, model, args.limit, args.cache, args.variants) for name in args.files]
    columns = ["model alone", *args.variants, "PPMd"]
    print_table(rows, [("file", "file", ""), ("bytes", "bytes", ",")] + [(c, c, ".4f") for c in columns])
    print_table(rows, [("file", "file", "")] + [(f"{v} seconds", f"{v} s", ".1f") for v in args.variants])
    if args.markdown:
        lines = ["| file | bytes | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
        lines += [
            f"| {r['file']} | {r['bytes']:,} | " + " | ".join(f"{r[c]:.4f}" for c in columns) + " |" for r in rows
        ]
        with open(args.markdown, "w") as out:
            out.write("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
    write_json({"model": str(args.model), "limit": args.limit, "rows": rows}, "adaptive_mixing.json", args.json)


if __name__ == "__main__":
    main()
