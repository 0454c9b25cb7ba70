"""Training on several processes with ``torchrun`` and DistributedDataParallel
(docs/training.md, "Several GPUs or processes").

Under ``torchrun --nproc_per_node=N -m sharnn train ...`` every process (a rank) holds
the whole model and trains it on its own contiguous block of the ``B`` train streams
(rank ``r`` of ``N`` takes streams ``r B/N .. (r+1) B/N - 1``), carrying the LSTM state
and attention memory of those streams only. DDP averages the gradients, so that with
the same window lengths on every rank (one jitter RNG, seeded alike) the N ranks take
the update one process takes on all ``B`` streams. Evaluation splits its streams among
the ranks in the same way and adds up their totals.

This module is the only one that talks to ``torch.distributed`` or reads torchrun's
environment: a :class:`Distributed` is the process group as training sees it, and one
made outside torchrun (``Distributed()``) is a single process, for which every method is
the identity. Small decisions and checkpoints travel through a gloo group on the CPU
(the process group itself under gloo; a second group beside NCCL), so that they never
make the host wait for the GPU.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigError, RunError, SharnnError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
T = TypeVar("T")


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (which sets RANK, WORLD_SIZE, ...)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def is_main_process() -> bool:
    """Whether this is rank 0 (or a process outside torchrun): the one that reports."""
    return os.environ.get("RANK", "0") == "0"


def first_on_its_machine() -> bool:
    """Whether this is the first process on its machine (local rank 0, or outside
    torchrun): the one that prints errors there, which every process meets alike."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def launcher() -> list[str]:
    """The command that starts ``sharnn`` as this process was started: ``["sharnn"]``, or
    under torchrun the launcher's words as they were typed (``torchrun --standalone
    --nproc_per_node=N -m sharnn``, read from the parent process's command line in
    ``/proc`` on Linux), else rebuilt from torchrun's environment, which does not hold its
    rendezvous options (``torchrun --nproc_per_node=N [--nnodes=K] -m sharnn``)."""
    if not launched_by_torchrun():
        return ["sharnn"]
    typed = launcher_as_typed()
    if typed is not None:
        return typed
    per_machine, processes = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    machines = [f"--nnodes={processes // per_machine}"] if processes > per_machine else []
    return ["torchrun", f"--nproc_per_node={per_machine}", *machines, "-m", "sharnn"]


def launcher_as_typed() -> list[str] | None:
    """``["torchrun", OPTIONS..., "-m", "sharnn"]`` (or the script torchrun started) as
    typed, when the parent process is torchrun (started as ``torchrun`` or ``python -m
    torch.distributed.run``) and its command line ends with this process's arguments;
    else None."""
    try:
        cmdline = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    words = [w.decode(errors="replace") for w in cmdline.split(b"\0")[:-1]]
    for i, word in enumerate(words):
        if Path(word).name == "torchrun":
            typed = words[i + 1 :]
            break
        if word == "-m" and words[i + 1 : i + 2] == ["torch.distributed.run"]:
            typed = words[i + 2 :]
            break
    else:
        return None
    arguments = sys.argv[1:]
    if len(typed) < len(arguments) or typed[len(typed) - len(arguments) :] != arguments:
        return None
    return ["torchrun", *typed[: len(typed) - len(arguments)]]


