"""Lossless compression by the model (``sharnn.coding.codec``) next to gzip, bzip2, xz and
zstd.

For each file and compressor: the compressed size in bytes, the bits per byte
(8 * size / original size), the compression and decompression speed in original bytes
per second, and the round trip (the decompressed bytes must equal the input; any
difference stops the script with exit status 1).

Compressors: ``gzip -9`` (``gzip.compress(data, 9)``), ``bzip2 -9`` (``bz2.compress(data,
9)``), ``xz -9e`` (``lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)``), ``zstd -19``
(``zstandard.ZstdCompressor(level=19)``), all measured in the same run; ``sharnn B=N``,
``sharnn.coding.codec.compress(data, model, streams=N, precision=P)`` with the checkpoint of
``--model``, one row ``sharnn B=N P`` per ``--streams`` value and ``--precision`` (default
``integer``, the portable integer step, and ``fp32``, the float step; the integer step's
sizes are judged against the fp32 step's: at most 1% larger); ``sharnn online B=N``, online
mode (no model file: a fixed-seed model of ``sharnn.coding.online.online_config(overrides)``
learns from the bytes already coded). sharnn's sizes include its file header (JSON, a few
hundred bytes, also reported as ``header_bytes``).

Timed: ``time.perf_counter`` around one whole ``compress`` call and one whole
``decompress`` call (the input already in memory, the checkpoint already loaded; in
online mode the fixed-seed model is built inside both timed regions, as ``decompress``
builds it). The sharnn rows run once each (they are long and deterministic);
the baselines take the median of 3 repeats. Everything runs on CPU; sharnn codes on
``--threads`` torch threads (default 1, as ``sharnn compress``), and online mode on
``--online-streams`` streams (default: ``sharnn compress --online``'s).

Per position (with ``--model``, an SHA-RNN; :func:`measure_positions`): for every ``B`` of
``--batch``, the milliseconds one position of ``B`` streams takes, on one thread
(``torch.set_num_threads(1)`` for the section), the median of ``--repeats`` rounds (each
path in turn, so that all meet the same machine) of ``--positions`` positions, after the
attention memory has filled (``attention_span`` positions, untimed): ``forward``, the
model's forward on a ``[1, B]`` window carrying its state, what files of versions 1 and 2
decode with; ``step fp32`` and ``step bf16``, :class:`sharnn.models.step.Step`, the float
step (bf16 skipped with a note on a CPU without bf16 instructions); ``step integer``,
:class:`sharnn.models.integer_step.IntegerStep`, what version 4 codes with by default;
``generate``, one token of ``sharnn.generation.generate`` (the step, then sampling; no I/O);
``floor``, the bare work of the same shapes at batch ``B``: ``n_layers`` ``torch.lstm_cell``
steps, as many Boom up-projections (``F.linear``, ``d`` to ``boom_dim``) and the output
projection (``F.linear``, ``d`` to ``V``); ``floor onednn``, the same products through
oneDNN as the step runs them (where torch has it). Each row gives bytes per second (``B`` /
time) and its ratio to the floor; the targets of the step (issue 22) are judged against the
floor.

Files (``--files``): ``enwik8-head-test``, the test split of the bundled corpus (the last
5%); ``enwik8-head``, the whole bundled file; ``wikitext2-test``, WikiText-2's raw test
text (``--wikitext``; skipped with a note when absent); ``sharnn-docs``, English text of
another kind: this repository's ``README.md`` and ``docs/*.md`` (in name order),
joined; ``alice29``, ``asyoulik``, ``lcet10``, ``plrabn12``, the four English texts of the
Canterbury corpus (``benchmarks/data/canterbury``). ``--limit N`` keeps each file's first N
bytes.

    python benchmarks/compressors.py --model runs/enwik8 --streams 1 8 32 --no-online
    python benchmarks/compressors.py --files enwik8-head-test --limit 20000 bptt=64
    python benchmarks/compressors.py --files enwik8-head-test --model runs/tiny --streams 8 32 --batch 1 8 32 128
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
import torch.nn.functional as F

from common import (
    environment,
    judge,
    median,
    missing_extra,
    parse_args_with_overrides,
    print_table,
    print_targets,
    time_repeats,
    write_json,
)
from sharnn import SHARNN
from sharnn.coding.codec import compress, decompress
from sharnn.coding.container import read_header
from sharnn.coding.environment import BF16_PRODUCTS, cpu_features, environment as coding_environment, torch_threads
from sharnn.coding.online import ONLINE_STREAMS, online_config, online_model
from sharnn.data.corpus import SPLITS, bundled_wikitext2, load_corpus
from sharnn.errors import SharnnError
from sharnn.generation import generate
from sharnn.models.integer_step import IntegerStep
from sharnn.models.step import ONEDNN, ReferenceStep, Step, linear as step_linear
from sharnn.training.checkpoint import load_model

try:
    import zstandard
except ModuleNotFoundError as e:  # not a dependency of sharnn itself: the extra "bench" installs it
    missing_extra(e, __name__)

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
CANTERBURY = ("alice29", "asyoulik", "lcet10", "plrabn12")  # benchmarks/data/canterbury, public-domain English
FILES = ("enwik8-head-test", "enwik8-head", "wikitext2-test", "sharnn-docs", *CANTERBURY)
WIKITEXT = bundled_wikitext2() / "test.txt.gz"
REPEATS = 3  # of each baseline; the median is reported
CPU = torch.device("cpu")

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
    if name == "enwik8-head":  # the whole head: its splits, in order
        corpus = load_corpus("enwik8-head")
        return b"".join(corpus.split(split).tobytes() for split in SPLITS)
    if name == "sharnn-docs":
        return b"".join(path.read_bytes() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    if name in CANTERBURY:
        return (ROOT / "benchmarks" / "data" / "canterbury" / f"{name}.txt").read_bytes()
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


def floor_position(model: SHARNN, streams: int, onednn: bool = False):
    """One position of the floor at batch ``streams``: ``n_layers`` ``torch.lstm_cell``
    steps (``d`` to ``4d`` gates, the state carried), as many Boom up-projections
    (``F.linear``, ``d`` to ``boom_dim``) and the output projection (``F.linear``, ``d`` to
    ``V``), on seeded random fp32 weights of the model's shapes. With ``onednn``, the same
    products through oneDNN as the step runs them (``sharnn.models.step``'s), the cell's
    two gate products separate and its pointwise part in plain torch. Returns
    ``run(tokens)`` (``tokens`` unused: the floor has no embedding)."""
    config = model.config
    d, generator = config.d_model, torch.Generator().manual_seed(0)

    def weight(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5

    layers = [(weight(4 * d, d), weight(4 * d, d), weight(4 * d), weight(4 * d)) for _ in range(config.n_layers)]
    boom = [(weight(config.boom_dim, d), weight(config.boom_dim)) for _ in range(config.n_layers)]
    output = weight(config.vocab_size, d), weight(config.vocab_size)
    x, state = weight(streams, d), [(torch.zeros(streams, d), torch.zeros(streams, d)) for _ in layers]

    def run(tokens: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (lstm, up) in enumerate(zip(layers, boom)):
            state[i] = torch.lstm_cell(h, state[i], *lstm)
            h = state[i][0]
            F.linear(h, *up)
        return F.linear(h, *output)

    def run_onednn(tokens: torch.Tensor) -> torch.Tensor:
        h = x
        for i, ((w_ih, w_hh, b_ih, b_hh), up) in enumerate(zip(layers, boom)):
            gates = step_linear(state[i][0], w_hh, step_linear(h, w_ih, b_ih)).add_(b_hh)  # i, f, g, o
            input_gate, forget, cell, output_gate = gates.chunk(4, dim=1)
            c = torch.addcmul(torch.sigmoid(forget) * state[i][1], torch.sigmoid(input_gate), torch.tanh(cell))
            h = torch.sigmoid(output_gate) * torch.tanh(c)
            state[i] = h, c
            step_linear(h, *up)
        return step_linear(h, *output)

    return run_onednn if onednn else run


def generation_position(model: SHARNN, streams: int, positions: int):
    """``run(tokens)``: the next token of :func:`sharnn.generation.generate` for ``streams``
    streams from a prompt of one byte (``tokens`` unused: it samples its own); its first
    call feeds the prompt and prepares the step, every later one is one position: the
    step on the last tokens, then sampling. At most ``positions`` calls."""
    prompt = torch.full((1, streams), 10, dtype=torch.int64)
    samples = generate(model, prompt, positions, seed=0)
    return lambda tokens: next(samples)


def positions_ms(paths: dict, streams: int, vocab: int, warmup: int, positions: int, repeats: int) -> dict:
    """Milliseconds of one call ``run(tokens)`` of every path (``tokens [streams]``, seeded
    random ids below ``vocab``): after ``warmup`` untimed calls of each, ``repeats``
    rounds in which each path in turn runs ``positions`` calls, so that every path meets
    the same machine; per path, the median round's time over ``positions``."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (warmup + positions * repeats, streams), generator=generator)
    for run in paths.values():
        for row in tokens[:warmup]:
            run(row)
    times = {path: [] for path in paths}
    for r in range(repeats):
        rows = tokens[warmup + r * positions : warmup + (r + 1) * positions]
        for path, run in paths.items():
            times[path] += time_repeats(lambda run=run, rows=rows: [run(row) for row in rows], CPU, 1)
    return {path: 1000 * median(seconds) / positions for path, seconds in times.items()}


def bf16_note() -> str | None:
    """Why the step's bf16 rows are skipped on this CPU (None: they run)."""
    features = cpu_features()
    if set(BF16_PRODUCTS) & set(features):
        return None
    return f"this CPU has no bf16 instructions ({' or '.join(BF16_PRODUCTS)}; it has {' '.join(features) or 'none'})"


def position_paths(model: SHARNN, streams: int, calls: int, bf16: bool) -> dict:
    """Path name -> ``run(tokens)`` of one position at batch ``streams`` (the floor first),
    each good for ``calls`` calls."""
    paths = {"floor": floor_position(model, streams)}
    if ONEDNN:
        paths["floor onednn"] = floor_position(model, streams, onednn=True)
    paths |= {
        "forward": ReferenceStep(model),
        "step fp32": Step(model, streams),
        "step integer": IntegerStep(model, streams),
    }
    if bf16:
        paths["step bf16"] = Step(model, streams, precision="bf16")
    paths["generate"] = generation_position(model, streams, calls)
    return paths


@torch.no_grad()
def measure_positions(model: SHARNN, batches: list[int], positions: int, repeats: int) -> dict:
    """The per-position section: every path of :func:`position_paths` at every ``B`` of
    ``batches``, on one thread, after the attention memory filled (``attention_span``
    positions, untimed). Returns the section's JSON (rows, targets, environment, note)."""
    model.eval()
    note = bf16_note()
    warmup = model.config.attention_span + 1  # the memory full; generate's first call (the prompt) in it
    rows = []
    with torch_threads(1):
        env = coding_environment(CPU, "bf16")
        for streams in batches:
            print(f"per position: B={streams} ...", file=sys.stderr, flush=True)
            paths = position_paths(model, streams, warmup + positions * repeats, note is None)
            vocab = model.config.vocab_size
            ms = positions_ms(paths, streams, vocab, warmup, positions, repeats)
            rows += [
                {
                    "batch": streams,
                    "path": path,
                    "ms_per_position": value,
                    "bytes_per_s": 1000 * streams / value,
                    "floor_ratio": value / ms["floor"],
                }
                for path, value in ms.items()
            ]
    return {
        "environment": env,
        "model": model_shape(model),
        "batch": batches,
        "positions": positions,
        "repeats": repeats,
        "warmup": warmup,
        "bf16_skipped": note,
        "rows": rows,
        "targets": position_targets(rows),
    }


def model_shape(model: SHARNN) -> dict:
    """The shapes the section's figures depend on."""
    config = model.config
    keys = ("d_model", "n_layers", "boom_dim", "vocab_size", "attention_span")
    return {key: getattr(config, key) for key in keys} | {"parameters": model.num_parameters()}


def position_targets(rows: list[dict]) -> list[dict]:
    """Issue 22's targets for the step, judged on the rows measured (a target whose ``B``
    or path was not measured is left out): fp32 at most 0.8x the floor at B=8 and 1.2x at
    B=32; bf16 at most 0.8x the fp32 floor at B=32; generation within 10% of the fp32
    step at every ``B``; issue 29's: the integer step at least as fast as the fp32 step at
    B=8 and B=32."""
    ms = {(row["batch"], row["path"]): row for row in rows}
    limits = [(8, "step fp32", 0.8), (32, "step fp32", 1.2), (32, "step bf16", 0.8)]
    targets = [
        judge(f"{path} B={streams} <= {limit}x fp32 floor", ms[streams, path]["floor_ratio"], limit, False, "x")
        for streams, path, limit in limits
        if (streams, path) in ms
    ]
    for streams in dict.fromkeys(row["batch"] for row in rows):
        ratio = ms[streams, "generate"]["ms_per_position"] / ms[streams, "step fp32"]["ms_per_position"]
        targets.append(judge(f"generate B={streams} <= 1.1x step fp32", ratio, 1.1, False, "x"))
    for streams in (8, 32):
        if (streams, "step integer") in ms:
            ratio = ms[streams, "step integer"]["ms_per_position"] / ms[streams, "step fp32"]["ms_per_position"]
            targets.append(judge(f"step integer B={streams} <= 1.0x step fp32", ratio, 1.0, False, "x"))
    return targets


def size_targets(rows: list[dict]) -> list[dict]:
    """Issue 29's size target, per file and ``B`` with both rows: the integer step's file
    at most 1% larger than the fp32 step's."""
    sizes = {(row["file"], row["compressor"]): row["size"] for row in rows}
    targets = []
    for (file, compressor), size in sizes.items():
        fp32 = sizes.get((file, compressor.replace(" integer", " fp32")))
        if compressor.endswith(" integer") and fp32:
            name = f"{file} {compressor.removeprefix('sharnn ')} <= 1.01x fp32 size"
            targets.append(judge(name, size / fp32, 1.01, False, "x"))
    return targets


def print_positions(section: dict) -> None:
    """The per-position table, then its targets."""
    print(f"\nper position, one thread (median of {section['repeats']} x {section['positions']} positions):")
    if section["bf16_skipped"]:
        print(f"note: {section['bf16_skipped']}: no step bf16 rows")
    print_table(
        section["rows"],
        [
            ("batch", "B", ""),
            ("path", "path", ""),
            ("ms_per_position", "ms/position", ".3f"),
            ("bytes_per_s", "bytes/s", ",.0f"),
            ("floor_ratio", "x floor", ".2f"),
        ],
    )
    print_targets(section["targets"], ".2f")


def parse_arguments() -> tuple[argparse.Namespace, SHARNN | None, object]:
    """The options, checked (a bad one is a usage error); the model of ``--model`` (None)
    and online mode's settings (None with ``--no-online``)."""
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
    parser.add_argument(
        "--online-streams", type=int, default=ONLINE_STREAMS, help="streams B of online mode [default: %(default)s]"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the sharnn rows [default: 1]")
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=["integer", "fp32", "bf16"],
        default=["integer", "fp32"],
        help="of the sharnn model rows, one row each [default: integer fp32]",
    )
    parser.add_argument("--no-online", action="store_true", help="skip online mode (slow on big files)")
    parser.add_argument(
        "--batch", nargs="+", type=int, default=[1, 8, 32, 128], help="B of the per-position section, one each"
    )
    parser.add_argument("--positions", type=int, default=100, help="timed positions per repeat, per position")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per position (the median is reported)")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/compression.json]")
    parser.add_argument("--plot", default=None, help="bar chart of bits per byte [default: the JSON's path with .png]")
    parser.add_argument(
        "overrides", nargs="*", help="key=value settings of online mode (sharnn.coding.online.online_config)"
    )
    args = parse_args_with_overrides(parser)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if min(args.streams + [args.online_streams, args.threads] + args.batch) < 1:
        parser.error("streams (--streams, --online-streams, --batch) and --threads must be at least 1")
    if min(args.positions, args.repeats) < 1:
        parser.error("--positions and --repeats must be at least 1")
    if args.no_online and args.overrides:
        parser.error(f"key=value settings ({args.overrides[0]}) are for online mode, not with --no-online")
    try:
        settings = None if args.no_online else online_config(args.overrides)
        model = load_model(args.model)[0] if args.model else None
    except SharnnError as e:
        parser.error(str(e))
    return args, model, settings


