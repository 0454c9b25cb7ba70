"""The constrained experiment of paper §6.1: one SHA-RNN body trained on WikiText-2 as
bytes, bpe:1000, bpe:8000 and words, each for the same wall-clock time on one machine,
all scored in bits per byte of the same test text and in word perplexity.

Everything goes through the command line, one subprocess per step, so that each run is
isolated and every number is the CLI's own. For each tokenizer (``--tokenizers``), then
each seed (``--seeds``), one after another:

1. ``sharnn prepare wikitext-2 [--source SOURCE] --tokenizer T --out DATA/wikitext-2-NAME``
   (NAME: ``bytes``, ``words``, ``bpe1k`` for ``bpe:1000``, ``bpe8k``, ``bpe1500`` ...),
   skipped when that folder exists and its ``meta.json`` names WikiText-2 and ``T``;
2. ``sharnn train --preset P --out RUNS/NAME-seedS --quiet max_steps=0 epochs=1000
   [overrides] max_seconds=SECONDS seed=S data=DIR [model.vocab_size=V]``, with P the
   ``wikitext2-bytes-tiny``, ``wikitext2-bpe8k-tiny`` (every ``bpe:N``, its vocabulary
   set to the corpus's) or ``wikitext2-words-tiny`` preset: one body (d 256, 2 layers,
   Boom 1024, span 192, bptt 128, no dropout), so only the tokenization differs. The
   budget ``max_seconds`` alone stops a run (``max_steps=0 epochs=1000`` come first, the
   trailing overrides may change them: the ``stopped by`` column says). As
   ``TrainConfig.max_seconds`` counts it, the budget is training wall clock (validation
   runs once, after it; the test of the best checkpoint comes after that). A run folder
   with ``summary.json`` is reused; one without is continued with ``sharnn train
   --resume``; either must hold the configuration planned here (else an error: choose
   another ``--runs``), so an interrupted experiment resumes by running the same command;
3. ``sharnn analyze tokenization RUN --split test [--max-tokens N] --out RUN/analysis``,
   skipped when ``RUN/analysis/tokenization-test.json`` is newer than ``summary.json``
   and scored the same number of tokens.

Reported per run, from the run's ``summary.json``, ``metrics.jsonl``, the corpus's
``meta.json`` and the analysis JSON: vocabulary, parameters, steps, training seconds
(the training clock at the last step, as the last validation record of ``metrics.jsonl``
gives it, earlier validations included if an override asks for any; summary.json's
``train_seconds`` also counts that last validation, minutes for a whole WikiText-2 split
on a CPU, and is in the JSON as ``summary_train_seconds``), tokens/s (the median over the
logged training intervals, which count training time only), the text seen in training
(``epochs`` of ``summary.json`` times the train split's bytes, and as epochs), valid BPC
(the one validation, at the end), test BPC and test word perplexity (the best checkpoint
on the whole test split: WikiText's words plus one ``<eos>`` per line), test bits per
token (``nats / ln 2`` of the test record), and the analysis's share of the bits on
words' first characters (bytes) or first pieces (bpe:N; over the first
``--analyze-tokens`` tokens of the test split when given). With several seeds, a table
per tokenizer: the mean and the spread (min-max). Then the Markdown of that table (for
docs/tokenization.md), the byte model's bits by character position (mean surprisal and
predictive entropy per character, share of bits), its naive word perplexities
``2^(BPC * Nc / Nw)`` beside the exact one, and the bpe models' bits per word by number
of pieces, all from the analysis JSON.

Speed is whatever the machine gives while the run runs: run nothing else beside it.
Torch's thread count is the subprocesses' own (``OMP_NUM_THREADS`` is passed on).

    python benchmarks/tokenization.py --data data --runs runs/tokenization --seconds 600
    python benchmarks/tokenization.py --seconds 600 --seeds 1,2,3 --plot benchmarks/results/tokenization.png

JSON in ``benchmarks/results/tokenization.json`` unless ``--json PATH``, rewritten after
every run (every number, the commands run with their exit status and seconds, the
machine: CPU count, torch version, date); a PNG with ``--plot PATH``: (a) test BPC per
tokenization (bars: the mean over seeds; points: the seeds), (b) training curves (train
bits per byte against training seconds; for token models the train estimate, bits per
token over the train split's mean bytes per token), (c) the byte model's mean surprisal
and entropy by character position, (d) bits per word by number of pieces (bpe models).
Exit status 0; 1 when a step failed (the others still run); 2 for a usage error; 130 or
143 when interrupted (the same command resumes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from common import environment, print_table, stop_reason, write_json
from sharnn.config import config_changes, load_config
from sharnn.errors import SharnnError
from sharnn.runtime import resolve_device
from sharnn.training.metrics import read_records

DEFAULT_TOKENIZERS = "bytes,bpe:1000,bpe:8000,words"
PRESETS = {"bytes": "wikitext2-bytes-tiny", "bpe": "wikitext2-bpe8k-tiny", "words": "wikitext2-words-tiny"}
# Set before the user's overrides, so that the budget is what stops a run.
BUDGET_DEFAULTS = ["max_steps=0", "epochs=1000"]
# Set by options or by the tokenizer; refused as overrides.
OPTION_KEYS = {
    "max_seconds": "--seconds",
    "seed": "--seeds",
    "data": "--data and --tokenizers",
    "model.vocab_size": "--tokenizers",
}
SHARNN = [sys.executable, "-m", "sharnn"]
ANALYSIS_FILE = "tokenization-test.json"
INTERRUPTED = (130, 143)
# Per-run numbers that get a mean and a spread over seeds.
NUMBERS = [
    "parameters",
    "steps",
    "train_seconds",
    "tokens_per_s",
    "text_bytes",
    "text_epochs",
    "valid_bpc",
    "test_bpc",
    "test_word_perplexity",
    "test_bits_per_token",
    "first_share",
]


class ExperimentError(SharnnError):
    """A prepared corpus or a run folder that is not what this experiment plans."""


# ----------------------------------------------------------------------------- plan


def parse_tokenizers(text: str) -> list[str]:
    """``bytes,bpe:1000,...`` as a list; each ``bytes``, ``words`` or ``bpe:N`` (N >= 1),
    none twice. Raises ValueError."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("no tokenizer given")
    for name in names:
        if name in ("bytes", "words"):
            continue
        kind, _, size = name.partition(":")
        if kind != "bpe" or not size.isdigit() or int(size) < 1:
            raise ValueError(f"unknown tokenizer {name!r} (bytes, words or bpe:N)")
    if len(set(names)) != len(names):
        raise ValueError(f"a tokenizer is given twice in {text!r}")
    return names


