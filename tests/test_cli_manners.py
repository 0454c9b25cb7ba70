"""sharnn compress and decompress with xz's manners: FILE.shz by default, -o, -c, -k, --rm,
-f, -t, -l, -d, several files each all or nothing, the input's mode and modification time
kept, no compressed data to or from a terminal, the old SRC DEST form while it lasts; and
progress that tells the truth (docs/compression.md, "The command line")."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import stat
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import sharnn
import sharnn.progress as progress_module
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli
from sharnn.cli import main
from sharnn.coding.arithmetic import DEFAULT_MIXING
from sharnn.coding.container import read_header
from sharnn.commands.compress import CodingProgress, precision_note
from sharnn.errors import ConfigError
from sharnn.progress import ProgressDisplay

MODEL = Path(__file__).parent / "data" / "v2-model"  # a tiny SHA-RNN, read only
TEXT = b"The cat sat on the mat. The cat sat on the hat.\n" * 6


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A working folder holding a.txt and b.txt (different texts)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_bytes(TEXT)
    (tmp_path / "b.txt").write_bytes(TEXT[::-1])
    return tmp_path


def compress(*args):
    """``sharnn compress --model MODEL ARGS``: its summaries on standard error, as all it says."""
    return cli("compress", "--model", MODEL, *args)


def decompress(*args):
    return cli("decompress", "--model", MODEL, *args)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------------------------------ default names


def test_compress_writes_file_shz_keeps_the_input_and_decompress_restores_the_name(folder):
    result = compress("a.txt")
    assert_ok(result)
    assert result.stderr.startswith("compressed a.txt: ") and result.stdout == ""
    assert names(folder) == ["a.txt", "a.txt.shz", "b.txt"]  # kept by default, as zstd keeps it
    (folder / "a.txt").rename(folder / "a.orig")
    result = decompress("a.txt.shz")
    assert_ok(result)
    assert (folder / "a.txt").read_bytes() == TEXT and (folder / "a.txt.shz").exists()
    assert_ok(decompress("a.txt.shz", "-k", "-f"))  # -k: the default, for xz's habit


def test_rm_removes_the_input_once_its_output_is_written(folder):
    assert_ok(compress("--rm", "a.txt"))
    assert names(folder) == ["a.txt.shz", "b.txt"]
    assert_ok(decompress("--rm", "a.txt.shz"))
    assert names(folder) == ["a.txt", "b.txt"] and (folder / "a.txt").read_bytes() == TEXT


def test_decompress_refuses_a_name_without_shz_unless_told_the_output(folder):
    assert_ok(compress("a.txt", "-o", "packed"))
    assert_user_error(decompress("packed"), "packed does not end in .shz", "give -o FILE or -c")
    assert_ok(decompress("packed", "-o", "restored"))
    assert (folder / "restored").read_bytes() == TEXT
    assert_user_error(decompress(".shz"), ".shz does not end in .shz")  # no name left to restore


def test_compress_skips_a_file_that_ends_in_shz_a_folder_and_a_fifo(folder):
    (folder / "x.shz").write_bytes(b"anything")
    assert_user_error(compress("x.shz"), "x.shz already ends in .shz", "give -o FILE")
    (folder / "sub").mkdir()
    assert_user_error(compress("sub"), "sub is a folder")
    os.mkfifo(folder / "pipe")
    assert_user_error(compress("pipe"), "pipe is not a regular file")  # never blocks on reading it
    assert names(folder) == ["a.txt", "b.txt", "pipe", "sub", "x.shz"]


def test_mode_and_modification_time_are_kept_both_ways(folder):
    source = folder / "a.txt"
    source.chmod(0o755)
    os.utime(source, ns=(1_000_000_000_123_456_789, 981_173_106_000_000_000))  # 2001-02-03
    assert_ok(compress("a.txt"))
    packed = (folder / "a.txt.shz").stat()
    assert stat.S_IMODE(packed.st_mode) == 0o755 and packed.st_mtime_ns == 981_173_106_000_000_000
    source.unlink()
    assert_ok(decompress("a.txt.shz"))
    restored = source.stat()
    assert stat.S_IMODE(restored.st_mode) == 0o755 and restored.st_mtime_ns == 981_173_106_000_000_000
    assert source.read_bytes() == TEXT
    (folder / "a.txt.shz").chmod(0o4755)  # set-user-ID is never passed on
    assert_ok(decompress("a.txt.shz", "-f"))
    assert stat.S_IMODE(source.stat().st_mode) == 0o755


# ------------------------------------------------------------------------------ several files, -f


def test_force_with_several_files_overwrites_outputs_never_a_second_file(folder):
    (folder / "a.txt.shz").write_bytes(b"old")
    result = compress("a.txt", "b.txt")
    assert result.exit_code == 1 and result.stdout == ""
    error, summary = result.stderr.splitlines()
    assert error == "error: a.txt.shz exists; give --force to replace it"
    assert summary.startswith("compressed b.txt: ") and (folder / "a.txt.shz").read_bytes() == b"old"
    assert_ok(compress("-f", "a.txt", "b.txt"))  # xz's -f: both compressed, b.txt is no output
    assert (folder / "b.txt").read_bytes() == TEXT[::-1]
    assert read_header((folder / "a.txt.shz").read_bytes())[0].length == len(TEXT)
    assert_ok(decompress("-f", "a.txt.shz", "b.txt.shz"))
    assert (folder / "a.txt").read_bytes() == TEXT and (folder / "b.txt").read_bytes() == TEXT[::-1]


def test_several_files_each_all_or_nothing_a_failure_is_one_line_and_the_rest_goes_on(folder):
    assert_ok(compress("a.txt", "b.txt"))
    (folder / "a.txt").unlink()
    (folder / "b.txt").unlink()
    blob = bytearray((folder / "a.txt.shz").read_bytes())
    blob[-2] ^= 1
    (folder / "bad.shz").write_bytes(bytes(blob))
    result = decompress("-q", "bad.shz", "missing.shz", "b.txt.shz")  # the errors alone
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), lines
    # a missing file is found before any coding (before torch loads), a corrupt one while decoding
    assert "cannot read missing.shz" in lines[0] and "bad.shz is corrupt" in lines[1]
    assert names(folder) == ["a.txt.shz", "b.txt", "b.txt.shz", "bad.shz"]  # no partial output, no temporary file
    assert (folder / "b.txt").read_bytes() == TEXT[::-1]


def test_an_output_that_is_another_input_is_refused(folder):
    assert_ok(compress("a.txt"))
    (folder / "a.txt").write_bytes(b"precious")
    result = decompress("-f", "a.txt.shz", "a.txt")
    assert result.exit_code == 1 and (folder / "a.txt").read_bytes() == b"precious"
    assert "a.txt is an input too" in result.stderr


# ------------------------------------------------------------------------------ -c, -t, -l, -d


def test_stdout_writes_the_compressed_file_and_keeps_the_input(folder):
    result = CliRunner().invoke(main, ["compress", "-c", "a.txt", "--model", str(MODEL)])
    assert result.exit_code == 0, result.stderr
    assert read_header(result.stdout_bytes)[0].length == len(TEXT)
    assert "compressed a.txt" in result.stderr and names(folder) == ["a.txt", "b.txt"]
    assert_user_error(compress("-c", "a.txt", "b.txt"), "-c writes one compressed file")
    assert_ok(compress("a.txt", "b.txt"))
    both = CliRunner().invoke(main, ["decompress", "-c", "a.txt.shz", "b.txt.shz", "--model", str(MODEL), "-q"])
    assert both.exit_code == 0 and both.stdout_bytes == TEXT + TEXT[::-1]  # as zcat concatenates


def test_test_decodes_and_writes_nothing(folder):
    assert_ok(compress("a.txt"))
    (folder / "a.txt").unlink()
    for command in (("decompress", "-t"), ("compress", "-t")):
        result = cli(*command, "a.txt.shz", "--model", MODEL)
        assert_ok(result)
        size = (folder / "a.txt.shz").stat().st_size
        assert result.stdout == "" and result.stderr.startswith(f"tested a.txt.shz: {size:,} bytes decode")
        assert names(folder) == ["a.txt.shz", "b.txt"]
    blob = bytearray((folder / "a.txt.shz").read_bytes())
    blob[-2] ^= 1
    (folder / "a.txt.shz").write_bytes(bytes(blob))
    assert_user_error(decompress("-t", "a.txt.shz"), "a.txt.shz is corrupt")


def test_list_and_info_show_what_a_file_says_about_itself(folder):
    assert_ok(compress("a.txt", "--streams", "2"))
    header = read_header((folder / "a.txt.shz").read_bytes())[0]
    size = (folder / "a.txt.shz").stat().st_size
    listed = cli("decompress", "-l", "a.txt.shz")
    assert_ok(listed)
    for expected in (
        "a.txt.shz:",
        "format version: 6",
        f"not shipped (decompress with --model), sha256 {header.model_sha256}",
        "streams:        2",
        f"original:       {len(TEXT):,} bytes",
        f"compressed:     {size:,} bytes, ratio {size / len(TEXT):.3f}, {8 * size / len(TEXT):.4f} bits per byte",
        f"arithmetic:     integer (integer step 1, mixing {DEFAULT_MIXING}), portable",
        "storage:        coded",
    ):
        assert expected in listed.stdout, (expected, listed.stdout)
    assert "line ends" not in listed.stdout  # LF text: nothing folded, no row (a CRLF file's: tests/test_compress.py)
    info = cli("info", "a.txt.shz")
    assert_ok(info)
    assert info.stdout == listed.stdout == cli("compress", "-l", "a.txt.shz").stdout
    assert sharnn.list_file("a.txt.shz").header == header
    assert_user_error(cli("decompress", "-l", "a.txt"), "a.txt is not a sharnn compressed file")
    assert_ok(compress("b.txt"))
    two = cli("decompress", "-l", "a.txt.shz", "b.txt.shz").stdout
    assert two == listed.stdout + "\n" + cli("info", "b.txt.shz").stdout


def test_list_names_a_stored_file_and_an_empty_one(folder):
    (folder / "empty").write_bytes(b"")
    assert_ok(compress("empty"))
    listed = cli("info", "empty.shz").stdout
    assert "original:       0 bytes" in listed and "no bits per byte" in listed and ", ratio" not in listed
    noise = np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    (folder / "noise").write_bytes(noise)  # the model alone codes it in more than 9 bits a byte
    assert_ok(compress("noise", "--no-adapt"))
    assert "storage:        stored raw (coding gave" in cli("info", "noise.shz").stdout


def test_compress_d_is_decompress_and_refuses_what_only_compressing_takes(folder):
    assert_ok(compress("a.txt"))
    (folder / "a.txt").unlink()
    assert_ok(compress("-d", "a.txt.shz"))
    assert (folder / "a.txt").read_bytes() == TEXT
    for extra, name in ((["--streams", "2"], "--streams"), (["--online"], "--online"), (["lr=1"], "settings")):
        result = cli("compress", "-d", "a.txt.shz", *extra)
        assert result.exit_code == 2 and name in result.stderr and "not with -d" in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-o", "x", "a.txt", "b.txt"], "-o names one output"),
        (["-o", "x", "-c", "a.txt"], "give -o FILE or -c, not both"),
        (["-o", "", "a.txt"], "-o names no file"),
        (["--rm", "-c", "a.txt"], "--rm removes FILE once its output file is written"),
        (["--rm", "-k", "a.txt"], "--rm removes FILE"),
        (["-t", "-o", "x", "a.txt.shz"], "-t writes nothing"),
        (["-t", "-l", "a.txt.shz"], "give one of -d, -t and -l"),
    ],
)
def test_contradicting_file_options_are_usage_errors(folder, args, fragment):
    result = cli("compress", *args)
    assert result.exit_code == 2 and fragment in result.stderr
    assert names(folder) == ["a.txt", "b.txt"]


def test_settings_are_told_from_files(folder):
    assert_user_error(compress("a.txt", "lr=1"), "key=value settings (lr=1) are for --online only")
    (folder / "x=1").write_bytes(TEXT)
    assert_ok(compress("x=1"))  # a file of that name is a file
    assert (folder / "x=1.shz").exists()


# ------------------------------------------------------------------------------ a second name


def test_an_existing_second_file_is_an_input_never_an_output(folder):
    """`sharnn compress -f a.txt b.txt` once wrote a.txt's compressed bytes over b.txt."""
    (folder / "c.shz").write_bytes(b"precious")
    result = compress("-f", "a.txt", "c.shz")
    assert result.exit_code == 1 and (folder / "c.shz").read_bytes() == b"precious"
    assert "c.shz already ends in .shz" in result.stderr and (folder / "a.txt.shz").exists()


