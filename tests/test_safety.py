"""One run, one writer; nothing deleted that sharnn did not make (sharnn.files).

- A run folder is locked by the process that trains in it: a second ``--resume`` (or one
  under torchrun) is refused in one line naming the holder, and a holder killed with
  ``kill -9`` blocks nothing. Two commands writing one output (compress, decompress,
  export, prepare) are refused alike, and no lock file is left in the user's folder.
- Staging files and folders have unique names made by the process: a user's file or
  folder named like an old fixed staging name (``.OUT.tmp``, ``.latest.tmp``,
  ``.step-N.tmp``) survives. SIGTERM and Ctrl-C during a prepare leave no staging folder
  and no output (exit 143 and 130, one line).
- A destination that is a symbolic link, even a dangling or looping one, is refused in
  one line, and replaced (the link, never its target) only with ``--force``.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import (
    SMALL,
    SUBPROCESS_ENV,
    assert_ok,
    assert_user_error,
    checkpoint_step,
    cli,
    shared_run,
    sharnn_process,
    signal_when,
    wait_for,
    write_small_corpus,
)
from sharnn.files import Lock, output_lock
from sharnn.training.run_folder import LOCK_FILE

TEXT = b"One run, one writer. " * 10  # 210 bytes: an --online compression of it takes about a second


def run_records(run_dir: Path) -> int:
    """The number of starts and resumes metrics.jsonl records."""
    return (run_dir / "metrics.jsonl").read_text().count('"split": "run"')


@pytest.fixture
def run_dir(tmp_path, tmp_path_factory) -> Path:
    """A copy of the shared finished SMALL run (12 steps), to change."""
    run = tmp_path / "run"
    shutil.copytree(shared_run(tmp_path_factory), run, symlinks=True)
    return run


# One writer of a run folder


@pytest.mark.slow
def test_a_second_resume_of_a_running_run_is_refused_and_kill_9_leaves_no_stale_lock(tmp_path):
    """A run trains in a real process. While it runs (stopped with SIGSTOP, so that the
    files can be compared) a second ``sharnn train --resume`` is refused in one line
    naming it, and changes nothing; after ``kill -9`` of the first, a resume trains on."""
    corpus, run = write_small_corpus(tmp_path / "small.txt"), tmp_path / "run"
    first = sharnn_process(
        "train", "--preset", "tiny", "--out", run, "--quiet", *SMALL, "max_steps=100000", f"data={corpus}"
    )
    try:
        assert wait_for(lambda: (run / "latest").exists(), first), first.communicate()
        os.kill(first.pid, signal.SIGSTOP)
        before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
        latest = os.readlink(run / "latest")
        second = sharnn_process("train", "--resume", run, "max_steps=100")
        stdout, stderr = second.communicate(timeout=300)
        assert second.returncode == 1 and stdout == ""
        assert stderr.splitlines() == [
            f"error: {run} is in use by process {first.pid} (sharnn train --preset tiny --out {run} --quiet "
            f"{' '.join(SMALL)} max_steps=100000 data={corpus}); wait for it or stop it"
        ]
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
        assert os.readlink(run / "latest") == latest and run_records(run) == 1
    finally:
        first.kill()  # kill -9: the kernel drops its lock
        first.communicate()
    assert (run / LOCK_FILE).read_text().startswith(f"{first.pid} ")  # what it wrote stays; the lock does not
    steps = checkpoint_step(run / "latest") + 4
    result = cli("train", "--resume", run, "--quiet", f"max_steps={steps}")
    assert_ok(result)
    assert checkpoint_step(run / "latest") == steps and run_records(run) == 2


@pytest.mark.slow
def test_a_resume_under_torchrun_is_refused_by_every_process_in_one_line(run_dir):
    """The main process alone takes the lock; the other stops with it, printing nothing
    (torchrun then adds its own failure report)."""
    with Lock(run_dir / LOCK_FILE, "the test"):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "sharnn",
            "train",
            "--resume",
            str(run_dir),
            "max_steps=16",
        ]
        result = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {run_dir} is in use by process {os.getpid()} ("), errors
    assert errors[0].endswith("); wait for it or stop it")
    frames = [line for line in result.stderr.splitlines() if line.strip().startswith('File "')]
    assert all("torch/distributed" in line or "runpy" in line for line in frames), frames  # torchrun's report, not ours
    assert "[rank1]" not in result.stderr and run_records(run_dir) == 1


@pytest.mark.slow
def test_a_run_folder_being_created_is_locked_from_its_start(tmp_path):
    """A new run takes its folder's lock as it makes it, before writing anything in it."""
    corpus, run = write_small_corpus(tmp_path / "small.txt"), tmp_path / "run"
    first = sharnn_process(
        "train", "--preset", "tiny", "--out", run, "--quiet", *SMALL, "max_steps=100000", f"data={corpus}"
    )
    try:
        assert wait_for(lambda: (run / "config.yaml").exists(), first), first.communicate()
        assert_user_error(cli("train", "--resume", run), f"{run} is in use by process {first.pid} (sharnn train")
    finally:
        first.kill()
        first.communicate()


