"""The report of ``sharnn analyze tokenization`` (:func:`sharnn.analysis.analyze`) as a
reader gets it: plain aligned tables (:func:`format_report`), and the JSON and figures
written beside them (:func:`write_report`, whose destination :func:`check_destination`
checks before the analysis; docs/tokenization.md).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .files import write_atomically

_FIGURES = {"bytes": "positions", "bpe": "pieces"}  # the figure of each kind of report, by its file's suffix


def format_report(report: dict) -> str:
    """The report of :func:`analyze` as plain aligned tables."""
    totals = report["totals"]
    where = f"{report['data']} ({report['split']})" if "data" in report else "the data"
    lines = [
        f"{where}: {report['tokens']:,} tokens ({report['tokenizer']}), {totals['tokens']:,} predicted, "
        f"{report['streams']} streams, windows of {report['bptt']}",
        f"bits per token {_format(totals['bits_per_token'], '.4f')}, "
        f"per byte {_format(totals['bits_per_byte'], '.4f')}, per word {_format(totals['bits_per_word'], '.4f')} "
        f"({totals['words']:,} words with one <eos> per line); "
        f"word perplexity {_format(totals['word_perplexity'], ',.2f')}",
    ]
    if report["kind"] == "bytes":
        lines += [""] + _byte_tables(report)
    elif report["kind"] == "bpe":
        lines += [""] + _piece_tables(report)
    return "\n".join(lines)


def _byte_tables(report: dict) -> list[str]:
    """The byte model's tables: by position, by frequency, the naive conversion."""
    totals = report["totals"]
    lines = ["bits by character position in the word (words: runs of non-whitespace characters)"]
    lines += table_lines(
        report["positions"],
        [
            ("position", "position", ""),
            ("characters", "characters", ","),
            ("surprisal", "surprisal (bits)", ".3f"),
            ("entropy", "entropy (bits)", ".3f"),
            ("share", "share of bits", ".1%"),
        ],
    )
    first = report["positions"][0]
    counted = sum(r["characters"] for r in report["positions"])
    lines.append(
        f"first characters: {_format(first['characters'] / counted if counted else None, '.1%')} of the characters, "
        f"{_format(report['first_character_share'], '.1%')} of the bits"
    )
    lines += ["", "bits per word by the word's count in the train split"]
    lines += table_lines(
        report["frequency"],
        [
            ("frequency", "train count", ""),
            ("words", "words", ","),
            ("characters", "chars/word", ".2f"),
            ("bits_per_word", "bits/word", ".3f"),
            ("first_share", "first-char share (mean)", ".1%"),
        ],
    )
    counts = report["counts"]
    lines += [
        "",
        f"word perplexity from bits per byte: 2^(BPC * Nc / Nw), BPC {totals['bits_per_byte']:.4f}, "
        f"Nw = {counts['words']:,} words + {counts['lines']:,} lines = {counts['words'] + counts['lines']:,}",
    ]
    lines += table_lines(
        report["conversion"],
        [
            ("nc", "Nc", ""),
            ("count", "count", ","),
            ("per_word", "Nc/Nw", ".3f"),
            ("perplexity", "perplexity", ",.2f"),
            ("vs_exact", "vs exact", ".3f"),
        ],
    )
    lines.append(
        "note: with Nc = bytes the conversion is the exact figure by construction (BPC * bytes = total bits); "
        "other countings of Nc rescale the exponent"
    )
    return lines


def _piece_tables(report: dict) -> list[str]:
    """The wordpiece model's table: bits per word by number of pieces."""
    lines = ["bits per word by its number of pieces (a word starts at a piece beginning with a space)"]
    lines += table_lines(
        report["pieces"],
        [
            ("pieces", "pieces", ""),
            ("words", "words", ","),
            ("bits_per_word", "bits/word", ".3f"),
            ("first_share", "first-piece share (mean)", ".1%"),
            ("share", "share of bits", ".1%"),
        ],
    )
    lines.append(f"first pieces: {_format(report['first_piece_share'], '.1%')} of the bits")
    return lines


