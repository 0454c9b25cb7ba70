"""The compiled core: numba kernels, compiled once per CPU and cached (docs/compression.md,
"The compiled core").

numba compiles a Python function through LLVM for the CPU it runs on; no compiler is needed
on a user's machine. A kernel's results are the same bits on every CPU when it keeps these
rules, which :func:`kernel` enforces where it can and ``tests/test_compiled.py`` checks:

- ``fastmath`` off (numba's default): no fused multiply-add, no reordered float sums;
- ``parallel=True`` only where every output is computed by one thread in a fixed order
  (no parallel float reduction): the test runs each parallel kernel on 1 and 2 threads
  and compares the bits;
- no libm transcendental (``math.exp``, ``log``, ``tanh``, ...): the system's libm differs
  between machines; tables computed with :mod:`decimal` instead;
- integers wherever they can be.

Each kernel is compiled on first use for the signatures it declares, and cached on disk
(numba's cache: beside the package, or in ``~/.cache`` when the package's folder is
read-only; ``NUMBA_CACHE_DIR`` overrides). :func:`ensure_compiled` compiles or loads them
all at once and says in one line on standard error when it compiles.

The cache is an optimisation that never breaks a run: with no folder numba may write it
in, or a cache file that cannot be read back (truncated, emptied, garbled), the kernel is
compiled in memory for this process, and :func:`ensure_compiled` says so once. What cannot
run at all is one :class:`~sharnn.errors.ConfigError` line: numba's JIT switched off
(``NUMBA_DISABLE_JIT``), a threading layer that is not installed (``NUMBA_THREADING_LAYER``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.caching import NullCache
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .errors import ConfigError

KERNELS: list = []  # every kernel, for ensure_compiled and the rules' test
INLINED: list = []  # every helper compiled into the kernels that call it, for the rules' test
PARALLEL_KERNELS: list = []  # the kernels compiled with parallel=True
UNCACHED: list = []  # the kernels numba found no folder to cache in (compiled in memory)

NO_CACHE_NOTICE = (
    "sharnn: no folder to cache its kernels in (the package's and ~/.cache are read-only; "
    "NUMBA_CACHE_DIR names one): compiling them in memory, for this process only"
)

_compiled = False
_pool_started = False


def kernel(*signatures: str, parallel: bool = False, allocates: bool = False) -> Callable:
    """Decorate a function as a compiled kernel (``numba.njit``: ``cache=True``,
    ``fastmath=False``, ``nogil=True``) with the numba ``signatures`` it is compiled for.
    Only a kernel that ``allocates`` arrays runs with numba's reference counting (NRT),
    which costs two atomic operations per array argument of every call, and per array
    taken from a tuple (measured: 0.9 s of mixing 3's 2.4 s on alice29); the others borrow
    their caller's arrays. A kernel that allocates without saying so does not compile.

    Raises:
        ValueError: no signature (a kernel compiled lazily for whatever it is called with
            would compile in the middle of coding, and escape :func:`ensure_compiled`).
    """
    if not signatures:
        raise ValueError("a kernel declares the signatures it is compiled for")

    def wrap(function: Callable):
        options = dict(nogil=True, fastmath=False, parallel=parallel, _nrt=allocates)
        try:
            dispatcher = numba.njit(cache=True, **options)(function)
        except RuntimeError as e:  # no folder numba may write the cache in (a read-only package, HOME too)
            if "no locator available" not in str(e):
                raise
            dispatcher = numba.njit(cache=False, **options)(function)
            UNCACHED.append(dispatcher)
        dispatcher.declared_signatures = signatures
        KERNELS.append(dispatcher)
        if parallel:
            PARALLEL_KERNELS.append(dispatcher)
        return dispatcher

    return wrap


def _prefetch_codegen(locality: int) -> Callable:
    """The code of a prefetch of ``locality`` (LLVM's: 3, every cache level; 2, from the
    second level out), for :func:`prefetch` and :func:`prefetch_ahead`."""

    def codegen(context, builder, signature, args):
        element = builder.gep(context.make_array(signature.args[0])(context, builder, args[0]).data, [args[1]])
        address = builder.bitcast(element, ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(function, [address, i32(0), i32(locality), i32(1)])  # a read, of data
        return context.get_dummy_value()

    return codegen


def _check_prefetch(array, index) -> None:
    if not (isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)):
        raise TypingError("prefetch takes a C-contiguous array and a flat index")


@intrinsic
def prefetch(typingctx, array, index):
    """``prefetch(array, k)`` in a kernel: ask the memory for the cache line of the ``k``-th
    element of the C-contiguous ``array`` (flat index), without waiting for it. A hint
    (x86 ``prefetcht0``; nothing where a CPU has none): it changes no number, and a read
    that follows finds the line sooner when the kernel reads many places at random.

    Raises:
        TypingError: at compile time, for anything but a C-contiguous array and an integer.
    """
    _check_prefetch(array, index)
    return types.void(array, index), _prefetch_codegen(3)


@intrinsic
def prefetch_ahead(typingctx, array, index):
    """:func:`prefetch` into the second-level cache (x86 ``prefetcht1``), for a line the
    kernel reads a while later: a matrix streamed once per call, asked for some blocks
    ahead of the one being read. Kept out of the first level, these requests do not wait
    for its few fill buffers, and more of them are in flight together (measured on the
    integer step's products with the caches emptied: 40% less time than with no hint, 9%
    less with ``prefetcht0``; docs/compression.md, "The integer step's kernels").

    Raises:
        TypingError: at compile time, for anything but a C-contiguous array and an integer.
    """
    _check_prefetch(array, index)
    return types.void(array, index), _prefetch_codegen(2)


def inline(function: Callable):
    """Decorate a helper of kernels (``numba.njit(inline="always")``, ``fastmath`` off): it
    is compiled into each kernel that calls it, as if written there, so a call costs
    nothing. A kernel that calls another kernel makes a real call, every array of its
    arguments passed through memory (a struct of seven words each; measured on mixing 3's
    node and its helpers: the learning step 15% faster, the mix, which waits on memory,
    unchanged). The helper keeps the kernels' rules (``tests/test_compiled.py`` reads it
    too) and is compiled and cached with its callers."""
    dispatcher = numba.njit(inline="always", fastmath=False)(function)
    INLINED.append(dispatcher)
    return dispatcher


def ensure_compiled(say: Callable[[str], None] | None = None) -> float:
    """Compile every registered kernel for its declared signatures, or load it from the
    cache; once per process. On a cache miss (the first use on a machine, or a new
    sharnn or numba), says so in one line through ``say`` (default: standard error, or
    nowhere when it is closed); likewise, once, when the cache cannot be used (no folder
    to write it in, or a damaged file: those kernels are compiled in memory).

    Returns:
        Seconds spent (0.0 when already done in this process).

    Raises:
        ConfigError: numba's JIT is switched off (``NUMBA_DISABLE_JIT``), or its
            threading layer cannot be loaded (:func:`start_pool`).
    """
    global _compiled
    if _compiled:
        return 0.0
    if numba.config.DISABLE_JIT:
        raise ConfigError("NUMBA_DISABLE_JIT is set: sharnn runs its kernels compiled only; unset it")
    start_pool()
    say = say or _to_standard_error
    start, told = time.perf_counter(), set()
    if UNCACHED:
        say(NO_CACHE_NOTICE)
    for dispatcher in KERNELS:
        for kind, notice in compile_kernel(dispatcher).items():
            if kind not in told:
                say(notice)
                told.add(kind)
    _compiled = True
    return time.perf_counter() - start


def compile_kernel(dispatcher) -> dict[str, str]:
    """Compile ``dispatcher`` (a :func:`kernel`) for its declared signatures, or load it from
    numba's cache. A cache file that cannot be read back (truncated, emptied, garbled,
    unreadable) is never an error: the kernel is then compiled in memory, its cache left
    as it is.

    Returns:
        The notices for the user, by kind: ``"compiling"`` (a cache miss: compiled and
        cached), ``"damaged"`` (the cache could not be read).
    """
    notices = {}
    misses = sum(dispatcher.stats.cache_misses.values())
    for signature in dispatcher.declared_signatures:
        try:
            dispatcher.compile(signature)
        except Exception as e:  # numba reads its cache with pickle: any error can come out of a damaged file
            if isinstance(dispatcher._cache, NullCache):  # not the cache's doing: a compile error
                raise
            folder = cache_folder(dispatcher)
            dispatcher._cache = NullCache()  # in memory from now on; a compile error raises again below
            dispatcher.compile(signature)
            notices["damaged"] = (
                f"sharnn: its kernel cache in {folder} cannot be read ({type(e).__name__}): compiling in memory "
                "for this process; remove that folder to rebuild the cache"
            )
    cached = not isinstance(dispatcher._cache, NullCache)  # else its notice is given already
    if cached and sum(dispatcher.stats.cache_misses.values()) > misses:
        folder = cache_folder(dispatcher)
        notices["compiling"] = f"sharnn: compiling its kernels for this CPU, once (under a minute; cached in {folder})"
    return notices


def _to_standard_error(line: str) -> None:
    """Print ``line`` on standard error; nothing when it is closed (never on standard output,
    where ``print(file=None)`` would put it)."""
    if sys.stderr is not None:
        print(line, file=sys.stderr, flush=True)


def cache_folder(dispatcher) -> str:
    """Where numba caches ``dispatcher``'s machine code."""
    return str(dispatcher.stats.cache_path)


