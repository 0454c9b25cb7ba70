"""Inputs and outputs a user can get wrong end in one line and a non-zero exit, never a
traceback, a hang, a lost file or a silently wrong answer (sharnn.files):

- a closed standard input or output (``<&-``, ``>&-``) given as ``-``;
- an input without an end (``/dev/zero``) or larger than compression takes, refused
  before it exhausts memory (a regular file by its size, before it is read);
- a destination that is a device, a FIFO or a socket, never replaced, even with ``--force``;
- an export into the run folder it reads (its ``latest`` or ``best`` link);
- an analysis whose ``--out`` cannot take the report, refused before the analysis;
- an online model whose size overflows torch's counting, or that is too large to build.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sharnn
import sharnn.api as api
import sharnn.coding.container as container
import sharnn.coding.online as online_mode
import sharnn.commands.compress as compressing
import sharnn.commands.decompress as decompressing
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli, shared_run
from sharnn import files
from sharnn.coding.online import check_online_size, online_config, online_model
from sharnn.errors import ConfigError, DataError
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN

TEXT = b"Hostile input, one clear line. " * 4
TINY_ONLINE = ["model.d_model=32", "model.boom_dim=64", "model.attention_span=48", "bptt=16"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """The shared finished SMALL run (read only)."""
    return shared_run(tmp_path_factory)


@pytest.fixture
def run_dir(tmp_path, shared) -> Path:
    """A copy of the shared run, to change."""
    run = tmp_path / "run"
    shutil.copytree(shared, run, symlinks=True)
    return run


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_bytes(TEXT)
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ----------------------------------------------------------------------------- files' public functions


def test_the_output_safety_lives_in_files():
    for function in (files.output_destination, files.read_input, files.write_output):
        assert function.__doc__ and function.__module__ == "sharnn.files"
    assert not any(hasattr(api, name) for name in ("_destination", "_read_input", "_write_output"))


def test_read_input_stops_at_its_limit(tmp_path):
    with pytest.raises(DataError, match="/dev/zero has more than 1,000 bytes, the most it takes"):
        files.read_input("/dev/zero", 1000, "the most it takes")
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    assert files.read_input(small, 1000) == b"x" * 1000
    with pytest.raises(DataError, match="has 1,000 bytes, more than 999"):
        files.read_input(small, 999)


# ----------------------------------------------------------------------------- closed standard streams


def _with_closed(fd: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    """``sharnn ARGS`` in a real process whose standard input (``fd`` "0") or output ("1")
    is closed by the shell (``<&-``, ``>&-``): Python then has ``sys.stdin`` (``sys.stdout``) None."""
    script = f'exec "$0" -m sharnn "$@" {"<&-" if fd == "0" else ">&-"}'
    return subprocess.run(
        ["sh", "-c", script, sys.executable, *map(str, args)],
        cwd=cwd,
        env=SUBPROCESS_ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if fd == "0" else None,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # real processes
@pytest.mark.parametrize(
    "command, fd, line",
    [
        ("compress", "0", "error: standard input is closed: give a file to read instead of -"),
        ("compress", "1", "error: standard output is closed: give a file to write to instead of -"),
        ("decompress", "0", "error: standard input is closed: give a file to read instead of -"),
        ("decompress", "1", "error: standard output is closed: give a file to write to instead of -"),
    ],
)
def test_a_closed_standard_stream_is_one_line(tmp_path, text, command, fd, line):
    source, dest = ("-", "out") if fd == "0" else (text.name, "-")
    more = ["--online"] if command == "compress" else []
    done = _with_closed(fd, command, source, "-o", dest, *more, "--quiet", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [line]
    assert _listing(tmp_path) == ["text.txt"]


# ----------------------------------------------------------------------------- inputs without an end


def test_an_input_without_an_end_is_refused_before_memory_runs_out(tmp_path, monkeypatch, shared):
    monkeypatch.setattr(compressing, "MAX_LENGTH", 1 << 20)
    line = assert_user_error(
        cli("compress", "/dev/zero", "-o", tmp_path / "out.shz", "--model", shared, "--quiet"),
        "/dev/zero has more than 1,048,576 bytes, the most sharnn compresses",
    )
    assert _listing(tmp_path) == [], line
    monkeypatch.setattr(decompressing, "MAX_FILE_BYTES", 1 << 20)
    assert_user_error(
        cli("decompress", "/dev/zero", "-o", tmp_path / "out", "--quiet"),
        "/dev/zero has more than 1,048,576 bytes, the most sharnn decompresses",
    )
    assert _listing(tmp_path) == []


def test_a_file_larger_than_compression_takes_is_refused_by_its_size(tmp_path, monkeypatch, shared):
    assert container.MAX_LENGTH == 2**31  # documented: docs/compression.md, api.compress_file
    assert "2 GiB" in (Path(__file__).parents[1] / "docs" / "compression.md").read_text()
    monkeypatch.setattr(compressing, "MAX_LENGTH", len(TEXT) - 1)
    big = tmp_path / "big.txt"
    big.write_bytes(TEXT)
    opened = []
    monkeypatch.setattr(files, "_read_at_most", lambda *args: opened.append(args))
    assert_user_error(
        cli("compress", big, "-o", tmp_path / "out.shz", "--model", shared, "--quiet"),
        f"big.txt has {len(TEXT)} bytes, more than {len(TEXT) - 1}, the most sharnn compresses",
    )
    assert opened == [] and _listing(tmp_path) == ["big.txt"]


def test_standard_input_larger_than_compression_takes_is_refused(tmp_path, monkeypatch, shared):
    monkeypatch.setattr(compressing, "MAX_LENGTH", len(TEXT))
    out = tmp_path / "out.shz"
    assert_ok(cli_with_input(TEXT, "compress", "-", "-o", out, "--model", shared, "--quiet"))
    assert out.exists()
    result = cli_with_input(TEXT + b"!", "compress", "-", "-o", tmp_path / "more.shz", "--model", shared, "--quiet")
    assert_user_error(result, f"standard input has more than {len(TEXT)} bytes, the most sharnn compresses")
    assert _listing(tmp_path) == ["out.shz"]


def cli_with_input(data: bytes, *args):
    from click.testing import CliRunner

    from sharnn.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], input=data, catch_exceptions=True)


# ----------------------------------------------------------------------------- destinations that are not files


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
def test_a_fifo_destination_is_refused_and_left(tmp_path, text, shared, force):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert_user_error(
        cli("compress", text, "-o", fifo, "--model", shared, "--quiet", *force),
        f"{fifo} is a FIFO, not a file; give - to write to standard output",
    )
    packed = tmp_path / "text.shz"
    assert_ok(cli("compress", text, "-o", packed, "--model", shared, "--quiet"))
    assert_user_error(cli("decompress", packed, "-o", fifo, "--model", shared, "-q", *force), "is a FIFO, not a file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _listing(tmp_path) == ["pipe", "text.shz", "text.txt"]


def test_a_character_device_is_never_replaced(tmp_path):
    # The inputs fail after the destination's check (a missing file, one that is not
    # sharnn's): had the check been missed, nothing would have been written to /dev/null.
    junk = tmp_path / "junk"
    junk.write_bytes(b"not compressed")
    for args in (
        ("compress", tmp_path / "missing", "-o", "/dev/null", "--online"),
        ("decompress", junk, "-o", "/dev/null"),
    ):
        for force in ([], ["--force"]):
            assert_user_error(
                cli(*args, "--quiet", *force), "/dev/null is a character device, not a file; give - to write"
            )
            assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    with pytest.raises(ConfigError, match="character device"):
        files.write_output("/dev/null", b"x")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


# ----------------------------------------------------------------------------- export into its own run


def test_export_refuses_a_destination_inside_the_run_it_reads(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    links = {name: os.readlink(run_dir / name) for name in ("latest", "best")}
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    step = (run_dir / "best").resolve()
    cases = [
        (run_dir, run_dir / "latest", "is inside"),
        (run_dir, run_dir / "best", "is inside"),
        (run_dir, run_dir / "checkpoints" / "new", "is inside"),
        (run_dir, run_dir / "export", "is inside"),
        (run_dir, run_dir, "is"),
        (step, run_dir / "elsewhere", "is inside"),
        (step, step / "model", "is inside"),
        (run_dir / "best", run_dir / "latest", "is inside"),
    ]
    for source, out, what in cases:
        assert_user_error(
            cli("export", source, "--out", out, "--force"), f"{out} {what} ", "which export reads: give --out a folder"
        )
    assert {name: os.readlink(run_dir / name) for name in links} == links
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    assert_ok(cli("export", run_dir, "--out", tmp_path / "run-export"))  # beside the run, a prefix of its name
    assert (tmp_path / "run-export" / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- analysis destinations


def test_analyze_checks_its_destination_before_the_analysis(shared, tmp_path, monkeypatch):
    from sharnn.analysis_report import check_destination, report_files

    afile = tmp_path / "afile"
    afile.write_text("mine")
    in_the_way = tmp_path / "taken"
    (in_the_way / "tokenization-test.json").mkdir(parents=True)
    analyzed = []
    monkeypatch.setattr("sharnn.analysis.analyze", lambda *a, **k: analyzed.append(a))
    for out, fragment in (
        (afile, f"{afile} is not a folder: give --out a folder"),
        (afile / "sub", f"{afile / 'sub'} cannot be made: {afile} is not a folder"),
        (in_the_way, "tokenization-test.json is in the way of the report"),
    ):
        result = cli("analyze", "tokenization", shared, "--max-tokens", 3000, "--out", out)
        assert_user_error(result, fragment)
        assert result.stdout == ""
        with pytest.raises(ConfigError, match=r"not a folder|in the way"):
            sharnn.analyze_tokenization(shared, max_tokens=3000, out=out, quiet=True)
    assert analyzed == [] and afile.read_text() == "mine"
    assert check_destination(tmp_path / "new" / "deeper", "valid", "bpe") == report_files(
        tmp_path / "new" / "deeper", "valid", "bpe"
    )
    assert [p.name for p in report_files(tmp_path, "test", "words")] == ["tokenization-test.json"]
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- online sizes


def test_an_online_model_too_large_for_torch_to_count_is_one_line(text, tmp_path):
    assert_user_error(
        cli(
            "compress",
            text,
            "-o",
            tmp_path / "out.shz",
            "--online",
            "model.d_model=3000000000",
            "model.boom_dim=3000000000",
            "--quiet",
        ),
        "online mode's model would have ",
        "parameters; at most 100,000,000 are allowed",
    )
    assert not (tmp_path / "out.shz").exists()


def test_a_header_whose_online_model_overflows_is_corrupt(text, tmp_path):
    packed = tmp_path / "text.shz"
    assert_ok(cli("compress", text, "-o", packed, "--online", *TINY_ONLINE, "--quiet"))
    header, payload = container.read_header(packed.read_bytes())
    fields = dataclasses.asdict(header)
    del fields["stream_crc32"]  # a key of versions 1 to 5
    fields["online"]["model"] |= {"d_model": 3_000_000_000, "boom_dim": 3_000_000_000}
    hostile = tmp_path / "hostile.shz"
    hostile.write_bytes(container.frame(json.dumps(fields).encode(), container.FORMAT_VERSION) + payload)
    assert_user_error(
        cli("decompress", hostile, "-o", tmp_path / "out", "--quiet"),
        "hostile.shz is corrupt: its header's online settings are invalid: online mode's model would have",
    )
    assert not (tmp_path / "out").exists()


def test_large_online_models_are_refused_without_building_them(monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(online_mode, "SHARNN", built)
    for settings in (
        ["model.d_model=50000", "model.boom_dim=50000"],
        ["model.n_layers=100000000", "model.d_model=1", "model.boom_dim=1"],  # minutes to build, even on meta
        ["model.d_model=3000000000", "model.boom_dim=3000000000"],
    ):
        config = online_config(settings)
        with pytest.raises(ConfigError, match="parameters; at most 100,000,000 are allowed"):
            online_model(config)
        with pytest.raises(ConfigError, match="at most 100,000,000"):
            check_online_size(config)


def test_the_parameter_count_is_the_models():
    from sharnn.coding.online import count_parameters

    grid = itertools.product(
        ("lstm", "ln_lstm"), ("overparam", "vector"), ("boom", "mlp"), (False, True), ("none", "single", "all", [0, 2])
    )
    for cell, gate, feed_forward, collapsed, attention in grid:
        config = SHARNNConfig(
            vocab_size=300,
            d_model=12,
            n_layers=3,
            boom_dim=36,
            attention=attention,
            cell=cell,
            value_gate=gate,
            feed_forward=feed_forward,
            collapsed=collapsed,
        )
        with torch.device("meta"):
            model = SHARNN(config)
        assert count_parameters(config) == model.num_parameters(), config
    default = online_config()
    assert count_parameters(default.model) == online_model(default).num_parameters()
