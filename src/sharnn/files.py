"""Writing what a user keeps (a config, a summary, a model, a decompressed output, a
prepared corpus, an exported folder) so that a crash, a kill or a full disk never leaves
it half-written, that one process at a time writes it, and that nothing but what this
process made is ever deleted:

- :func:`write_atomically`: a file, through a temporary file of a unique name beside it.
- :func:`staging_folder` and :func:`publish`: a folder, built inside a private folder of
  a unique name beside it and renamed into place.
- :class:`Lock` and :func:`output_lock`: an OS lock (``flock``, through ``filelock``)
  held by the one process that writes a run folder or an output; the kernel drops it
  when the process ends, however it ends (``kill -9`` too), so a dead writer never
  blocks the next one.
- :func:`output_destination` (:func:`check_destination`), :func:`read_input` and
  :func:`write_output`: a command's one input file and one output file (``-``: standard
  input or output), checked before any work: an output that would overwrite the input,
  a folder or a device, a folder that takes no new file, an input larger than the
  command takes, a closed standard stream.
- :func:`sigterm_raises`: SIGTERM raises :class:`Terminated`, as Ctrl-C raises
  ``KeyboardInterrupt``, so that the clean-ups of a command run.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shlex
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import ConfigError, DataError, SharnnError

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import: os.umask can only be read by setting it


class LockError(SharnnError):
    """A run folder or an output that another process is writing, or a lock that cannot be taken."""


class Terminated(BaseException):
    """SIGTERM, raised where the process was (see :func:`sigterm_raises`). Not an
    ``Exception``, so that no error handler takes it for an error of its own."""


def write_atomically(path: str | Path, data: bytes | str, like: os.stat_result | None = None) -> None:
    """Write ``data`` (``str`` as UTF-8) to ``path`` through a temporary file of a unique
    name beside it (``.NAME.<random>.tmp``, made by this call), flushed to disk and
    renamed over it: ``path`` holds either what it held before or all of ``data``. A
    symbolic link at ``path`` is replaced by the file, its target left as it is. The
    file gets the usual mode (0666 less the umask), or with ``like`` (another file's
    ``os.stat``) that file's permission bits (set-user-ID, set-group-ID and sticky left
    out) and access and modification times, before it is renamed into place. The
    temporary file is removed on any error; no other file is ever removed.

    Raises:
        OSError: the file system refused (a full disk, a quota, permissions).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=".tmp")
    try:
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK if like is None else stat.S_IMODE(like.st_mode) & 0o777)
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            if like is not None:
                os.utime(f.fileno(), ns=(like.st_atime_ns, like.st_mtime_ns))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_RANDOM_PART = len(".") + 8 + len(".tmp")  # what tempfile adds to a prefix: 8 random characters, the suffix


def temporary_prefix(path: Path) -> str:
    """The prefix of the temporary name beside ``path`` (``.NAME.``, then ``tempfile``'s
    random part and ``.tmp``): ``NAME``'s bytes cut short so that the whole name fits the
    file system's longest (``NAME_MAX``, 255 bytes on most), and a file whose own name is
    as long as it may be can still be written."""
    try:
        longest = os.pathconf(path.parent if str(path.parent) else ".", "PC_NAME_MAX")
    except (OSError, ValueError):  # the folder does not exist (the write will say), or no such limit
        longest = 255
    room = max(1, longest - _RANDOM_PART - len(".."))
    return f".{os.fsdecode(os.fsencode(path.name)[:room])}."


@contextmanager
def staging_folder(destination: Path) -> Iterator[Path]:
    """A new empty folder (the usual mode) in which to build ``destination``: named like
    it, inside a private folder beside it that this call makes under a unique name
    (``.NAME.<random>.tmp``). Rename it to ``destination`` inside the block
    (:func:`publish`); on leaving the block, by any way (an error, Ctrl-C, SIGTERM under
    :func:`sigterm_raises`), the private folder is removed with whatever is left in it.
    Nothing else is ever removed.

    Raises:
        OSError: the file system refused.
    """
    with tempfile.TemporaryDirectory(
        dir=destination.parent, prefix=temporary_prefix(destination), suffix=".tmp"
    ) as private:
        staging = Path(private) / destination.name
        staging.mkdir()
        yield staging


@contextmanager
def parent_folders(path: Path) -> Iterator[None]:
    """Make the folders above ``path`` that are missing, for the block; if it fails (an
    error, Ctrl-C, SIGTERM under :func:`sigterm_raises`), those this call made are removed
    again, deepest first, each only if it is still empty: a failed command leaves no
    folder behind that it made, and never removes one it did not.

    Raises:
        OSError: the file system refused.
    """
    missing, folder = [], path.absolute().parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    made = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
        yield
    except BaseException:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:  # not empty: something else put a file there
                break
        raise


