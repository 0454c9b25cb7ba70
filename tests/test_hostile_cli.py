"""The command line as people meet it (issue 64): standard output carries data alone, a
closed or odd standard stream changes nothing else, a name that is not UTF-8, the kernel
cache damaged, unwritable or switched off, names at the file system's longest, an output
folder that takes no file (found before any coding), inputs refused before torch loads,
a symbolic link, a model whose run is training, a failed prepare, and the error nobody
foresaw: each the right result or one line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import sharnn.commands.compress as compressing
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli, shared_run
from sharnn import compiled, console, files
from sharnn.coding.container import as_bytes, parse
from sharnn.errors import ConfigError

MODEL = Path(__file__).parent / "data" / "v2-model"  # a tiny SHA-RNN, read only
COMPRESSED = Path(__file__).parent / "data" / "v2-model.shz"
TEXT = b"The cat sat on the mat. The cat sat on the hat.\n" * 6


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_bytes(TEXT)
    return tmp_path


def _sharnn(*args, cwd: Path, shell: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m sharnn ARGS`` in a real process, ``shell`` appended to the command line
    (``2>&-``, say), bytes in and out."""
    script = f'exec "$0" -m sharnn "$@" {shell}'
    return subprocess.run(
        ["sh", "-c", script, sys.executable, *map(os.fsdecode, args)],
        cwd=cwd,
        env={**SUBPROCESS_ENV, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
    )


# ----------------------------------------------------------------------------- standard streams


def test_standard_output_carries_no_summary_and_quiet_prints_nothing(folder):
    done = cli("compress", "--model", MODEL, "a.txt")
    assert_ok(done)
    assert done.stdout == "" and done.stderr.startswith("compressed a.txt: ")
    for args in (
        ("compress", "--model", MODEL, "-q", "-f", "a.txt"),
        ("decompress", "--model", MODEL, "-q", "-t", "a.txt.shz"),
        ("decompress", "--model", MODEL, "-q", "a.txt.shz", "-o", "back.txt"),
        ("compress", "--model", MODEL, "-q", "--precision", "fp32", "a.txt", "-o", "fp32.shz"),  # no note either
    ):
        quiet = cli(*args)
        assert_ok(quiet)
        assert (quiet.stdout, quiet.stderr) == ("", ""), args
    assert (folder / "back.txt").read_bytes() == TEXT


@pytest.mark.slow  # a real process
def test_quiet_compress_prints_nothing_at_all(folder):
    done = _sharnn("compress", "--model", MODEL, "-q", "a.txt", cwd=folder)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert parse((folder / "a.txt.shz").read_bytes(), "a.txt.shz").header.length == len(TEXT)


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_a_second_name_is_an_input_never_an_output(folder, command):
    """``compress a.txt typo.txt`` once wrote compressed bytes into typo.txt, exit 0."""
    first = "a.txt" if command == "compress" else "x.shz"
    shutil.copyfile(COMPRESSED, folder / "x.shz")
    done = cli(command, "--model", MODEL, first, "typo.txt")
    assert done.exit_code == 1 and "Traceback" not in done.output
    refused = {
        "compress": "error: cannot read typo.txt: No such file or directory",
        "decompress": "error: typo.txt does not end in .shz: skipped (give -o FILE or -c to name its output)",
    }[command]
    assert refused in done.stderr.splitlines()
    assert not (folder / "typo.txt").exists()
    assert (folder / ("a.txt.shz" if command == "compress" else "x")).is_file()  # the first FILE coded all the same


def test_verbose_adds_what_the_file_records_on_standard_error(folder):
    verbose = cli("compress", "--model", MODEL, "-v", "a.txt")
    assert_ok(verbose)
    assert verbose.stdout == "" and verbose.stderr.startswith("compressed a.txt: ")
    assert "  model:" in verbose.stderr and "  arithmetic:" in verbose.stderr


def test_notices_of_the_kernels_never_go_to_standard_output(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", None)  # as Python leaves it when standard error is closed
    compiled._to_standard_error("sharnn: compiling its kernels")
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # real processes
def test_with_standard_error_closed_the_output_is_the_compressed_file_alone(folder):
    closed = _sharnn("compress", "--model", MODEL, "-q", "-c", "a.txt", cwd=folder, shell="2>&-")
    assert closed.returncode == 0
    shown = _sharnn("compress", "--model", MODEL, "-q", "-c", "a.txt", cwd=folder)
    assert closed.stdout == shown.stdout and parse(closed.stdout, "out").header.length == len(TEXT)
    (folder / "x.shz").write_bytes(closed.stdout)
    back = _sharnn("decompress", "--model", MODEL, "-c", "x.shz", cwd=folder, shell="2>&-")
    assert back.returncode == 0 and back.stdout == TEXT


@pytest.mark.slow  # a real process: Python's own handling of argv
def test_a_name_that_is_not_utf8_is_coded_and_shown_as_its_bytes(folder):
    name = b"caf\xe9.txt"
    (folder / os.fsdecode(name)).write_bytes(TEXT)
    done = _sharnn("compress", "--model", MODEL, name, cwd=folder)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(b"compressed " + name + b": ") and done.stdout == b""
    listed = _sharnn("decompress", "-l", name + b".shz", cwd=folder)
    assert listed.returncode == 0 and listed.stdout.startswith(name + b".shz:")


# ----------------------------------------------------------------------------- the kernel cache


def _load_kernel_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("damage", [b"", b"\x80\x04garbled"])
def test_a_damaged_kernel_cache_is_compiled_in_memory_and_said_once(tmp_path, damage):
    source = tmp_path / "kernels_here.py"
    source.write_text("import numba\n\n@numba.njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    first = _load_kernel_module(source, "kernels_first").twice
    first.declared_signatures = ("int64(int64)",)
    assert compiled.compile_kernel(first).keys() == {"compiling"}
    (index,) = (tmp_path / "__pycache__").glob("*.nbi")
    index.write_bytes(damage)
    again = _load_kernel_module(source, "kernels_again").twice
    again.declared_signatures = ("int64(int64)",)
    notices = compiled.compile_kernel(again)
    assert notices.keys() == {"damaged"} and "cannot be read" in notices["damaged"]
    assert again(21) == 42 and index.read_bytes() == damage  # it works; the cache is left as it was


@pytest.mark.slow  # real processes: the kernels compiled in memory
def test_no_folder_for_the_kernel_cache_compiles_in_memory(folder):
    nowhere = {"NUMBA_CACHE_LOCATOR_CLASSES": "UserWideCacheLocator", "XDG_CACHE_HOME": "/dev/null/x"}
    done = _sharnn("compress", "--model", MODEL, "a.txt", cwd=folder, env=nowhere | {"HOME": "/dev/null"})
    assert done.returncode == 0, done.stderr
    notice, summary = done.stderr.decode().splitlines()
    assert notice == compiled.NO_CACHE_NOTICE
    assert summary.startswith("compressed a.txt: ") and (folder / "a.txt.shz").is_file()


@pytest.mark.parametrize("quiet", [False, True])
def test_quiet_silences_the_notice_of_kernels_compiled_in_memory(tmp_path, monkeypatch, capsys, quiet):
    """What the coding commands load (``console._load_coding``), with one kernel for which
    numba finds no folder to cache in: its notice, or nothing with -q."""
    source = tmp_path / "kernels_nowhere.py"
    source.write_text(
        "from sharnn import compiled\n\n@compiled.kernel('int64(int64)')\ndef twice(x):\n    return 2 * x\n"
    )
    monkeypatch.setattr(compiled, "KERNELS", [])
    monkeypatch.setattr(compiled, "UNCACHED", [])
    monkeypatch.setattr(compiled, "_compiled", False)
    monkeypatch.setattr(numba.core.caching.CacheImpl, "_locator_classes", [])  # no folder anywhere
    twice = _load_kernel_module(source, "kernels_nowhere").twice
    assert compiled.UNCACHED == [twice]
    capsys.readouterr()
    console._load_coding.__wrapped__("sharnn compress", quiet)
    notices = capsys.readouterr().err.splitlines()
    assert notices == ([] if quiet else [compiled.NO_CACHE_NOTICE]) and twice(21) == 42


@pytest.mark.slow  # real processes
@pytest.mark.parametrize(
    "setting, line",
    [
        ({"NUMBA_DISABLE_JIT": "1"}, "error: NUMBA_DISABLE_JIT is set: sharnn runs its kernels compiled only"),
        ({"NUMBA_THREADING_LAYER": "tbb"}, "error: numba cannot load its threading layer 'tbb'"),
    ],
)
def test_numba_switched_off_or_without_its_threading_layer_is_one_line(folder, setting, line):
    if "NUMBA_THREADING_LAYER" in setting and importlib.util.find_spec("tbb") is not None:
        pytest.skip("TBB is installed here")
    done = _sharnn("compress", "--model", MODEL, "-q", "a.txt", cwd=folder, env=setting)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(line), lines
    assert not (folder / "a.txt.shz").exists()


def test_numba_disable_jit_is_refused_by_the_library_too(monkeypatch):
    monkeypatch.setattr(compiled, "_compiled", False)
    monkeypatch.setattr(numba.config, "DISABLE_JIT", True)
    with pytest.raises(ConfigError, match="NUMBA_DISABLE_JIT"):
        compiled.ensure_compiled()


# ----------------------------------------------------------------------------- names and folders


def test_names_at_the_longest_are_written_atomically(tmp_path):
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("x" * longest)
    files.write_atomically(path, b"data")
    with files.staging_folder(tmp_path / ("y" * longest)) as staging:
        (staging / "f").write_bytes(b"")
        files.publish(staging, tmp_path / ("y" * longest))
    assert path.read_bytes() == b"data" and sorted(p.name for p in tmp_path.iterdir()) == [path.name, "y" * longest]


def test_a_file_whose_name_leaves_room_for_shz_alone_is_compressed(folder):
    name = "z" * (os.pathconf(folder, "PC_NAME_MAX") - len(".shz"))
    (folder / name).write_bytes(TEXT)
    assert_ok(cli("compress", "--model", MODEL, "-q", name))
    (folder / name).unlink()
    assert_ok(cli("decompress", "--model", MODEL, "-q", name + ".shz"))
    assert (folder / name).read_bytes() == TEXT


def test_an_output_folder_that_takes_no_file_is_refused_before_coding(folder, monkeypatch):
    if os.access("/sys", os.W_OK) and _creatable(Path("/sys")):
        pytest.skip("/sys takes files here")
    monkeypatch.setattr(compressing, "_predictor", lambda *a: pytest.fail("the model was loaded"))
    assert_user_error(cli("compress", "--model", MODEL, "-q", "a.txt", "-o", "/sys/a.txt.shz"), "cannot write")


def _creatable(folder: Path) -> bool:
    try:
        (folder / ".sharnn-probe").touch()
    except OSError:
        return False
    (folder / ".sharnn-probe").unlink()
    return True


def test_a_failed_prepare_leaves_no_folder_it_made(folder):
    assert_user_error(cli("prepare", "enwik8", "--source", "missing.zip", "--out", "data/deep/enwik8"))
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]


# ----------------------------------------------------------------------------- inputs


@pytest.mark.slow  # a real process, to see what it imported
def test_a_missing_file_is_refused_before_torch_loads(folder):
    probe = (
        "import atexit, sys; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
        "sys.argv = ['sharnn', 'compress', 'missing.txt']; import sharnn.__main__ as m; m.run()"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=folder, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["error: cannot read missing.txt: No such file or directory", "False"]


def test_a_symbolic_link_is_followed_with_force_only(folder):
    (folder / "link.txt").symlink_to("a.txt")
    assert_user_error(cli("compress", "--model", MODEL, "-q", "link.txt"), "link.txt is a symbolic link: skipped")
    assert_ok(cli("compress", "--model", MODEL, "-q", "-f", "link.txt"))
    assert (folder / "link.txt.shz").is_file() and (folder / "link.txt").is_symlink()


def test_the_progress_names_the_file(folder, monkeypatch):
    labels = []

    class Recording(compressing.CodingProgress):
        def __init__(self, label, **kwargs):
            labels.append(label)
            super().__init__(label, **kwargs)

    monkeypatch.setattr(compressing, "CodingProgress", Recording)
    assert_ok(cli("compress", "--model", MODEL, "-q", "a.txt"))
    assert labels == ["compress a.txt"]


def test_bytes_like_inputs_are_their_bytes():
    blob = COMPRESSED.read_bytes()
    assert parse(memoryview(blob), "x") == parse(blob, "x") == parse(bytearray(blob), "x")
    assert as_bytes("data", memoryview(b"abcd")[::2]) == b"ac"
    with pytest.raises(ConfigError, match="data must be bytes, got str"):
        as_bytes("data", "text")


# ----------------------------------------------------------------------------- models and bugs


def test_a_checkpoint_of_a_run_that_is_training_is_refused(folder, tmp_path_factory):
    run = folder / "run"
    shutil.copytree(shared_run(tmp_path_factory), run, symlinks=True)
    (run / ".lock").touch()
    trainer = files.Lock(run / ".lock", str(run))
    trainer.acquire()  # as the training process holds it
    try:
        assert_user_error(cli("compress", "--model", run, "-q", "a.txt"), "is training", "sharnn export")
    finally:
        trainer.release()
    assert not (folder / "a.txt.shz").exists()
    compressing.check_model_stays(run)  # the run done: its checkpoints stay


@pytest.mark.parametrize("error", [RuntimeError("boom\nmore"), EOFError()])
def test_an_unforeseen_error_is_one_line(folder, monkeypatch, error):
    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr("sharnn.compress_file", fails)
    line = assert_user_error(cli("compress", "--model", MODEL, "-q", "a.txt"), type(error).__name__, "unforeseen")
    assert "more" not in line and "Aborted" not in line