def measure_files(args: argparse.Namespace, model: SHARNN | None, settings) -> tuple[dict, list[dict]]:
    """The compressors' rows of every file of ``--files``: ``({file: bytes}, rows)``."""
    files, rows = {}, []
    for name in args.files:
        data = read_file(name, args.wikitext)
        if data is None:
            continue
        data = data[: args.limit] if args.limit else data
        files[name] = len(data)
        for compressor, (encode, decode) in BASELINES.items():
            rows.append(measure(name, compressor, data, encode, decode, REPEATS))
        for precision in _precisions(args.precision, model):
            for streams in args.streams:
                rows.append(
                    measure_sharnn(
                        name,
                        f"sharnn B={streams} {precision}",
                        data,
                        lambda d, b=streams, p=precision: compress(  # the step alone: no mixing
                            d, model, streams=b, threads=args.threads, precision=p, adapt=False
                        ),
                        lambda blob: decompress(blob, model),
                    )
                )
        if settings is not None:
            rows.append(
                measure_sharnn(
                    name,
                    f"sharnn online B={args.online_streams}",
                    data,
                    lambda d: compress(
                        d, online_model(settings), streams=args.online_streams, threads=args.threads, online=settings
                    ),
                    decompress,
                )
            )
    for row in rows:
        del row["_blob"]
    return files, rows


