"""Test bits per byte and cost per byte against the attention span a model reads at test time.

The paper (§3.1): "you can extend your memory window indefinitely with minimal overhead":
the head has no position encoding, so a model trained with a span of N can read a longer
memory (``SHARNN.set_attention_span``, ``sharnn eval --attention-span``). Each model is
scored on its own run's test split (its ``test_max_bytes`` prefix) by the paper's protocol
(``test_streams`` streams, each cold, windows of its ``bptt``; docs/evaluation.md) with the
span set to each multiple of the span it trained with. Where the span is shorter than the
window, the window is cut to the span (there is then no memory at all). Cost per byte is
the evaluation's wall time over the bytes it scored, on this machine's threads, and its
ratio to the trained span's, measured in the same run.

Every evaluation is appended to the JSON as it finishes, and a rerun with the same JSON
skips what is there, so a stopped run resumes (``--fresh`` starts again).

    python benchmarks/attention_span.py                          # the shipped model
    python benchmarks/attention_span.py --models wikipedia-2x512 runs/span-256 runs/span-1024 \\
        --plot results/attention-span.png --markdown results/attention-span.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from common import RESULTS, environment, print_table, write_json
from sharnn import load_corpus
from sharnn.data.corpus import split_prefix
from sharnn.evaluation import evaluate
from sharnn.models.shipped import DEFAULT_MODEL
from sharnn.training.checkpoint import load_model

MULTIPLES = (0.5, 1, 2, 4, 8, 16)


def measure(name: str, model, config, trained: int, data, multiple: float) -> dict:
    """Score ``model`` (trained with a span of ``trained``) on its test split ``data`` with
    the span times ``multiple``."""
    span = max(1, round(trained * multiple))
    window = min(config.bptt, span)
    model.set_attention_span(span)
    started = time.perf_counter()
    with torch.inference_mode():
        result = evaluate(model, data, config.test_streams, window)
    seconds = time.perf_counter() - started
    row = {"model": name, "trained_span": trained, "multiple": multiple, "span": span, "window": window}
    return row | {"bytes": result.bytes, "bpc": result.bpc, "seconds": seconds, "streams": config.test_streams}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with its BPC and cost per byte beside its model's trained span's."""
    base = {r["model"]: r for r in rows if r["multiple"] == 1}
    out = []
    for r in rows:
        b = base.get(r["model"])
        extra = {"us_per_byte": 1e6 * r["seconds"] / r["bytes"]}
        if b is not None:
            extra |= {
                "bpc_change": r["bpc"] - b["bpc"],
                "cost_ratio": (r["seconds"] / r["bytes"]) / (b["seconds"] / b["bytes"]),
            }
        out.append(r | extra)
    return out


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | trained span | span | window | test BPC | change | us per byte | cost vs trained span |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        change = f"{r['bpc_change']:+.4f}" if "bpc_change" in r else "-"
        ratio = f"{r['cost_ratio']:.2f}x" if "cost_ratio" in r else "-"
        lines.append(
            f"| {r['model']} | {r['trained_span']:,} | {r['span']:,} | {r['window']} | {r['bpc']:.4f} | {change} "
            f"| {r['us_per_byte']:.1f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """Two panels against the span's multiple of the trained span (log 2): test BPC, and
    cost per byte relative to the trained span's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bpc, cost) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = sorted((r for r in rows if r["model"] == name), key=lambda r: r["multiple"])
        label = f"{Path(name).name} (trained span {mine[0]['trained_span']:,})"
        bpc.plot([r["multiple"] for r in mine], [r["bpc"] for r in mine], marker="o", label=label)
        ratios = [(r["multiple"], r["cost_ratio"]) for r in mine if "cost_ratio" in r]
        cost.plot(*zip(*ratios), marker="o", label=label)
    for axis, what in ((bpc, "test bits per byte"), (cost, "cost per byte / trained span's")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("attention span at test time / trained span")
        axis.set_ylabel(what)
        axis.grid(alpha=0.3)
    bpc.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[DEFAULT_MODEL], help="runs, checkpoints or shipped models")
    parser.add_argument("--multiples", nargs="+", type=float, default=list(MULTIPLES))
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/attention_span.json]")
    parser.add_argument("--fresh", action="store_true", help="discard the results file's rows instead of resuming")
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--plot", default=None, help="also draw the two panels to this PNG")
    args = parser.parse_args()

    path = Path(args.json) if args.json else RESULTS / "attention_span.json"
    rows = [] if args.fresh or not path.exists() else json.loads(path.read_text())["rows"]
    done = {(r["model"], r["multiple"]) for r in rows}
    for name in args.models:
        model, config = load_model(name)
        trained = model.config.attention_span
        data, _ = split_prefix(load_corpus(config.data), "test", config.test_max_bytes)
        for multiple in sorted(args.multiples, key=lambda m: m != 1):  # the baseline first
            if (name, multiple) in done:
                continue
            row = measure(name, model, config, trained, data, multiple)
            print(f"{name} span {row['span']:,}: {row['bpc']:.4f} BPC in {row['seconds']:.0f} s", file=sys.stderr)
            rows.append(row)
            write_json({"rows": rows, **environment(torch.device("cpu"))}, "attention_span.json", str(path))
    rows = with_ratios([r for r in rows if r["model"] in args.models and r["multiple"] in args.multiples])
    print_table(
        rows,
        [("model", "model", ""), ("span", "span", ","), ("bpc", "test BPC", ".4f")]
        + [("us_per_byte", "us/byte", ".1f"), ("cost_ratio", "cost vs trained", ".2f")],
    )
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
        print(f"wrote {args.markdown}")
    if args.plot:
        plot(rows, Path(args.plot))


if __name__ == "__main__":
    main()
