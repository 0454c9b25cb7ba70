"""Lossless compression by the model (``sharnn.compress``) next to gzip, bzip2, xz and zstd.

For each file and compressor: the compressed size in bytes, the bits per byte
(8 * size / original size), the compression and decompression speed in original bytes
per second, and the round trip (the decompressed bytes must equal the input; any
difference stops the script with exit status 1).

Compressors: ``gzip -9`` (``gzip.compress(data, 9)``), ``bzip2 -9`` (``bz2.compress(data,
9)``), ``xz -9e`` (``lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)``), ``zstd -19``
(``zstandard.ZstdCompressor(level=19)``), all measured in the same run; ``sharnn B=N``,
``sharnn.compress.compress(data, model, streams=N)`` with the checkpoint of ``--model``,
one row per ``--streams`` value; ``sharnn online B=N``, online mode (no model file: a
fixed-seed model of ``sharnn.compress.online_config(overrides)`` learns from the bytes
already coded). sharnn's sizes include its file header (JSON, a few hundred bytes, also
reported as ``header_bytes``).

Timed: ``time.perf_counter`` around one whole ``compress`` call and one whole
``decompress`` call (the input already in memory, the checkpoint already loaded; in
online mode the fixed-seed model is built inside both timed regions, as ``decompress``
builds it). The sharnn rows run once each (they are long and deterministic);
the baselines take the median of 3 repeats. Everything runs on CPU, with torch's
thread count as set by ``OMP_NUM_THREADS``.

Files (``--files``): ``enwik8-head-test``, the test split of the bundled corpus (the last
5%); ``enwik8-head``, the whole bundled file; ``wikitext2-test``, WikiText-2's raw test
text (``--wikitext``; skipped with a note when absent). ``--limit N`` keeps each file's
first N bytes.

    python benchmarks/compressors.py --model runs/enwik8 --streams 1 8 32 --no-online
    python benchmarks/compressors.py --files enwik8-head-test --limit 20000 bptt=64
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import statistics
import sys
import time
from pathlib import Path

import matplotlib
import torch
import zstandard

from common import environment, enwik8_head, parse_args_with_overrides, print_table, write_json
from sharnn.checkpoint import load_model
from sharnn.compress import compress, decompress, online_config, online_model, read_header
from sharnn.data import bundled_wikitext2, load_corpus
from sharnn.errors import SharnnError

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
FILES = ("enwik8-head-test", "enwik8-head", "wikitext2-test")
WIKITEXT = bundled_wikitext2() / "test.txt.gz"
REPEATS = 3  # of each baseline; the median is reported

BASELINES = {
    "gzip -9": (lambda d: gzip.compress(d, 9), gzip.decompress),
    "bzip2 -9": (lambda d: bz2.compress(d, 9), bz2.decompress),
    "xz -9e": (lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME), lzma.decompress),
    "zstd -19": (
        lambda d: zstandard.ZstdCompressor(level=19).compress(d),
        lambda b: zstandard.ZstdDecompressor().decompress(b),
    ),
}


def read_file(name: str, wikitext: Path) -> bytes | None:
    """The bytes of one of :data:`FILES` (None, with a note, when the WikiText file is absent)."""
    if name == "enwik8-head-test":
        return load_corpus("enwik8-head").test.tobytes()
    if name == "enwik8-head":
        return enwik8_head()
    if not wikitext.is_file():
        print(f"note: {wikitext} is absent: skipping {name}")
        return None
    return gzip.decompress(wikitext.read_bytes())


def measure(file: str, compressor: str, data: bytes, encode, decode, repeats: int) -> dict:
    """One row: median seconds of ``repeats`` calls of ``encode(data)`` and of ``decode(blob)``,
    the round trip checked (a mismatch exits with status 1)."""
    encode_s, decode_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        blob = encode(data)
        encode_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        restored = decode(blob)
        decode_s.append(time.perf_counter() - start)
        if restored != data:
            sys.exit(f"error: {compressor} on {file}: the decompressed bytes differ from the input")
    seconds = statistics.median(encode_s), statistics.median(decode_s)
    return {
        "file": file,
        "compressor": compressor,
        "bytes": len(data),
        "size": len(blob),
        "bits_per_byte": 8 * len(blob) / len(data),
        "compress_s": seconds[0],
        "decompress_s": seconds[1],
        "compress_bytes_per_s": len(data) / seconds[0],
        "decompress_bytes_per_s": len(data) / seconds[1],
        "repeats": repeats,
        "round_trip": True,
        "_blob": blob,
    }


def measure_sharnn(file: str, compressor: str, data: bytes, encode, decode) -> dict:
    """A sharnn row (one call each way), with its progress as one line on stderr."""
    print(f"{file}: {compressor} on {len(data):,} bytes ...", end="", file=sys.stderr, flush=True)
    row = measure(file, compressor, data, encode, decode, repeats=1)
    row["header_bytes"] = row["size"] - read_header(row["_blob"])[0].payload_bytes
    print(
        f" {row['bits_per_byte']:.4f} bits/byte, compress {row['compress_s']:.1f} s, "
        f"decompress {row['decompress_s']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return row


def plot(rows: list[dict], path: Path) -> None:
    """Bits per byte of every compressor, grouped by file (a bar chart)."""
    files = list(dict.fromkeys(r["file"] for r in rows))
    compressors = list(dict.fromkeys(r["compressor"] for r in rows))
    value = {(r["file"], r["compressor"]): r["bits_per_byte"] for r in rows}
    width = 0.8 / len(compressors)
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(files) * len(compressors) + 3), 4.5))
    for i, name in enumerate(compressors):
        xs = [f + (i - (len(compressors) - 1) / 2) * width for f in range(len(files))]
        bars = ax.bar(xs, [value.get((file, name), 0) for file in files], width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(files)), files)
    ax.set_ylabel("bits per byte")
    ax.set_title("compressed size (lower is better)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(FILES))
    parser.add_argument("--limit", type=int, default=None, help="keep each file's first N bytes")
    parser.add_argument(
        "--wikitext", type=Path, default=WIKITEXT, help="WikiText-2's test.txt.gz [default: %(default)s]"
    )
    parser.add_argument(
        "--model", default=None, help="run or checkpoint for the sharnn rows (none: those rows are skipped)"
    )
    parser.add_argument(
        "--streams", nargs="+", type=int, default=[8], help="streams B of the sharnn rows, one row each"
    )
    parser.add_argument("--online-streams", type=int, default=8, help="streams B of online mode")
    parser.add_argument("--no-online", action="store_true", help="skip online mode (slow on big files)")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/compression.json]")
    parser.add_argument("--plot", default=None, help="bar chart of bits per byte [default: the JSON's path with .png]")
    parser.add_argument(
        "overrides", nargs="*", help="key=value settings of online mode (sharnn.compress.online_config)"
    )
    args = parse_args_with_overrides(parser)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if min(args.streams + [args.online_streams]) < 1:
        parser.error("streams must be at least 1")
    if args.no_online and args.overrides:
        parser.error(f"key=value settings ({args.overrides[0]}) are for online mode, not with --no-online")
    try:
        settings = None if args.no_online else online_config(args.overrides)
        model = load_model(args.model)[0] if args.model else None
    except SharnnError as e:
        parser.error(str(e))
    if model is None:
        print("note: no --model: no sharnn model rows")
    if args.no_online:
        print("note: --no-online: no sharnn online row")

    files, rows = {}, []
    for name in args.files:
        data = read_file(name, args.wikitext)
        if data is None:
            continue
        data = data[: args.limit] if args.limit else data
        files[name] = len(data)
        for compressor, (encode, decode) in BASELINES.items():
            rows.append(measure(name, compressor, data, encode, decode, REPEATS))
        for streams in args.streams if model is not None else []:
            rows.append(
                measure_sharnn(
                    name,
                    f"sharnn B={streams}",
                    data,
                    lambda d, b=streams: compress(d, model, streams=b),
                    lambda blob: decompress(blob, model),
                )
            )
        if settings is not None:
            rows.append(
                measure_sharnn(
                    name,
                    f"sharnn online B={args.online_streams}",
                    data,
                    lambda d: compress(d, online_model(settings), streams=args.online_streams, online=settings),
                    decompress,
                )
            )
    if not rows:
        sys.exit("error: no file to measure")
    for row in rows:
        del row["_blob"]

    print_table(
        rows,
        [
            ("file", "file", ""),
            ("compressor", "compressor", ""),
            ("size", "size", ","),
            ("bits_per_byte", "bits/byte", ".4f"),
            ("compress_bytes_per_s", "compress B/s", ",.0f"),
            ("decompress_bytes_per_s", "decompress B/s", ",.0f"),
        ],
    )
    result = {
        "environment": environment(torch.device("cpu")),
        "files": files,
        "limit": args.limit,
        "model": args.model,
        "streams": args.streams,
        "online": None if settings is None else {"streams": args.online_streams, "overrides": args.overrides},
        "baseline_repeats": REPEATS,
        "rows": rows,
    }
    target = write_json(result, "compression.json", args.json)
    plot(rows, Path(args.plot) if args.plot else target.with_suffix(".png"))


if __name__ == "__main__":
    main()