def publish(staging: Path, destination: Path) -> None:
    """Rename the finished ``staging`` to ``destination``. A symbolic link there (which
    :func:`check_new` lets through only with ``force``) is removed first: the link, never
    its target.

    Raises:
        OSError: the file system refused; ``staging`` is left where it was.
    """
    if destination.is_symlink():
        destination.unlink()
    os.replace(staging, destination)


def check_new(path: Path, force: bool, error: type[SharnnError], exists: str) -> None:
    """Refuse a destination that exists (``error(exists)``) or that is a symbolic link,
    even a dangling or looping one, unless ``force``: a link is then replaced by
    :func:`publish`, never written through. An existing file or folder is never replaced.

    Raises:
        error: as above.
    """
    if path.is_symlink():
        if not force:
            raise error(
                f"{path} is a symbolic link (to {os.readlink(path)}); give --force to replace the link "
                f"(its target is left as it is)"
            )
    elif path.exists():
        raise error(exists)


@contextmanager
def output_destination(source: str | Path, dest: str | Path, force: bool, error: type[SharnnError]) -> Iterator[None]:
    """Hold the output file ``dest`` for the block alone (:func:`output_lock`), having
    checked it with :func:`check_destination` under the lock, before any work.

    Raises:
        error: as :func:`check_destination`.
        LockError: another process is writing ``dest``.
    """
    if str(dest) == "-":
        check_destination(source, dest, force, error)
        yield
        return
    with output_lock(Path(dest)):
        check_destination(source, dest, force, error)
        yield


def check_destination(source: str | Path, dest: str | Path, force: bool, error: type[SharnnError]) -> None:
    """Refuse (``error(message)``, one line) an output file ``dest`` that:

    - is ``-`` (standard output) while standard output is closed;
    - is the input ``source`` (``-``: standard input, never refused here);
    - is a device, a FIFO or a socket (never replaced, even with ``force``: ``-`` writes
      to standard output);
    - exists, or is a symbolic link (dangling or looping too), without ``force``: with it
      a file is replaced, and a link by the file, its target left as it is
      (:func:`check_new`);
    - is a folder, or whose folder does not exist, or takes no new file (read-only,
      full, not this user's: a temporary file is made there and removed), so that no
      work is done for an output that cannot be written.

    Raises:
        error: as above.
    """
    source, dest = Path(source), Path(dest)
    if str(dest) == "-":
        if sys.stdout is None:
            raise error("standard output is closed: give a file to write to instead of -")
        return
    if str(source) != "-" and dest.exists() and dest.resolve() == source.resolve():
        raise error(f"{dest} is the input file")
    _check_not_special(dest, error)
    if dest.is_dir() and not dest.is_symlink():  # never replaced: --force would not help
        raise error(f"{dest} is a folder")
    if not force or dest.is_symlink():
        check_new(dest, force, error, f"{dest} exists; give --force to replace it")
    folder = dest.absolute().parent
    if not folder.is_dir():
        raise error(f"no folder {folder}")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(dest), suffix=".tmp")
    except OSError as e:
        raise error(f"cannot write {dest}: {e.strerror or e} ({folder})") from None
    os.close(fd)
    os.unlink(probe)


_SPECIAL = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


def _check_not_special(dest: Path, error: type[SharnnError]) -> None:
    """Refuse ``dest`` if it is a device, a FIFO or a socket itself (a symbolic link to
    one is a link, which :func:`write_atomically` replaces, never writes through)."""
    try:
        mode = os.lstat(dest).st_mode
    except OSError:  # nothing there (or nothing this process may look at: the write will say)
        return
    for test, kind in _SPECIAL:
        if test(mode):
            raise error(f"{dest} is a {kind}, not a file; give - to write to standard output")


