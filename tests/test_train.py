"""The training recipe, its explicit state and exact resume (docs/training.md).

Exact resume is checked the hard way: a real ``sharnn train`` process is killed with
SIGKILL (or interrupted with SIGINT) once it has written ``latest``, resumed with
``sharnn train --resume``, and its final weights must equal, tensor for tensor, those
of the same run done without interruption. Every run here is tiny (a few seconds on
2 CPU cores), except the one that checks learning on real enwik8 bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
import shutil
import signal
import types
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from helpers import (
    RESUMABLE,
    SMALL,
    assert_ok,
    assert_same_weights,
    assert_user_error,
    checkpoint_step,
    cli,
    metrics,
    sharnn_process,
    signal_when,
    single_thread,
    weights,
    write_small_corpus,
)
from sharnn.config import load_config
from sharnn.errors import Interrupted, TrainingDiverged
from sharnn.runtime import Runtime
from sharnn.training import metrics as metrics_module, trainer as train_module
from sharnn.training.checkpoint import load_model, read_info
from sharnn.training.recipe import TrainingState, learning_rate, train_step
from sharnn.training.trainer import train


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, corpus_file):
    """The RESUMABLE run, done in one go (the exact-resume tests compare against it)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    with single_thread():
        train(load_config("tiny", RESUMABLE + [f"data={corpus_file}"]), out, quiet=True)
    return out


# --------------------------------------------------------------------------------------
# Learning-rate schedule


def test_warmup_is_linear_from_lr_over_warmup_to_lr():
    config = load_config("enwik8-paper")
    assert (config.lr, config.warmup_steps) == (2e-3, 800)
    assert learning_rate(config, 1, 0) == pytest.approx(2e-3 / 800, rel=1e-12)
    assert learning_rate(config, 400, 0) == pytest.approx(1e-3, rel=1e-12)
    assert learning_rate(config, 800, 0) == pytest.approx(2e-3, rel=1e-12)
    ramp = [learning_rate(config, step, 0) for step in range(1, 801)]
    steps = [b - a for a, b in pairwise(ramp)]
    assert all(d == pytest.approx(2e-3 / 800, rel=1e-9) for d in steps)


def test_constant_after_warmup():
    config = load_config("enwik8-paper")
    for step in (801, 802, 5_000, 10**6):
        assert learning_rate(config, step, 0) == pytest.approx(2e-3, rel=1e-12)
    assert learning_rate(config, 10**6, 22) == pytest.approx(2e-3, rel=1e-12)


def test_paper_preset_halves_lr_for_the_last_two_of_25_epochs():
    config = load_config("enwik8-paper")
    assert config.epochs == 25 and list(config.lr_halve_epochs) == [24]
    per_epoch = [learning_rate(config, 10**6, epoch) for epoch in range(config.epochs)]  # 0-based epochs
    assert per_epoch[:23] == pytest.approx([2e-3] * 23)
    assert per_epoch[23:] == pytest.approx([1e-3] * 2)  # 1-based epochs 24 and 25


def test_each_halving_entry_halves_again_and_no_warmup_means_full_lr():
    config = load_config("tiny", ["lr=0.004", "lr_halve_epochs=[2,4]", "warmup_steps=0", "epochs=5"])
    assert [learning_rate(config, 1, epoch) for epoch in range(5)] == pytest.approx([0.004, 0.002, 0.002, 0.001, 0.001])
    config = load_config("tiny", ["lr=0.004", "lr_halve_epochs=[2]", "warmup_steps=10", "epochs=2"])
    assert learning_rate(config, 5, 1) == pytest.approx(0.004 * 0.5 * 0.5)  # warmup and halving multiply


def nanogpt_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """nanoGPT's ``get_lr`` (train.py) after its warmup, as it is written there."""
    assert it >= warmup_iters
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


def test_cosine_decay_is_nanogpts_after_the_linear_warmup():
    config = load_config("tiny", ["lr=0.004", "warmup_steps=100", "lr_decay_steps=1100", "min_lr=0.0004"])
    for step in (1, 50, 100):  # the warmup, as without the decay
        assert learning_rate(config, step, 0) == pytest.approx(0.004 * step / 100, rel=1e-12)
    for step in (101, 350, 600, 1000, 1099, 1100, 1101, 5000, 10**6):  # mid-decay, its end, after
        expected = nanogpt_lr(step, 0.004, 100, 1100, 0.0004)
        assert learning_rate(config, step, 0) == pytest.approx(expected, rel=1e-12, abs=0)
    assert learning_rate(config, 600, 0) == pytest.approx(0.0022, rel=1e-12)  # half-way: the mean of lr and min_lr
    assert learning_rate(config, 1100, 0) == learning_rate(config, 10**6, 0) == 0.0004
    halved = load_config("tiny", ["lr=0.004", "warmup_steps=100", "lr_decay_steps=1100", "lr_halve_epochs=[2]"])
    assert learning_rate(halved, 600, 1) == pytest.approx(0.5 * nanogpt_lr(600, 0.004, 100, 1100, 0.0), rel=1e-12)
    assert learning_rate(halved, 2000, 1) == 0.0  # min_lr 0, the default


def test_no_decay_keeps_the_schedule_bit_for_bit():
    config = load_config("tiny", ["lr=0.004", "warmup_steps=7", "lr_halve_epochs=[2,3]", "epochs=3", "min_lr=0.001"])
    for step in (1, 3, 7, 8, 10**6):
        for epoch in range(3):
            halvings = sum(1 for e in (2, 3) if epoch + 1 >= e)
            assert learning_rate(config, step, epoch) == 0.004 * min(step / 7, 1.0) * 0.5**halvings


