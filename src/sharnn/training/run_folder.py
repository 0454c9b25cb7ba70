"""The folder of a training run (docs/training.md, "The run folder")::

    config.yaml            the resolved TrainConfig
    metrics.jsonl, events.out.tfevents.*, bpc.png     (sharnn.training.metrics)
    checkpoints/step-N/, latest, best                 (sharnn.training.checkpoint)
    summary.json           final valid and test BPC, parameter counts, steps, time
    .lock                  held by the process that trains in it (sharnn.files.Lock)

:class:`RunFolder` writes it, from the main process of a run alone. Around it, what a
run's records, stop and resume need of run folders: :class:`TrainLog` (the train
records), :func:`config_changes`, :func:`read_summary`, the commands that start and
resume a run (:func:`command_line`, :func:`resume_command`), and :class:`StopRequest`
(Ctrl-C, SIGTERM or a hook: the run saves ``latest`` and stops). How a run starts or
resumes in it: :mod:`sharnn.training.run_start`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import sys
from pathlib import Path

import torch

from .. import files
from ..config import TrainConfig, flatten, to_yaml
from ..errors import CheckpointError, Interrupted, RunError
from ..evaluation import EvalResult
from ..files import Lock, write_atomically
from .checkpoint import RunCheckpoints, read_info
from .distributed import Distributed, launched_by_torchrun, launcher, launcher_as_typed
from .metrics import MetricsLog, scores
from .recipe import Progress, TrainingState

LOCK_FILE = ".lock"  # in a run folder: held by the process that trains in it (sharnn.files.Lock)


class RunFolder:
    """The run folder of one training run, as each of its processes sees it: the main
    process alone writes it and holds its lock; on the others the methods that write do
    nothing. Use it in a ``with`` block: its end releases the lock.

    Collective: every process calls :meth:`lock_for_resume`, :meth:`create`,
    :meth:`reopen`, :meth:`remove_staging`, :meth:`record`, :meth:`save` and
    :meth:`finish` (each writes through :meth:`Distributed.on_main`, which raises an
    error of the main process, a full disk say, on every process); :meth:`log` is
    the main process's alone, without communication.

    Args:
        path: the run folder.
        distributed: the processes of the run (default: one).
    """

    def __init__(self, path: str | Path, distributed: Distributed = Distributed()):
        self.path, self.distributed = Path(path), distributed
        self.lock = Lock(self.path / LOCK_FILE, str(path))
        self.checkpoints = RunCheckpoints(self.path)
        self.metrics: MetricsLog | _NoMetrics = _NoMetrics()
        self.saved_step: int | None = None  # the step of the last checkpoint this run wrote or resumed from

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()

    def lock_for_resume(self) -> None:
        """Take the run folder to resume for this run alone (a folder that is not a run,
        without ``config.yaml``, is refused by the resume, and gets no lock file).

        Raises:
            LockError: another process trains in it.
        """
        self.distributed.on_main(lambda: self.lock.acquire() if (self.path / "config.yaml").is_file() else None)

    def create(self, config: TrainConfig, restart: bool) -> None:
        """Create the run folder (with ``restart``, one that exists without a checkpoint),
        lock it, write its ``config.yaml`` and open its metrics with this start's ``run`` record.

        Raises:
            RunError: the folder exists (without ``restart``) or cannot be created.
        """
        self.metrics = self.distributed.on_main(lambda: self._create(config, restart)) or _NoMetrics()

    def _create(self, config: TrainConfig, restart: bool) -> MetricsLog:
        if not restart and self.path.exists():
            raise RunError(f"run folder {self.path} already exists; resume it with --resume or choose another --out")
        try:
            self.path.mkdir(parents=True, exist_ok=restart)
            self.lock.acquire()
            write_atomically(self.path / "config.yaml", to_yaml(config))
        except OSError as e:
            raise RunError(f"cannot create the run folder {self.path}: {e.strerror or e}") from None
        metrics = MetricsLog(self.path, resume_step=0 if restart else None)
        metrics.log(self._run_record(0))
        metrics.log_config(to_yaml(config), 0)
        return metrics

    def reopen(self, config: TrainConfig, step: int, best_step: int, epochs: float, changes: dict[str, list]) -> None:
        """A resumed run's folder, at the checkpoint of ``step``: ``best`` repaired (to
        ``best_step``), the metrics opened with this resume's ``run`` record (and the test
        records of a finished run that is extended), the changed settings recorded (in
        ``metrics.jsonl`` at ``epochs`` and in ``config.yaml``)."""
        self.metrics = (
            self.distributed.on_main(lambda: self._reopen(config, step, best_step, epochs, changes)) or _NoMetrics()
        )
        self.saved_step = step

    def _reopen(
        self, config: TrainConfig, step: int, best_step: int, epochs: float, changes: dict[str, list]
    ) -> MetricsLog:
        self.checkpoints.repair_best(best_step)
        ended_here = (read_summary(self.path) or {}).get("steps") == step
        metrics = MetricsLog(self.path, resume_step=step, ended_here=ended_here)
        metrics.log(self._run_record(step))
        if changes:
            metrics.log({"split": "config", "step": step, "epoch": round(epochs, 4), "changes": changes})
            write_atomically(self.path / "config.yaml", to_yaml(config))
        metrics.log_config(to_yaml(config), step)
        return metrics

    def _run_record(self, step: int) -> dict:
        """The ``run`` record of this start or resume: the command line and the processes."""
        return {"split": "run", "step": step, "command": command_line(), "processes": self.distributed.world_size}

    def remove_staging(self) -> None:
        """Remove what a save killed by ``kill -9`` left half made (:meth:`RunCheckpoints.remove_staging`)."""
        self.distributed.on_main(self.checkpoints.remove_staging)

    def restore(self, state: TrainingState, n_layers: int, device: torch.device) -> None:
        """Load ``latest`` into ``state``, having removed what a save killed by ``kill -9``
        left half made. Collective.

        Raises:
            CheckpointError: a ``latest`` that cannot be read, or does not fit ``state``.
        """
        self.remove_staging()
        saved = self.checkpoints.load_latest(n_layers, device)
        try:
            state.load_state_dict(saved)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            detail = " ".join(str(e).split())[:300]
            raise CheckpointError(f"cannot resume from {self.checkpoints.latest.resolve()}: {detail}") from None

    def log(self, record: dict, extra_scalars: dict | None = None) -> None:
        """Log a train record (:meth:`MetricsLog.log`); the main process's alone."""
        self.metrics.log(record, extra_scalars)

    def record(self, record: dict) -> None:
        """Log a validation or test record and redraw ``bpc.png``."""
        self.distributed.on_main(lambda: self._record(record))

    def _record(self, record: dict) -> None:
        self.metrics.log(record)
        self.metrics.plot()

    def save(
        self,
        config: TrainConfig,
        state: dict,
        progress: Progress,
        epochs: float,
        valid_bpc: float | None,
        again: bool = False,
    ) -> None:
        """Checkpoint ``state`` (what every process's :meth:`TrainingState.state_dict`
        gave the main one) at ``progress`` (``epochs``: the epochs of training done) as
        ``latest``, and as ``best`` when ``valid_bpc``, this step's validation, is the best
        so far; ``again``: write the step's checkpoint again in place
        (:meth:`RunCheckpoints.rewrite`).

        Raises:
            CheckpointError, RunError: see :meth:`RunCheckpoints.save`.
        """
        step = progress.step
        info = {
            "step": str(step),
            "epochs": f"{epochs:.4f}",
            "best_valid_bpc": repr(progress.best_valid_bpc),
            "best_step": str(progress.best_step),
        }
        if valid_bpc is not None:
            info["valid_bpc"] = repr(valid_bpc)
        best = valid_bpc is not None and progress.best_step == step
        write = self.checkpoints.rewrite if again else self.checkpoints.save
        self.distributed.on_main(lambda: write(step, config, state, best=best, info=info))
        self.saved_step = step

    def finish(
        self,
        config: TrainConfig,
        state: TrainingState,
        test: EvalResult,
        tokenizer: str,
        epochs: float,
        prefix_bytes: dict[str, int | None],
    ) -> dict:
        """The end of a run, scored on the test split with the weights of its best step
        (``test``): log the test record and the run's settings as TensorBoard
        hyperparameters, write ``summary.json``, close the metrics.

        Args:
            state: the run's training state, at its last step, with the best weights.
            tokenizer: the name of the corpus's tokenizer.
            epochs: the epochs of training done.
            prefix_bytes: for ``valid`` and ``test``, the bytes scored (``valid_max_bytes``
                and ``test_max_bytes``), or None for the whole split.

        Returns:
            The summary (its keys: :func:`sharnn.training.trainer.train`).
        """
        progress, model = state.progress, state.model
        summary = {
            "run_dir": str(self.path),
            "valid_bpc": progress.best_valid_bpc,
            "valid_prefix_bytes": prefix_bytes["valid"],
            "test_bpc": test.bpc,
            "test_prefix_bytes": prefix_bytes["test"],
            "test_perplexity": test.perplexity,
            "test_word_perplexity": test.word_perplexity,
            "tokenizer": tokenizer,
            "best_step": progress.best_step,
            "steps": progress.step,
            "epochs": round(epochs, 4),
            "train_seconds": round(progress.elapsed, 1),
            "parameters": model.num_parameters(),
            "parameters_collapsed": model.num_parameters(collapsed=True),
        }
        record = {
            "split": "test",
            "step": progress.best_step,
            "epoch": round(epochs, 4),
            "run_step": progress.step,
            **scores(test, prefix_bytes["test"]),
        }

        def write_results() -> None:
            self._record(record)
            self.metrics.log_hparams(flatten(dataclasses.asdict(config)), summary["valid_bpc"], test.bpc, progress.step)
            write_atomically(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")

        self.distributed.on_main(write_results)
        self.metrics.close()
        return summary

    def summary(self) -> dict | None:
        """The run's ``summary.json`` (:func:`read_summary`)."""
        return read_summary(self.path)

    def kept(self, lr: float) -> str:
        """What a diverged run keeps: its last good checkpoint, and how to resume it."""
        if not self.checkpoints.has_latest():
            return "no checkpoint was written; start again with a lower lr"
        step = read_info(self.checkpoints.latest).get("step", "?")
        return (
            f"the last good checkpoint, step {step}, is kept: resume it with a lower learning rate, "
            f"e.g. {resume_command(self.path)} lr={lr / 4:g}"
        )

    def interrupted(self, signum: int | None, step: int) -> Interrupted:
        """The error that ends a run stopped at ``step`` (exit status 128 + the signal:
        130 for Ctrl-C), with the command that resumes it: from this step when it is
        saved, else (a second signal) from the last checkpoint, or from step 0 without one."""
        name = " by SIGTERM" if signum == signal.SIGTERM else ""
        saved = self.saved_step
        if saved == step:
            where = f"at step {step}; continue with"
        elif saved is None:
            where = f"at step {step}, before the first checkpoint; start again from step 0 with"
        else:
            where = f"at step {step}, before saving it; continue from step {saved} with"
        return Interrupted(
            f"interrupted{name} {where}: {resume_command(self.path)}", exit_code=128 + (signum or signal.SIGINT)
        )


def command_line() -> str:
    """This process's command line as a user would type it: under torchrun the launcher's
    command (:func:`sharnn.training.distributed.launcher`) and ``ARGS``, else
    :func:`sharnn.files.command_line` (``sharnn ARGS`` for the command-line tool)."""
    if launched_by_torchrun():
        command = shlex.join([*launcher(), *sys.argv[1:]])
        return (
            command
            if launcher_as_typed()
            else command + "  # torchrun's own options (such as --standalone) not recorded"
        )
    return files.command_line()


def resume_command(run_dir: Path) -> str:
    """The command that resumes ``run_dir`` with this run's processes."""
    return shlex.join([*launcher(), "train", "--resume", str(run_dir)])


def read_summary(run_dir: str | Path) -> dict | None:
    """A run's ``summary.json`` (written when it finished), or None."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


class _NoMetrics:
    """The metrics of a process other than the main one: it records nothing."""

    def log(self, record: dict, extra_scalars: dict | None = None) -> None:
        pass

    def plot(self) -> None:
        pass

    def close(self) -> None:
        pass