def read_input(source: str | Path, limit: int, too_large: str = "the most this command reads") -> bytes:
    """All the bytes of the file ``source`` (``-``: standard input), at most ``limit``:
    a regular file is refused by its size before it is read; anything else (standard
    input, a FIFO, a device such as ``/dev/zero``, which has no end) is read in chunks
    and refused as soon as it has given more than ``limit`` bytes, before it exhausts
    memory.

    Raises:
        DataError: standard input is closed; ``source`` cannot be read; more than
            ``limit`` bytes (``NAME is larger than LIMIT bytes, TOO_LARGE``); not enough
            memory to hold them.
    """
    name = "standard input" if str(source) == "-" else str(source)
    try:
        if str(source) == "-":
            if sys.stdin is None:
                raise DataError("standard input is closed: give a file to read instead of -")
            return _read_at_most(sys.stdin.buffer, limit, name, too_large)
        with open(source, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size > limit:
                raise DataError(f"{name} has {info.st_size:,} bytes, more than {limit:,}, {too_large}")
            return _read_at_most(f, limit, name, too_large)
    except OSError as e:
        raise DataError(f"cannot read {name}: {e.strerror or e}") from None
    except MemoryError:
        raise DataError(f"{name} does not fit in memory") from None


_CHUNK = 1 << 24  # 16 MiB


def _read_at_most(stream, limit: int, name: str, too_large: str) -> bytes:
    """What ``stream`` gives until its end, refused past ``limit`` bytes (see :func:`read_input`)."""
    buffer = io.BytesIO()
    while chunk := stream.read(min(_CHUNK, limit + 1 - buffer.tell())):
        buffer.write(chunk)
        if buffer.tell() > limit:
            buffer.close()  # its memory back now, not when the error is dropped
            raise DataError(f"{name} has more than {limit:,} bytes, {too_large}")
    return buffer.getvalue()


def write_output(dest: str | Path, data: bytes, like: os.stat_result | None = None) -> None:
    """Write ``data`` to standard output (``-``), or to ``dest`` through
    :func:`write_atomically` (with the mode and times of ``like``, the input's
    ``os.stat``, if given): never half-written; a symbolic link there is replaced, never
    written through. Check ``dest`` with :func:`output_destination` first.

    Raises:
        ConfigError: standard output is closed; ``dest`` has become a device, a FIFO or a
            socket since it was checked (it is left as it is).
        OSError: the file system refused.
    """
    if str(dest) == "-":
        if sys.stdout is None:
            raise ConfigError("standard output is closed: give a file to write to instead of -")
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        _check_not_special(Path(dest), ConfigError)
        write_atomically(dest, data, like)


class Lock:
    """An exclusive OS lock on ``file`` (``flock`` through :class:`filelock.FileLock`),
    held from :meth:`acquire` until :meth:`release` or the end of the process. The
    holder writes its PID and command line into ``file``, which a refused process reads
    for its message. The file is never deleted (deleting a lock file lets two processes
    lock two different files of one name)."""

    def __init__(self, file: Path, what: str):
        self.file, self.what = Path(file), what
        self._lock = FileLock(self.file, timeout=0)

    def acquire(self) -> None:
        """Take the lock (nothing happens if this object holds it already).

        Raises:
            LockError: another process holds it: ``WHAT is in use by process PID
                (COMMAND); wait for it or stop it``.
            OSError: the lock file cannot be made (its folder is read-only, say).
        """
        if self._lock.is_locked:
            return
        try:
            self._lock.acquire()
        except Timeout:
            raise LockError(f"{self.what} is in use by {self._holder()}; wait for it or stop it") from None
        try:
            self.file.write_bytes(os.fsencode(f"{os.getpid()} {command_line()}\n"))  # a name's bytes as given
        except BaseException:
            self.release()
            raise

    def holder_elsewhere(self) -> str | None:
        """Who holds the lock, when another process does (``process PID (COMMAND)``); None
        when none does, or when this object holds it. It takes nothing: a shared lock is
        asked for and dropped at once, so that a holder's exclusive one refuses it."""
        if self._lock.is_locked or not self.file.is_file():
            return None
        try:
            fd = os.open(self.file, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return self._holder()
        finally:
            os.close(fd)  # drops the shared lock, if it was had
        return None

    def release(self) -> None:
        """Drop the lock if this object holds it."""
        self._lock.release(force=True)

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _holder(self) -> str:
        try:
            pid, command = os.fsdecode(self.file.read_bytes()).rstrip("\n").split(" ", 1)
        except (OSError, ValueError):  # the holder has not written it yet
            return "another process"
        return f"process {pid} ({command})"


def output_lock(path: Path) -> Lock:
    """The :class:`Lock` of one output (a file or folder in a user's folder). Its lock file
    is not put in the user's folder but in this user's private folder of locks in the
    temporary folder (``$TMPDIR/sharnn-locks-UID``), named by the SHA-256 of the
    output's absolute path (its folder's symbolic links resolved). Processes of one user
    with one temporary folder exclude each other.

    Raises:
        LockError: the folder of locks is not a folder this user owns.
        OSError: it cannot be made.
    """
    where = os.path.join(os.path.realpath(path.absolute().parent), path.name)
    digest = hashlib.sha256(os.fsencode(where)).hexdigest()[:32]
    return Lock(_lock_folder() / f"{digest}.lock", str(path))


def _lock_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"sharnn-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise LockError(f"{folder} is not a folder of this user's: remove it, or set TMPDIR to another folder")
    return folder


def command_line() -> str:
    """This process's command line, as ``sharnn ARGS`` for the command-line tool (started
    as ``sharnn``, ``python -m sharnn`` or ``python -m sharnn.cli``)."""
    program = Path(sys.argv[0])
    if program.name == "sharnn" or (program.parent.name == "sharnn" and program.name in ("__main__.py", "cli.py")):
        return shlex.join(["sharnn", *sys.argv[1:]])
    return shlex.join(["python", *sys.argv])


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` where the process is (so that
    ``finally`` and ``except BaseException`` clean-ups run, as for Ctrl-C); a second
    SIGTERM is ignored until the block ends, so that it does not cut the clean-ups
    short. Outside the main thread, where Python cannot take signals, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