def test_bad_optimizer_and_schedule_settings_are_one_line(tmp_path):
    for setting, message in (
        (["optimizer=sgd"], "optimizer must be one of lamb, adamw, got 'sgd'"),
        (["lr=0.001", "min_lr=0.01"], "min_lr (0.01) must be at most lr (0.001)"),
        (["warmup_steps=10", "lr_decay_steps=10"], "lr_decay_steps (10) must be more than warmup_steps (10)"),
        (["min_lr=-1"], "min_lr must be >= 0"),
    ):
        result = cli("train", "--preset", "tiny", "--out", tmp_path / "run", *setting)
        assert_user_error(result, message)
        assert not (tmp_path / "run").exists()
    result = cli("compress", __file__, "-o", tmp_path / "out.shz", "--online", "lr_decay_steps=100")
    assert_user_error(result, "lr_decay_steps=100: online mode takes only the settings its files record")
    assert not (tmp_path / "out.shz").exists()


def test_min_trust_0_trains_with_plain_lamb(tmp_path, corpus_file):
    run_dir = tmp_path / "run"
    with single_thread():
        assert_ok(
            cli(
                "train",
                "--preset",
                "tiny",
                "--out",
                run_dir,
                "--quiet",
                *SMALL,
                "max_steps=6",
                "min_trust=0",
                f"data={corpus_file}",
            )
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and math.isfinite(summary["valid_bpc"])
    groups = torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [g["min_trust"] for g in groups] == [0.0]


def test_training_loop_applies_schedule_over_epochs(tmp_path):
    """Two whole epochs over a tiny corpus with a halving at epoch 2: every logged lr is
    learning_rate(step, epoch), epoch 2 runs at half lr, and each epoch ends with a
    validation."""
    data = write_small_corpus(tmp_path / "six-kb.txt", size=6_000)
    overrides = SMALL + [
        f"data={data}",
        "max_steps=0",
        "epochs=2",
        "lr_halve_epochs=[2]",
        "train_streams=8",
        "bptt=32",
        "bptt_jitter=false",
        "warmup_steps=4",
        "log_every_steps=1",
        "checkpoint_every_steps=1000",
    ]
    config = load_config("tiny", overrides)
    summary = train(config, tmp_path / "run", quiet=True)
    records = metrics(tmp_path / "run")
    train_records = [r for r in records if r["split"] == "train"]
    # 5400 train bytes / 8 streams = 675 rows; 674 predicted rows in windows of 32 -> 22 steps per epoch
    assert len(train_records) == 44 and summary["steps"] == 44 and summary["epochs"] == 2
    # records give the epochs done: step k of epoch e (0-based) logs e + 32k / 674
    in_progress = [math.ceil(r["epoch"]) - 1 for r in train_records]
    assert in_progress == [0] * 22 + [1] * 22
    assert train_records[0]["epoch"] == round(32 / 674, 4) and train_records[21]["epoch"] == 1.0
    for r, epoch in zip(train_records, in_progress):
        assert r["lr"] == pytest.approx(learning_rate(config, r["step"], epoch), rel=1e-12)
    assert train_records[0]["lr"] == pytest.approx(config.lr / 4)
    assert all(r["lr"] == pytest.approx(config.lr) for r in train_records[4:22])
    assert all(r["lr"] == pytest.approx(config.lr / 2) for r in train_records[22:])
    valid = [r for r in records if r["split"] == "valid"]
    assert [(r["step"], r["epoch"]) for r in valid] == [(22, 1), (44, 2)]


# --------------------------------------------------------------------------------------
# Exact resume


def test_a_restored_training_state_continues_exactly_like_the_original():
    """TrainingState.state_dict() holds everything a step depends on: a second state built
    from the same config and loaded from it takes the same next steps (dropout included)."""
    config = load_config("tiny", RESUMABLE)
    tokens = torch.randint(0, 256, (3 * 16 + 1, 4), generator=torch.Generator().manual_seed(0))
    windows = [(tokens[i : i + 16], tokens[i + 1 : i + 17]) for i in range(0, 48, 16)]

    def step(state: TrainingState, inputs, targets) -> None:
        _, _, state.recurrent_state = train_step(
            state.model, state.optimizer, state.scaler, inputs, targets, state.recurrent_state, config.clip
        )
        state.progress.step += 1
        state.jitter_rng.random()  # the window-length RNG moves with every step

    original = TrainingState(config, Runtime(torch.device("cpu")))
    step(original, *windows[0])
    saved = copy.deepcopy(original.state_dict())  # a checkpoint: tensors as they are now
    for inputs, targets in windows[1:]:
        step(original, inputs, targets)

    restored = TrainingState(config, Runtime(torch.device("cpu")))
    restored.load_state_dict(saved)
    assert restored.progress.step == 1
    for inputs, targets in windows[1:]:
        step(restored, inputs, targets)
    for (name, a), b in zip(original.model.state_dict().items(), restored.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert original.jitter_rng.random() == restored.jitter_rng.random()
    for (h, c), (h2, c2) in zip(original.recurrent_state.lstm, restored.recurrent_state.lstm):
        assert torch.equal(h, h2) and torch.equal(c, c2)


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    """The resumed run ended exactly where the uninterrupted one did."""
    for link in ("best", "latest"):
        assert checkpoint_step(run_dir / link) == checkpoint_step(reference / link)
        assert_same_weights(run_dir / link, reference / link)
    ours, theirs = (json.loads((d / "summary.json").read_text()) for d in (run_dir, reference))
    for key in ("valid_bpc", "test_bpc", "best_step", "steps", "epochs"):
        assert ours[key] == theirs[key], key
    records, ref_records = metrics(run_dir), metrics(reference)
    train_steps = [r["step"] for r in records if r["split"] == "train"]
    assert len(train_steps) == len(set(train_steps)), f"duplicated train steps: {train_steps}"
    keys = lambda rs: [(r["split"], r["step"]) for r in rs if r["split"] in ("train", "valid")]  # noqa: E731
    assert keys(records) == keys(ref_records)
    valid = lambda rs: [r["bpc"] for r in rs if r["split"] == "valid"]  # noqa: E731
    assert valid(records) == valid(ref_records)
    # only the checkpoints that latest and best point to are left
    linked = {(run_dir / n).resolve() for n in ("latest", "best")}
    assert {p.resolve() for p in (run_dir / "checkpoints").iterdir()} == linked


@pytest.mark.slow
def test_resume_after_kill_9_ends_with_exactly_the_same_weights(tmp_path, corpus_file, reference_run):
    run_dir = tmp_path / "killed"
    process = sharnn_process(
        "train", "--preset", "tiny", "--out", run_dir, "--quiet", *RESUMABLE, f"data={corpus_file}"
    )

    def past_first_validations() -> bool:  # after the step-8 validation: best set, memory full
        return (run_dir / "latest").exists() and checkpoint_step(run_dir / "latest") >= 12

    _, stderr = signal_when(process, past_first_validations, signal.SIGKILL)  # finished already: resume must still work
    assert process.returncode in (-signal.SIGKILL, 0), stderr
    assert "Traceback" not in stderr

    result = cli("train", "--resume", run_dir, "--quiet")
    assert_ok(result)
    assert "test" in result.stdout and "BPC" in result.stdout
    _assert_same_run(run_dir, reference_run)


@pytest.mark.slow
def test_ctrl_c_saves_latest_prints_one_line_and_resumes_exactly(tmp_path, corpus_file, reference_run):
    run_dir = tmp_path / "interrupted"
    process = sharnn_process(
        "train", "--preset", "tiny", "--out", run_dir, "--quiet", *RESUMABLE, f"data={corpus_file}"
    )
    _, stderr = signal_when(process, lambda: (run_dir / "latest").exists(), signal.SIGINT)
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    if process.returncode != 0:
        assert process.returncode == 130, (process.returncode, lines)
        assert len(lines) == 1, lines
        match = re.fullmatch(r"interrupted at step (\d+); continue with: sharnn train --resume (.+)", lines[0])
        if match is None:  # only possible when the signal came after training, during the final test
            assert lines[0].strip() == "interrupted", lines
        else:
            assert Path(match.group(2)) == run_dir
            # the run stopped at a step boundary and saved that step as latest
            assert checkpoint_step(run_dir / "latest") == int(match.group(1))
            trainer = torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)
            assert json.loads(trainer["progress"])["step"] == int(match.group(1))
            assert not (run_dir / "summary.json").exists()

    result = cli("train", "--resume", run_dir, "--quiet")
    assert_ok(result)
    _assert_same_run(run_dir, reference_run)


# AdamW with weight decay and a cosine decay that ends (step 20) before the run does (24).
ADAMW_COSINE = [
    *RESUMABLE,
    "max_steps=24",
    "optimizer=adamw",
    "weight_decay=0.1",
    "lr_decay_steps=20",
    "min_lr=0.0002",
]


@pytest.mark.slow
def test_adamw_with_cosine_decay_resumes_exactly_after_kill_9(tmp_path, corpus_file):
    """The AdamW state (moments and step count) and the schedule come back exactly: a run
    killed with SIGKILL and resumed ends with the weights of the uninterrupted one."""
    reference = tmp_path / "reference"
    config = load_config("tiny", ADAMW_COSINE + [f"data={corpus_file}"])
    with single_thread():
        train(config, reference, quiet=True)
    run_dir = tmp_path / "killed"
    process = sharnn_process(
        "train", "--preset", "tiny", "--out", run_dir, "--quiet", *ADAMW_COSINE, f"data={corpus_file}"
    )
    _, stderr = signal_when(
        process, lambda: (run_dir / "latest").exists() and checkpoint_step(run_dir / "latest") >= 12, signal.SIGKILL
    )
    assert process.returncode in (-signal.SIGKILL, 0), stderr
    optimizer = torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)["optimizer"]
    assert [g["weight_decay"] for g in optimizer["param_groups"]] == [0.1, 0.0]
    for state in optimizer["state"].values():
        assert state.keys() == {"exp_avg", "exp_avg_sq", "step"}
        assert int(state["step"]) == checkpoint_step(run_dir / "latest")
    assert_user_error(cli("train", "--resume", run_dir, "optimizer=lamb"), "cannot change optimizer")

    assert_ok(cli("train", "--resume", run_dir, "--quiet"))
    _assert_same_run(run_dir, reference)
    logged = {r["step"]: r["lr"] for r in metrics(run_dir) if r["split"] == "train"}
    assert logged == {step: pytest.approx(learning_rate(config, step, 0), rel=1e-12) for step in range(2, 25, 2)}
    assert logged[20] == logged[24] == pytest.approx(0.0002) and logged[4] == pytest.approx(0.002 * 4 / 5)


