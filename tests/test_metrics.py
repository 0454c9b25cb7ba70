"""bpc.png's y range, the test marker, config records, resuming a metrics log, and what
TensorBoard gets (read back from the event files)."""

import json
import math
import time
from pathlib import Path

import pytest

from helpers import SMALL, assert_ok, cli, single_thread, write_small_corpus
from sharnn.training.metrics import UNIFORM_BPC, MetricsLog, _describe_changes, _figure, _y_range


def realistic_history() -> list[dict]:
    """Train logged every 10 steps from 5.5 down to 2.1, valid every 100 steps at
    2.6 to 2.3, the test of the best checkpoint (step 400) at 2.1132."""
    history = []
    for step in range(10, 501, 10):
        bpc = 2.1 + 3.4 * math.exp(-(step - 10) / 30)
        history.append({"split": "train", "step": step, "epoch": round(step / 300, 3), "bpc": bpc, "lr": 0.002})
    for step, bpc in ((100, 2.6), (200, 2.45), (300, 2.35), (400, 2.3), (500, 2.31)):
        history.append({"split": "valid", "step": step, "epoch": round(step / 300, 3), "bpc": bpc, "nats": bpc * 0.693})
    history.append({"split": "test", "step": 400, "epoch": 2, "bpc": 2.1132, "nats": 1.4647})
    return history


def legend_labels(fig) -> list[str]:
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def test_y_range_covers_valid_and_test_and_is_tight():
    history = realistic_history()
    low, high = _y_range(history)
    plotted = [r["bpc"] for r in history if r["split"] in ("valid", "test")]
    assert low < min(plotted) and max(plotted) < high
    assert low <= min(r["bpc"] for r in history)  # the lowest train point too
    assert low > 1.5 and high < 3.5  # not 0 to 8
    assert high - low < UNIFORM_BPC / 3


def test_y_range_ignores_warmup_spike_but_never_a_valid_point():
    history = realistic_history()
    assert _y_range(history)[1] < 5.5  # the train points of the first 10% lie above
    # a valid point above every later train point is still shown
    history.append({"split": "valid", "step": 30, "epoch": 0.1, "bpc": 4.2, "nats": 2.9})
    low, high = _y_range(history)
    assert 4.2 < high < 5.5
    assert low < 2.1


def test_y_range_without_warmup_filtering_when_there_is_only_train():
    history = [{"split": "train", "step": 1, "epoch": 0.0, "bpc": 7.9}]
    low, high = _y_range(history)
    assert low < 7.9 < high
    assert _y_range([]) == (0.0, UNIFORM_BPC)


def test_y_range_ignores_config_and_non_finite_records():
    history = realistic_history()
    expected = _y_range(history)
    history.append({"split": "config", "step": 300, "epoch": 1.0, "changes": {"lr": [0.002, 0.001]}})
    history.append({"split": "valid", "step": 510, "epoch": 1.7, "bpc": float("inf"), "nats": float("inf")})
    assert _y_range(history) == expected


def test_figure_marks_test_bpc_in_legend_and_drops_uniform_line_out_of_range():
    history = realistic_history()
    fig = _figure(history, "run")
    labels = legend_labels(fig)
    assert "test 2.1132" in labels
    assert "uniform (8 bits)" not in labels
    assert fig.axes[0].get_ylim() == pytest.approx(_y_range(history))
    (marker,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "test 2.1132"]
    assert list(marker.get_xdata()) == [400] and list(marker.get_ydata()) == [2.1132]


def test_figure_without_test_record_and_with_uniform_line_in_range():
    history = [{"split": "train", "step": s, "epoch": s / 100, "bpc": b} for s, b in ((1, 8.3), (2, 7.6))]
    history.append({"split": "valid", "step": 2, "epoch": 0.02, "bpc": 8.1, "nats": 5.6})
    low, high = _y_range(history)
    assert low < UNIFORM_BPC < high
    labels = legend_labels(_figure(history, "run"))
    assert "uniform (8 bits)" in labels
    assert not any(label.startswith("test") for label in labels)


