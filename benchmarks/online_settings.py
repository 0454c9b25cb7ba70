"""Which settings of online compression learn most from each byte, and at what speed.

Each setting is a stream count followed by ``key=value`` overrides of
``sharnn.compress.online_config``; each is run once, compression only, on the first
``--bytes`` bytes of the bundled enwik8 head. Reported: the payload's bits per byte (the
file header left out, so that short inputs compare fairly) and original bytes per second,
timed with ``time.perf_counter`` around one ``sharnn.compress.compress`` call, the model
built inside the timed region. ``xz -9e`` on the same bytes is the baseline. The bits
per byte are deterministic on one machine; the speeds are single runs on whatever else
the machine is doing.

    python benchmarks/online_settings.py --bytes 300000 \\
        "8 model.d_model=128 model.boom_dim=512 bptt=16 lr=0.003" \\
        "16 model.d_model=128 model.boom_dim=512 bptt=16 lr=0.003"
"""

from __future__ import annotations

import argparse
import lzma
import time

import torch

from common import environment, enwik8_head, print_table, write_json
from sharnn.compress import compress, online_config, online_model, read_header
from sharnn.errors import SharnnError


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=300_000, help="how many bytes of the enwik8 head to code")
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/online_settings.json]")
    parser.add_argument("settings", nargs="+", help='"STREAMS key=value ...", one run each')
    args = parser.parse_args()
    data = enwik8_head()[: args.bytes]
    rows = [
        {
            "settings": "xz -9e",
            "streams": None,
            "bits_per_byte": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data),
        }
    ]
    for setting in args.settings:
        streams, *overrides = setting.split()
        try:
            config = online_config(overrides)
        except SharnnError as e:
            parser.error(f"{setting!r}: {e}")
        start = time.perf_counter()
        blob = compress(data, online_model(config), streams=int(streams), online=config)
        seconds = time.perf_counter() - start
        payload = read_header(blob)[0].payload_bytes
        rows.append(
            {
                "settings": " ".join(overrides) or "defaults",
                "streams": int(streams),
                "bits_per_byte": 8 * payload / len(data),
                "bytes_per_s": len(data) / seconds,
            }
        )
        print(
            f"{setting}: {rows[-1]['bits_per_byte']:.4f} bits per byte, {rows[-1]['bytes_per_s']:,.0f} bytes/s",
            flush=True,
        )
    print_table(
        rows,
        [
            ("settings", "settings", ""),
            ("streams", "streams", ""),
            ("bits_per_byte", "bits/byte", ".4f"),
            ("bytes_per_s", "bytes/s", ",.0f"),
        ],
    )
    write_json(
        {"environment": environment(torch.device("cpu")), "bytes": len(data), "rows": rows},
        "online_settings.json",
        args.json,
    )


if __name__ == "__main__":
    main()