TWO_EPOCHS = [
    "max_steps=0",
    "epochs=2",
    "lr_halve_epochs=[2]",
    "train_streams=8",
    "bptt=32",
    "bptt_jitter=true",
    "warmup_steps=4",
    "log_every_steps=1",
    "checkpoint_every_steps=5",
    "valid_every_steps=10",
    "model.dropouti=0.1",
    "model.dropouth=0.1",
    "model.dropouto=0.1",
]


@pytest.fixture(scope="module")
def two_epoch_data(tmp_path_factory):
    return write_small_corpus(tmp_path_factory.mktemp("two-epochs") / "six-kb.txt", size=6_000)


@pytest.fixture(scope="module")
def two_epoch_reference(tmp_path_factory, two_epoch_data):
    out = tmp_path_factory.mktemp("two-epoch-reference") / "run"
    with single_thread():
        train(load_config("tiny", SMALL + TWO_EPOCHS + [f"data={two_epoch_data}"]), out, quiet=True)
    return out


def ctrl_c() -> bool:
    """A real Ctrl-C (SIGINT, raised in this process): the trainer's handler turns it into
    a stop after the step; the hook itself asks for nothing."""
    signal.raise_signal(signal.SIGINT)
    return False


@pytest.mark.slow
@pytest.mark.parametrize(
    "how, where",
    [("should_stop", w) for w in ("mid-epoch-1", "last-step-of-epoch-1", "first-step-of-epoch-2", "mid-epoch-2")]
    + [("ctrl-c", "last-step-of-epoch-1"), ("ctrl-c", "mid-epoch-2")],
)
def test_a_stop_anywhere_across_epochs_resumes_exactly(tmp_path, two_epoch_data, two_epoch_reference, how, where):
    """A stop at a chosen step around the epoch boundary, with jittered windows and
    dropout, asked for by ``should_stop`` or by a real Ctrl-C during that step: the run
    saves that step and raises Interrupted; resuming ends exactly like the run that was
    never stopped."""
    records = metrics(two_epoch_reference)
    boundary = max(r["step"] for r in records if r["split"] == "train" and r["epoch"] <= 1)  # last step of epoch 1
    total = max(r["step"] for r in records if r["split"] == "train")
    assert 10 < boundary < total - 3
    stop_at = {
        "mid-epoch-1": 7,
        "last-step-of-epoch-1": boundary,
        "first-step-of-epoch-2": boundary + 1,
        "mid-epoch-2": total - 3,
    }[where]
    config = load_config("tiny", SMALL + TWO_EPOCHS + [f"data={two_epoch_data}"])
    run_dir = tmp_path / "run"
    ask = (lambda: True) if how == "should_stop" else ctrl_c
    with pytest.raises(Interrupted, match=rf"interrupted at step {stop_at}; continue with: sharnn train --resume"):
        train(config, run_dir, quiet=True, should_stop=lambda progress: progress.step == stop_at and ask())
    assert checkpoint_step(run_dir / "latest") == stop_at

    train(config, run_dir, resume=True, quiet=True)
    _assert_same_run(run_dir, two_epoch_reference)
    # logged every step, so every step's training loss is compared too
    ours = [(r["step"], r["epoch"], r["lr"], r["bpc"]) for r in metrics(run_dir) if r["split"] == "train"]
    assert ours == [(r["step"], r["epoch"], r["lr"], r["bpc"]) for r in records if r["split"] == "train"]


