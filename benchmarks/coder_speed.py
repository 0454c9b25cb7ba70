"""The compressor's speed beside its baseline and its neighbours, in one run (docs/compression.md,
"Measured: speed").

For each file of ``--files`` (by default the four Canterbury texts and a small one, the
first 10,000 bytes of alice29; also ``json``, ``log`` and ``binary``, the files of
``benchmarks/data/other``: a JSON record, a test run's log and x86-64 object code, which
judge the coder beyond prose, issue 41), each compressor compresses and decompresses it;
every round trip is checked, and the order of the compressors is rotated from repeat to
repeat (interleaved, so a busy moment of the machine falls on each in turn). One thread
everywhere but ``sharnn --threads 2``.

- ``sharnn``: this checkout's ``sharnn.coding.codec.compress`` / ``decompress`` with the
  shipped model and no options (what ``sharnn compress FILE`` does), in a fresh process, the
  model loaded and the kernels compiled before the clock starts;
- with ``--modes [MODE ...]`` (none named: all), ``sharnn --mixing 2`` and ``--mixing 1``
  (the adaptive stage of versions 2 and 1), ``sharnn --no-adapt`` (the model alone) and
  ``sharnn --streams 32`` (0.4.0's streams on a file of 256 KB or more: an eighth of the
  positions of the default 4, each stream's start cold) and ``sharnn --threads 2`` (the
  products and the kernels on two threads): the same with those arguments of
  ``compress``; beside ``--mixing 2``, the ``x --mixing 2``
  column (issue 41's speed target: mixing 3 at least 0.8 of it, the slower direction), and
  for two threads ``x one thread``, its speed over ``sharnn``'s (issue 39's target: at least
  1.7, the slower direction);
- ``sharnn BASELINE``: the same in the checkout ``--baseline DIR`` (a ``git worktree`` of
  an earlier release, e.g. 0.4.0: ``git worktree add ../sharnn-0.4.0 e547d1e``);
- ``products``: the shipped model's matrix products alone, float32 through oneDNN, at the
  streams ``sharnn`` uses, for as many positions as the file codes: the floor the coder
  is measured against (``--no-products`` leaves it out: on a long file it takes longer
  than the coder);
- ``paq8px -8`` (``--paq8px PATH``: built from its source, never shipped; ``--paq8px-levels
  8 8L`` adds its LSTM, -8L), ``xz -9e``, ``bzip2 -9``, ``zstd -19`` and ``PPMd`` (order 8,
  16 MiB, ``pyppmd``).

Besides, ``enwik8-head-test`` and ``wikitext2-test``: the test texts of the bundled corpora.

The table gives each compressor's size beside PPMd's (``vs PPMd``, percent larger: the
target of issue 41 is at most +1% for ``sharnn``), and without ``--baseline`` no baseline
columns.

Start-up: the wall time of ``sharnn compress`` of a 1 KB file as a command, warm cache,
for this checkout and the baseline.

The run is resumable: every measurement is written to ``--json`` as it is made, and a
second run with the same file skips what is there. ``--report`` prints the table of a file.

    python benchmarks/coder_speed.py --baseline ../sharnn-0.4.0 --paq8px PATH/TO/paq8px --json results/coder-speed.json
    python benchmarks/coder_speed.py --files json log binary --paq8px PATH/TO/paq8px \
        --json results/coder-format-6.json
"""

from __future__ import annotations

import argparse
import bz2
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import environment, median, missing_extra, print_table, write_json
from compressors import WIKITEXT, read_file

try:
    import pyppmd
    import zstandard
except ModuleNotFoundError as e:  # not dependencies of sharnn itself: the extra "bench" installs them
    missing_extra(e, __name__)

ROOT = Path(__file__).resolve().parents[1]
CANTERBURY = ROOT / "benchmarks" / "data" / "canterbury"
OTHER = ROOT / "benchmarks" / "data" / "other"
FILES = ("small", "alice29", "asyoulik", "lcet10", "plrabn12")  # the default: the speed targets' files
OTHER_FILES = {"json": "span1024-results.json", "log": "pytest.log", "binary": "matching-mix.o"}  # name: file
WIKIPEDIA = ("enwik8-head-test", "wikitext2-test")  # the bundled corpora's test texts (compressors.read_file)
SMALL_BYTES = 10_000
MODES = {  # compress's arguments
    "sharnn --mixing 2": {"mixing": 2},
    "sharnn --mixing 1": {"mixing": 1},
    "sharnn --no-adapt": {"adapt": False},
    "sharnn --streams 32": {"streams": 32},  # 0.4.0's streams on a long file: fewer positions, more cold starts
    "sharnn --threads 2": {"threads": 2},  # two threads for the products and the kernels; the file records it
}

