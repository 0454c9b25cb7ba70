"""Whether the libraries fit in this process's address space (``ulimit -v``,
``RLIMIT_AS``), asked before they load: below what torch, OpenBLAS and numba's LLVM map
as they start, they fail inside native code that no Python can catch (docs/compression.md,
"The command line"). This module imports nothing but the standard library, so that
:func:`check_address_space` runs before any of them.
"""

from __future__ import annotations

import os
import resource

from .errors import ConfigError

# What the coding commands map before their first position (torch, numpy's and scipy's
# OpenBLAS, numba with LLVM and its compiled kernels, the shipped model), measured with
# `ulimit -v` on one CPU: below 1,037 MB it fails inside a library, which no Python code
# can catch: an abort (LLVM's "Buffer allocation failed", "Allocation failed", "Unable to
# allocate section memory!", torch's std::bad_alloc), scipy's OpenBLAS retrying its buffer
# for ever, numpy's exiting with its own line. Each further CPU: 13 MB (numba's and torch's
# thread stacks) with OpenBLAS on one thread; each further OpenBLAS thread 75 MB (two
# libraries, each a thread and a 32 MiB buffer). Past these, what fails is an allocation
# the commands refuse in one line (the model, the coding's context tables).
LIBRARIES_ADDRESS_SPACE = 5 << 28  # 1.25 GiB
ADDRESS_SPACE_PER_CPU = 32 << 20
ADDRESS_SPACE_PER_OPENBLAS_THREAD = 96 << 20
CONTEXT_TABLES_ADDRESS_SPACE = 1 << 30  # the adaptive mixing's tables: 963 MB more for 4 KB (compress, decompress)


def check_address_space(doing: str, need: int = LIBRARIES_ADDRESS_SPACE) -> None:
    """Refuse in one line a process whose address-space limit (``ulimit -v``,
    ``RLIMIT_AS``) is below ``need`` (the libraries' :data:`LIBRARIES_ADDRESS_SPACE`, to
    which a caller may add :data:`CONTEXT_TABLES_ADDRESS_SPACE`), with what each CPU
    and OpenBLAS thread past the first adds. To run before torch, numpy or numba loads:
    under a limit, OpenBLAS runs on one thread unless ``OPENBLAS_NUM_THREADS`` says
    otherwise (sharnn computes nothing with it; its threads' buffers are virtual memory
    that grows with the CPUs). Nothing is done without a limit.

    Raises:
        ConfigError: ``doing`` (``sharnn compress``) and both sizes.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        blas = max(1, int(os.environ["OPENBLAS_NUM_THREADS"]))
    except ValueError:  # OpenBLAS reads such a value as unset: a thread per CPU
        blas = os.cpu_count() or 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    need += ADDRESS_SPACE_PER_CPU * (cpus - 1) + ADDRESS_SPACE_PER_OPENBLAS_THREAD * (min(blas, cpus) - 1)
    if soft < need:
        raise ConfigError(
            f"{doing} needs an address space of at least {need / 2**30:.2f} GiB, more than this process's "
            f"address-space limit ({soft / 2**30:.2f} GiB): raise it (ulimit -v {-(-need // 1024)}, or unlimited)"
        )