def parse_seeds(text: str) -> list[int]:
    """``1,2,3`` as distinct ints. Raises ValueError."""
    seeds = [int(s) for s in text.split(",") if s.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"give distinct integer seeds, e.g. 1,2,3 (not {text!r})")
    return seeds


def short_name(tokenizer: str) -> str:
    """``bytes``, ``words``, ``bpe1k`` (bpe:1000), ``bpe8k``, ``bpe1500``: names folders."""
    if not tokenizer.startswith("bpe:"):
        return tokenizer
    size = int(tokenizer[4:])
    return f"bpe{size // 1000}k" if size % 1000 == 0 else f"bpe{size}"


def corpus_folder(data: Path, tokenizer: str) -> Path:
    return data / f"wikitext-2-{short_name(tokenizer)}"


def run_folder(runs: Path, tokenizer: str, seed: int) -> Path:
    return runs / f"{short_name(tokenizer)}-seed{seed}"


def preset_for(tokenizer: str) -> str:
    return PRESETS[tokenizer.split(":")[0]]


def read_meta(folder: Path, tokenizer: str) -> dict | None:
    """The ``meta.json`` of a prepared corpus of WikiText-2 with ``tokenizer``; None when
    ``folder`` does not exist. Raises ExperimentError for any other folder."""
    if not folder.exists():
        return None
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise ExperimentError(
            f"{folder} exists but has no readable meta.json ({e}): remove it or give another --data"
        ) from e
    if meta.get("name") != "wikitext-2" or meta.get("tokenizer") != tokenizer:
        raise ExperimentError(
            f"{folder} holds {meta.get('name')} with the {meta.get('tokenizer')} tokenizer, not "
            f"wikitext-2 with {tokenizer}: remove it or give another --data"
        )
    return meta


