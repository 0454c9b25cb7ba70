"""Checkpoints (src/sharnn/training/checkpoint.py): the folder format, a run's step folders with
their ``latest`` and ``best`` links, clean-up, and the repair of ``best`` after a crash."""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import shutil
import stat
from pathlib import Path

import pytest
import torch

from helpers import SMALL, assert_ok, checkpoint_step, cli, sharnn_process, write_small_corpus
from sharnn.config import load_config
from sharnn.errors import CheckpointError, RunError
from sharnn.runtime import Runtime
from sharnn.training import checkpoint as checkpoint_module
from sharnn.training.checkpoint import RunCheckpoints, read_checkpoint, read_info, write_checkpoint
from sharnn.training.recipe import TrainingState, train_step
from sharnn.training.trainer import train

CONFIG = load_config("tiny", SMALL + ["model.dropouth=0.1"])


@pytest.fixture()
def trained_state() -> TrainingState:
    """A TrainingState two steps in, with a recurrent state and optimizer moments."""
    state = TrainingState(CONFIG, Runtime(torch.device("cpu")))
    tokens = torch.randint(0, 256, (17, 4), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        _, _, state.recurrent_state = train_step(
            state.model, state.optimizer, state.scaler, tokens[:-1], tokens[1:], state.recurrent_state, CONFIG.clip
        )
        state.progress.step += 1
    return state


def test_a_training_state_round_trips_through_a_checkpoint(tmp_path, trained_state):
    saved = trained_state.state_dict()
    write_checkpoint(tmp_path / "ckpt", CONFIG, saved)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "config.yaml",
        "model.safetensors",
        "state.safetensors",
        "trainer.pt",
    ]
    back = read_checkpoint(tmp_path / "ckpt", CONFIG.model.n_layers)
    assert back["model"].keys() == saved["model"].keys()
    assert all(torch.equal(back["model"][k], v) for k, v in saved["model"].items())
    for (h, c), (h2, c2) in zip(saved["recurrent_state"].lstm, back["recurrent_state"].lstm):
        assert torch.equal(h, h2) and torch.equal(c, c2)
    assert json.loads(back["trainer"]["progress"])["step"] == 2
    assert torch.equal(back["trainer"]["torch_rng"], saved["trainer"]["torch_rng"])
    assert load_config(tmp_path / "ckpt") == CONFIG


def test_write_refuses_an_existing_folder_and_leaves_no_staging(tmp_path, trained_state):
    write_checkpoint(tmp_path / "ckpt", CONFIG, trained_state.state_dict())
    with pytest.raises(CheckpointError, match="already exists"):
        write_checkpoint(tmp_path / "ckpt", CONFIG, trained_state.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_run_keeps_only_linked_checkpoints(tmp_path, trained_state):
    checkpoints = RunCheckpoints(tmp_path)
    state = trained_state.state_dict()
    checkpoints.save(4, CONFIG, state, best=True)
    checkpoints.save(8, CONFIG, state, best=False)
    assert (checkpoint_step(checkpoints.latest), checkpoint_step(checkpoints.best)) == (8, 4)
    checkpoints.save(12, CONFIG, state, best=True)
    assert (checkpoint_step(checkpoints.latest), checkpoint_step(checkpoints.best)) == (12, 12)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000012"]
    with pytest.raises(RunError, match="in use"):
        checkpoints.save(12, CONFIG, state, best=False)
    # a folder a killed run wrote after its last link is replaced, not refused
    checkpoints.step_folder(16).mkdir()
    checkpoints.save(16, CONFIG, state, best=False)
    assert checkpoint_step(checkpoints.latest) == 16 and checkpoints.has_latest()


def test_repair_points_best_at_the_recorded_step(tmp_path, trained_state):
    checkpoints = RunCheckpoints(tmp_path)
    checkpoints.save(4, CONFIG, trained_state.state_dict(), best=False)  # as if killed before `best` moved
    assert not checkpoints.best.exists()
    checkpoints.repair_best(4)
    assert checkpoint_step(checkpoints.best) == 4
    checkpoints.repair_best(99)  # no such checkpoint: nothing to point at
    assert checkpoint_step(checkpoints.best) == 4


def test_load_latest_errors(tmp_path, trained_state):
    checkpoints = RunCheckpoints(tmp_path)
    with pytest.raises(RunError, match="nothing to resume"):
        checkpoints.load_latest(2, "cpu")
    checkpoints.save(4, CONFIG, {"model": trained_state.model.state_dict()}, best=False)  # weights only
    with pytest.raises(CheckpointError, match=r"trainer\.pt"):
        checkpoints.load_latest(2, "cpu")
    checkpoints.save(8, CONFIG, trained_state.state_dict(), best=False)
    for damage in (b"not a torch file", os.urandom(5000), (checkpoints.latest / "trainer.pt").read_bytes()[:3000]):
        (checkpoints.latest / "trainer.pt").write_bytes(damage)
        with pytest.raises(CheckpointError, match=r"trainer\.pt is missing or corrupt"):
            checkpoints.load_latest(2, "cpu")


def test_crash_between_the_latest_and_best_links_resumes_consistently(tmp_path, monkeypatch):
    """A crash after ``latest`` points at a new checkpoint but before ``best`` does: the
    resumed run must still test (and report) a real best checkpoint. Here the only
    validation is at the last step, so after the crash there is no ``best`` link at all
    while the saved progress already says best_step = 4."""
    corpus_file = write_small_corpus(tmp_path / "small.txt")
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "max_steps=4"])
    real_point = checkpoint_module.point

    class Crash(BaseException):
        pass

    def crashing_point(link, target):
        if Path(link).name == "best":
            raise Crash("simulated kill -9 between the two link swaps")
        real_point(link, target)

    monkeypatch.setattr(checkpoint_module, "point", crashing_point)
    with pytest.raises(Crash):
        train(config, tmp_path / "run", quiet=True)
    monkeypatch.setattr(checkpoint_module, "point", real_point)
    assert checkpoint_step(tmp_path / "run" / "latest") == 4

    result = cli("train", "--resume", tmp_path / "run", "--quiet")
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert_ok(result)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert checkpoint_step(tmp_path / "run" / "best") == summary["best_step"] == 4


