"""Which settings of online compression learn most from each byte, and at what speed.

Each setting is a stream count followed by ``key=value`` overrides of
``sharnn.coding.online.online_config``. Each runs once on ``--file`` (one of
``compressors.py``'s files, its first ``--bytes`` bytes with ``--bytes``), on
``--threads`` torch threads: ``sharnn.coding.codec.compress``, then ``decompress``, whose
output must equal the input (``--no-decompress`` skips it). Reported: the payload's bits
per byte (the file header left out, so that short inputs compare fairly) and original
bytes per second of each direction, timed with ``time.perf_counter`` around the call,
the model built inside the timed region. ``xz -9e`` on the same bytes is the baseline.
The bits per byte are deterministic on one machine; the speeds are single runs on
whatever else the machine is doing.

With ``--results FILE`` every finished setting is appended to ``FILE`` (JSON lines) at
once, and a setting already there for the same file, bytes and threads is not run again:
a search killed midway resumes where it stopped, losing only the setting it was running.

    python benchmarks/online_settings.py --file enwik8-head-test --results online.jsonl \\
        "8 bptt=16" "4 bptt=8 optimizer=adamw lr=0.001"
"""

from __future__ import annotations

import argparse
import json
import lzma
import time
from pathlib import Path

import torch

from common import environment, print_table, write_json
from compressors import FILES, WIKITEXT, read_file
from sharnn.coding.codec import compress, decompress
from sharnn.coding.container import read_header
from sharnn.coding.online import online_config, online_model
from sharnn.errors import SharnnError


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", choices=FILES, default="enwik8-head-test", help="what to code [default: %(default)s]")
    parser.add_argument("--bytes", type=int, default=None, help="keep the file's first N bytes [default: all]")
    parser.add_argument("--wikitext", type=Path, default=WIKITEXT, help="WikiText-2's test.txt.gz")
    parser.add_argument("--threads", type=int, default=1, help="torch threads [default: %(default)s]")
    parser.add_argument("--no-decompress", action="store_true", help="time compression only")
    parser.add_argument("--results", type=Path, default=None, help="JSON lines to append to and resume from")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/online_settings.json]")
    parser.add_argument("settings", nargs="+", help='"STREAMS key=value ...", one run each')
    args = parser.parse_args()
    for setting in args.settings:
        try:
            online_config(setting.split()[1:])
        except SharnnError as e:
            parser.error(f"{setting!r}: {e}")
    data = read_file(args.file, args.wikitext)
    if data is None:
        parser.error(f"{args.file} is absent")
    data = data[: args.bytes]
    where = {"file": args.file, "bytes": len(data), "threads": args.threads}
    done = {row["setting"]: row for row in read_results(args.results) if all(row[k] == v for k, v in where.items())}
    xz = 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)
    rows = [{"setting": "xz -9e", "streams": None, "bits_per_byte": xz}]
    for setting in args.settings:
        if setting not in done:
            done[setting] = where | measure(data, setting, args.threads, not args.no_decompress)
            if args.results is not None:
                with args.results.open("a") as results:
                    results.write(json.dumps(done[setting]) + "\n")
        rows.append(done[setting])
        print(f"{setting}: {done[setting]['bits_per_byte']:.4f} bits per byte", flush=True)
    print_table(
        rows,
        [
            ("setting", "setting", ""),
            ("bits_per_byte", "bits/byte", ".4f"),
            ("compress_bytes_per_s", "compress B/s", ",.0f"),
            ("decompress_bytes_per_s", "decompress B/s", ",.0f"),
        ],
    )
    result = {"environment": environment(torch.device("cpu")), **where, "rows": rows}
    write_json(result, "online_settings.json", args.json)


def read_results(path: Path | None) -> list[dict]:
    """The rows of a results file (none if absent); a last line cut short by a kill is skipped."""
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def measure(data: bytes, setting: str, threads: int, both: bool) -> dict:
    """One setting's row: bits per byte of the payload, bytes per second of compression
    (and of decompression, checked to give ``data`` back, when ``both``)."""
    streams, *overrides = setting.split()
    config = online_config(overrides)
    start = time.perf_counter()
    blob = compress(data, online_model(config), streams=int(streams), threads=threads, online=config)
    row = {
        "setting": setting,
        "streams": int(streams),
        "bits_per_byte": 8 * read_header(blob)[0].payload_bytes / len(data),
        "compress_bytes_per_s": len(data) / (time.perf_counter() - start),
        "decompress_bytes_per_s": None,
    }
    if both:
        start = time.perf_counter()
        if decompress(blob) != data:
            raise SystemExit(f"{setting}: decompression did not give the input back")
        row["decompress_bytes_per_s"] = len(data) / (time.perf_counter() - start)
    return row


if __name__ == "__main__":
    main()
