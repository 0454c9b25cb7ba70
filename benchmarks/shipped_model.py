"""The shipped model's evaluation (docs/pretrained.md), in one run.

Test bits per byte, by the paper's protocol as ``sharnn eval`` scores a split (the model's
``test_streams`` streams, each cold, windows of its ``bptt``; docs/evaluation.md): on the
enwik8 head's test split and on WikiText-2's test file as raw bytes, both held out of its
training text.

Compression, in bits per byte (8 x compressed bytes / bytes), of the enwik8 head's test
split and the four English texts of the Canterbury corpus (benchmarks/data/canterbury:
Project Gutenberg texts in the public domain, with their provenance), and with
``--files ... wikitext2-test`` WikiText-2's test file: ``sharnn``, what ``sharnn compress
FILE OUT`` writes with the model (its default streams, one thread, header included, the
model mixed with context models that adapt to the file; ``sharnn.coding.codec.compress``)
and decoded again, both directions timed (KB/s of original bytes), ``--jobs`` files at
once in worker processes; with ``--no-adapt`` also ``sharnn --no-adapt``, the model alone;
``xz -9e`` (``lzma``, preset 9 | extreme), ``bzip2 -9`` (``bz2``), ``zstd --ultra -22`` (``zstandard``, level 22) and
``PPMd`` (``pyppmd``: variant H, order 8, 16 MiB, the raw stream without the length its
decoder must be told), every round trip checked (a mismatch exits with status 1).

    python benchmarks/shipped_model.py                  # the default shipped model
    python benchmarks/shipped_model.py --model runs/wikipedia-2x512 --markdown results/pretrained.table.md
    python benchmarks/shipped_model.py --files alice29 --limit 20000 --no-splits
"""

from __future__ import annotations

import argparse
import bz2
import lzma
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from common import environment, missing_extra, print_table, write_json
from sharnn import load_corpus
from sharnn.coding.codec import compress, decompress
from sharnn.evaluation import evaluate
from sharnn.models.shipped import DEFAULT_MODEL
from sharnn.training.checkpoint import load_model

try:
    import pyppmd
    import zstandard
except ModuleNotFoundError as e:  # not dependencies of sharnn itself: the extra "bench" installs them
    missing_extra(e, __name__)

CANTERBURY = Path(__file__).resolve().parent / "data" / "canterbury"
FILES = ("enwik8-head-test", "wikitext2-test", "alice29", "asyoulik", "lcet10", "plrabn12")
DEFAULT_FILES = ("enwik8-head-test", "alice29", "asyoulik", "lcet10", "plrabn12")
SPLITS = {"enwik8-head test": ("enwik8-head", "test"), "WikiText-2 test (bytes)": ("wikitext-2-bytes", "test")}
SHARNN_MODES = ("sharnn", "sharnn --no-adapt")
PPMD = {"max_order": 8, "mem_size": 16 << 20}
CLASSICAL = {
    "xz -9e": (lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME), lzma.decompress),
    "bzip2 -9": (lambda d: bz2.compress(d, 9), bz2.decompress),
    "zstd --ultra -22": (
        lambda d: zstandard.ZstdCompressor(level=22).compress(d),
        lambda b: zstandard.ZstdDecompressor().decompress(b),
    ),
    "PPMd": (
        lambda d: pyppmd.compress(d, variant="H", **PPMD),
        None,  # needs the length: see coded()
    ),
}


def read_file(name: str, limit: int | None) -> bytes:
    if name == "enwik8-head-test":
        data = load_corpus("enwik8-head").test.tobytes()
    elif name == "wikitext2-test":
        data = load_corpus("wikitext-2-bytes").test.tobytes()
    else:
        data = (CANTERBURY / f"{name}.txt").read_bytes()
    return data[:limit] if limit else data


def coded(name: str, compressor: str, data: bytes) -> dict:
    """One classical compressor on one file: its size and the round trip checked."""
    encode, decode = CLASSICAL[compressor]
    started = time.perf_counter()
    blob = encode(data)
    seconds = time.perf_counter() - started
    restored = (
        pyppmd.Ppmd7Decoder(PPMD["max_order"], PPMD["mem_size"]).decode(blob, len(data))
        if decode is None
        else decode(blob)
    )
    if restored != data:
        sys.exit(f"error: {compressor} on {name}: the decompressed bytes differ from the input")
    return {"size": len(blob), "seconds": seconds}


