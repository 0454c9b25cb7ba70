"""How the ``sharnn`` command meets the process (:mod:`sharnn.cli` has the commands): the
errors a user can cause become one ``error:`` line and an exit status (1, 2 for usage),
Ctrl-C ``interrupted`` and 130, SIGTERM ``terminated`` and 143; running out of memory and
any error not foreseen are one line too (``SHARNN_TRACEBACK=1`` shows the traceback); torch is loaded by
:class:`Command` before a command runs, so that ``--help``, ``--version`` and usage
errors answer without it. It also defines the options and arguments several commands share.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import click

from .errors import ConfigError, Interrupted, SharnnError
from .files import Terminated


class Command(click.Command):
    """A command: it loads torch first (see :func:`_import_torch`)."""

    def invoke(self, ctx):
        _import_torch(ctx.command_path)
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
            _echo_once(error_line(e))
            sys.exit(1)
        except click.UsageError as e:
            _usage_error(e)
        except OSError as e:  # the file system refused: a full disk, a quota, permissions
            click.echo(error_line(e), err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            _interrupted()
        except Terminated:
            _stopped_by_signal("terminated", 143)
        except MemoryError:
            click.echo("error: out of memory (a limit on this process, ulimit -v, or the machine's)", err=True)
            sys.exit(1)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:  # a bug of ours, or a library's error we did not foresee: one line still
            if os.environ.get("SHARNN_TRACEBACK"):
                raise
            click.echo(internal_error_line(e), err=True)
            sys.exit(1)


def internal_error_line(e: Exception) -> str:
    """The line an unforeseen error is printed as (``SHARNN_TRACEBACK=1``: its traceback instead)."""
    what = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return (
        f"error: {type(e).__name__}{': ' + what if what else ''} (unforeseen: SHARNN_TRACEBACK=1 shows where; "
        "please report it)"
    )


def error_line(e: Exception) -> str:
    """The line an error a user can cause (a :class:`SharnnError`, or an ``OSError``: the
    file system refused) is printed as."""
    if isinstance(e, OSError):
        return f"error: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}"
    return f"error: {e}"


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


def _import_torch(doing: str) -> None:
    """Import torch, which every command (``doing``: ``sharnn compress``) uses, once the
    process's address-space limit is known to hold the libraries
    (:func:`sharnn.address_space.check_address_space`: below it they abort), with Ctrl-C and SIGTERM ending the process
    at once (one line, status 130 or 143): torch's import catches some exceptions and goes
    on half done, so an exception raised inside it can turn into another error (and a
    traceback) further on.

    OpenMP's threads sleep when they wait (``OMP_WAIT_POLICY=PASSIVE``, which the OpenMP
    runtime reads as torch loads it) unless the environment sets a policy: beside another
    busy program, threads that spin while they wait slow training several times over, and
    on a quiet machine sleeping cost nothing we could measure (docs/training.md, "Threads on
    a shared CPU"; benchmarks/train_contention.py).

    Python's cyclic garbage collector is off while torch loads, and what the import made
    is then frozen (``gc.freeze``): it lives as long as the process, and each pass of the
    collector over its oldest generation would read those 400,000 objects again (measured:
    `sharnn compress` of 1 KB in 3.7 s instead of 4.4, medians of 3).

    numba's error messages are not coloured (``NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING``,
    read as numba loads, unless the environment sets it): with colorama installed, numba
    would start it while compiling, and colorama writes a reset code (``ESC [0m``) to
    standard output at exit when that is a terminal, bytes no command of ours wrote."""
    if "torch" in sys.modules:
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
    with _collector_off_then_frozen():
        if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
            _checked_import(doing)
            return
        previous = {sig: signal.signal(sig, _exit_at_once) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            _checked_import(doing)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _checked_import(doing: str) -> None:
    """The address-space check (it imports a module of ours), then torch."""
    from .address_space import check_address_space

    check_address_space(doing)
    import torch  # noqa: F401


@contextmanager
def _collector_off_then_frozen() -> Iterator[None]:
    """Python's cyclic garbage collector off inside; what was made is frozen after (``gc.freeze``)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _exit_at_once(signum, frame):
    os.write(2, b"interrupted\n" if signum == signal.SIGINT else b"terminated\n")
    os._exit(128 + signum)


def _echo_once(message: str) -> None:
    """Print ``message`` on standard error; under torchrun, from the first process of each
    machine only (every process meets the same error). Outside torchrun nothing is
    imported for it: an error found before torch loads is printed without it."""
    if "LOCAL_RANK" in os.environ:  # torchrun's
        from .training.distributed import first_on_its_machine

        if not first_on_its_machine():
            return
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
out_option = click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to create.")
force_out_option = click.option(
    "--force",
    "-f",
    is_flag=True,
    help="Replace --out if it is a symbolic link (the link, never its target); an existing folder is never replaced.",
)


def new_folder_options(command):
    """``--out`` and ``--force`` of the commands that create a folder (``sharnn prepare``)."""
    return out_option(force_out_option(command))


fraction_type = click.FloatRange(0, 0.5, min_open=True, max_open=True)
"""A split's share of a corpus (``--valid-fraction``, ``--test-fraction``)."""
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
    """The --threads, --device, --adapt, --mixing and --precision options of compress: what the
    file records and its decoding repeats (docs/compression.md)."""
    command = click.option(
        "--mixing",
        default=None,
        type=click.IntRange(min=1),
        help="The adaptive mixing's version, the size-for-speed trade: 3 codes each byte bit by bit (on the "
        "Canterbury texts 6 to 8% smaller than 2, at 0.87 to 1.0 times its speed); 2, a match model and APMs; 1, "
        'context models alone (docs/compression.md, "Adapting to the file").  [default: 3]',
    )(command)
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
        default=None,
        help="cpu or cuda[:N]: a file coded on CUDA decodes only on the same GPU type with the same library "
        "versions.  [default: cpu]",
    )(command)
    return click.option(
        "--threads",
        default=None,
        type=click.IntRange(min=1, max=1024),
        help="Torch threads while coding; decompression uses the same count.  [default: 1; with -d, -t: the file's]",
    )(command)


