"""How the ``sharnn`` command meets the process (:mod:`sharnn.cli` has the commands): the
errors a user can cause become one ``error:`` line and an exit status (1, 2 for usage),
Ctrl-C ``interrupted`` and 130, SIGTERM ``terminated`` and 143; torch is loaded by
:class:`Command` before a command runs, so that ``--help``, ``--version`` and usage
errors answer without it. It also defines the options and arguments several commands share.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

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
            _stopped_by_signal("terminated", 143)


def _interrupted():
    _stopped_by_signal("interrupted", 130)


def _stopped_by_signal(line: str, status: int):
    """Print ``line`` and exit with ``status``. A signal can land inside a constructor (a
    tqdm bar's, say); the half-built object's destructor then fails at shutdown, and Python
    would print that as "Exception ignored in ..." after our line: such reports are
    silenced, the process being on its way out."""
    click.echo(line, err=True)
    sys.unraisablehook = lambda unraisable: None
    sys.exit(status)


def _import_torch() -> None:
    """Import torch, which every command uses, with Ctrl-C and SIGTERM ending the process
    at once (one line, status 130 or 143): torch's import catches some exceptions and goes
    on half done, so an exception raised inside it can turn into another error (and a
    traceback) further on.

    OpenMP's threads sleep when they wait (``OMP_WAIT_POLICY=PASSIVE``, which the OpenMP
    runtime reads as torch loads it) unless the environment sets a policy: beside another
    busy program, threads that spin while they wait slow training several times over, and
    on a quiet machine sleeping cost nothing we could measure (docs/training.md, "Threads on
    a shared CPU"; benchmarks/train_contention.py)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
    from .training.distributed import first_on_its_machine

    if first_on_its_machine():
        click.echo(message, err=True)


def _usage_error(e: click.UsageError):
    hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
    click.echo(f"error: {e.format_message()}{hint}", err=True)
    sys.exit(2)


# The options and arguments several commands share.
model_path = click.Path()
"""A shipped model's name or a path, kept as typed: ``NAME`` is the shipped model (the
package's), ``./NAME`` the folder (a ``Path`` would drop the ``./``)."""
checkpoint_argument = click.argument("checkpoint", type=model_path)
model_argument = click.argument("checkpoint", required=False, type=model_path)
"""A checkpoint, run, exported folder or shipped model's name; without it, DEFAULT_MODEL."""
source_argument = click.argument("source", type=click.Path(path_type=Path, allow_dash=True))
dest_argument = click.argument("dest", type=click.Path(path_type=Path, allow_dash=True))
out_option = click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create.")
force_out_option = click.option(
    "--force",
    "-f",
    is_flag=True,
    help="Replace --out if it is a symbolic link (the link, never its target); an existing folder is never replaced.",
)
force_dest_option = click.option(
    "--force", "-f", is_flag=True, help="Replace DEST if it is a file or a symbolic link (the link, never its target)."
)
quiet_option = click.option("--quiet", is_flag=True, help="No progress bar or progress lines.")
split_option = click.option("--split", type=click.Choice(["valid", "test"]), default="test", show_default=True)
bptt_option = click.option(
    "--bptt", default=None, type=click.IntRange(min=1), help="Window length [default: the run's bptt]."
)
attention_span_option = click.option(
    "--attention-span",
    "span",
    default=None,
    type=click.IntRange(min=1),
    help="Positions a window attends to, itself included; a SHA-RNN reads any length [default: as trained].",
)


def streams_option(default: str = "the run's valid_streams or test_streams"):
    """The --streams option of eval and analyze; ``default`` says what its default is."""
    return click.option(
        "--streams", default=None, type=click.IntRange(min=1), help=f"Parallel streams [default: {default}]."
    )


def runtime_options(command):
    """The --device and --fast-path options of eval, generate and analyze."""
    command = click.option(
        "--fast-path",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="SDPA attention and bf16 memory (auto: on with CUDA); off is the eager reference path.",
    )(command)
    return click.option("--device", default="auto", show_default=True)(command)


decoding_threads_option = click.option(
    "--threads",
    default=None,
    type=click.IntRange(min=1, max=1024),
    help="Torch threads while decoding: another count than the file's for a portable file only.  [default: the file's]",
)


def coding_options(command):
    """The --threads, --device, --adapt and --precision options of compress: what the file records
    and its decoding repeats (docs/compression.md)."""
    command = click.option(
        "--precision",
        type=click.Choice(["integer", "fp32", "bf16"]),
        default=None,
        help="integer (the default with a model): the integer step, a file that decodes on any machine; fp32 (the "
        "default online): the float step, a file that decodes on the same kind of machine only; bf16: its products "
        "in bfloat16 on a CPU with bf16 instructions, decoded only on a CPU with the same features.",
    )(command)
    command = click.option(
        "--adapt/--no-adapt",
        default=None,
        help="Mix the model with context models that learn the file as it is coded [default: with --precision "
        'integer] (docs/compression.md, "Adapting to the file"); --no-adapt: the model alone.',
    )(command)
    command = click.option(
        "--device",
        default="cpu",
        show_default=True,
        help="cpu or cuda[:N]: a file coded on CUDA decodes only on the same GPU type with the same library versions.",
    )(command)
    return click.option(
        "--threads",
        default=1,
        show_default=True,
        type=click.IntRange(min=1, max=1024),
        help="Torch threads while coding; decompression uses the same count.",
    )(command)