# One writer of an output, and no lock file in the user's folder


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_an_output_being_written_is_refused_to_a_second_command(tmp_path, command):
    source = tmp_path / "in.bin"
    source.write_bytes(TEXT)
    if command == "decompress":
        assert_ok(cli("compress", source, "-o", tmp_path / "packed", "--online", "--quiet"))
        source = tmp_path / "packed"
    dest = tmp_path / "out"
    with output_lock(dest):  # as another command writing it would
        assert_user_error(
            cli(command, source, "-o", dest, "--quiet", *(["--online"] if command == "compress" else [])),
            f"{dest} is in use by process {os.getpid()} (",
            "; wait for it or stop it",
        )
    assert not dest.exists()
    assert_ok(cli(command, source, "-o", dest, "--quiet", *(["--online"] if command == "compress" else [])))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"in.bin", "packed", "out"} if command == "decompress" else {"in.bin", "out"}
    )  # no lock file, no staging


def test_an_export_being_written_is_refused_to_a_second_command(tmp_path, run_dir):
    out = tmp_path / "exports" / "model"
    with output_lock(out):
        assert_user_error(cli("export", run_dir, "--out", out), f"{out} is in use by process {os.getpid()}")
    assert not out.exists()
    assert_ok(cli("export", run_dir, "--out", out))
    assert [p.name for p in out.parent.iterdir()] == ["model"]  # no lock file, no staging


class _SlowEnwik8(http.server.BaseHTTPRequestHandler):
    """Serves the start of a 100 MB 'enwik8' on localhost, then waits (at most a minute)
    until the test lets it go: a prepare that stays in its download."""

    release = threading.Event()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000000")
        self.end_headers()
        self.wfile.write(b"<mediawiki>" * 10_000)
        self.wfile.flush()
        self.release.wait(timeout=60)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowEnwik8)
    _SlowEnwik8.release.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/enwik8.zip"
    _SlowEnwik8.release.set()
    server.shutdown()
    server.server_close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "status", "line"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_prepare_refuses_a_second_writer_and_a_signal_leaves_no_staging(tmp_path, slow_url, sig, status, line):
    """A real ``sharnn prepare enwik8`` downloads into its staging folder: a second prepare
    of the same --out is refused in one line; SIGTERM (or Ctrl-C) then stops the first
    with one line, its staging folder removed and no --out made."""
    out = tmp_path / "enwik8"
    first = sharnn_process("prepare", "enwik8", "--source", slow_url, "--out", out)
    staging = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".enwik8.")]  # noqa: E731
    try:
        assert wait_for(lambda: any((p / "enwik8.zip").exists() for p in staging()), first), first.communicate()
        assert_user_error(
            cli("prepare", "enwik8", "--source", slow_url, "--out", out),
            f"{out} is in use by process {first.pid} (sharnn prepare enwik8 --source {slow_url} --out {out})",
        )
    finally:
        _, stderr = signal_when(first, lambda: True, sig)
    assert first.returncode == status, stderr
    assert stderr.splitlines()[-1] == line and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # no staging folder, no output, no lock file