# What a fresh process runs for ``sharnn`` and its baseline: load, compile, then time.
DRIVER = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import sharnn
from sharnn.coding import codec
try:
    from sharnn.compiled import ensure_compiled
    compile_seconds = ensure_compiled()
except ImportError:
    compile_seconds = None
model = sharnn.load().model
data = open(sys.argv[1], "rb").read()
options = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}  # a mode's arguments of compress
start = time.perf_counter(); blob = codec.compress(data, model, **options); middle = time.perf_counter()
back = codec.decompress(blob, model); end = time.perf_counter()
streams = options.get("streams") or codec.default_streams(len(data))
print(json.dumps({"bytes": len(blob), "compress_s": middle - start, "decompress_s": end - middle,
                  "exact": back == data, "streams": streams, "compile_s": compile_seconds}))
"""

PRODUCTS = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import sharnn
model = sharnn.load().model
streams, positions = int(sys.argv[1]), int(sys.argv[2])
linear = torch.ops.mkldnn._linear_pointwise
shapes = []
for i, block in enumerate(model.blocks):
    d = model.config.d_model
    shapes.append((4 * d, d if i == 0 else 2 * d))  # block 0's input product is a table
    if block.attention is not None:
        shapes.append((d, d))
    shapes.append((model.config.boom_dim, d))
shapes.append((model.config.vocab_size, model.config.d_model))
weights = [torch.randn(n, k) for n, k in shapes]
inputs = [torch.randn(streams, k) for _, k in shapes]
for w, x in zip(weights, inputs):
    linear(x, w, None, "none", [], "")
start = time.perf_counter()
for _ in range(positions):
    for w, x in zip(weights, inputs):
        linear(x, w, None, "none", [], "")
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def file_name(name: str) -> str:
    """The file ``name`` of ``--files`` stands for (what the compressors see it called)."""
    return OTHER_FILES.get(name, f"{name}.txt")


def read(name: str) -> bytes:
    if name == "small":
        return (CANTERBURY / "alice29.txt").read_bytes()[:SMALL_BYTES]
    if name in WIKIPEDIA:
        return read_file(name, WIKITEXT)
    return (OTHER if name in OTHER_FILES else CANTERBURY).joinpath(file_name(name)).read_bytes()


def python(source: Path, code: str, *args: str) -> dict:
    """Run ``code`` in a fresh Python whose ``sharnn`` is ``source``'s: its last line's JSON."""
    env = os.environ | {"PYTHONPATH": str(source / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{source}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sharnn(source: Path, path: Path, options: dict | None = None) -> dict:
    result = python(source, DRIVER, str(path), *([json.dumps(options)] if options else []))
    if not result["exact"]:
        raise SystemExit(f"{source}: {path.name} did not round-trip")
    return result


def timed(compress, decompress, data: bytes) -> dict:
    start = time.perf_counter()
    blob = compress(data)
    middle = time.perf_counter()
    if decompress(blob) != data:
        raise SystemExit("a round trip failed")
    return {"bytes": len(blob), "compress_s": middle - start, "decompress_s": time.perf_counter() - middle}


def paq8px(binary: str, path: Path, level: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        packed, out = Path(folder) / "in.paq8px", Path(folder) / "out"
        start = time.perf_counter()
        subprocess.run([binary, level, str(path), str(packed)], check=True, capture_output=True)
        middle = time.perf_counter()
        subprocess.run([binary, "-d", str(packed), str(out)], check=True, capture_output=True)
        end = time.perf_counter()
        if out.read_bytes() != path.read_bytes():
            raise SystemExit(f"paq8px: {path.name} did not round-trip")
        return {"bytes": packed.stat().st_size, "compress_s": middle - start, "decompress_s": end - middle}


def ppmd(data: bytes) -> dict:
    """PPMd variant H, order 8, 16 MiB (``pyppmd``; its decoder is told the length)."""
    return timed(
        lambda raw: pyppmd.compress(raw, variant="H", max_order=8, mem_size=16 << 20),
        lambda blob: pyppmd.Ppmd7Decoder(8, 16 << 20).decode(blob, len(data)),
        data,
    )


def startup(source: Path) -> float:
    """Wall seconds of ``sharnn compress`` of 1 KB as a command (the cache warm: run once first)."""
    env = os.environ | {"PYTHONPATH": str(source / "src")}
    with tempfile.TemporaryDirectory() as folder:
        small = Path(folder) / "one.txt"
        small.write_bytes(read("alice29")[:1000])
        packed = Path(folder) / "one.shz"
        command = [sys.executable, "-m", "sharnn", "compress"]
        usage = subprocess.run([*command, "--help"], env=env, check=True, capture_output=True, text=True).stdout
        command += [str(small), "-o", str(packed)] if "--output" in usage else [str(small), str(packed)]  # 0.4.0's
        subprocess.run(command, env=env, check=True, capture_output=True)
        packed.unlink()
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        return time.perf_counter() - start


def compressors(args) -> dict:
    """Name -> ``measure(name_of_file, path) -> dict`` for every compressor of this run."""
    table = {"sharnn": lambda name, path: sharnn(ROOT, path)}
    for mode, options in MODES.items() if args.modes is not None else ():
        if args.modes and mode.removeprefix("sharnn ") not in args.modes:
            continue
        table[mode] = lambda name, path, options=options: sharnn(ROOT, path, options)
    if args.baseline:
        table[f"sharnn {args.baseline_name}"] = lambda name, path: sharnn(Path(args.baseline), path)
    for level in args.paq8px_levels if args.paq8px else ():
        table[f"paq8px -{level}"] = lambda name, path, level=level: paq8px(args.paq8px, path, f"-{level}")
    table |= {
        "xz -9e": lambda name, path: timed(
            lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME), lzma.decompress, path.read_bytes()
        ),
        "bzip2 -9": lambda name, path: timed(lambda d: bz2.compress(d, 9), bz2.decompress, path.read_bytes()),
        "zstd -19": lambda name, path: timed(
            zstandard.ZstdCompressor(level=19).compress, zstandard.ZstdDecompressor().decompress, path.read_bytes()
        ),
        "PPMd": lambda name, path: ppmd(path.read_bytes()),
    }
    return table


def products(streams: int, positions: int) -> float:
    return python(ROOT, PRODUCTS, str(streams), str(positions))["seconds"]


def run(args) -> dict:
    result = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {}
    result.setdefault("environment", environment(__import__("torch").device("cpu")))
    cells = result.setdefault("cells", [])
    done = {(c["file"], c["compressor"], c["repeat"]) for c in cells}
    table = compressors(args)
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for name in args.files:
                path = Path(folder) / file_name(name)
                path.write_bytes(read(name))
                order = list(table)[repeat % len(table) :] + list(table)[: repeat % len(table)]
                for compressor in order:
                    if (name, compressor, repeat) in done:
                        continue
                    print(f"repeat {repeat}: {name} {compressor} ...", file=sys.stderr, flush=True)
                    cell = {"file": name, "compressor": compressor, "repeat": repeat, "original": path.stat().st_size}
                    cell |= table[compressor](name, path)
                    if compressor == "sharnn" and args.products:  # the floor: the same positions and streams
                        positions = -(-cell["original"] // cell["streams"])
                        cell["products_s"] = products(cell["streams"], positions)
                    cells.append(cell)
                    write_json(result, "coder_speed.json", args.json)
        if args.baseline and "startup" not in result:
            result["startup"] = {
                "sharnn": [startup(ROOT) for _ in range(3)],
                args.baseline_name: [startup(Path(args.baseline)) for _ in range(3)],
            }
            write_json(result, "coder_speed.json", args.json)
    return result


# the rows each row's speed is divided by: reference -> (column, the one row it serves, or None: all)
REFERENCES = {
    "paq8px -8": ("x_paq8px", None),
    "sharnn --mixing 2": ("x_mixing_2", None),
    "sharnn": ("x_one_thread", "sharnn --threads 2"),
}


def is_baseline(compressor: str) -> bool:
    """Whether a row is the baseline's (``sharnn 0.4.0``), not this checkout's or one of its modes."""
    return compressor.startswith("sharnn ") and compressor not in MODES


def rows(result: dict) -> list[dict]:
    """One row per file and compressor: medians over repeats, speeds in KB/s of original bytes,
    the size beside PPMd's in percent (``vs_ppmd``: 100 * (bytes / PPMd's bytes - 1))."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for cell in result["cells"]:
        groups.setdefault((cell["file"], cell["compressor"]), []).append(cell)
    out = []
    for (name, compressor), cells in groups.items():
        original = cells[0]["original"]
        row = {"file": name, "compressor": compressor, "original": original, "bytes": cells[0]["bytes"]}
        row["bpc"] = 8 * row["bytes"] / original
        for way in ("compress", "decompress"):
            row[f"{way}_kb_s"] = original / 1000 / median([c[f"{way}_s"] for c in cells])
        floors = [c["products_s"] for c in cells if "products_s" in c]  # a repeat run with --no-products has none
        if floors:
            row["products_kb_s"] = original / 1000 / median(floors)
        row["repeats"] = len(cells)
        out.append(row)
    for row in out:  # ratios to the baseline and to paq8px, file by file; sizes to PPMd's
        others = {r["compressor"]: r for r in out if r["file"] == row["file"]}
        if "PPMd" in others:
            row["vs_ppmd"] = 100 * (row["bytes"] / others["PPMd"]["bytes"] - 1)
        for reference in (k for k in others if is_baseline(k) or k in REFERENCES):
            key, only = ("x_baseline", None) if is_baseline(reference) else REFERENCES[reference]
            if only not in (None, row["compressor"]):
                continue
            row[key] = min(row[f"{w}_kb_s"] / others[reference][f"{w}_kb_s"] for w in ("compress", "decompress"))
    return out