def test_plot_writes_png_atomically(tmp_path):
    log = MetricsLog(tmp_path)
    for record in realistic_history():
        log.log(record)
    log.plot()
    log.close()
    assert (tmp_path / "bpc.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / ".bpc.png.tmp").exists()


def test_config_record_is_logged_as_jsonl_and_text_and_not_plotted(tmp_path):
    log = MetricsLog(tmp_path)
    texts = []
    add_text = log.tensorboard.add_text
    log.tensorboard.add_text = lambda tag, text, step: (texts.append((tag, text, step)), add_text(tag, text, step))
    log.log({"split": "train", "step": 10, "epoch": 0.5, "bpc": 3.0, "lr": 0.002})
    config = {"split": "config", "step": 10, "epoch": 0.5, "changes": {"lr": [0.002, 0.001], "max_steps": [1200, 1500]}}
    log.log(config)
    log.log({"split": "valid", "step": 20, "epoch": 1.0, "bpc": 2.8, "nats": 1.94})
    log.plot()
    log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[1] == config
    assert texts == [("config/changes", "- lr: 0.002 -> 0.001\n- max_steps: 1200 -> 1500", 10)]
    assert (tmp_path / "bpc.png").read_bytes().startswith(b"\x89PNG")
    assert "config" not in legend_labels(_figure(records, "run"))
    # reopening the folder reads the config record back
    reopened = MetricsLog(tmp_path)
    assert reopened.history[1] == config
    reopened.close()


def test_describe_changes():
    assert _describe_changes({"lr": [0.002, 0.001]}) == "- lr: 0.002 -> 0.001"
    assert _describe_changes({"schedule": ["cosine", None]}) == '- schedule: "cosine" -> null'
    assert _describe_changes({}) == "(no changes)"


def test_resume_drops_later_and_test_records(tmp_path):
    log = MetricsLog(tmp_path)
    for record in realistic_history():
        log.log(record)
    log.log({"split": "config", "step": 250, "epoch": 0.833, "changes": {"lr": [0.002, 0.001]}})
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "st')  # a torn last line
    resumed = MetricsLog(tmp_path, resume_step=300)
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == resumed.history
    assert kept and all(r["step"] <= 300 and r["split"] != "test" for r in kept)
    assert [r["step"] for r in kept if r["split"] == "valid"] == [100, 200, 300]
    assert max(r["step"] for r in kept if r["split"] == "train") == 300
    assert any(r["split"] == "config" for r in kept)
    resumed.plot()
    resumed.close()
    assert "test" not in " ".join(legend_labels(_figure(kept, "run")))


def test_a_short_runs_train_curve_is_drawn_whole():
    """A 12-step run logged every 2 steps: its first point, far above the rest (the first
    steps of warm-up), lies inside the plot, and the line covers every logged step."""
    bpcs = [8.9, 7.6, 7.2, 6.9, 6.6, 6.4]
    history = [{"split": "train", "step": 2 * (i + 1), "epoch": 0.0, "bpc": b} for i, b in enumerate(bpcs)]
    history.append({"split": "valid", "step": 12, "epoch": 0.01, "bpc": 6.3, "nats": 4.4})
    fig = _figure(history, "run")
    (line,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "train"]
    assert list(line.get_xdata()) == [2, 4, 6, 8, 10, 12] and list(line.get_ydata()) == bpcs
    low, high = fig.axes[0].get_ylim()
    assert low < min(bpcs) and max(bpcs) < high


def test_resume_keeps_the_test_of_an_earlier_end(tmp_path):
    """A run that ended (and tested) at step 300 and is extended keeps that test record;
    a resume at the step of a test the run made before a kill (no summary: ``ended_here``
    False) drops it, since the resumed run tests again; tests of earlier ends always stay."""

    def write(records):
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    first_end = {"split": "test", "step": 200, "epoch": 1.0, "run_step": 300, "bpc": 2.4, "nats": 1.7}
    history = [r for r in realistic_history() if r["step"] <= 300 and r["split"] != "test"] + [first_end]
    write(history)
    extended = MetricsLog(tmp_path, resume_step=300, ended_here=True)
    extended.close()
    assert extended.history == history and read_test_records(tmp_path) == [first_end]
    write(history)
    MetricsLog(tmp_path, resume_step=300).close()
    assert read_test_records(tmp_path) == []
    killed = {"split": "train", "step": 380, "epoch": 1.3, "bpc": 2.0, "lr": 0.002}  # the extension, killed
    write(history + [dict(killed, step=360), killed])
    MetricsLog(tmp_path, resume_step=360).close()  # from its checkpoint of step 360
    assert read_test_records(tmp_path) == [first_end]


def read_test_records(folder: Path) -> list[dict]:
    return [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r["split"] == "test"]


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory) -> Path:
    """A SMALL run of 12 steps, then extended to 16 with ``--resume RUN max_steps=16``."""
    base = tmp_path_factory.mktemp("extended")
    data = write_small_corpus(base / "small.txt")
    run = base / "run"
    with single_thread():
        assert_ok(cli("train", "--preset", "tiny", "--out", run, *SMALL, f"data={data}"))
        # TensorBoard reads a folder's event files in name order: events.out.tfevents.SECONDS.HOST.PID.N,
        # N counting this process's writers. A resume comes later than its run, in a process of its own;
        # in-process within the same second, N would decide (".10" < ".9").
        time.sleep(1.1)
        assert_ok(cli("train", "--resume", run, "max_steps=16"))
    return run


def test_an_extended_run_keeps_the_test_record_of_its_first_end(extended_run):
    tests = read_test_records(extended_run)
    summary = json.loads((extended_run / "summary.json").read_text())
    assert [(r["run_step"], r["step"]) for r in tests] == [(12, 12), (16, summary["best_step"])]
    assert tests[-1]["bpc"] == summary["test_bpc"]


def test_tensorboard_gets_the_config_and_the_hyperparameters_in_the_run_folder(extended_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    folders = [p.name for p in extended_run.iterdir() if p.is_dir() and not p.is_symlink()]
    assert folders == ["checkpoints"]  # no sub-folder, as SummaryWriter.add_hparams would make
    events = EventAccumulator(str(extended_run), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors("config/text_summary")]
    assert [step for step, _ in texts] == [0, 12]  # at the start and at the resume
    assert "max_steps: 12" in texts[0][1] and "max_steps: 16" in texts[1][1] and "d_model: 32" in texts[1][1]
    summary = json.loads((extended_run / "summary.json").read_text())
    for name, value in (("valid_bpc", summary["valid_bpc"]), ("test_bpc", summary["test_bpc"])):
        scalars = events.Scalars(f"hparams/{name}")
        assert scalars[-1].step == 16 and scalars[-1].value == pytest.approx(value)
    assert [s.step for s in events.Scalars("valid/bpc")] == [12, 16]  # the resume purged nothing at step 12
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["model.d_model"].number_value == 32 and start.hparams["data"].string_value.endswith(
        "small.txt"
    )
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"hparams/valid_bpc", "hparams/test_bpc"}