# Unique staging names: a user's files of the old fixed names survive


def test_files_named_like_old_staging_names_survive_a_resume(run_dir):
    """Checkpoints, the latest/best links, config.yaml, summary.json and bpc.png were
    written through fixed names (``.NAME.tmp``) removed first; now through names of
    their own. A resume that writes them all leaves the user's files of those names."""
    mine = [
        run_dir / "checkpoints" / ".step-00000016.tmp",
        run_dir / ".latest.tmp",
        run_dir / ".best.tmp",
        run_dir / ".config.yaml.tmp",
        run_dir / ".summary.json.tmp",
        run_dir / ".bpc.png.tmp",
    ]
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("precious")
    (run_dir / "checkpoints" / "notes.txt").write_text("mine too")
    assert_ok(cli("train", "--resume", run_dir, "--quiet", "max_steps=16"))
    assert checkpoint_step(run_dir / "latest") == 16 and (run_dir / "summary.json").is_file()
    assert all((folder / "keep.txt").read_text() == "precious" for folder in mine)
    assert (run_dir / "checkpoints" / "notes.txt").read_text() == "mine too"
    linked = {(run_dir / name).resolve().name for name in ("latest", "best")}
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {".step-00000016.tmp", "notes.txt", *linked}


def test_a_resume_removes_the_staging_folders_a_killed_save_left_and_nothing_else(run_dir):
    """``kill -9`` during a save leaves its staging folder (a unique name made by
    tempfile): the next writer of the run, which holds its lock, removes those alone."""
    left = [run_dir / "checkpoints" / ".step-00000016.k3x_9ab2.tmp", run_dir / ".latest.q8w2mm0z.tmp"]
    kept = [
        run_dir / "checkpoints" / ".step-00000016.tmp",
        run_dir / "checkpoints" / ".step-16.abcdefgh.tmp",
        run_dir / ".notes.abcdefgh.tmp",
    ]
    for folder in left + kept:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    assert_ok(cli("train", "--resume", run_dir, "--quiet", "max_steps=16"))
    assert not any(folder.exists() for folder in left)
    assert all((folder / "model.safetensors").read_bytes() == b"half" for folder in kept)


def test_resuming_a_folder_that_is_not_a_run_leaves_no_lock_file(tmp_path):
    from sharnn.config import load_config
    from sharnn.errors import RunError
    from sharnn.training.trainer import train

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(RunError):
        train(load_config("tiny", SMALL), folder, resume=True, quiet=True)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_sigterm_while_a_training_sets_up_is_one_line(tmp_path):
    """Before the training loop takes the signals over (loading torch and the corpus,
    building the model) SIGTERM ends ``sharnn train`` with one line and status 143."""
    corpus = write_small_corpus(tmp_path / "small.txt")
    for delay in (0.5, 1.5):
        process = sharnn_process(
            "train", "--preset", "tiny", "--out", tmp_path / f"run{delay}", "--quiet", *SMALL, f"data={corpus}"
        )
        threading.Timer(delay, process.send_signal, (signal.SIGTERM,)).start()
        _, stderr = process.communicate(timeout=120)
        assert (process.returncode, stderr) == (143, "terminated\n") or (  # the loop had begun: it saved
            process.returncode == 143 and stderr.startswith("interrupted by SIGTERM")
        ), (process.returncode, stderr)


def test_a_folder_named_like_the_old_export_staging_survives_an_export(tmp_path, run_dir):
    out = tmp_path / "model"
    (tmp_path / ".model.tmp").mkdir()
    (tmp_path / ".model.tmp" / "keep.txt").write_text("precious")
    assert_ok(cli("export", run_dir, "--out", out))
    assert (tmp_path / ".model.tmp" / "keep.txt").read_text() == "precious" and (out / "config.json").is_file()