def train_overrides(
    tokenizer: str, seed: int, seconds: float, corpus: Path, meta: dict | None, overrides: list[str]
) -> list[str]:
    """The ``key=value`` overrides of one run: budget defaults, the user's, then the
    experiment's own (budget, seed, data, and a bpe model's vocabulary)."""
    forced = [f"max_seconds={seconds:g}", f"seed={seed}", f"data={corpus}"]
    if tokenizer.startswith("bpe:"):
        forced.append(f"model.vocab_size={meta['vocab_size'] if meta else int(tokenizer[4:])}")
    return BUDGET_DEFAULTS + list(overrides) + forced


# ----------------------------------------------------------------------------- results of one run


def train_curve(records: list[dict]) -> list[dict]:
    """The training records of metrics.jsonl as ``step``, ``seconds`` and ``bpc`` (bits per
    byte; for token models, bits per token over the train split's mean bytes per token)."""
    return [{"step": r["step"], "seconds": r["seconds"], "bpc": r["bpc"]} for r in records if r.get("split") == "train"]


def summarize_run(tokenizer: str, seed: int, run_dir: Path, meta: dict, analysis: dict | None, config=None) -> dict:
    """One run's row: its ``summary.json``, ``metrics.jsonl`` and corpus ``meta.json``, and
    the analysis report (None: not analyzed). Keys: module docstring; ``first_share`` is
    ``first_character_share`` (bytes) or ``first_piece_share`` (bpe), None for words.
    ``train_seconds`` is the training clock at the last step (the ``seconds`` of the last
    validation record, which the validation itself does not count);
    ``summary_train_seconds`` is summary.json's, which counts the last validation too.
    ``train_commands``: the command lines that started and resumed the run (its ``run``
    records), so that a reused run keeps them."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_records(run_dir)
    rates = [r["tokens_per_s"] for r in records if r.get("split") == "train" and "tokens_per_s" in r]
    tests = [r for r in records if r.get("split") == "test"]
    test = tests[-1] if tests else {}
    valids = [r for r in records if r.get("split") == "valid" and "seconds" in r]
    first_share = None
    if analysis is not None:
        first_share = analysis.get("first_character_share", analysis.get("first_piece_share"))
    train_bytes, train_tokens = meta["train_bytes"], meta["train_tokens"]
    return {
        "tokenizer": tokenizer,
        "seed": seed,
        "run_dir": str(run_dir),
        "vocabulary": meta["vocab_size"],
        "parameters": summary["parameters"],
        "steps": summary["steps"],
        "train_seconds": valids[-1]["seconds"] if valids else summary["train_seconds"],
        "summary_train_seconds": summary["train_seconds"],
        "stopped_by": stop_reason(config, summary) if config is not None else None,
        "tokens_per_s": statistics.median(rates) if rates else None,
        "train_bytes_per_token": train_bytes / train_tokens,
        "text_epochs": summary["epochs"],
        "text_tokens": summary["epochs"] * train_tokens,
        "text_bytes": summary["epochs"] * train_bytes,
        "valid_bpc": summary["valid_bpc"],
        "test_bpc": summary["test_bpc"],
        "test_word_perplexity": summary.get("test_word_perplexity"),
        "test_bits_per_token": test["nats"] / math.log(2) if "nats" in test else None,
        "test_perplexity": summary.get("test_perplexity"),
        "first_share": first_share,
        "analysis_tokens": analysis.get("tokens") if analysis else None,
        "analysis_totals": analysis.get("totals") if analysis else None,
        "train_curve": train_curve(records),
        "train_commands": [r["command"] for r in records if r.get("split") == "run" and "command" in r],
    }


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per tokenizer (in the order first met): ``seeds``, ``runs`` and, for every
    key of :data:`NUMBERS`, ``KEY`` (the mean over the runs that have it), ``KEY_min`` and
    ``KEY_max`` (None when no run has it)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault(row["tokenizer"], []).append(row)
    result = []
    for tokenizer, runs in groups.items():
        out = {
            "tokenizer": tokenizer,
            "vocabulary": runs[0]["vocabulary"],
            "seeds": [r["seed"] for r in runs],
            "runs": len(runs),
        }
        for key in NUMBERS:
            values = [r[key] for r in runs if r.get(key) is not None]
            out[key] = statistics.fmean(values) if values else None
            out[f"{key}_min"] = min(values) if values else None
            out[f"{key}_max"] = max(values) if values else None
        result.append(out)
    return result


# ----------------------------------------------------------------------------- output


def spread(group: dict, key: str, spec: str) -> str:
    """``mean`` or, over several runs, ``mean (min-max)``; '-' when missing."""
    if group.get(key) is None:
        return "-"
    text = format(group[key], spec)
    if group["runs"] > 1:
        text += f" ({format(group[f'{key}_min'], spec)}-{format(group[f'{key}_max'], spec)})"
    return text


MARKDOWN_COLUMNS = [  # (header, key, format spec, percent)
    ("vocabulary", "vocabulary", ",", False),
    ("parameters", "parameters", ",.0f", False),
    ("steps", "steps", ",.0f", False),
    ("training s", "train_seconds", ",.0f", False),
    ("tokens/s", "tokens_per_s", ",.0f", False),
    ("text seen (MB)", "text_bytes", ".2f", False),
    ("epochs", "text_epochs", ".3f", False),
    ("valid BPC", "valid_bpc", ".4f", False),
    ("test BPC", "test_bpc", ".4f", False),
    ("test word ppl", "test_word_perplexity", ",.1f", False),
    ("test bits/token", "test_bits_per_token", ".3f", False),
    ("bits on first char/piece", "first_share", ".1f", True),
]


def markdown_table(groups: list[dict]) -> str:
    """The per-tokenizer table in Markdown; cells ``mean`` or ``mean (min-max)``."""
    lines = [
        "| tokenization | seeds | " + " | ".join(h for h, *_ in MARKDOWN_COLUMNS) + " |",
        "|---|---:|" + "---:|" * len(MARKDOWN_COLUMNS),
    ]
    for g in groups:
        cells = []
        for _, key, spec, percent in MARKDOWN_COLUMNS:
            if key == "vocabulary":
                cells.append(format(g[key], spec))
                continue
            view = dict(g)
            scale = 1e-6 if key == "text_bytes" else 100 if percent else 1
            for suffix in ("", "_min", "_max"):
                if view.get(key + suffix) is not None:
                    view[key + suffix] = view[key + suffix] * scale
            cell = spread(view, key, spec)
            cells.append(cell + ("%" if percent and cell != "-" else ""))
        lines.append(f"| {g['tokenizer']} | {len(g['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


RUN_COLUMNS = [
    ("tokenizer", "tokenizer", ""),
    ("seed", "seed", ""),
    ("vocabulary", "vocab", ","),
    ("parameters", "params", ","),
    ("steps", "steps", ","),
    ("train_seconds", "train s", ".0f"),
    ("stopped_by", "stopped by", ""),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("train_bytes_per_token", "bytes/token", ".3f"),
    ("text_mb", "seen (MB)", ".2f"),
    ("text_epochs", "epochs", ".3f"),
    ("valid_bpc", "valid BPC", ".4f"),
    ("test_bpc", "test BPC", ".4f"),
    ("test_word_perplexity", "test word ppl", ",.1f"),
    ("test_bits_per_token", "test bits/tok", ".3f"),
    ("first_pct", "first char/piece %", ".1f"),
]


def print_runs(rows: list[dict]) -> None:
    shown = []
    for r in rows:
        row = dict(r)
        row["text_mb"] = r["text_bytes"] / 1e6 if r.get("text_bytes") is not None else None
        row["first_pct"] = 100 * r["first_share"] if r.get("first_share") is not None else None
        shown.append(row)
    print_table(shown, RUN_COLUMNS + ([("error", "error", "")] if any("error" in r for r in rows) else []))


def print_groups(groups: list[dict]) -> None:
    """Per tokenizer, mean (min-max) over seeds."""
    columns = [
        ("valid_bpc", "valid BPC", ".4f"),
        ("test_bpc", "test BPC", ".4f"),
        ("test_word_perplexity", "test word ppl", ",.1f"),
        ("test_bits_per_token", "test bits/tok", ".3f"),
        ("steps", "steps", ",.0f"),
        ("tokens_per_s", "tokens/s", ",.0f"),
        ("first_share", "first share", ".3f"),
    ]
    shown = [
        {
            "tokenizer": g["tokenizer"],
            "seeds": ",".join(map(str, g["seeds"])),
            **{key: spread(g, key, spec) for key, _, spec in columns},
        }
        for g in groups
    ]
    print_table(shown, [("tokenizer", "tokenizer", ""), ("seeds", "seeds", "")] + [(k, h, "") for k, h, _ in columns])


def print_analyses(runs: list[dict]) -> None:
    """The analysis tables of every analyzed run: byte positions and conversions, bpe pieces."""
    for run in runs:
        report = run.get("analysis")
        if not report:
            continue
        name = f"{run['tokenizer']} seed {run['seed']}"
        where = f"first {report['tokens']:,} test tokens"
        if report["kind"] == "bytes":
            print(f"\n{name}: bits by character position in the word ({where})")
            print_table(
                report["positions"],
                [
                    ("position", "position", ""),
                    ("characters", "characters", ","),
                    ("surprisal", "surprisal (bits)", ".3f"),
                    ("entropy", "entropy (bits)", ".3f"),
                    ("share", "share of bits", ".3f"),
                ],
            )
            print(f"\n{name}: word perplexity from bits per byte, 2^(BPC * Nc / Nw), beside the exact one ({where})")
            print_table(
                report["conversion"],
                [
                    ("nc", "Nc", ""),
                    ("count", "count", ","),
                    ("per_word", "Nc/Nw", ".3f"),
                    ("perplexity", "perplexity", ",.2f"),
                    ("vs_exact", "vs exact", ".3f"),
                ],
            )
        elif report["kind"] == "bpe":
            print(
                f"\n{name}: bits per word by number of pieces ({where}); "
                f"first pieces hold {report['first_piece_share']:.3f} of the bits"
            )
            print_table(
                report["pieces"],
                [
                    ("pieces", "pieces", ""),
                    ("words", "words", ","),
                    ("bits_per_word", "bits/word", ".3f"),
                    ("first_share", "first-piece share", ".3f"),
                    ("share", "share of bits", ".3f"),
                ],
            )
        else:
            totals = report["totals"]
            print(
                f"\n{name}: {totals['words']:,} words scored ({where}), {totals['bits_per_word']:.4f} bits per word, "
                f"word perplexity {totals['word_perplexity']:,.2f}"
            )


def plot(result: dict, path: Path) -> None:
    """The four panels of the module docstring, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if "error" not in r]
    groups = result["tokenizers"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (bars, curves), (positions, pieces) = axes
    colors = {g["tokenizer"]: f"C{i}" for i, g in enumerate(groups)}

    x = range(len(groups))
    bars.bar(x, [g["test_bpc"] for g in groups], 0.6, color=[colors[g["tokenizer"]] for g in groups], alpha=0.6)
    for i, g in enumerate(groups):
        seeds = [r["test_bpc"] for r in runs if r["tokenizer"] == g["tokenizer"]]
        bars.plot([i] * len(seeds), seeds, "k.", markersize=8)
    bars.set_xticks(list(x), [g["tokenizer"] for g in groups])
    bars.set_ylabel("test bits per byte")
    bars.set_title(f"(a) test BPC after {result['seconds']:g} s of training (points: seeds)")
    bars.grid(axis="y", alpha=0.3)

    for r in runs:
        curve = r["train_curve"]
        curves.plot(
            [p["seconds"] for p in curve],
            [p["bpc"] for p in curve],
            color=colors[r["tokenizer"]],
            label=f"{r['tokenizer']} seed {r['seed']}",
            linewidth=1,
        )
    curves.set_xlabel("training seconds")
    curves.set_ylabel("train bits per byte (token models: estimate)")
    curves.set_title("(b) training curves")
    curves.grid(alpha=0.3)
    if runs:
        curves.legend(fontsize=8)

    byte_reports = [r["analysis"] for r in runs if r.get("analysis") and r["analysis"]["kind"] == "bytes"]
    if byte_reports:
        labels = [row["position"] for row in byte_reports[0]["positions"]]
        for key, style in (("surprisal", "o-"), ("entropy", "s--")):
            mean = [_mean_of([rep["positions"][i][key] for rep in byte_reports]) for i in range(len(labels))]
            positions.plot(range(len(labels)), mean, style, label=key)
        positions.set_xticks(range(len(labels)), ["ws" if label == "whitespace" else label for label in labels])
        positions.legend()
    positions.set_xlabel("character position in the word (ws: whitespace)")
    positions.set_ylabel("mean bits per character")
    positions.set_title("(c) byte model: bits by character position" + ("" if byte_reports else " (no byte run)"))
    positions.grid(alpha=0.3)

    for g in groups:
        reports = [
            r["analysis"]
            for r in runs
            if r["tokenizer"] == g["tokenizer"] and r.get("analysis") and r["analysis"]["kind"] == "bpe"
        ]
        if reports:
            labels = [row["pieces"] for row in reports[0]["pieces"]]
            mean = [_mean_of([rep["pieces"][i]["bits_per_word"] for rep in reports]) for i in range(len(labels))]
            pieces.plot(range(len(labels)), mean, "o-", color=colors[g["tokenizer"]], label=g["tokenizer"])
            pieces.set_xticks(range(len(labels)), labels)
    pieces.set_xlabel("pieces in the word")
    pieces.set_ylabel("mean bits per word")
    pieces.set_title("(d) bpe models: bits per word by number of pieces")
    pieces.grid(alpha=0.3)
    if pieces.get_legend_handles_labels()[0]:
        pieces.legend()
    fig.suptitle("WikiText-2, one SHA-RNN body, the same training time per tokenization (paper §6.1)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def _mean_of(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


# ----------------------------------------------------------------------------- running


class Step(Exception):
    """A command failed (``code``: its exit status)."""

    def __init__(self, command: str, code: int):
        super().__init__(f"exit status {code}: {command}")
        self.code = code


def run_command(args: list[str], log: list[dict]) -> None:
    """Print and run ``python -m sharnn ARGS`` (its output shown as it comes); log it.
    Raises Step when it fails."""
    command = [*SHARNN, *[str(a) for a in args]]
    text = shlex.join(command)
    print(f"\n$ {text}", flush=True)
    started = time.perf_counter()
    code = subprocess.run(command).returncode
    log.append({"command": text, "returncode": code, "seconds": round(time.perf_counter() - started, 1)})
    if code != 0:
        raise Step(text, code)


def check_run_config(run_dir: Path, planned) -> None:
    """Refuse a run folder whose configuration is not the planned one."""
    try:
        existing = load_config(str(run_dir))
    except SharnnError as e:
        raise ExperimentError(f"{run_dir} exists but its config cannot be read ({e}): choose another --runs") from None
    changes = config_changes(existing, planned)
    if changes:
        listed = ", ".join(f"{k} {old} (run) vs {new} (planned)" for k, (old, new) in list(changes.items())[:4])
        raise ExperimentError(
            f"{run_dir} was started with another configuration ({listed}): choose another --runs "
            f"or give the options it was started with"
        )


def read_analysis(run_dir: Path, expected_tokens: int) -> dict | None:
    """The run's test analysis, if it is newer than its summary and scored ``expected_tokens``."""
    file = run_dir / "analysis" / ANALYSIS_FILE
    try:
        if file.stat().st_mtime < (run_dir / "summary.json").stat().st_mtime:
            return None
        report = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return report if report.get("tokens") == expected_tokens and report.get("split") == "test" else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=None, help="WikiText-2 for `sharnn prepare` [default: the bundled copy]")
    parser.add_argument(
        "--data", default="data", help="folder of the prepared corpora, reused when there [%(default)s]"
    )
    parser.add_argument(
        "--tokenizers", default=DEFAULT_TOKENIZERS, help="comma list: bytes, words, bpe:N [%(default)s]"
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="training wall clock per run [%(default)s]")
    parser.add_argument("--seeds", default="1", help="comma list of seeds, each a run per tokenizer [%(default)s]")
    parser.add_argument(
        "--runs", default="runs/tokenization", help="run folders; finished runs are reused [%(default)s]"
    )
    parser.add_argument(
        "--analyze-tokens",
        type=int,
        default=None,
        metavar="N",
        help="analyze only the first N tokens of the test split [all]",
    )
    parser.add_argument("--json", default=None, help="results file [benchmarks/results/tokenization.json]")
    parser.add_argument("--plot", default=None, help="PNG of the four panels [none]")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args(argv)

    try:
        tokenizers, seeds = parse_tokenizers(args.tokenizers), parse_seeds(args.seeds)
    except ValueError as e:
        parser.error(str(e))
    if not args.seconds > 0:
        parser.error("--seconds must be > 0")
    if args.analyze_tokens is not None and args.analyze_tokens < 2:
        parser.error("--analyze-tokens must be >= 2")
    for item in args.overrides:
        key = item.split("=", 1)[0]
        if "=" not in item:
            parser.error(f"override {item!r} must look like key=value")
        if key in OPTION_KEYS:
            parser.error(f"{key} is set by {OPTION_KEYS[key]}, not as an override")

    data, runs_dir = Path(args.data), Path(args.runs)
    plan = []  # (tokenizer, seed, corpus folder, run folder, overrides), checked before the first step
    try:
        for tokenizer in tokenizers:
            corpus = corpus_folder(data, tokenizer)
            meta = read_meta(corpus, tokenizer)
            for seed in seeds:
                overrides = train_overrides(tokenizer, seed, args.seconds, corpus, meta, args.overrides)
                config = load_config(preset_for(tokenizer), overrides)
                run_dir = run_folder(runs_dir, tokenizer, seed)
                if run_dir.exists() and meta is not None:
                    check_run_config(run_dir, config)
                plan.append((tokenizer, seed, corpus, run_dir, overrides))
        device = resolve_device(config.device)
    except SharnnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(
        f"{len(plan)} run(s) of {args.seconds:g} s of training each, one after another: "
        f"{', '.join(tokenizers)} x seed {', '.join(map(str, seeds))}; corpora in {data}, run folders in {runs_dir}",
        flush=True,
    )
    result = {
        "question": "WikiText-2 as bytes, bpe:N and words, one SHA-RNN body, the same training time each (paper §6.1)",
        "environment": environment(device)
        | {
            "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "platform": sys.platform,
        },
        "seconds": args.seconds,
        "seeds": seeds,
        "tokenizers_requested": tokenizers,
        "source": args.source,
        "data": str(data),
        "runs_folder": str(runs_dir),
        "analyze_tokens": args.analyze_tokens,
        "overrides": args.overrides,
        "commands": [],
        "runs": [],
        "tokenizers": [],
    }
    failed, interrupted = False, None
    metas: dict[str, dict] = {}
    for tokenizer, seed, corpus, run_dir, overrides in plan:
        name = f"{tokenizer} seed {seed}"
        print(f"\n=== {name}: {run_dir}", flush=True)
        preset = preset_for(tokenizer)
        try:
            if tokenizer not in metas:
                meta = read_meta(corpus, tokenizer)
                if meta is None:
                    source = ["--source", args.source] if args.source else []
                    run_command(
                        ["prepare", "wikitext-2", *source, "--tokenizer", tokenizer, "--out", corpus],
                        result["commands"],
                    )
                    meta = read_meta(corpus, tokenizer)
                else:
                    print(f"reusing the prepared corpus {corpus}")
                metas[tokenizer] = meta
            meta = metas[tokenizer]
            overrides = train_overrides(tokenizer, seed, args.seconds, corpus, meta, args.overrides)
            config = load_config(preset, overrides)
            if (run_dir / "summary.json").is_file():
                check_run_config(run_dir, config)
                print(f"reusing the finished run {run_dir}")
            elif run_dir.exists():
                check_run_config(run_dir, config)
                run_command(["train", "--resume", run_dir, "--quiet"], result["commands"])
            else:
                run_command(["train", "--preset", preset, "--out", run_dir, "--quiet", *overrides], result["commands"])
            expected = (
                meta["test_tokens"] if args.analyze_tokens is None else min(args.analyze_tokens, meta["test_tokens"])
            )
            analysis = read_analysis(run_dir, expected)
            if analysis is None:
                limit = [] if args.analyze_tokens is None else ["--max-tokens", args.analyze_tokens]
                run_command(
                    ["analyze", "tokenization", run_dir, "--split", "test", *limit, "--out", run_dir / "analysis"],
                    result["commands"],
                )
                analysis = read_analysis(run_dir, expected)
                if analysis is None:
                    raise ExperimentError(f"the analysis of {run_dir} wrote no {ANALYSIS_FILE} of {expected:,} tokens")
            else:
                print(f"reusing the analysis {run_dir / 'analysis' / ANALYSIS_FILE}")
            row = summarize_run(tokenizer, seed, run_dir, meta, analysis, config)
            row |= {"preset": preset, "overrides": overrides, "analysis": analysis}
        except Step as e:
            print(f"error: {name}: {e}", file=sys.stderr, flush=True)
            row = {"tokenizer": tokenizer, "seed": seed, "run_dir": str(run_dir), "error": str(e)}
            if e.code in INTERRUPTED:
                interrupted = e.code
            failed = True
        except SharnnError as e:
            print(f"error: {name}: {e}", file=sys.stderr, flush=True)
            row = {"tokenizer": tokenizer, "seed": seed, "run_dir": str(run_dir), "error": str(e)}
            failed = True
        except KeyboardInterrupt:
            interrupted = 130
            row = {"tokenizer": tokenizer, "seed": seed, "run_dir": str(run_dir), "error": "interrupted"}
        result["runs"].append(row)
        result["tokenizers"] = aggregate(result["runs"])
        write_json(result, "tokenization.json", args.json)
        if interrupted:
            print("interrupted: run the same command again to resume (finished runs are reused)", file=sys.stderr)
            return interrupted

    rows = result["runs"]
    print(
        f"\nWikiText-2 after {args.seconds:g} s of training per run, scored on the whole test split "
        f"(BPC: bits per byte of the same text; word perplexity: words + one <eos> per line; tokens/s: median of the "
        f"training log; seen: the text the training went through; first char/piece %: share of the analyzed "
        f"bits on words' first characters or first pieces)"
    )
    print_runs(rows)
    groups = result["tokenizers"]
    if len(seeds) > 1 and groups:
        print("\nper tokenizer over seeds: mean (min-max)")
        print_groups(groups)
    print_analyses([r for r in rows if "error" not in r])
    if groups:
        print("\nMarkdown (docs/tokenization.md):\n")
        print(markdown_table(groups))
    print(f"\ncommands run: {len(result['commands'])}")
    write_json(result, "tokenization.json", args.json)
    if args.plot and groups:
        plot(result, Path(args.plot))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