# sharnn compress and decompress: xz's manners (docs/compression.md, "The command line").
_SETTING = re.compile(r"[A-Za-z_][\w.]*=")


def file_options(command=None, *, compressing: bool = False):
    """The options of compress and decompress that say what becomes of each FILE."""
    options = [
        click.option(
            "--quiet", "-q", is_flag=True, help="Nothing but errors: no progress, no summary, no note, no notice."
        ),
        click.option("--verbose", "-v", is_flag=True, help="Below each summary, what its compressed file records."),
        click.option("--list", "-l", "list_", is_flag=True, help="Print what each FILE.shz says about itself."),
        click.option("--test", "-t", is_flag=True, help="Decode and check each FILE.shz; write nothing."),
        click.option("--rm", is_flag=True, help="Remove each FILE once its output is written."),
        click.option("--keep", "-k", is_flag=True, help="Keep each FILE (the default, as zstd; xz removes it: --rm)."),
        click.option(
            "--force",
            "-f",
            is_flag=True,
            help="Replace existing output files (a symbolic link: the link, never its target); follow an input "
            "that is a symbolic link.",
        ),
        click.option("--stdout", "-c", "to_stdout", is_flag=True, help="Write to standard output (keeps FILE)."),
        click.option("--output", "-o", default=None, help="Write to this file (one FILE only; -: standard output)."),
    ]
    if command is None:
        return lambda command: file_options(command, compressing=compressing)
    if compressing:
        options.append(click.option("--decompress", "-d", is_flag=True, help="Decompress, as `sharnn decompress`."))
    for option in options:
        command = option(command)
    return command