def sharnn_coded(name: str, limit: int | None, model_path: str, adapt: bool = True) -> dict:
    """``sharnn compress`` (``--no-adapt`` without ``adapt``) with the model at ``model_path``
    on one file (on one thread, as the command codes), decoded again and checked, both
    directions timed; run in a worker process."""
    torch.set_num_threads(1)
    data, model = read_file(name, limit), load_model(model_path)[0]
    started = time.perf_counter()
    blob = compress(data, model, adapt=adapt)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    if decompress(blob, model) != data:
        return {"error": f"sharnn on {name}: the decompressed bytes differ from the input"}
    back = time.perf_counter() - started
    print(f"{name}: sharnn {8 * len(blob) / len(data):.4f} bits/byte in {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"size": len(blob), "seconds": seconds, "decode_seconds": back}


def split_scores(model, config) -> list[dict]:
    """Test bits per byte of ``model`` on :data:`SPLITS`, by the paper's protocol."""
    rows = []
    for what, (corpus, split) in SPLITS.items():
        data = load_corpus(corpus).split(split)
        result = evaluate(model, data, config.test_streams, config.bptt)
        rows.append({"split": what, "bytes": len(data), "bpc": result.bpc, "streams": config.test_streams})
        print(f"{what}: {result.bpc:.4f} bits per byte", file=sys.stderr, flush=True)
    return rows


def markdown(files: list[dict], splits: list[dict]) -> str:
    names = [n for n in SHARNN_MODES if n in files[0]] + list(CLASSICAL)
    lines = ["| split | bytes | test bits per byte |", "|---|---:|---:|"] if splits else []
    lines += [f"| {r['split']} | {r['bytes']:,} | {r['bpc']:.4f} |" for r in splits] + [""] * bool(splits)
    lines += ["| file | bytes | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for row in files:
        best = min(row[n] for n in names)
        cells = [f"**{row[n]:.3f}**" if row[n] == best else f"{row[n]:.3f}" for n in names]
        lines.append(f"| {row['file']} | {row['bytes']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="run, checkpoint or shipped model [%(default)s]")
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(DEFAULT_FILES))
    parser.add_argument("--no-adapt", action="store_true", help="also code each file with the model alone")
    parser.add_argument("--limit", type=int, default=None, help="keep each file's first N bytes")
    parser.add_argument("--jobs", type=int, default=2, help="files sharnn codes at once, one process each")
    parser.add_argument("--no-splits", action="store_true", help="skip the test splits' bits per byte")
    parser.add_argument("--markdown", default=None, help="also write the tables as Markdown to this file")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/shipped_model.json]")
    args = parser.parse_args()

    model, config = load_model(args.model)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        largest_first = sorted(args.files, key=lambda name: -len(read_file(name, args.limit)))
        modes = {"sharnn": True, "sharnn --no-adapt": False} if args.no_adapt else {"sharnn": True}
        coding = {
            (name, mode): pool.submit(sharnn_coded, name, args.limit, args.model, adapt)
            for name in largest_first
            for mode, adapt in modes.items()
        }
        files = []
        for name in args.files:
            data = read_file(name, args.limit)
            sizes = {mode: coding[name, mode].result() for mode in modes} | {c: coded(name, c, data) for c in CLASSICAL}
            for mode in modes:
                if "error" in sizes[mode]:
                    sys.exit(f"error: {sizes[mode]['error']}")
            row = {"file": name, "bytes": len(data)} | {c: 8 * s["size"] / len(data) for c, s in sizes.items()}
            speeds = {f"{mode} KB/s": len(data) / 1e3 / sizes[mode]["seconds"] for mode in modes}
            speeds |= {f"{mode} KB/s back": len(data) / 1e3 / sizes[mode]["decode_seconds"] for mode in modes}
            files.append(row | speeds | {"seconds": {c: s["seconds"] for c, s in sizes.items()}})
    splits = [] if args.no_splits else split_scores(model, config)

    print(f"model {args.model}: bits per byte")
    if splits:
        print_table(splits, [("split", "test split", ""), ("bytes", "bytes", ","), ("bpc", "bits per byte", ".4f")])
        print()
    names = [*modes, *CLASSICAL]
    speeds = [(f"{mode} KB/s{way}", f"{mode} KB/s{way}", ".2f") for mode in modes for way in ("", " back")]
    print_table(files, [("file", "file", ""), ("bytes", "bytes", ",")] + [(c, c, ".3f") for c in names] + speeds)
    if args.markdown:
        Path(args.markdown).write_text(markdown(files, splits))
        print(f"wrote {args.markdown}")
    result = {
        "model": str(args.model),
        "limit": args.limit,
        "files": files,
        "splits": splits,
        **environment(torch.device("cpu")),
    }
    write_json(result, "shipped_model.json", args.json)


if __name__ == "__main__":
    main()