# --------------------------------------------------------------------------------------
# A checkpoint that cannot be written


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_links_and_no_staging(
    tmp_path, trained_state, monkeypatch
):
    """The disk fills while trainer.pt is written: one-line CheckpointError; the staging
    folder is gone, the step folder was never created, ``latest`` and ``best`` still
    point at the previous checkpoint, which still loads."""
    checkpoints = RunCheckpoints(tmp_path)
    state = trained_state.state_dict()
    checkpoints.save(4, CONFIG, state, best=True)

    class FillsUp(io.FileIO):
        def write(self, data):
            if str(self.name).endswith("trainer.pt"):
                super().write(data[:100])
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    monkeypatch.setattr(checkpoint_module, "open", FillsUp, raising=False)
    with pytest.raises(CheckpointError) as error:
        checkpoints.save(8, CONFIG, state, best=True)
    assert str(error.value) == f"cannot write the checkpoint {checkpoints.step_folder(8)}: No space left on device"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000004"]
    assert checkpoint_step(checkpoints.latest) == checkpoint_step(checkpoints.best) == 4
    monkeypatch.undo()
    assert json.loads(checkpoints.load_latest(2, "cpu")["trainer"]["progress"])["step"] == 2


def test_free_space_is_checked_before_anything_is_written(tmp_path, trained_state, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: real(path)._replace(free=1 << 20))
    with pytest.raises(
        CheckpointError, match=r"not enough free space .* \(1 MB free\); a run needs room for two checkpoints"
    ):
        write_checkpoint(tmp_path / "ckpt", CONFIG, trained_state.state_dict())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_file_size_limit_during_training_is_one_line_and_leaves_no_staging(tmp_path):
    """A real write failure: the process may not write files over 200 KB, so trainer.pt
    (the Adam-style moments, ~270 KB here) fails at the first save with EFBIG."""
    corpus = write_small_corpus(tmp_path / "small.txt")
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # noqa: E731
    process = sharnn_process(
        "train", "--preset", "tiny", "--out", tmp_path / "run", "--quiet", *SMALL, f"data={corpus}", preexec_fn=limit
    )
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1, stderr
    assert (
        stderr.strip()
        == f"error: cannot write the checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-00000004'}: File too large"
    )
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []


def test_checkpoint_files_share_the_usual_mode_and_carry_their_info(tmp_path, trained_state):
    folder = write_checkpoint(
        tmp_path / "ckpt", CONFIG, trained_state.state_dict(), info={"step": "2", "valid_bpc": "5.5"}
    )
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {
        name: 0o666 & ~umask for name in ("config.yaml", "model.safetensors", "state.safetensors", "trainer.pt")
    }
    assert read_info(folder) == {"step": "2", "valid_bpc": "5.5"}
