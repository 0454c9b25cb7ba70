"""``python -m sharnn`` (and ``torchrun --nproc_per_node=N -m sharnn train ...``): the
command line of :mod:`sharnn.cli`, and :func:`run`, the ``sharnn`` command's entry point."""

import codecs
import fcntl
import os
import sys


def run() -> None:
    """Run the command line. Ctrl-C at any moment, even while the libraries a command needs
    are loading, prints one line ``interrupted`` and exits with status 130."""
    try:
        open_standard_streams()
        from .cli import main

        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def open_standard_streams() -> None:
    """Meet the process's standard streams as xz does:

    - a standard stream that was closed (``2>&-``, or open the wrong way: :func:`_usable`)
      gets ``/dev/null`` in its place, so that no file this process opens takes its
      number: otherwise the first file opened would become "standard error" (or
      output), and a library's message would land in it. ``sys.stdin`` or ``sys.stdout``
      is then None, and the commands refuse ``-`` there; a closed standard error
      swallows messages;
    - a file name that is not UTF-8 (a Latin-1 ``caf\\xe9.txt``, which Python holds with
      surrogates) is written back as its own bytes, in messages and listings, instead of
      failing to encode (other characters that cannot be encoded are escaped).
    """
    for fd, stream in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if _usable(fd):
            continue
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if fd < 2:
            setattr(sys, stream, None)  # the commands refuse `-` there
    if sys.stderr is None:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115 -- the process's
    codecs.register_error("sharnn.names", _names_as_bytes)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="sharnn.names")


def _usable(fd: int) -> bool:
    """Whether the standard stream ``fd`` is open the way it is used: standard input for
    reading, the others for writing. One open the other way counts as closed: a shell
    script that runs Python by ``exec`` with ``2>&-`` (pyenv's shims) can leave its own file,
    read-only, in standard error's place."""
    try:
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:  # closed
        return False
    return access == os.O_RDWR or access == (os.O_RDONLY if fd == 0 else os.O_WRONLY)


def _names_as_bytes(error: UnicodeError):
    """The error handler of :func:`open_standard_streams`: the bytes a name's surrogates
    stand for (``surrogateescape``), else a backslash escape."""
    try:
        return codecs.lookup_error("surrogateescape")(error)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(error)


if __name__ == "__main__":
    run()
