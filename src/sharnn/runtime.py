"""Where and how a model runs: the device, the precision and the fast path; and whether
it fits in the memory this process may hold (:func:`check_memory`, :func:`build_within_memory`).

Training, evaluation, generation and the benchmarks each resolve one :class:`Runtime` and
go through it for the device, the autocast context and the set-up of the fast path
(docs/model.md, "Execution").

The fast path computes the reference's function up to bf16 rounding: the attention
through ``scaled_dot_product_attention`` with the memory stored in bf16, optionally the
attention and feed-forward sub-layers compiled with ``torch.compile``. Activation
recompute (PyTorch's activation checkpointing) is independent of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import FAST_PATH, PRECISIONS
from .errors import ConfigError
from .models.build import LanguageModel, build_model, parameter_count
from .models.config import SHARNNConfig
from .models.sharnn import SHARNN

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU. Raises :class:`ConfigError` for a device
    that does not exist or is not available here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r} (auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {name!r} is not supported (auto, cpu, cuda or cuda:N)")
    return device


def autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on ``device_type`` ("cpu", "cuda"); None: no autocast, fp32."""
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@dataclass(frozen=True)
class Runtime:
    """One resolved choice of device, precision and execution path.

    Attributes:
        device: where the model and its batches live.
        autocast_dtype: bf16 or fp16 autocast, or None for plain fp32.
        fast_path: SDPA attention with the memory in bf16 (else the eager reference).
        compile: ``torch.compile`` of every attention and feed-forward sub-layer (which
            :meth:`resolve` turns on only with the fast path); the LSTMs and the attention
            kernel stay outside.
        recompute: recompute the sub-layers' activations in the backward pass instead of
            storing them (less memory, about one more forward of them).
    """

    device: torch.device
    autocast_dtype: torch.dtype | None = None
    fast_path: bool = False
    compile: bool = False
    recompute: bool = False

    @classmethod
    def resolve(
        cls,
        device: str = "auto",
        precision: str = "auto",
        fast_path: str = "auto",
        compile: bool = False,
        recompute: bool = False,
    ) -> Runtime:
        """From the settings' words (see ``TrainConfig``): ``precision`` auto means bf16
        autocast on CUDA and fp32 elsewhere, ``fast_path`` auto means on with CUDA.

        Raises:
            ConfigError: an unknown setting, an unavailable device, or fp16 without CUDA.
        """
        if precision not in PRECISIONS or fast_path not in FAST_PATH:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)} and fast_path one of "
                f"{', '.join(FAST_PATH)}, got {precision!r} and {fast_path!r}"
            )
        resolved = resolve_device(device)
        cuda = resolved.type == "cuda"
        if precision == "fp16" and not cuda:
            raise ConfigError("precision fp16 needs CUDA; use bf16 or fp32 on CPU")
        dtype = (torch.bfloat16 if cuda else None) if precision == "auto" else AUTOCAST_DTYPES[precision]
        fast = cuda if fast_path == "auto" else fast_path == "on"
        return cls(resolved, dtype, fast, compile=fast and compile, recompute=recompute)

    @classmethod
    def for_training(cls, config, device: str | None = None) -> Runtime:
        """The runtime a ``TrainConfig`` asks for (on ``device`` instead of its own when given)."""
        return cls.resolve(
            device or config.device, config.precision, config.fast_path, config.compile, config.recompute
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of this runtime (does nothing for fp32)."""
        return autocast(self.device.type, self.autocast_dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A loss scaler, enabled only for fp16 (bf16 has fp32's range)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.autocast_dtype == torch.float16)

    def prepare(self, model: SHARNN) -> SHARNN:
        """Move ``model`` to the device and set it up to run this way; returns it."""
        model.to(self.device)
        if self.fast_path:
            model.set_attn_implementation("sdpa", memory_dtype=torch.bfloat16)
        if self.recompute:  # PyTorch's activation checkpointing, as torchtune and torchtitan apply it
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

            sublayers = {id(m) for m in model.sublayers()}
            apply_activation_checkpointing(model, check_fn=lambda module: id(module) in sublayers)
        if self.compile:
            for sublayer in model.sublayers():
                sublayer.compile(dynamic=True)
        return model

    def describe(self) -> str:
        """One line, e.g. ``cuda, bf16 autocast, fast path (compiled)``."""
        precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}[self.autocast_dtype]
        path = ("fast path" + (" (compiled)" if self.compile else "")) if self.fast_path else "eager reference path"
        return f"{self.device}, {precision}, {path}" + (", recompute" if self.recompute else "")


CGROUP_MEMORY = Path("/sys/fs/cgroup/memory.max")  # cgroup v2: a container's limit ("max": none)


def memory_limit() -> tuple[int, str]:
    """The most memory this process may hold, in bytes, and what sets it: the smallest of
    the machine's memory, the address-space limit (``ulimit -v``, ``RLIMIT_AS``) and the
    container's limit (cgroup v2 ``memory.max``)."""
    limits = [(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "this process's address-space limit (ulimit -v)"))
    try:
        text = CGROUP_MEMORY.read_text().strip()
    except OSError:
        text = ""
    if text.isdigit():
        limits.append((int(text), "this container's memory limit (cgroup memory.max)"))
    return min(limits)


def gib(size: int) -> str:
    """``size`` bytes in GiB, for messages (``12.3 GiB``)."""
    return f"{size / 2**30:,.1f} GiB"


def check_memory(need: int, doing: str) -> None:
    """Refuse, before anything is allocated, what needs more than :func:`memory_limit`:
    ``doing`` (``loading model X``) needs at least ``need`` bytes.

    Raises:
        ConfigError: one line with both sizes and what sets the limit.
    """
    limit, what = memory_limit()
    if need > limit:
        raise ConfigError(f"{doing} needs at least {gib(need)} of memory, more than {what} ({gib(limit)})")


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: Python's ``MemoryError``, torch's
    (``DefaultCPUAllocator: can't allocate memory`` on the CPU, ``OutOfMemoryError`` on CUDA),
    or a mapping the system refused (an ``OSError`` ENOMEM: ``mmap`` past ``ulimit -v``)."""
    return (
        isinstance(error, (MemoryError, torch.OutOfMemoryError))
        or (isinstance(error, RuntimeError) and "can't allocate memory" in str(error))
        or (isinstance(error, OSError) and error.errno == errno.ENOMEM)
    )


TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and the optimizer's two moments


def check_model_memory(config: SHARNNConfig, bytes_per_parameter: int, doing: str) -> int:
    """The parameters of the model ``config`` describes, by arithmetic
    (:func:`~sharnn.models.build.parameter_count`: nothing built, however large), having
    refused with :func:`check_memory` a model whose ``bytes_per_parameter`` per parameter
    (4 to hold fp32 weights, :data:`TRAINING_BYTES_PER_PARAMETER` to train them) do not fit.

    Raises:
        ConfigError: an invalid config; a model too large for this process's memory.
    """
    parameters = parameter_count(config)
    check_memory(parameters * bytes_per_parameter, f"{doing} a model of {parameters:,} parameters")
    return parameters


@contextlib.contextmanager
def out_of_memory_as(error: type[Exception], message: str) -> Iterator[None]:
    """Run the block; an allocation that fails in it (:func:`out_of_memory`) raises
    ``error(message)``, one line, instead."""
    try:
        yield
    except (MemoryError, RuntimeError, OSError) as e:
        if not out_of_memory(e):
            raise
        raise error(message) from None


def build_within_memory(config: SHARNNConfig, bytes_per_parameter: int, doing: str) -> LanguageModel:
    """:func:`~sharnn.models.build.build_model` once :func:`check_model_memory` has passed;
    an allocation that fails all the same is refused in one line too.

    Raises:
        ConfigError: an invalid config; a model too large for this process's memory.
    """
    parameters = check_model_memory(config, bytes_per_parameter, doing)
    limit, what = memory_limit()
    with out_of_memory_as(
        ConfigError, f"{doing} a model of {parameters:,} parameters ran out of memory ({what}: {gib(limit)})"
    ):
        return build_model(config)
