"""How the ``sharnn`` command meets the process (:mod:`sharnn.cli` has the commands): the
errors a user can cause become one ``error:`` line and an exit status (1, 2 for usage),
Ctrl-C ``interrupted`` and 130, SIGTERM ``terminated`` and 143; torch is loaded by
:class:`Command` before a command runs, so that ``--help``, ``--version`` and usage
errors answer without it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import click

from .errors import Interrupted, SharnnError
from .files import Terminated


class Command(click.Command):
    """A command: it loads torch first (see :func:`_import_torch`)."""

    def invoke(self, ctx):
        _import_torch()
        return super().invoke(ctx)


class Group(click.Group):
    """Turns the errors a user can cause into one line and an exit status."""

    command_class = Command
    group_class = type  # its groups are Groups too

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:  # the group's own options, e.g. `sharnn --bogus`
            _usage_error(e)
        except KeyboardInterrupt:  # click's own handler would print "Aborted!" and exit 1
            _interrupted()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Interrupted as e:
            _echo_once(str(e))
            sys.exit(e.exit_code)
        except SharnnError as e:
            _echo_once(f"error: {e}")
            sys.exit(1)
        except click.UsageError as e:
            _usage_error(e)
        except OSError as e:  # the file system refused: a full disk, a quota, permissions
            where = f" ({e.filename})" if e.filename else ""
            click.echo(f"error: {e.strerror or e}{where}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            _interrupted()
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(143)


def _interrupted():
    click.echo("interrupted", err=True)
    sys.exit(130)


def _import_torch() -> None:
    """Import torch, which every command uses, with Ctrl-C and SIGTERM ending the process
    at once (one line, status 130 or 143): torch's import catches some exceptions and goes
    on half done, so an exception raised inside it can turn into another error (and a
    traceback) further on."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        import torch

        return
    previous = {sig: signal.signal(sig, _exit_at_once) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        import torch  # noqa: F401
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_at_once(signum, frame):
    os.write(2, b"interrupted\n" if signum == signal.SIGINT else b"terminated\n")
    os._exit(128 + signum)


def _echo_once(message: str) -> None:
    """Print ``message`` on standard error; under torchrun, from the first process of each
    machine only (every process meets the same error)."""
    from .distributed import first_on_its_machine

    if first_on_its_machine():
        click.echo(message, err=True)


def _usage_error(e: click.UsageError):
    hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
    click.echo(f"error: {e.format_message()}{hint}", err=True)
    sys.exit(2)