def test_ctrl_c_during_a_validation_stops_at_that_step(tmp_path, corpus_file, monkeypatch):
    """The signal arrives while the step's validation runs: the step is saved and the run
    stops there, without training another step."""
    config = load_config("tiny", RESUMABLE + [f"data={corpus_file}"])
    real_evaluate = train_module.evaluate

    def evaluate_then_ctrl_c(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", evaluate_then_ctrl_c)
    with pytest.raises(Interrupted, match="interrupted at step 8;"):  # the first validation
        train(config, tmp_path / "run", quiet=True)
    assert checkpoint_step(tmp_path / "run" / "latest") == 8


def test_a_second_ctrl_c_interrupts_at_once_without_saving(tmp_path, corpus_file):
    config = load_config("tiny", SMALL + [f"data={corpus_file}"])

    def twice(progress) -> bool:
        if progress.step == 3:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return False

    with pytest.raises(
        Interrupted,
        match="interrupted at step 3, before the first checkpoint; start again from step 0 with: sharnn train --resume",
    ) as stopped:
        train(config, tmp_path / "run", quiet=True, should_stop=twice)
    assert stopped.value.exit_code == 130
    assert not (tmp_path / "run" / "latest").exists()  # the first checkpoint is at step 4


def _evaluate_signalling(monkeypatch, sig: int, streams: int, after_windows: int = 2) -> None:
    """Make the evaluations of ``streams`` streams receive ``sig`` after a few windows."""
    real_evaluate = train_module.evaluate

    def evaluate(model, data, n_streams, *args, stop=None, **kwargs):
        if n_streams != streams:
            return real_evaluate(model, data, n_streams, *args, stop=stop, **kwargs)
        asked = []

        def stop_after_windows() -> bool:
            asked.append(True)
            if len(asked) == after_windows + 1:
                signal.raise_signal(sig)
            return stop()

        real_evaluate(model, data, n_streams, *args, stop=stop_after_windows, **kwargs)
        raise AssertionError(f"the evaluation went on to its end ({len(asked)} windows)")

    monkeypatch.setattr(train_module, "evaluate", evaluate)


@pytest.mark.slow
def test_sigterm_during_a_validation_abandons_it_and_the_resume_is_exact(
    tmp_path, corpus_file, reference_run, monkeypatch
):
    """SIGTERM a few windows into the step-16 validation: the validation stops at the next
    window, the step is saved with its validation still due, exit status 143; the resume
    validates step 16 first and ends exactly like the run never stopped."""
    config = load_config("tiny", RESUMABLE + [f"data={corpus_file}", "valid_streams=2"])
    reference = tmp_path / "reference"
    train(config, reference, quiet=True)
    real_validate = train_module.Trainer.validate
    monkeypatch.setattr(
        train_module.Trainer,
        "validate",
        lambda self, abandon=None: (
            _evaluate_signalling(monkeypatch, signal.SIGTERM, 2) if self.state.progress.step == 16 else None,
            real_validate(self, abandon),
        )[1],
    )
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted, match="interrupted by SIGTERM at step 16; continue with: ") as stopped:
        train(config, run_dir, quiet=True)
    assert stopped.value.exit_code == 143
    assert checkpoint_step(run_dir / "latest") == 16
    assert [r["step"] for r in metrics(run_dir) if r["split"] == "valid"] == [8]
    monkeypatch.undo()

    # Resumed to the end of step 16 only: its checkpoint is written again with the score of
    # the validation the resume did, so that it reads as a validated one (info, export).
    train(dataclasses.replace(config, max_steps=16), run_dir, resume=True, quiet=True)
    valid_16 = [r["bpc"] for r in metrics(run_dir) if r["split"] == "valid" and r["step"] == 16]
    info = read_info(run_dir / "latest")
    assert info["step"] == "16" and [float(info["valid_bpc"])] == valid_16
    assert not list((run_dir / "checkpoints" / "step-00000016").glob(".*"))  # no temporary file left
    train(config, run_dir, resume=True, quiet=True)  # extended to 40: step 16 is not validated again
    _assert_same_run(run_dir, reference)