@contextmanager
def kernel_threads(count: int) -> Iterator[None]:
    """Run the parallel kernels on ``min(count, numba's thread pool)`` threads; the previous
    count is restored. The bits do not depend on it (the module's rules)."""
    start_pool()
    previous, wanted = numba.get_num_threads(), max(1, min(count, numba.config.NUMBA_NUM_THREADS))
    if wanted == previous:  # the common case, each position of a coding run: nothing to set
        yield
        return
    numba.set_num_threads(wanted)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def start_pool() -> None:
    """Start numba's thread pool, keeping torch's thread count. Its OpenMP layer (the
    fastest here: its work queue took 3.4x as long to code a file) shares OpenMP with torch,
    and starting it resets the count torch reads (``torch.set_num_threads(1)``, then a
    parallel kernel's first call: torch reports 2), which a float file records and decodes
    with. Started here, once, with torch's count put back, the two keep their own counts.

    Raises:
        ConfigError: numba's threading layer cannot be loaded (``NUMBA_THREADING_LAYER=tbb``
            without TBB installed, say).
    """
    global _pool_started
    if _pool_started:
        return
    import torch  # here, not at the top: the command line's --help imports no torch

    previous = torch.get_num_threads()
    try:
        numba.get_num_threads()  # starts the pool
    except ValueError:  # numba's "No threading layer could be loaded", with an install hint
        raise ConfigError(
            f"numba cannot load its threading layer {numba.config.THREADING_LAYER!r} (NUMBA_THREADING_LAYER): "
            "unset it, or install that layer"
        ) from None
    torch.set_num_threads(previous)
    _pool_started = True
