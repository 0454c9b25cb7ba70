"""Multi-process training under torchrun (sharnn.training.distributed), on the CPU with gloo and
real processes: two ranks train as one process does, a two-process run killed with
kill -9 resumes exactly, and a process count that does not divide the streams is refused.

Each torchrun launch costs a few seconds of start-up; the runs are the tiny SMALL model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import (
    RESUMABLE,
    SMALL,
    SUBPROCESS_ENV,
    assert_ok,
    assert_same_weights,
    cli,
    metrics,
    wait_for,
    weights,
    write_small_corpus,
)
from sharnn.errors import ConfigError
from sharnn.evaluation import EvalResult
from sharnn.models.sharnn import State
from sharnn.training.distributed import Distributed
from sharnn.training.recipe import block_of_streams


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    return write_small_corpus(tmp_path_factory.mktemp("data") / "corpus.txt")


def torchrun(processes: int, *args, **popen_kwargs) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node=PROCESSES -m sharnn ARGS`` as a real process
    (a free port on localhost for the rendezvous)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "sharnn",
        *[str(a) for a in args],
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV, **popen_kwargs
    )


def run_torchrun(processes: int, *args) -> subprocess.CompletedProcess:
    process = torchrun(processes, *args)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def train_args(corpus_file: Path, run_dir: Path, recipe: list[str]) -> list[str]:
    return ["train", "--preset", "tiny", "--out", run_dir, f"data={corpus_file}", *recipe]


def assert_finished(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"


def scores(run_dir: Path) -> list[tuple]:
    """Every logged loss and score of a run: (split, step, bpc)."""
    return [(r["split"], r["step"], r["bpc"]) for r in metrics(run_dir) if "bpc" in r]


@pytest.mark.slow
def test_two_processes_train_as_one_process_on_all_the_streams(tmp_path, corpus_file):
    """Without dropout (whose masks a rank draws for its own streams), 2 ranks on 2 + 2
    streams compute the update 1 process computes on 4: the same losses at every step,
    the same valid and test BPC (split across the ranks, totals added), the same weights
    and, gathered from both ranks, the same recurrent state, to fp32 rounding."""
    recipe = [*SMALL, "log_every_steps=1", "valid_every_steps=6", "progress_every_seconds=0.01"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert_ok(cli(*train_args(corpus_file, one, recipe)))
    result = run_torchrun(2, *train_args(corpus_file, two, recipe))
    assert_finished(result)
    assert "2 processes" in result.stderr and result.stdout.count("done: valid") == 1  # rank 0 alone reports
    shown = [
        int(line.split("step ")[1].split("/")[0]) for line in result.stderr.splitlines() if line.startswith("train ")
    ]
    assert shown and shown == sorted(set(shown)), shown  # one progress display, not one per process

    expected, got = scores(one), scores(two)
    assert [(split, step) for split, step, _ in got] == [(split, step) for split, step, _ in expected]
    assert len([s for s in got if s[0] == "train"]) == 12 and len([s for s in got if s[0] == "valid"]) == 2
    for (split, step, a), (_, _, b) in zip(expected, got):
        assert b == pytest.approx(a, rel=1e-6, abs=1e-6), (split, step)
    for name, tensor in weights(one / "latest").items():
        torch.testing.assert_close(weights(two / "latest")[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    state_one, state_two = (
        load_file(one / "latest" / "state.safetensors"),
        load_file(two / "latest" / "state.safetensors"),
    )
    assert state_two.keys() == state_one.keys() and state_two["lstm.0.h"].shape == (1, 4, 32)  # all 4 streams
    for name, tensor in state_one.items():
        torch.testing.assert_close(state_two[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    trainer = torch.load(two / "latest" / "trainer.pt", weights_only=True)
    assert trainer["torch_rng"].shape[0] == 2 and not torch.equal(*trainer["torch_rng"])  # each rank's own RNG


@pytest.mark.slow
def test_torchrun_with_one_process_is_a_plain_run(tmp_path, corpus_file):
    """One process under torchrun trains through DistributedDataParallel and gloo, and
    ends bit for bit where a plain run does (dropout on: the same masks)."""
    recipe = [*RESUMABLE, "max_steps=16"]
    plain, launched = tmp_path / "plain", tmp_path / "torchrun"
    assert_ok(cli(*train_args(corpus_file, plain, recipe)))
    assert_finished(run_torchrun(1, *train_args(corpus_file, launched, recipe)))
    assert_same_weights(plain / "latest", launched / "latest")
    assert scores(plain) == scores(launched)
    runs = [json.loads(line) for line in (launched / "metrics.jsonl").read_text().splitlines() if '"run"' in line]
    assert runs[0]["processes"] == 1
    assert runs[0]["command"].startswith(
        f"torchrun --standalone --nproc_per_node=1 -m sharnn train --preset tiny --out {launched}"
    )


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torchrun_with_one_process_on_cuda_matches_a_plain_run(tmp_path, corpus_file):
    """On a GPU (NCCL): one process under torchrun against a plain run, in fp32 on the
    eager path; GPU kernels need not be bitwise repeatable, so to fp32 tolerance."""
    recipe = [*SMALL, "log_every_steps=1", "device=cuda", "precision=fp32", "fast_path=off", "compile=false"]
    plain, launched = tmp_path / "plain", tmp_path / "torchrun"
    assert_ok(cli(*train_args(corpus_file, plain, recipe)))
    assert_finished(run_torchrun(1, *train_args(corpus_file, launched, recipe)))
    for (split, step, a), (_, _, b) in zip(scores(plain), scores(launched), strict=True):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-5), (split, step)
    for name, tensor in weights(plain / "latest").items():
        torch.testing.assert_close(weights(launched / "latest")[name], tensor, msg=name)


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (torchrun starts each worker in a session of its own,
    so killing torchrun's process group would leave them running)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, queue = [], [pid]
    while queue:
        tree.append(queue.pop())
        queue.extend(parents.get(tree[-1], []))
    return tree


@pytest.mark.slow
def test_a_two_process_run_killed_with_kill_9_resumes_exactly(tmp_path, corpus_file):
    """kill -9 of torchrun and both workers after the first checkpoint (step 4 of 40, with
    dropout): ``torchrun ... train --resume`` ends with the weights and the logged losses
    of the uninterrupted two-process run, bit for bit (each rank's streams and RNG were
    gathered into the checkpoint)."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert_finished(run_torchrun(2, *train_args(corpus_file, whole, RESUMABLE)))

    process = torchrun(2, *train_args(corpus_file, killed, RESUMABLE))
    try:
        assert wait_for(lambda: (killed / "latest").is_symlink(), process)  # the first checkpoint, step 4 of 40
        tree = _process_tree(process.pid)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
    finally:
        process.kill()
        process.communicate()
    assert len(tree) >= 3  # torchrun and its two workers
    assert wait_for(
        lambda: not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in tree), timeout=30
    )
    stopped_at = int((killed / "latest").resolve().name.split("-")[1])
    assert stopped_at < 40 and not (killed / "summary.json").exists()

    assert_finished(run_torchrun(2, "train", "--resume", killed))
    assert_same_weights(whole / "latest", killed / "latest")
    assert scores(killed) == scores(whole)
    resumes = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines() if '"run"' in line]
    assert [r["step"] for r in resumes] == [0, stopped_at] and all(r["processes"] == 2 for r in resumes)


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_process_at_one_step_and_saves_it(tmp_path, corpus_file):
    """SIGTERM to torchrun, which passes it on to its workers (a scheduler's preemption):
    they agree on one step, save it as ``latest`` and print the torchrun command that
    resumes the run, once."""
    run_dir = tmp_path / "run"
    process = torchrun(
        2, *train_args(corpus_file, run_dir, [*RESUMABLE, "max_steps=100000", "checkpoint_every_steps=100000"])
    )
    try:
        assert wait_for(
            lambda: (
                any(r["split"] == "train" for r in metrics(run_dir)) if (run_dir / "metrics.jsonl").exists() else False
            ),
            process,
        )
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    stops = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(stops) == 1, stderr
    step = int(stops[0].split("at step ")[1].split(";")[0])
    assert stops[0] == (
        f"interrupted by SIGTERM at step {step}; continue with: "
        f"torchrun --standalone --nproc_per_node=2 -m sharnn train --resume {run_dir}"
    )
    assert (run_dir / "latest").resolve().name == f"step-{step:08d}"
    assert load_file(run_dir / "latest" / "state.safetensors")["lstm.0.h"].shape[1] == 4  # both processes' streams


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie, already dead), or "Z" if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.slow
def test_a_process_count_that_does_not_divide_the_streams_is_refused_with_one_line(tmp_path, corpus_file):
    """3 processes for 4 train streams: the workers print one error line between them
    (torchrun then adds its own failure report) and nothing is created."""
    run_dir = tmp_path / "run"
    result = run_torchrun(3, *train_args(corpus_file, run_dir, SMALL))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [
        "error: train_streams=4 cannot be divided among 3 processes: run a number of processes "
        "that divides 4, or change train_streams"
    ], result.stderr
    frames = [line for line in result.stderr.splitlines() if line.strip().startswith('File "')]
    assert all("torch/distributed" in line or "runpy" in line for line in frames), frames  # torchrun's, not ours
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_run_folder_that_exists_is_refused_with_one_line_and_no_traceback(tmp_path, corpus_file):
    """The main process alone creates the run folder; its refusal reaches the other
    process, which stops without a traceback of its own."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_torchrun(2, *train_args(corpus_file, run_dir, SMALL))
    assert result.returncode != 0
    assert [line for line in result.stderr.splitlines() if "error:" in line] == [
        f"error: run folder {run_dir} already exists; resume it with --resume or choose another --out"
    ], result.stderr
    assert "[rank1]" not in result.stderr and not list(run_dir.iterdir())


@pytest.mark.slow
def test_a_two_process_run_goes_on_in_one_process(tmp_path, corpus_file):
    """Resumed with another number of processes, a run goes on from its checkpoint: the
    streams are divided again and dropout draws fresh masks (said in one line)."""
    run_dir = tmp_path / "run"
    assert_finished(run_torchrun(2, *train_args(corpus_file, run_dir, [*RESUMABLE, "max_steps=8"])))
    result = cli("train", "--resume", run_dir, "max_steps=12")
    assert_ok(result)
    assert "the checkpoint was saved by 2 process(es), this run has 1" in result.stderr
    assert [r["step"] for r in metrics(run_dir) if r["split"] == "valid"] == [8, 12]
    assert torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)["torch_rng"].shape[0] == 1


def test_one_process_outside_torchrun_is_the_identity():
    """Outside torchrun every method of Distributed leaves things as they are."""
    single = Distributed.from_environment("cpu")
    assert (single.active, single.rank, single.world_size, single.is_main) == (False, 0, 1, True)
    loss, state = torch.tensor(2.5), State(lstm=[(torch.ones(1, 4, 3), torch.zeros(1, 4, 3))], memory=[None])
    assert single.mean(loss) is loss and single.agree(True, 3.0) == (True, 3.0)
    totals = EvalResult(nats=1.5, tokens=10).totals()
    assert single.sum(totals) is totals and EvalResult.from_totals(totals, words=False) == EvalResult(1.5, 10)
    tensors = state.tensors()
    assert single.gather_streams(tensors) is tensors and single.block(4, "train_streams") == slice(0, 4)
    assert single.gather_rows(torch.arange(3)).tolist() == [[0, 1, 2]]
    assert single.device(torch.device("cpu")) == "cpu" and single.share("name") == "name"


def test_streams_are_divided_in_contiguous_blocks(monkeypatch):
    """Rank r of N takes streams r B/N .. (r+1) B/N - 1; its block of a saved state is
    those streams."""
    blocks = [Distributed(rank=r, world_size=4, active=True).block(8, "train_streams") for r in range(4)]
    assert blocks == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    saved = State(
        lstm=[(torch.arange(8.0).view(1, 8, 1), -torch.arange(8.0).view(1, 8, 1))],
        memory=[torch.arange(16.0).view(2, 8, 1)],
    )
    mine = block_of_streams(saved, blocks[2], 1)
    assert mine.lstm[0][0].flatten().tolist() == [4.0, 5.0] and mine.memory[0][:, :, 0].tolist() == [
        [4.0, 5.0],
        [12.0, 13.0],
    ]
    with pytest.raises(ConfigError, match="test_streams=6 cannot be divided among 4 processes"):
        Distributed(rank=0, world_size=4, active=True).block(6, "test_streams")