def _precisions(chosen: list[str], model: SHARNN | None) -> list[str]:
    """The model rows' precisions: ``chosen`` for an SHA-RNN, fp32 alone for a Transformer
    (it has no inference step), none without a model."""
    return [] if model is None else chosen if isinstance(model, SHARNN) else ["fp32"]


def main():
    args, model, settings = parse_arguments()
    if model is None:
        print("note: no --model: no sharnn model rows, no per-position section")
    elif not isinstance(model, SHARNN):
        print(f"note: --model is a {type(model).__name__}: no per-position section (it has no inference step)")
    if args.no_online:
        print("note: --no-online: no sharnn online row")
    files, rows = measure_files(args, model, settings)
    if not rows:
        sys.exit("error: no file to measure")
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
    sizes = size_targets(rows)
    if sizes:
        print("\nsize of the integer step's files against the fp32 step's:")
        print_targets(sizes, ".4f")
    positions = None
    if isinstance(model, SHARNN):
        positions = measure_positions(model, args.batch, args.positions, args.repeats)
        print_positions(positions)
    result = {
        "environment": environment(CPU),
        "files": files,
        "limit": args.limit,
        "model": args.model,
        "streams": args.streams,
        "threads": args.threads,
        "precision": args.precision,
        "online": None if settings is None else {"streams": args.online_streams, "overrides": args.overrides},
        "baseline_repeats": REPEATS,
        "rows": rows,
        "size_targets": sizes,
        "per_position": positions,
    }
    target = write_json(result, "compression.json", args.json)
    plot(rows, Path(args.plot) if args.plot else target.with_suffix(".png"))


if __name__ == "__main__":
    main()
