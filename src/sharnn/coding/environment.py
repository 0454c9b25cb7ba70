"""What a compressed file's probabilities depend on besides the model, and the settings
coding runs under (docs/compression.md, "What a file depends on"): the machine's
:func:`environment` (device, torch, CPU capability, threads), the CPU's bf16 features, torch's
thread count (:func:`torch_threads`) and the deterministic kernels (:func:`deterministic_kernels`),
each set for the coding alone and restored after it.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from ..compiled import kernel_threads

MAX_THREADS = 1024


MAX_FEATURES = 16  # names in a header's environment.cpu_features


# The CPU features bf16 products depend on, as /proc/cpuinfo names them: those that decide
# which kernel oneDNN (and torch's choice of it) runs for a bf16 matrix product: AVX2 and
# AVX-512 (conversion and emulation), AVX-512 BF16 and AVX-NE-CONVERT (bf16 instructions),
# AVX-512 FP16 (a higher oneDNN level, recorded to be safe), AMX (tiles, their bf16 products).
BF16_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile", "amx_bf16")


BF16_PRODUCTS = ("avx512_bf16", "amx_bf16")  # a CPU with one of them multiplies in bf16


_CPUINFO = Path("/proc/cpuinfo")


def environment(device: torch.device, precision: str = "fp32") -> dict:
    """What the model's arithmetic depends on besides its weights: the device, the torch
    version, the CPU's vector capability and torch's thread count; on CUDA also the GPU's
    name and the CUDA and cuDNN versions; for precision bf16 also the CPU's
    :func:`cpu_features` (key ``cpu_features``)."""
    env = {
        "device": device.type,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if precision == "bf16":
        env["cpu_features"] = cpu_features()
    if device.type == "cuda":
        env |= {
            "gpu": torch.cuda.get_device_name(device),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return env


def cpu_features() -> list[str]:
    """The :data:`BF16_FEATURES` this CPU has, in that order, from the ``flags`` of
    /proc/cpuinfo (Linux on x86); elsewhere ``[torch.backends.cpu.get_cpu_capability()]``
    (e.g. ``["AVX2"]``), which names no bf16 instructions."""
    try:
        lines = _CPUINFO.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    fields = (line.partition(":") for line in lines)
    flags = next((value.split() for key, _, value in fields if key.strip() == "flags"), None)
    if flags is None:
        return [torch.backends.cpu.get_cpu_capability()]
    return [feature for feature in BF16_FEATURES if feature in flags]


@contextmanager
def coding_threads(count: int):
    """Run with ``count`` threads for torch's products and the compiled kernels
    (:func:`sharnn.compiled.kernel_threads`); both previous counts are restored. A
    portable file's bits do not depend on the count."""
    with torch_threads(count), kernel_threads(count):
        yield


@contextmanager
def torch_threads(count: int):
    """Run with torch's intra-op thread count at ``count``; the previous count is restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def deterministic_kernels(device: torch.device):
    """Run with the same kernels on both sides of a round trip: on CUDA no TF32 and no
    autotuned cuDNN choice (``torch.backends``' process-wide flags); the flags as they were
    are restored on exit. On the CPU nothing changes."""
    if device.type != "cuda":
        yield
        return
    flags = (
        (torch.backends.cuda.matmul, "allow_tf32"),
        (torch.backends.cudnn, "allow_tf32"),
        (torch.backends.cudnn, "deterministic"),
        (torch.backends.cudnn, "benchmark"),
    )
    previous = [getattr(owner, name) for owner, name in flags]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        for (owner, name), value in zip(flags, previous):
            setattr(owner, name, value)