def test_a_resume_whose_budget_ends_before_its_step_validates_that_step_and_tests_it(tmp_path, corpus_file):
    """Stopped at step 8, before any validation; resumed with max_steps=4: the run ends
    at step 8 as a run that reached its budget there does, validated and tested."""
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "max_steps=100", "valid_every_steps=1000"])
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(config, run_dir, quiet=True, should_stop=lambda progress: progress.step == 8)
    assert not (run_dir / "best").exists()
    summary = train(dataclasses.replace(config, max_steps=4), run_dir, resume=True, quiet=True)
    assert (summary["steps"], summary["best_step"]) == (8, 8)
    assert float(read_info(run_dir / "best")["valid_bpc"]) == summary["valid_bpc"]
    assert [(r["split"], r["step"]) for r in metrics(run_dir) if r["split"] in ("valid", "test")] == [
        ("valid", 8),
        ("test", 8),
    ]


def test_ctrl_c_during_the_test_stops_it_and_the_resume_tests(tmp_path, corpus_file, monkeypatch):
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "test_streams=1"])
    _evaluate_signalling(monkeypatch, signal.SIGINT, 1)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted, match="interrupted at step 12; continue with: ") as stopped:
        train(config, run_dir, quiet=True)
    assert stopped.value.exit_code == 130
    assert not (run_dir / "summary.json").exists()
    monkeypatch.undo()
    summary = train(config, run_dir, resume=True, quiet=True)
    assert summary["steps"] == 12 and (run_dir / "summary.json").exists()


def test_a_second_sigterm_while_saving_is_recorded_and_the_checkpoint_completes(tmp_path, corpus_file, monkeypatch):
    """Two SIGTERMs while ``latest`` is written: the save completes and the run stops
    after it, saved, with exit status 143 and the resume command."""
    real_save = train_module.checkpoint.RunCheckpoints.save

    def save_signalled(self, step, *args, **kwargs):
        if step == 8:
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(train_module.checkpoint.RunCheckpoints, "save", save_signalled)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted, match="interrupted by SIGTERM at step 8; continue with: ") as stopped:
        train(load_config("tiny", SMALL + [f"data={corpus_file}"]), run_dir, quiet=True)
    assert stopped.value.exit_code == 143
    assert checkpoint_step(run_dir / "latest") == 8
    assert not list((run_dir / "checkpoints").glob(".*"))  # no staging folder left


# --------------------------------------------------------------------------------------
# Quick runs: validation and test on a prefix


def test_valid_and_test_max_bytes_score_a_prefix_recorded_as_such(tmp_path, corpus_file):
    run_dir = tmp_path / "run"
    result = cli(
        "train",
        "--preset",
        "tiny",
        "--out",
        run_dir,
        "--quiet",
        *SMALL,
        f"data={corpus_file}",
        "valid_max_bytes=1000",
        "test_max_bytes=600",
    )
    assert_ok(result)
    assert re.search(
        r"done: valid [\d.]+ BPC \(best, step 12, on the first 1,000 bytes\), "
        r"test [\d.]+ BPC on the first 600 bytes,",
        result.stdout,
    ), result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["valid_prefix_bytes"], summary["test_prefix_bytes"]) == (1000, 600)
    records = metrics(run_dir)
    assert {r["prefix_bytes"] for r in records if r["split"] == "valid"} == {1000}
    assert [r["prefix_bytes"] for r in records if r["split"] == "test"] == [600]
    # the same score as evaluating those bytes alone
    model, config = load_model(run_dir)
    data = train_module.load_corpus(config.data).valid[:1000]
    assert train_module.evaluate(model, data, config.valid_streams, config.bptt).bpc == pytest.approx(
        summary["valid_bpc"]
    )

    # One prefix throughout a run: for the best checkpoint's choice, and for its test score.
    assert_user_error(cli("train", "--resume", run_dir, "valid_max_bytes=2000"), "cannot change valid_max_bytes")
    assert_user_error(
        cli("train", "--resume", run_dir, "test_max_bytes=0", "max_steps=14"), "cannot change test_max_bytes"
    )
    # An export says the scores are of prefixes, and keeps them out of the card's model-index.
    assert_ok(cli("export", run_dir, "--out", tmp_path / "exported"))
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "on the first 1,000 bytes of the split only" in card and "on the first 600 bytes of the split only" in card
    assert "model-index" not in card
    training = json.loads((tmp_path / "exported" / "training.json").read_text())
    assert (training["valid_prefix_bytes"], training["test_prefix_bytes"]) == (1000, 600)


def test_a_prefix_too_short_for_its_streams_is_one_line(tmp_path, corpus_file):
    assert_user_error(
        cli("train", "--preset", "tiny", "--out", tmp_path / "run", *SMALL, f"data={corpus_file}", "valid_max_bytes=5"),
        "valid_max_bytes=5",
        "too few for 4 streams",
    )
    assert not (tmp_path / "run").exists()


def test_a_prefix_is_whole_tokens_whose_text_fits_the_bytes(tmp_path):
    from sharnn.data.prepare import prepare_corpus

    corpus = train_module.load_corpus("enwik8-head")  # bytes: max_bytes tokens
    ids, size = train_module.split_prefix(corpus, "valid", 100)
    assert (len(ids), size) == (100, 100) and (ids == corpus.valid[:100]).all()
    assert train_module.split_prefix(corpus, "valid", 0)[1] is None
    whole, size = train_module.split_prefix(corpus, "valid", len(corpus.valid))
    assert size is None and len(whole) == len(corpus.valid)

    folder = prepare_corpus(write_small_corpus(tmp_path / "small.txt", 20_000), tmp_path / "bpe", 0.1, 0.1, "bpe:300")
    corpus = train_module.load_corpus(str(folder))
    lengths = corpus.tokenizer.byte_lengths()
    ids, size = train_module.split_prefix(corpus, "valid", 1000)
    assert size == int(lengths[ids].sum()) <= 1000 < size + int(lengths[corpus.valid[len(ids)]])
    assert (ids == corpus.valid[: len(ids)]).all()