def table_lines(rows: list[dict], columns: list[tuple[str, str, str]]) -> list[str]:
    """``rows`` under ``columns`` = ``(key, header, format spec)``, missing values as '-',
    the first column left-aligned, a rule under the headers (the benchmarks print theirs
    with it too)."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append([_format(row.get(key), spec) for key, _, spec in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))) for line in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _format(value, spec: str) -> str:
    """``format(value, spec)``, or '-' for None."""
    return "-" if value is None else format(value, spec)


def report_files(folder: str | Path, split: str, kind: str) -> list[Path]:
    """The files :func:`write_report` writes into ``folder`` for a report of ``split``
    (``data`` for a report of no split) and ``kind`` (``bytes``, ``bpe`` or ``words``):
    ``tokenization-SPLIT.json``, then for bytes and bpe a PNG figure
    (``tokenization-SPLIT-positions.png``, ``tokenization-SPLIT-pieces.png``)."""
    folder, stem = Path(folder), f"tokenization-{split}"
    paths = [folder / f"{stem}.json"]
    if kind in _FIGURES:
        paths.append(folder / f"{stem}-{_FIGURES[kind]}.png")
    return paths


def check_destination(folder: str | Path, split: str, kind: str) -> list[Path]:
    """Check, before any work, that :func:`write_report` can write a report of ``split``
    and ``kind`` into ``folder``: a folder, or a name that can be made one (its nearest
    existing folder writable), in which each of :func:`report_files` is a file, a
    symbolic link (replaced, never written through) or nothing yet. An existing report
    is replaced. Returns :func:`report_files`.

    Raises:
        ConfigError: naming what is in the way.
    """
    folder = Path(folder)
    if os.path.lexists(folder):
        if not folder.is_dir():
            raise ConfigError(f"{folder} is not a folder: give --out a folder, or a new name, for the report")
        nearest = folder
    else:
        nearest = folder.absolute().parent
        while not os.path.lexists(nearest):
            nearest = nearest.parent
        if not nearest.is_dir():
            raise ConfigError(f"{folder} cannot be made: {nearest} is not a folder")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise ConfigError(f"{nearest} is not writable: give --out a folder this user can write in")
    paths = report_files(folder, split, kind)
    for path in paths:
        if not path.is_symlink() and os.path.lexists(path) and not path.is_file():
            raise ConfigError(f"{path} is in the way of the report: it is not a file (move it, or give another --out)")
    return paths


def write_report(report: dict, folder: str | Path) -> list[Path]:
    """Write :func:`report_files` into ``folder`` (created if needed, having passed
    :func:`check_destination`), atomically. Returns the paths written.

    Raises:
        ConfigError: from :func:`check_destination`.
        OSError: the file system refused.
    """
    folder = Path(folder)
    paths = check_destination(folder, report.get("split", "data"), report["kind"])
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(paths[0], json.dumps(report, indent=2, default=_json_number) + "\n")
    if len(paths) > 1:
        figure = {"bytes": _positions_figure, "bpe": _pieces_figure}[report["kind"]]
        write_atomically(paths[1], _png(figure(report)))
    return paths


def _positions_figure(report: dict):
    plt = _pyplot()
    rows = report["positions"]
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(x - 0.2, [r["surprisal"] or 0 for r in rows], 0.4, label="surprisal")
    left.bar(x + 0.2, [r["entropy"] or 0 for r in rows], 0.4, label="predictive entropy")
    left.set_ylabel("mean bits per character")
    right.bar(x, [100 * (r["share"] or 0) for r in rows], 0.6, color="tab:green")
    right.set_ylabel("share of all bits (%)")
    for axis in (left, right):
        axis.set_xticks(x, ["ws" if r["position"] == "whitespace" else r["position"] for r in rows])
        axis.set_xlabel("character position in the word (ws: whitespace)")
        axis.grid(axis="y", alpha=0.3)
    left.legend()
    fig.suptitle(f"{report.get('data', '')} {report.get('split', '')}: bits by character position (paper §6.1)")
    fig.tight_layout()
    return fig


def _pieces_figure(report: dict):
    plt = _pyplot()
    rows = report["pieces"]
    x = np.arange(len(rows))
    words = [r["bits_per_word"] or 0 for r in rows]
    fig, axis = plt.subplots(figsize=(6, 4))
    axis.bar(x, words, 0.6, label="whole word")
    axis.bar(x, [w * (r["first_share"] or 0) for w, r in zip(words, rows)], 0.6, label="first piece (mean share)")
    axis.set_xticks(x, [r["pieces"] for r in rows])
    axis.set_xlabel("pieces in the word")
    axis.set_ylabel("mean bits per word")
    axis.grid(axis="y", alpha=0.3)
    axis.legend()
    fig.suptitle(f"{report.get('data', '')} {report.get('split', '')}: bits per word by pieces ({report['tokenizer']})")
    fig.tight_layout()
    return fig


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    _pyplot().close(fig)
    return image.getvalue()


def _json_number(value):
    """numpy scalars as Python numbers for ``json.dumps``."""
    return value.item() if isinstance(value, np.generic) else str(value)