def code_files(arguments, how: dict, coding: dict | None, *, model, threads: int | None) -> None:
    """Run ``sharnn compress`` (``coding``: its options only compressing takes, as
    :func:`sharnn.compress_file` names them) or ``sharnn decompress`` (``coding`` None) on
    each FILE of ``arguments``, with the file options ``how`` (:func:`file_options`).

    Every FILE and its output are checked first, before torch loads or a kernel compiles
    (a missing file, a folder, a symbolic link without ``-f``, an output that exists or
    cannot be written is refused at once); then each is coded, all or nothing. With
    several, a failure is one line and the next file goes on, and the exit status is 1.
    Standard output carries data (``-c``, ``-o -``) and ``-l``'s listing only: each file's
    summary, ``-v``'s details, notes and progress go to standard error, and ``-q`` leaves
    errors alone there."""
    files = [a for a in arguments if not (_SETTING.match(a) and not os.path.lexists(a))]
    settings = [a for a in arguments if a not in files]
    mode = _mode(how, coding is not None)
    if coding is not None and mode != "compress":
        _refuse_compressing_options(coding | {"settings": settings}, mode)
    elif coding is None and settings:
        raise click.UsageError(f"key=value settings ({settings[0]}) are for `sharnn compress --online` only")
    if not files:
        raise click.UsageError("give a FILE (-: standard input)")
    if how["quiet"] and how["verbose"]:
        raise click.UsageError("give -q or -v, not both")
    _check_outputs(how, mode, files)
    work = {"model": model, "threads": threads, "force": how["force"], "quiet": how["quiet"]}
    if mode == "compress":
        work |= coding | {"settings": settings, "threads": threads or 1, "device": coding["device"] or "cpu"}
    jobs, failed = [], 0
    for source in files:
        try:
            jobs.append((source, _destination(source, how, mode, files)))
        except (SharnnError, OSError) as e:
            if len(files) == 1:
                raise
            click.echo(error_line(e), err=True)
            failed += 1
    if jobs:
        _load_coding(click.get_current_context().command_path, quiet=how["quiet"])
    for number, (source, dest) in enumerate(jobs):
        if mode == "list" and number:
            click.echo()  # a blank line between two files' blocks
        try:
            _code_one(source, dest, mode, work, remove=how["rm"], verbose=how["verbose"])
        except (SharnnError, OSError) as e:
            if len(files) == 1 or isinstance(e, Interrupted):
                raise
            click.echo(error_line(e), err=True)
            failed += 1
    if coding is not None and mode == "compress" and not how["quiet"]:
        _precision_note(coding)
    if failed:
        sys.exit(1)


@cache
def _load_coding(doing: str, quiet: bool) -> None:
    """Import the coding commands and load the compiled kernels with Python's cyclic
    garbage collector off, then freeze what they made, as :func:`_import_torch` does for
    torch: they live as long as the process, and the collector's passes over its oldest
    generation, each reading them all again, cost about 0.3 s of each `sharnn compress`
    (measured: 3 to 4 passes of 0.03 to 0.11 s as the imports grew the heap to 200,000
    objects, and one more while coding). Once per process; torch first (:func:`_import_torch`),
    which the coding commands load only once their files are checked. ``quiet``: the
    kernels' notices (a first compile, a cache that cannot be used) are not printed."""
    _import_torch(doing)
    with _collector_off_then_frozen():
        from .commands import compress, decompress  # noqa: F401
        from .compiled import ensure_compiled

        ensure_compiled((lambda line: None) if quiet else None)


def _mode(how: dict, compressing: bool) -> str:
    chosen = [flag for flag in ("decompress", "test", "list_") if how.get(flag)]
    if len(chosen) > 1:
        raise click.UsageError(f"give one of -d, -t and -l, not {' and '.join('-' + c[0] for c in chosen)}")
    return {"decompress": "decompress", "test": "test", "list_": "list"}.get(
        chosen[0] if chosen else "", "compress" if compressing else "decompress"
    )