def test_resume_of_a_finished_run_returns_its_summary_without_training_or_testing(tmp_path, reference_run):
    run_dir = tmp_path / "finished"
    shutil.copytree(reference_run, run_dir, symlinks=True)
    before = (run_dir / "summary.json").read_text()
    records = (run_dir / "metrics.jsonl").read_text()
    result = cli("train", "--resume", run_dir)
    assert_ok(result)
    assert f"test {json.loads(before)['test_bpc']:.4f} BPC" in result.stdout
    assert "has finished (step 40" in result.stderr and "max_steps" in result.stderr
    assert (run_dir / "summary.json").read_text() == before
    assert (run_dir / "metrics.jsonl").read_text() == records
    assert_same_weights(run_dir / "latest", reference_run / "latest")


def test_resume_of_a_finished_run_does_not_duplicate_the_test_record(tmp_path, reference_run):
    """Resuming continues "as if never stopped": the finished run's metrics must still hold
    one test record, not one per resume."""
    run_dir = tmp_path / "finished"
    shutil.copytree(reference_run, run_dir, symlinks=True)
    assert_ok(cli("train", "--resume", run_dir, "--quiet"))
    tests = [r for r in metrics(run_dir) if r["split"] == "test"]
    assert len(tests) == 1, f"{len(tests)} test records after one resume: {tests}"


def test_resume_tolerates_a_torn_last_metrics_line(tmp_path, reference_run):
    """kill -9 (or power loss) in the middle of appending to metrics.jsonl leaves a partial
    last line; that line is after the latest checkpoint and must be dropped, not crash."""
    run_dir = tmp_path / "torn"
    shutil.copytree(reference_run, run_dir, symlinks=True)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "step": 4')
    result = cli("train", "--resume", run_dir, "--quiet")
    assert_ok(result)


def train_diverging(run_dir, corpus_file):
    """A SMALL run at lr 1e30 without warmup: it diverges at its first steps."""
    return cli(
        "train",
        "--quiet",
        "--preset",
        "tiny",
        "--out",
        run_dir,
        *SMALL,
        f"data={corpus_file}",
        "lr=1e30",
        "warmup_steps=0",
    )


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_0(tmp_path, corpus_file):
    """It diverged at once (lr 1e30): resuming with a sane lr starts it again in its folder."""
    run_dir = tmp_path / "no-checkpoint"
    result = train_diverging(run_dir, corpus_file)
    assert_user_error(result, "no checkpoint was written")
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "latest").exists()
    result = cli("train", "--resume", run_dir, "lr=0.002")
    assert_ok(result)
    assert "has no checkpoint yet: starting it again from step 0" in result.stderr
    assert load_config(run_dir).lr == 0.002
    assert [r["step"] for r in metrics(run_dir) if r["split"] == "train"] == [2, 4, 6, 8, 10, 12]


def test_resume_of_what_is_not_a_run_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(cli("train", "--resume", empty), "is not a run folder")
    assert_user_error(cli("train", "--resume", tmp_path / "does-not-exist"), "no run folder")
    assert not (tmp_path / "does-not-exist").exists() and not list(empty.iterdir())


# --------------------------------------------------------------------------------------
# Divergence


def test_nonfinite_loss_stops_with_one_line_naming_the_step(tmp_path, corpus_file):
    run_dir = tmp_path / "diverged"
    result = train_diverging(run_dir, corpus_file)
    line = assert_user_error(result, "NaN or infinite")
    assert re.search(r"\bstep \d+\b", line), line
    assert not (run_dir / "summary.json").exists()


def test_divergence_message_does_not_point_to_a_checkpoint_that_does_not_exist(tmp_path, corpus_file):
    """With no checkpoint written yet, the message must not call ``RUN/latest`` "the last
    good checkpoint"."""
    run_dir = tmp_path / "diverged"
    line = assert_user_error(
        cli(
            "train",
            "--quiet",
            "--preset",
            "tiny",
            "--out",
            run_dir,
            *SMALL,
            f"data={corpus_file}",
            "lr=1e30",
            "warmup_steps=0",
        )
    )
    assert not (run_dir / "latest").exists()
    assert str(run_dir / "latest") not in line, line


def test_divergence_keeps_the_last_good_checkpoint_intact(tmp_path, corpus_file, monkeypatch):
    """Healthy until step 6, then an absurd learning rate: the run stops with
    TrainingDiverged and ``latest`` still points to the step-4 checkpoint, loadable and finite."""
    config = load_config("tiny", SMALL + [f"data={corpus_file}"])
    real_lr = train_module.learning_rate
    monkeypatch.setattr(
        train_module, "learning_rate", lambda c, step, epoch: 1e38 if step > 6 else real_lr(c, step, epoch)
    )
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"step \d+"):
        train(config, run_dir, quiet=True)
    assert checkpoint_step(run_dir / "latest") == 4
    model, loaded = load_model(run_dir / "latest")
    assert loaded == config
    assert all(torch.isfinite(p).all() for p in model.parameters())
    trainer = torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)
    assert json.loads(trainer["progress"])["step"] == 4
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000004"]


def test_checkpoint_after_an_exploding_update_is_not_kept_as_good(tmp_path, corpus_file):
    """lr=1e38: the first update overflows some weights to inf while the loss of that
    step (computed before the update) was still finite. A checkpoint written then holds
    non-finite weights; it must not survive as ``latest`` ("the last good checkpoint")."""
    run_dir = tmp_path / "run"
    result = cli(
        "train",
        "--quiet",
        "--preset",
        "tiny",
        "--out",
        run_dir,
        *SMALL,
        f"data={corpus_file}",
        "lr=1e38",
        "warmup_steps=0",
        "checkpoint_every_steps=1",
        "log_every_steps=1",
    )
    assert_user_error(result, "NaN or infinite")
    if (run_dir / "latest").exists():
        bad = [k for k, v in weights(run_dir / "latest").items() if not torch.isfinite(v).all()]
        assert not bad, f"latest ({(run_dir / 'latest').resolve().name}) has non-finite weights in {bad}"


# --------------------------------------------------------------------------------------
# Steering: a resumed run may change its budget, learning rate and cadence