@dataclass(frozen=True)
class Distributed:
    """The processes of one training run.

    Attributes:
        rank: this process's index, 0 .. ``world_size - 1``; rank 0 is the main process,
            which alone logs, plots and writes the run folder.
        world_size: the number of processes ``N``.
        local_rank: this process's index on its machine (its GPU there).
        active: whether a process group is in use (under torchrun, also for N = 1).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    active: bool = False

    @classmethod
    def from_environment(cls, device_type: str) -> Distributed:
        """The process group torchrun describes in the environment, initialised (NCCL for
        ``device_type`` "cuda", gloo for "cpu") unless the program did that already; a
        single process outside torchrun.

        Raises:
            ConfigError: more processes on this machine than it has GPUs.
        """
        if not launched_by_torchrun():
            return cls()
        local_rank, per_machine = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if not dist.is_initialized():
            if device_type == "cuda":
                if per_machine > torch.cuda.device_count():
                    raise ConfigError(
                        f"{per_machine} processes on this machine, which has {torch.cuda.device_count()} "
                        f"GPU(s): give torchrun --nproc_per_node={torch.cuda.device_count()} or fewer"
                    )
                torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
            atexit.register(dist.destroy_process_group)
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, active=True)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> str:
        """The device this process trains on, from the run's resolved ``device``:
        ``cuda:LOCAL_RANK`` for CUDA under torchrun, else ``device`` itself.

        Raises:
            ConfigError: a CUDA device with an index under torchrun (each process takes
                the GPU of its local rank).
        """
        if not self.active or device.type != "cuda":
            return str(device)
        if device.index is not None:
            raise ConfigError(
                f"device={device}: under torchrun each process uses the GPU of its local rank; "
                f"give device=cuda (or auto)"
            )
        return f"cuda:{self.local_rank}"

    def block(self, streams: int, what: str) -> slice:
        """This rank's contiguous block of ``streams`` streams: equal blocks of
        ``streams / N``.

        Raises:
            ConfigError: ``streams`` is not divisible by the number of processes.
        """
        if streams % self.world_size:
            raise ConfigError(
                f"{what}={streams} cannot be divided among {self.world_size} processes: "
                f"run a number of processes that divides {streams}, or change {what}"
            )
        size = streams // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to train through: ``model`` in DistributedDataParallel (which
        averages the gradients in the backward pass), or ``model`` itself."""
        if not self.active:
            return model
        device = next(model.parameters()).device
        return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    def share(self, text: str) -> str:
        """The main process's ``text``, on every process (e.g. a run folder's name that
        holds the time)."""
        if not self.active:
            return text
        box = [text]
        dist.broadcast_object_list(box, src=0, group=_control_group())
        return box[0]

    def on_main(self, action: Callable[[], T]) -> T | None:
        """Run ``action`` on the main process alone (what writes the run folder); its
        result there, None elsewhere. An error it raises (a run folder that exists, a full
        disk) is raised on every process, the others as :class:`RunError`, so that no
        process is left waiting for one that has stopped.

        Raises:
            SharnnError, OSError: ``action``'s, on the main process; RunError elsewhere.
        """
        if not self.active:
            return action()
        result, error = None, None
        if self.is_main:
            try:
                result = action()
            except (SharnnError, OSError) as e:
                error = e
        box = [None if error is None else str(error)]
        dist.broadcast_object_list(box, src=0, group=_control_group())
        if error is not None:
            raise error
        if box[0] is not None:
            raise RunError(f"the main process stopped: {box[0]}")
        return result

    def mean(self, value: Tensor) -> Tensor:
        """The mean of a 0-dim tensor over the processes (the train loss), on the device,
        without waiting for the host."""
        if not self.active:
            return value
        value = value.clone()
        dist.all_reduce(value)
        return value / self.world_size

    def agree(self, stop: bool, seconds: float) -> tuple[bool, float]:
        """Whether any process asks to stop, and the longest of their training times: so
        that every process decides alike when to stop, validate or finish."""
        if not self.active:
            return stop, seconds
        flags = torch.tensor([float(stop), seconds], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=_control_group())
        return bool(flags[0]), float(flags[1])

    def sum(self, values: list[float]) -> list[float]:
        """Each of ``values`` summed over the processes, in float64 (evaluation's totals:
        negative log-likelihood, tokens, bytes, words); the values themselves in a single
        process."""
        if self.world_size == 1:
            return values
        totals = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(totals, group=_control_group())
        return totals.tolist()

    def gather_streams(self, tensors: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """Every process's ``tensors`` (a recurrent state's, the streams on dim 1), their
        streams side by side in rank order, on the CPU of the main process: the state one
        process would carry for all ``B`` streams. None on the other processes."""
        if not self.active:
            return tensors
        parts = {name: self._gather(t) for name, t in tensors.items()}
        return {name: torch.cat(p, dim=1) for name, p in parts.items()} if self.is_main else None

    def gather_rows(self, tensor: Tensor) -> Tensor | None:
        """Every process's ``tensor`` (an RNG state), stacked in rank order ``[N, ...]``
        on the CPU of the main process; None on the others."""
        parts = self._gather(tensor)
        return torch.stack(parts) if self.is_main else None

    def _gather(self, tensor: Tensor) -> list[Tensor]:
        """Every process's ``tensor``, on the CPU of the main process (None elsewhere)."""
        if not self.active:
            return [tensor]
        tensor = tensor.detach().cpu().contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)] if self.is_main else None
        dist.gather(tensor, parts, dst=0, group=_control_group())
        return parts


@functools.cache
def _control_group():
    """The gloo group on the CPU for decisions and checkpoints: the process group itself
    under gloo, a second group beside NCCL (created once, by every process alike)."""
    return dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