def _refuse_compressing_options(options: dict, mode: str) -> None:
    given = [name for name, value in options.items() if value not in (None, False, [], ())]
    if given:
        name = "key=value settings" if given[0] == "settings" else f"--{given[0]}"
        raise click.UsageError(f"{name} is for compressing: not with -{mode[0]}")


def _check_outputs(how: dict, mode: str, files: list[str]) -> None:
    """Refuse the file options that contradict each other or the mode (usage errors)."""
    if how["output"] is not None and how["to_stdout"]:
        raise click.UsageError("give -o FILE or -c, not both")
    if how["output"] == "":
        raise click.UsageError("-o names no file: give a name, or - for standard output")
    if mode in ("test", "list") and (how["output"] is not None or how["to_stdout"] or how["rm"]):
        raise click.UsageError(f"-{mode[0]} writes nothing: no -o, -c or --rm")
    if how["rm"] and (how["keep"] or how["to_stdout"] or how["output"] == "-"):
        raise click.UsageError("--rm removes FILE once its output file is written: not with -k, -c or -o -")
    if len(files) > 1 and how["output"] is not None:
        raise click.UsageError(f"-o names one output: give one FILE, not {len(files)}")
    if len(files) > 1 and how["to_stdout"] and mode == "compress":
        raise click.UsageError(f"-c writes one compressed file: give one FILE, not {len(files)}")


def _destination(source: str, how: dict, mode: str, files: list[str]) -> str | None:
    """Where ``source``'s output goes: -o, -c, nowhere (-t, -l) or its name by default,
    never one of the inputs; ``source`` and the output checked as far as they can be
    without reading them (:func:`~sharnn.commands.names.check_source`,
    :func:`~sharnn.files.check_destination`)."""
    from .commands.names import check_source, compressed_name, decompressed_name
    from .files import check_destination

    if mode in ("test", "list"):
        check_source(source, follow_links=how["force"])
        return None
    if how["output"] is not None or how["to_stdout"]:
        dest = "-" if how["to_stdout"] else how["output"]
    else:
        dest = compressed_name(source) if mode == "compress" else decompressed_name(source)
        if os.path.exists(dest) and any(os.path.exists(f) and os.path.samefile(dest, f) for f in files):
            raise ConfigError(f"{dest} is an input too: {source} skipped")
    check_destination(source, dest, how["force"], ConfigError)
    check_source(source, follow_links=how["force"])
    return dest


def _code_one(source: str, dest: str | None, mode: str, work: dict, *, remove: bool, verbose: bool) -> None:
    """One FILE: code it, print its summary on standard error (not with -q; with -v, what
    the compressed file records below it), and remove it with --rm once its output is
    written."""
    import sharnn

    if mode == "list":
        click.echo(sharnn.api.list_file(source).format())
        return
    options = dict(work)
    model = options.pop("model")
    if mode == "compress":
        done = sharnn.compress_file(source, dest, model, **options)
    else:
        done = sharnn.decompress_file(source, dest, model, **options)
    if not work["quiet"]:
        from .commands.compress import shown_name

        click.echo(done.format(shown_name(source)), err=True)
    if verbose:
        click.echo(_details(done), err=True)
    if remove and source != "-":
        os.unlink(source)


def _details(done) -> str:
    """What ``-v`` adds below a file's summary: the model, the arithmetic and the machine
    its compressed file records (rows of ``sharnn decompress -l``)."""
    from .commands.decompress import shipped_name
    from .commands.listing import Listing

    header = done.header
    shipped = shipped_name(header.model_sha256) if header.mode == "model" else None
    rows = Listing("", 0, header, done.written if done.compressed else done.read, shipped).rows()
    return "\n".join(f"  {key + ':':<16}{rows[key]}" for key in ("model", "arithmetic", "coded on"))


def _precision_note(coding: dict) -> None:
    """The note a precision that leaves out the adaptive mixing asks for, on standard error."""
    from .commands.compress import precision_note

    note = precision_note(coding["precision"], coding["online"], coding["adapt"])
    if note:
        click.echo(note, err=True)