# ------------------------------------------------------------------------------ terminals


def _on_a_terminal(*args: str, stream: str = "stdout", stdin=None) -> subprocess.CompletedProcess:
    """``sharnn ARGS`` as a real process whose standard output (or input) is a pseudo
    terminal; what reached the terminal is in ``.terminal``."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    where = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "stdin": stdin or subprocess.DEVNULL}
    where[stream] = follower
    process = subprocess.run(
        [sys.executable, "-m", "sharnn", *args], env=SUBPROCESS_ENV, timeout=300, **where, check=False
    )
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other end is closed: all is read
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    process.terminal = received
    return process


def test_compressed_data_is_never_written_to_a_terminal(folder):
    for args in (["-c", "a.txt"], ["-o", "-", "a.txt"]):
        process = _on_a_terminal("compress", *args, "--model", str(MODEL))
        assert process.returncode == 1, process.stderr
        assert process.stderr.decode().splitlines() == [
            "error: compressed data cannot be written to a terminal: give -o FILE, or redirect standard output"
        ]
        assert process.terminal == b""


def test_compress_file_refuses_a_terminal_too(folder, monkeypatch):
    monkeypatch.setattr(sys, "stdout", type("Terminal", (io.StringIO,), {"isatty": lambda self: True})())
    with pytest.raises(ConfigError, match="written to a terminal"):
        sharnn.compress_file("a.txt", "-", MODEL, quiet=True)


def test_compressed_data_is_never_read_from_a_terminal(folder):
    process = _on_a_terminal("decompress", "-", stream="stdin")
    assert process.returncode == 1
    assert b"compressed data cannot be read from a terminal" in process.stderr


def test_the_bar_on_a_terminal_opens_without_bits_per_byte_and_ends_at_100(folder):
    (folder / "long.txt").write_bytes(TEXT * 20)  # 5,880 bytes: one stream, positions past 512
    process = _on_a_terminal("compress", "long.txt", "--model", str(MODEL), stream="stderr")
    assert process.returncode == 0, process.terminal
    frames = [f for f in process.terminal.decode().replace("\r", "\n").split("\n") if f.strip()]
    bars = [f for f in frames if f.startswith("compress ")]
    assert bars and "bpc" not in bars[0] and " 0%" in bars[0]
    assert "100%" in bars[-1] and "bpc" in bars[-1]
    assert not any("|," in f or "| ," in f for f in bars)  # tqdm's postfix comma
    size = (folder / "long.txt.shz").stat().st_size
    assert f"bpc {8 * size / len(TEXT * 20):.4f}" in bars[-1]  # the file's, as the closing line says


# ------------------------------------------------------------------------------ progress


def test_short_work_prints_no_progress_line_without_a_terminal(folder):
    result = cli("compress", "a.txt", "--model", MODEL)  # not --quiet: stderr is no terminal
    assert_ok(result)
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("compressed a.txt: ")  # its summary


def test_an_empty_file_reports_no_bits_per_byte(folder):
    (folder / "empty").write_bytes(b"")
    result = compress("empty")
    assert_ok(result)
    assert "bits per byte" in result.stderr and "no bits per byte" in result.stderr
    assert "776" not in result.stderr and "0 -> " in result.stderr


def test_progress_lines_come_every_few_seconds_and_leave_out_empty_fields(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    display = ProgressDisplay("decompress")
    assert display.every_seconds <= 5
    display.update(0.1)
    assert capsys.readouterr().err == ""  # before the period: nothing
    now[0] += display.every_seconds
    display.update(0.5)
    line = capsys.readouterr().err
    assert line.startswith("decompress  50% | elapsed ") and "|  |" not in line


def test_coding_progress_shows_no_bits_per_byte_before_anything_is_coded(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    display = CodingProgress("compress", every_seconds=1)
    display.update(bpc="224.0000")  # what the codec reports at position 0
    display.update(0.0)
    now[0] += 2
    display.update(0.0)
    assert "bpc" not in capsys.readouterr().err
    display.update(0.25)
    display.update(bpc="2.5000")
    now[0] += 2
    display.update(0.5)
    assert "bpc 2.5000" in capsys.readouterr().err


def test_the_bar_has_no_stray_comma_and_finishes_at_100(monkeypatch):
    screen = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()
    monkeypatch.setattr(sys, "stderr", screen)
    with ProgressDisplay("eval") as display:
        display.update(0.3, bpc="1.2345")
        display.finish()
    frames = [f for f in screen.getvalue().replace("\r", "\n").split("\n") if f.strip()]
    assert "| bpc 1.2345 [" in frames[-1] and "100%" in frames[-1]
    assert not any(", bpc" in f for f in frames)


# ------------------------------------------------------------------------------ saying what a flag does


def test_a_precision_without_mixing_says_so(folder):
    result = compress("a.txt", "--precision", "fp32")
    assert_ok(result)
    assert result.stderr.splitlines()[1:] == [precision_note("fp32", False, None)]  # after the summary
    assert "adaptive mixing needs the integer step's integer logits" in precision_note("bf16", False, None)
    assert precision_note("bf16", False, False) is None  # --no-adapt: asked for the model alone
    assert precision_note(None, False, None) is None and precision_note("fp32", True, None) is None
    assert_ok(result := compress("b.txt", "--precision", "fp32", "--no-adapt"))
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("compressed b.txt: ")  # no note


def test_help_says_what_is_kept_and_what_streams_trade():
    text = " ".join(cli("compress", "--help").stdout.split())
    assert "Each FILE is kept (--rm removes it)" in text and "mode and modification time" in text
    assert "each costs a cold start and the text before it" in text and "fewer than 4 are slower" in text
    assert "Keep each FILE (the default" in text
    assert "FILE.shz is kept" in " ".join(cli("decompress", "--help").stdout.split())


def test_a_folder_as_output_is_called_a_folder_first(folder):
    (folder / "out").mkdir()
    assert_user_error(compress("a.txt", "-o", "out"), "out is a folder")
    assert_user_error(compress("a.txt", "-o", "out", "-f"), "out is a folder")
    with pytest.raises(ConfigError, match="out is a folder"):
        sharnn.compress_file("a.txt", "out", MODEL, quiet=True)


def test_compress_mixing_chooses_the_adaptive_mixing_and_refuses_what_has_none(folder):
    """--mixing 2 writes a file of mixing 2 that decodes; an unknown version, --no-adapt or
    --precision fp32 with it, and -d with it are one-line errors that write nothing."""
    assert_ok(compress("a.txt", "--mixing", "2", "-o", "two.shz"))
    assert read_header((folder / "two.shz").read_bytes())[0].mixing == 2
    assert_ok(compress("-d", "two.shz", "-o", "back.txt"))
    assert (folder / "back.txt").read_bytes() == (folder / "a.txt").read_bytes()
    for flags, fragment in (
        (["--mixing", "4"], "mixing must be one of 1, 2, 3, got 4"),
        (["--mixing", "2", "--no-adapt"], "--no-adapt leaves out"),
        (["--mixing", "2", "--precision", "fp32"], "--precision fp32 leaves out"),
    ):
        assert_user_error(compress("a.txt", *flags, "-o", "refused.shz"), fragment)
        assert not (folder / "refused.shz").exists()
    assert_user_error(compress("-d", "two.shz", "--mixing", "2"), "--mixing is for compressing")