@pytest.mark.slow
def test_a_finished_run_extended_with_max_steps_ends_exactly_like_the_longer_run(tmp_path, corpus_file, reference_run):
    """RESUMABLE stopped by max_steps=24 (a finished run, validated and tested), then
    ``--resume RUN max_steps=40``: it ends at step 40 bit for bit like the run that had
    max_steps=40 from the start, and the change is on record."""
    run_dir = tmp_path / "extended"
    with single_thread():
        train(load_config("tiny", RESUMABLE + [f"data={corpus_file}", "max_steps=24"]), run_dir, quiet=True)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 24
    result = cli("train", "--resume", run_dir, "--quiet", "max_steps=40")
    assert_ok(result)
    _assert_same_run(run_dir, reference_run)
    assert checkpoint_step(run_dir / "latest") == 40
    changes = [r for r in metrics(run_dir) if r["split"] == "config"]
    assert changes == [
        {"split": "config", "step": 24, "epoch": changes[0]["epoch"], "changes": {"max_steps": [24, 40]}}
    ]
    assert load_config(run_dir).max_steps == 40 and load_config(run_dir / "latest").max_steps == 40


def test_a_run_resumed_with_a_lower_lr_continues_from_its_checkpoint(tmp_path, corpus_file):
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "log_every_steps=1"])
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(config, run_dir, quiet=True, should_stop=lambda progress: progress.step == 8)
    result = cli("train", "--resume", run_dir, "--quiet", "lr=0.0005")
    assert_ok(result)
    records = metrics(run_dir)
    lrs = {r["step"]: r["lr"] for r in records if r["split"] == "train"}
    assert sorted(lrs) == list(range(1, 13))  # steps 9-12 follow step 8: nothing restarted
    assert lrs[8] == 0.002 and all(lrs[step] == 0.0005 for step in range(9, 13))
    assert [r["changes"] for r in records if r["split"] == "config"] == [{"lr": [0.002, 0.0005]}]
    assert load_config(run_dir / "latest").lr == 0.0005


def test_resume_refuses_changes_to_what_the_checkpoint_holds_and_changes_nothing(tmp_path, reference_run):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir, symlinks=True)
    before = {f: (run_dir / f).read_text() for f in ("config.yaml", "metrics.jsonl", "summary.json")}
    line = assert_user_error(
        cli("train", "--resume", run_dir, "model.d_model=64", "bptt=8", "lr=0.001"),
        "cannot change model.d_model, bptt",
        "--init-from",
    )
    assert "lr" not in line.split("(")[0]
    assert_user_error(cli("train", "--resume", run_dir, "data=elsewhere.txt"), "cannot change data")
    assert_user_error(cli("train", "--resume", run_dir, "max_steps=abc"), "max_steps")
    assert {f: (run_dir / f).read_text() for f in before} == before


def _recipe(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith("model.")]


def test_init_from_starts_a_new_run_from_the_checkpoint_weights_and_model(tmp_path, corpus_file, reference_run):
    """The preset says d_model 512, the checkpoint 32: the model is the checkpoint's, its
    weights are the start, and optimizer and schedule start over (step 1 at warmup lr)."""
    text = tmp_path / "other.txt"
    text.write_bytes(corpus_file.read_bytes()[::-1])  # other text, the same byte frequencies
    run_dir, scratch = tmp_path / "tuned", tmp_path / "scratch"
    recipe = [*_recipe(SMALL), f"data={text}", "log_every_steps=1"]
    result = cli(
        "train", "--preset", "tiny", "--out", run_dir, "--init-from", reference_run, *recipe, "model.dropouth=0.2"
    )
    assert_ok(result)
    config = load_config(run_dir)
    assert config.init_from == str(reference_run) and config.data == str(text)
    expected_model = dataclasses.replace(load_config(reference_run).model, dropouth=0.2)
    assert config.model == expected_model
    first = metrics(run_dir)[0]
    assert (first["step"], first["lr"]) == (1, 0.002 / 5)
    assert_ok(cli("train", "--preset", "tiny", "--out", scratch, *SMALL, *recipe[len(_recipe(SMALL)) :]))
    assert first["bpc"] < metrics(scratch)[0]["bpc"] - 0.5  # trained weights: far below a fresh model's ~8 bits


def test_init_from_refuses_a_model_that_does_not_fit_and_creates_nothing(tmp_path, reference_run):
    out = tmp_path / "run"
    data = load_config(reference_run).data
    assert_user_error(
        cli(
            "train",
            "--preset",
            "tiny",
            "--out",
            out,
            "--init-from",
            reference_run,
            *_recipe(SMALL),
            f"data={data}",
            "model.d_model=64",
        ),
        "model.d_model 32 -> 64",
    )
    assert_user_error(
        cli("train", "--preset", "tiny", "--out", out, "--init-from", tmp_path / "nowhere"), "no checkpoint"
    )
    assert not out.exists()


# --------------------------------------------------------------------------------------
# SIGTERM (what schedulers send before preempting a job)


@pytest.mark.slow
def test_sigterm_saves_latest_exits_143_and_resumes_exactly(tmp_path, corpus_file, reference_run):
    run_dir = tmp_path / "preempted"
    process = sharnn_process(
        "train", "--preset", "tiny", "--out", run_dir, "--quiet", *RESUMABLE, f"data={corpus_file}"
    )
    _, stderr = signal_when(process, lambda: (run_dir / "latest").exists(), signal.SIGTERM)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode in (143, 0), (process.returncode, lines)
    if process.returncode == 143:
        assert len(lines) == 1, lines
        match = re.fullmatch(
            r"interrupted by SIGTERM at step (\d+); continue with: sharnn train --resume (.+)", lines[0]
        )
        assert match, lines
        assert checkpoint_step(run_dir / "latest") == int(match.group(1))
    assert_ok(cli("train", "--resume", run_dir, "--quiet"))
    _assert_same_run(run_dir, reference_run)


# --------------------------------------------------------------------------------------
# What a run reports: epochs, tokens/s, progress


