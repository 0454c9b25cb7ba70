"""``sharnn analyze tokenization``: :func:`analyze_tokenization` computes where a model's
bits fall within words, and :func:`write_and_describe` writes its files and gives the lines
the command prints.
"""

from __future__ import annotations

from pathlib import Path

from ..analysis_report import check_destination, format_report, write_report
from ..errors import CheckpointError, ConfigError
from ..loading import resolve
from ..progress import ProgressDisplay
from ..runtime import Runtime
from .loading import load, run_corpus, window_of


def analyze_tokenization(
    path: str | Path,
    split: str = "test",
    streams: int | None = None,
    bptt: int | None = None,
    max_tokens: int | None = None,
    device: str = "auto",
    fast_path: str = "auto",
    out: str | Path | None = None,
    quiet: bool = False,
) -> tuple[dict, Path]:
    """Where a model's bits fall within words (paper §6.1; docs/tokenization.md), as
    ``sharnn analyze tokenization`` computes it, on a split of the run's data.

    Args:
        path: a run folder (its best checkpoint), a checkpoint or an exported folder.
        split, streams, bptt, device, fast_path, quiet: as :func:`evaluate_checkpoint`.
        max_tokens: score only the first N tokens of the split (None: all).
        out: the folder for the report's files (None: ``RUN/analysis``, for a run folder only).

    Returns:
        ``(report, folder)``: the report of :func:`sharnn.analysis.analyze` (with
        ``checkpoint``, ``data`` and ``split``), and the folder in which
        :func:`sharnn.analysis_report.write_report` is to write it (nothing is written here).

    Raises:
        CheckpointError: as :func:`load`; a folder that records no training data.
        ConfigError: no ``out`` for what is not a run folder, or one the report cannot be written
            into (refused first: :func:`sharnn.analysis_report.check_destination`); a window the
            attention span cannot take. DataError: a tokenizer with no analysis; as :func:`evaluate_checkpoint`.
    """
    from ..analysis import analyze, kind

    source, path = path, Path(path)  # source as given: ./NAME is a folder, NAME a shipped model
    model, config, tokenizer = load(source)
    if config is None:
        raise CheckpointError(f"{path} records no training data (no train_config.yaml): nothing to analyze")
    analysis = kind(tokenizer)  # refuses a tokenizer with no analysis
    if out is None and resolve(source) == path.resolve():  # not a run folder: keep the checkpoint as it is
        raise ConfigError(f"{path} is not a run folder: give --out DIR (the default, RUN/analysis, is in a run)")
    folder = Path(out) if out is not None else path / "analysis"
    check_destination(folder, split, analysis)
    corpus = run_corpus(config, model, tokenizer)
    runtime = Runtime.resolve(device, config.precision, fast_path)
    window = window_of(config, bptt)
    streams = streams or (config.valid_streams if split == "valid" else config.test_streams)
    data = corpus.split(split)[:max_tokens]
    with ProgressDisplay("analyze", enabled=not quiet) as progress:
        report = analyze(
            runtime.prepare(model),
            tokenizer,
            data,
            streams,
            window,
            corpus.train,
            runtime.autocast_dtype,
            progress=progress,
        )
    report.update(checkpoint=str(resolve(source)), data=config.data, split=split)
    return report, folder


def write_and_describe(report: dict, folder: Path) -> list[str]:
    """Write the report's files into ``folder`` (:func:`sharnn.analysis_report.write_report`)
    and give the lines ``sharnn analyze tokenization`` prints: the report, then each file written."""
    lines = [format_report(report)]
    return lines + [f"wrote {path}" for path in write_report(report, folder)]