def test_a_file_named_like_the_old_output_staging_survives_a_compress(tmp_path):
    source, dest = tmp_path / "in.bin", tmp_path / "out"
    source.write_bytes(TEXT)
    (tmp_path / ".out.tmp").write_text("precious")
    assert_ok(cli("compress", source, "-o", dest, "--online", "--quiet"))
    assert (tmp_path / ".out.tmp").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.tmp", "in.bin", "out"]


# A destination that is a symbolic link


def links(tmp_path: Path) -> dict[str, Path]:
    """A dangling link, a looping link, and links to a file and to a folder of the user's."""
    target_file, target_folder = tmp_path / "target.txt", tmp_path / "target"
    target_file.write_text("precious")
    target_folder.mkdir()
    (target_folder / "keep.txt").write_text("precious")
    made = {
        "dangling": tmp_path / "nowhere",
        "looping": tmp_path / "link-looping",
        "file": target_file,
        "folder": target_folder,
    }
    for name, target in made.items():
        (tmp_path / f"link-{name}").symlink_to(target)
    return {name: tmp_path / f"link-{name}" for name in made}


def assert_targets_untouched(tmp_path: Path) -> None:
    assert (tmp_path / "target.txt").read_text() == "precious"
    assert [p.name for p in (tmp_path / "target").iterdir()] == ["keep.txt"]
    assert not (tmp_path / "nowhere").exists()


def test_compress_and_decompress_replace_a_link_only_with_force(tmp_path):
    source = tmp_path / "in.bin"
    source.write_bytes(TEXT)
    made = links(tmp_path)
    for link in made.values():
        line = assert_user_error(
            cli("compress", source, "-o", link, "--online", "--quiet"),
            f"error: {link} is a symbolic link (to {os.readlink(link)}); give --force to replace the link",
        )
        assert link.is_symlink(), line
    assert_ok(cli("compress", source, "-o", made["dangling"], "--online", "--quiet", "--force"))
    assert made["dangling"].is_file() and not made["dangling"].is_symlink()
    for kind in ("looping", "file", "folder"):
        assert_user_error(cli("decompress", made["dangling"], "-o", made[kind]), f"{made[kind]} is a symbolic link")
        assert_ok(cli("decompress", made["dangling"], "-o", made[kind], "--quiet", "--force"))
        assert not made[kind].is_symlink() and made[kind].read_bytes() == TEXT
    assert_targets_untouched(tmp_path)


def test_export_replaces_a_link_only_with_force(tmp_path, run_dir):
    user = tmp_path / "user"
    user.mkdir()
    made = links(user)
    for link in made.values():
        assert_user_error(cli("export", run_dir, "--out", link), f"{link} is a symbolic link", "give --force")
        assert link.is_symlink()
    for kind in ("dangling", "looping", "folder"):
        assert_ok(cli("export", run_dir, "--out", made[kind], "--force"))
        assert not made[kind].is_symlink() and (made[kind] / "config.json").is_file()
    assert_targets_untouched(user)
    assert_user_error(cli("export", run_dir, "--out", made["folder"], "--force"), "exists: export writes a new folder")


def test_prepare_replaces_a_link_only_with_force(tmp_path):
    corpus = write_small_corpus(tmp_path / "small.txt", size=2000)
    user = tmp_path / "user"
    user.mkdir()
    made = links(user)
    for link in made.values():
        assert_user_error(cli("prepare", "corpus", corpus, "--out", link), f"{link} is a symbolic link", "give --force")
        assert link.is_symlink()
    for kind in ("dangling", "looping", "folder"):
        assert_ok(cli("prepare", "corpus", corpus, "--out", made[kind], "--force"))
        assert not made[kind].is_symlink() and (made[kind] / "meta.json").is_file()
    assert_targets_untouched(user)
    assert_user_error(cli("prepare", "corpus", corpus, "--out", made["folder"], "--force"), "already exists")