def report(result: dict) -> None:
    """The table of ``result``: its columns that some row has (no baseline's without one)."""
    table = rows(result)
    columns = [
        ("file", "file", ""),
        ("compressor", "compressor", ""),
        ("original", "bytes", ","),
        ("bytes", "compressed", ","),
        ("bpc", "bits/byte", ".3f"),
        ("vs_ppmd", "vs PPMd %", "+.2f"),
        ("compress_kb_s", "compress KB/s", ".2f"),
        ("decompress_kb_s", "decompress KB/s", ".2f"),
        ("products_kb_s", "products KB/s", ".2f"),
        ("x_baseline", "x baseline (slower way)", ".2f"),
        ("x_paq8px", "x paq8px", ".2f"),
        ("x_mixing_2", "x --mixing 2", ".2f"),
        ("x_one_thread", "x one thread", ".2f"),
    ]
    print_table(table, [c for c in columns if any(c[0] in row for row in table)])
    if "startup" in result:
        for name, seconds in result["startup"].items():
            print(f"start-up, sharnn compress of 1 KB ({name}): median {median(seconds):.2f} s of {len(seconds)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", choices=(*FILES, *OTHER_FILES, *WIKIPEDIA), default=list(FILES))
    parser.add_argument("--baseline", default=None, help="a checkout of an earlier sharnn to measure beside")
    parser.add_argument("--baseline-name", default="0.4.0", help="its name in the table [%(default)s]")
    parser.add_argument("--paq8px", default=shutil.which("paq8px"), help="the paq8px binary [on PATH]")
    parser.add_argument(
        "--paq8px-levels",
        nargs="+",
        default=["8"],
        choices=["8", "8L"],
        help="its levels (without the dash): 8, and 8L with its LSTM learned online (slower) [8]",
    )
    parser.add_argument(
        "--modes",
        nargs="*",
        choices=[mode.removeprefix("sharnn ") for mode in MODES],
        metavar="MODE",
        help="also these of sharnn's other modes (none named: all): " + ", ".join(MODES),
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--no-products", dest="products", action="store_false", help="leave out the bare products' floor"
    )
    parser.add_argument("--json", default="benchmarks/results/coder_speed.json", help="results file (resumed)")
    parser.add_argument("--report", action="store_true", help="only print the table of --json")
    args = parser.parse_args()
    result = json.loads(Path(args.json).read_text()) if args.report else run(args)
    report(result)


if __name__ == "__main__":
    main()