def test_epochs_are_epochs_done_in_records_and_summary(two_epoch_reference):
    records = metrics(two_epoch_reference)
    valid = [r for r in records if r["split"] == "valid"]
    assert [r["epoch"] for r in valid if r["epoch"] in (1.0, 2.0)] == [1.0, 2.0]  # validations at the epochs' ends
    train_epochs = [r["epoch"] for r in records if r["split"] == "train"]
    assert train_epochs == sorted(train_epochs) and 0 < train_epochs[0] < 0.2 and train_epochs[-1] == 2.0
    assert json.loads((two_epoch_reference / "summary.json").read_text())["epochs"] == 2.0


@pytest.mark.slow
def test_tokens_per_s_counts_training_time_only(tmp_path, corpus_file, monkeypatch):
    """Each validation takes 1,000 s on the meter's clock: the train records after it keep
    their speed. The clock advances 1 ms per reading, never with the machine's load:
    counted, every record after the first would show fewer than 0.2 tokens/s (two steps of
    64 tokens over 1,000 s); not counted, each shows its tokens over a few readings."""
    skipped, ticks = [0.0], itertools.count()
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3 + skipped[0])  # 1 ms a reading
    monkeypatch.setattr(metrics_module, "time", clock)
    real_evaluate = train_module.evaluate

    def slow_evaluate(*args, **kwargs):
        skipped[0] += 1000.0
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", slow_evaluate)
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "valid_every_steps=2", "max_steps=16"])
    with single_thread():
        train(config, tmp_path / "run", quiet=True)
    assert skipped[0] >= 7000.0  # the validations ran: 7 in 16 steps, and the final one
    speeds = [r["tokens_per_s"] for r in metrics(tmp_path / "run") if r["split"] == "train"]
    assert len(speeds) >= 7 and min(speeds) > 128 / 500, speeds


def test_without_a_terminal_progress_lines_follow_max_steps(tmp_path, corpus_file, capsys):
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "progress_every_seconds=1e-9"])
    with single_thread():
        train(config, tmp_path / "run")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train ")]
    assert len(lines) == 12, lines  # one per step: an epoch here is ~900 steps, max_steps 12
    assert re.match(r"train  50% \| step 6/12, epoch 0\.0\d/1, bpc \d\.\d+", lines[5]), lines[5]
    assert lines[-1].startswith("train 100% | step 12/12")
    assert "left" in lines[-1]


def test_a_finite_blow_up_stops_naming_the_step_and_nothing_is_saved_from_it(tmp_path, corpus_file):
    """lr=1e6: the loss runs to ~1e17 bits per byte without ever being NaN. The run stops,
    and no checkpoint holds a state whose loss was above the limit."""
    run_dir = tmp_path / "run"
    result = cli(
        "train",
        "--quiet",
        "--preset",
        "tiny",
        "--out",
        run_dir,
        *SMALL,
        f"data={corpus_file}",
        "lr=1e6",
        "max_steps=100",
        "log_every_steps=1",
        "checkpoint_every_steps=1",
    )
    line = assert_user_error(result, "training diverged", "above 16 bits per token")
    stopped = int(re.search(r"at step (\d+)", line).group(1))
    assert stopped < 30 and not (run_dir / "summary.json").exists()
    losses = {r["step"]: r["bpc"] for r in metrics(run_dir) if r["split"] == "train"}
    assert max(losses.values()) > 1e6  # finite, far above 8 bits
    if (run_dir / "latest").exists():
        assert losses[checkpoint_step(run_dir / "latest")] < 16


# --------------------------------------------------------------------------------------
# Learning on real data


@pytest.mark.slow
def test_tiny_preset_learns_enwik8(tmp_path):
    """The tiny preset's model, a short run on the bundled enwik8 bytes: valid BPC falls
    far below the 8-bit uniform baseline (< 4.0) and below its first validation.

    The model shape comes from presets/tiny.yaml at test time; only the length of the run
    (140 steps, warmup 20, 8 streams of 64-byte windows) and the evaluation (16 KB prefixes) are cut. It is the
    suite's longest test (``pytest tests/test_train.py -k tiny_preset_learns``)."""
    config = load_config(
        "tiny",
        [
            "data=enwik8-head",
            "max_steps=140",
            "warmup_steps=20",
            "train_streams=8",
            "bptt=64",
            "valid_every_steps=35",
            "valid_max_bytes=16384",
            "test_max_bytes=16384",
            "checkpoint_every_steps=1000",
            "log_every_steps=10",
            "sample_bytes=0",
            "valid_fraction=0.01",
            "test_fraction=0.01",
        ],
    )
    summary = train(config, tmp_path / "learn", quiet=True)
    valid = [r["bpc"] for r in metrics(tmp_path / "learn") if r["split"] == "valid"]
    assert len(valid) == 4
    assert valid[-1] < valid[0] - 0.5, valid
    assert valid[-1] < 4.0, valid
    assert summary["valid_bpc"] == min(valid)
    assert summary["test_bpc"] < 4.5
    assert math.isfinite(summary["test_bpc"])


@pytest.mark.slow  # a few seconds: out of the working loop
def test_bf16_autocast_trains_on_cpu(tmp_path):
    """precision=bf16 runs the model under autocast (CPU here) and still learns finitely."""
    config = load_config(
        "tiny",
        [
            "data=enwik8-head",
            "precision=bf16",
            "model.d_model=32",
            "model.boom_dim=64",
            "model.attention_span=48",
            "bptt=16",
            "train_streams=4",
            "max_steps=30",
            "warmup_steps=5",
            "valid_every_steps=15",
            "checkpoint_every_steps=100",
            "sample_bytes=0",
            "valid_fraction=0.01",
            "test_fraction=0.01",
        ],
    )
    summary = train(config, tmp_path / "bf16", quiet=True)
    valid = [r["bpc"] for r in metrics(tmp_path / "bf16") if r["split"] == "valid"]
    assert all(math.isfinite(v) for v in valid) and valid[-1] < valid[0]
    assert math.isfinite(summary["test_bpc"]) and summary["test_bpc"] < 8.0
