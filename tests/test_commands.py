"""One module per command (sharnn.commands): the API re-exports their names, and the small
defects the commands had: `eval FILE` without --file, `info` of a near name, text from
`generate_text` to print, a library call that printed, a run ended early without a word."""

from __future__ import annotations

import dataclasses

import pytest

import sharnn
import sharnn.api
from helpers import SMALL, assert_ok, assert_user_error, cli, write_small_corpus
from sharnn.commands.train import budget_note, run_config
from sharnn.config import load_config


def test_the_api_names_are_the_commands_own():
    from sharnn.commands import compress, evaluate, generate, info, loading, train

    assert sharnn.api.compress_file is sharnn.compress_file is compress.compress_file
    assert sharnn.Evaluation is evaluate.Evaluation and sharnn.Generation is generate.Generation
    assert sharnn.info is info.info and sharnn.load is loading.load and sharnn.Loaded is loading.Loaded
    assert sharnn.api.format_summary is train.format_summary and sharnn.train_run is train.train_run
    assert set(sharnn.api.__all__) >= {"load", "evaluate_checkpoint", "generate_text", "list_file", "Coding"}


def test_eval_of_a_file_says_to_give_it_with_file(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\n")
    assert_user_error(cli("eval", notes), f"{notes} is a file, not a checkpoint: to score it, give --file {notes}")


def test_info_of_an_unknown_name_lists_the_shipped_models_and_the_closest():
    line = assert_user_error(cli("info", "wikipedia"), "unknown preset", "shipped models: ")
    assert "wikipedia-2x512" in line and line.endswith("did you mean wikipedia-2x512?")
    assert "did you mean" not in assert_user_error(cli("info", "zzzzzz"), "unknown preset")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A SMALL run on 3,000 bytes, whose one epoch (about 40 steps) ends before max_steps=1000."""
    base = tmp_path_factory.mktemp("short")
    data = write_small_corpus(base / "short.txt", size=3000)
    result = cli(
        "train", "--preset", "tiny", "--out", base / "run", *SMALL, f"data={data}", "max_steps=1000", "sample_bytes=20"
    )
    assert_ok(result)
    return base / "run", result


def test_a_run_ended_by_its_epochs_before_max_steps_says_so(short_run):
    run_dir, result = short_run
    summary = sharnn.api.train_run(resume=run_dir, quiet=True)  # finished: its summary again
    assert summary["steps"] < 1000
    note = f"note: epochs=1 ended the run at step {summary['steps']:,}, before max_steps=1,000: raise epochs"
    assert note in result.stderr
    config = run_config(summary)
    assert budget_note(summary, config).startswith("note: epochs=1 ended")
    assert budget_note(summary, dataclasses.replace(config, max_steps=summary["steps"])) is None
    assert budget_note(summary, dataclasses.replace(config, max_steps=0)) is None
    timed = dataclasses.replace(config, epochs=100, max_seconds=1.0)
    assert budget_note(summary | {"epochs": 0.5, "train_seconds": 2.0}, timed).startswith("note: max_seconds=1 ended")


def test_the_command_prints_the_sample_and_the_library_call_prints_nothing(short_run, tmp_path, capfd):
    run_dir, result = short_run
    assert "--- sample: 20 bytes generated at temperature 0.8 ---" in result.stderr
    data = load_config(str(run_dir)).data
    capfd.readouterr()
    summary = sharnn.train_run(
        preset="tiny", out=tmp_path / "again", overrides=[*SMALL, f"data={data}", "max_steps=4", "sample_bytes=20"]
    )
    out, err = capfd.readouterr()
    assert out == "" and "sample" not in err  # progress at most, on standard error
    assert summary["steps"] == 4
