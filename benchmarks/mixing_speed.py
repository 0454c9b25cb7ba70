"""The adaptive stage's time per position: its numba kernels (:mod:`sharnn.coding.mixing`)
against the numpy code they replaced, their specification (``tests/spec_mixing.py``)
(docs/compression.md, "Adapting to the file").

For each ``B`` of ``--streams``: ``--positions`` positions of real text (the bundled
enwik8 head, cut into ``B`` streams) with the integer step's log-weights of fixed random
logits, the last position coding all streams but one. First both implementations code
them once and must give the same probabilities, every bit (exit status 1 if not). Then
each is timed ``--repeats`` times, interleaved, one thread, ``mix`` and ``update``: each
time a fresh mixer through all positions (``first``: with the first touches of the
table rows the text names, as at the start of a file), then the same mixer through the
same positions again (``again``: its rows in memory, the arithmetic alone). Both hold
their tables in memory of small pages, as the package allocates them (numpy's own
allocation asks Linux for huge pages, whose first writes can stall for milliseconds);
the kernels' counts lie in rows in the order claimed, numpy's in rows by their hash.
The table gives the medians in microseconds per position, the kernels' ``again`` per
stream, and numpy's time over the kernels'.

    python benchmarks/mixing_speed.py
    python benchmarks/mixing_speed.py --streams 2 8 --positions 500 --repeats 7 --json mixing.json
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch

from common import environment, median, print_table, write_json
from sharnn.coding import mixing
from sharnn.compiled import ensure_compiled
from sharnn.models import exact

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the specification lives with the tests
import spec_mixing

CORPUS = Path(mixing.__file__).parents[1] / "corpora" / "enwik8-head.gz"


def numpy_mixer(streams: int) -> spec_mixing.AdaptiveMixer:
    """The specification's mixer, its tables in zeros of small pages, as the package's."""
    mixer = spec_mixing.AdaptiveMixer(streams)
    counts, tags = mixer.tables.counts, mixer.tables.tags
    mixer.tables.counts = mixing._small_page_zeros(counts.shape, counts.dtype)
    mixer.tables.tags = mixing._small_page_zeros(tags.shape, tags.dtype)
    return mixer


IMPLEMENTATIONS = {"numpy": numpy_mixer, "kernels": mixing.AdaptiveMixer}


def positions(rows: int, streams: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes ``[rows, B]`` of the corpus (stream ``b`` its ``b``-th piece) and the
    log-weights ``[rows, B, 256]`` of fixed random logits."""
    with gzip.open(CORPUS) as corpus:
        data = np.frombuffer(corpus.read(rows * streams), dtype=np.uint8)
    grid = data.reshape(streams, rows).T.astype(np.int64)
    logits = torch.randn(rows, streams, 256, generator=torch.Generator().manual_seed(0)) * 4
    return grid, exact.log_weights(logits).numpy()


def code(mixer, grid: np.ndarray, weights: np.ndarray, probabilities: list | None = None) -> None:
    """Mix and update every position of ``grid``, the last one for all streams but one."""
    rows, streams = grid.shape
    for t in range(rows):
        probs = mixer.mix(weights[t])
        if probabilities is not None:
            probabilities.append(probs)
        mixer.update(grid[t, : max(1, streams - 1) if t == rows - 1 else streams])


def measure(streams: int, rows: int, repeats: int) -> dict:
    """One row of the table: the medians (microseconds per position) and their ratios."""
    grid, weights = positions(rows, streams)
    outputs = {name: [] for name in IMPLEMENTATIONS}
    for name, mixer in IMPLEMENTATIONS.items():
        code(mixer(streams), grid, weights, outputs[name])
    if not all(np.array_equal(a, b) for a, b in zip(*outputs.values(), strict=True)):
        print(f"error: the kernels' probabilities differ from numpy's at B = {streams}", file=sys.stderr)
        sys.exit(1)
    times = {f"{name}_{run}": [] for name in IMPLEMENTATIONS for run in ("first", "again")}
    for _ in range(repeats):
        for name, make in IMPLEMENTATIONS.items():
            mixer = make(streams)
            for run in ("first", "again"):
                started = time.perf_counter()
                code(mixer, grid, weights)
                times[f"{name}_{run}"].append(1e6 * (time.perf_counter() - started) / rows)
    row = {"streams": streams, "positions": rows} | {f"{key}_us": median(t) for key, t in times.items()}
    row["kernels_again_us_per_stream"] = row["kernels_again_us"] / streams
    return row | {f"speedup_{run}": row[f"numpy_{run}_us"] / row[f"kernels_{run}_us"] for run in ("first", "again")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 2, 8, 32])
    parser.add_argument("--positions", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/mixing_speed.json]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    ensure_compiled()
    rows = [measure(streams, args.positions, args.repeats) for streams in args.streams]
    print_table(
        rows,
        [
            ("streams", "B", ""),
            ("numpy_first_us", "numpy first", ".1f"),
            ("kernels_first_us", "kernels first", ".1f"),
            ("speedup_first", "ratio", ".1f"),
            ("numpy_again_us", "numpy again", ".1f"),
            ("kernels_again_us", "kernels again", ".1f"),
            ("speedup_again", "ratio", ".1f"),
            ("kernels_again_us_per_stream", "kernels again / stream", ".2f"),
        ],
    )
    versions = {"numpy": np.__version__, "numba": numba.__version__}
    result = {"environment": environment(torch.device("cpu")) | versions, "repeats": args.repeats, "rows": rows}
    write_json(result, "mixing_speed.json", args.json)


if __name__ == "__main__":
    main()
