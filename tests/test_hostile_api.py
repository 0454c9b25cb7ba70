"""Hostile arguments (issue 40): the API's, the coder's bounds, generation's and eval's.

- the API takes a bool for a flag (``force='no'`` replaced a file), an integer for a count
  (``streams=2.5``, ``threads=2.5``), bytes for the codec (``codec.decompress(None, ...)``);
- ``--streams`` has an upper bound, and a portable file's recorded thread count is a hint,
  at most the CPUs: each bound says why;
- ``generate`` with a temperature or top-p below float32's smallest number, or a prompt
  that is not valid UTF-8; ``eval --file`` of a ``.gz`` that inflates without end;
- ``train`` of a model too large for this machine's memory, refused before it is built.

Every refusal is one line, and nothing a user had is lost.
"""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sharnn
import sharnn.data.corpus as corpus
from helpers import SUBPROCESS_ENV, assert_ok, assert_user_error, cli, shared_run, single_thread, write_small_corpus
from sharnn.coding import codec
from sharnn.coding.container import pack, parse
from sharnn.coding.environment import MAX_STREAMS, available_cpus
from sharnn.errors import ConfigError
from sharnn.generation import filter_logits
from sharnn.loading import load_model

TEXT = b"The coder's bounds say why. " * 6


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def model(run_dir):
    return load_model(run_dir)[0]


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_bytes(TEXT)
    return path


# ----------------------------------------------------------------------------- the API's types


@pytest.mark.parametrize(
    "flags",
    [{"force": "no"}, {"force": 0}, {"quiet": "yes"}, {"adapt": "no"}, {"adapt": 1}, {"online": "no"}],
    ids=str,
)
def test_compress_file_takes_a_bool_for_a_flag_and_keeps_the_file(run_dir, text, tmp_path, flags):
    dest = tmp_path / "kept.shz"
    dest.write_bytes(b"a user's file")
    ((name, value),) = flags.items()
    with pytest.raises(ConfigError) as error:
        sharnn.compress_file(text, dest, run_dir, **flags)
    expected = "True, False or None" if name == "adapt" else "True or False"
    assert str(error.value) == f"{name} must be {expected}, got {value!r}"
    assert dest.read_bytes() == b"a user's file"


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"streams": 2.5}, "streams must be an integer >= 1 or None, got 2.5"),
        ({"streams": True}, "streams must be an integer >= 1 or None, got True"),
        ({"streams": 0}, "streams must be an integer >= 1 or None, got 0"),
        ({"threads": 2.5}, "threads must be an integer >= 1, got 2.5"),
        ({"threads": None}, "threads must be an integer >= 1, got None"),
        ({"settings": "lr=0.1"}, "overrides must be a list of key=value strings"),
    ],
    ids=str,
)
def test_compress_file_refuses_counts_that_are_not_integers(run_dir, text, tmp_path, arguments, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        sharnn.compress_file(text, tmp_path / "out.shz", run_dir, **arguments)
    assert not (tmp_path / "out.shz").exists()


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"threads": 2.5}, "threads must be an integer >= 1 or None, got 2.5"),
        ({"threads": False}, "threads must be an integer >= 1 or None, got False"),
        ({"force": "no"}, "force must be True or False, got 'no'"),
        ({"quiet": None}, "quiet must be True or False, got None"),
        ({"model": 3}, "model must be a path (str or Path) or None, got 3"),
    ],
    ids=str,
)
def test_decompress_file_refuses_arguments_of_the_wrong_type(run_dir, text, tmp_path, arguments, message):
    with single_thread():
        sharnn.compress_file(text, tmp_path / "in.shz", run_dir, quiet=True)
    dest = tmp_path / "kept.txt"
    dest.write_bytes(b"a user's file")
    with pytest.raises(ConfigError) as error:
        sharnn.decompress_file(tmp_path / "in.shz", dest, **({"model": run_dir} | arguments))
    assert str(error.value) == message
    assert dest.read_bytes() == b"a user's file"


def test_a_flag_given_as_a_bool_still_works(run_dir, text, tmp_path):
    dest = tmp_path / "out.shz"
    dest.write_bytes(b"old")
    with single_thread():
        done = sharnn.compress_file(text, dest, run_dir, force=True, quiet=True, adapt=False)
        sharnn.decompress_file(dest, tmp_path / "back.txt", run_dir, quiet=True, force=False)
    assert done.header.mixing is None and (tmp_path / "back.txt").read_bytes() == TEXT


def test_the_codec_takes_bytes(model):
    with pytest.raises(ConfigError, match=r"^blob must be bytes, got NoneType$"):
        codec.decompress(None, model)
    with pytest.raises(ConfigError, match=r"^data must be bytes, got str$"):
        codec.compress("text", model)
    with single_thread():
        blob = codec.compress(bytearray(TEXT), model, streams=2)
    assert codec.decompress(memoryview(blob), model) == TEXT


# ----------------------------------------------------------------------------- streams and threads


def test_streams_past_the_bound_are_refused_saying_why(run_dir, text, tmp_path):
    line = assert_user_error(
        cli("compress", text, "-o", tmp_path / "out.shz", "--model", run_dir, "--streams", "100000"),
        f"streams must be an integer from 1 to {MAX_STREAMS:,}",
        "the coder's memory grows with every stream",
    )
    assert "got 100000" in line and not (tmp_path / "out.shz").exists()
    with pytest.raises(ConfigError, match="the coder's memory grows"):
        sharnn.compress_file(text, tmp_path / "out.shz", run_dir, streams=MAX_STREAMS + 1)


def test_the_bound_itself_is_taken(model):
    with single_thread():
        blob = codec.compress(TEXT, model, streams=MAX_STREAMS)  # as many streams as bytes: 168
    assert codec.decompress(blob, model) == TEXT


@pytest.mark.parametrize("threads", [0, 1025, 2.5, True], ids=str)
def test_the_codec_s_thread_count_is_bounded_saying_why(model, threads):
    with pytest.raises(ConfigError, match=r"threads must be an integer from 1 to 1,024 \(the most a file records"):
        codec.compress(TEXT, model, threads=threads)


def test_coding_that_runs_out_of_memory_is_one_line(run_dir, text, tmp_path, monkeypatch):
    def encode(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(codec, "encode", encode)
    line = assert_user_error(
        cli("compress", text, "-o", tmp_path / "out.shz", "--model", run_dir, "--streams", "8"),
        f"coding {len(TEXT):,} bytes in 8 streams needs more memory than this process may hold",
    )
    assert "give fewer streams" in line and not (tmp_path / "out.shz").exists()


def _recording_threads(monkeypatch) -> list[int]:
    counts = []
    real = codec.coding_threads

    def coding_threads(count):
        counts.append(count)
        return real(count)

    monkeypatch.setattr(codec, "coding_threads", coding_threads)
    return counts


def _with_threads(blob: bytes, threads: int) -> bytes:
    version, header, payload = parse(blob, "input")
    header = dataclasses.replace(header, environment=header.environment | {"threads": threads})
    return pack(header, version) + payload


def test_a_portable_file_s_recorded_thread_count_is_at_most_the_cpus(model, tmp_path, monkeypatch, run_dir):
    with single_thread():
        blob = _with_threads(codec.compress(TEXT, model, streams=2), 1024)  # a header that says 1,024 threads
    (tmp_path / "many.shz").write_bytes(blob)
    counts = _recording_threads(monkeypatch)
    assert_ok(cli("decompress", tmp_path / "many.shz", "-o", tmp_path / "back.txt", "--model", run_dir, "--quiet"))
    assert (tmp_path / "back.txt").read_bytes() == TEXT
    assert counts == [min(1024, available_cpus())] and 1 <= available_cpus() <= 1024
    assert codec.decoding_threads(parse(blob, "x")[1], None) == min(1024, available_cpus())
    assert codec.decoding_threads(parse(blob, "x")[1], 3) == 3  # a count given is the user's


def test_a_file_that_is_not_portable_decodes_with_its_own_count(model):
    with single_thread():
        blob = _with_threads(codec.compress(TEXT, model, precision="fp32"), 3)
    assert codec.decoding_threads(parse(blob, "x")[1], None) == 3  # its sums depend on the count


# ----------------------------------------------------------------------------- generation


def test_a_temperature_below_float32_s_smallest_number_samples_the_likeliest_byte():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [-5.0, 0.0, -1.0, 40.0]])
    greedy_like = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 1.0]])  # ties share, as the limit
    for temperature in (1e-46, 1e-40, 1e-300, 5e-324):
        probs = filter_logits(logits, temperature)
        assert torch.isfinite(probs).all() and torch.equal(probs, greedy_like), temperature
    assert torch.equal(filter_logits(logits, 1.0), torch.softmax(logits, -1))  # untouched where finite


def test_a_top_p_below_float32_s_smallest_number_keeps_the_likeliest_byte():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 2.0]])
    for top_p in (1e-46, 1e-300):
        assert torch.equal(filter_logits(logits, 1.0, top_p=top_p), torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("option", [["--temperature", "1e-46"], ["--top-p", "1e-46"], ["--temperature", "1e-40"]])
def test_generate_with_tiny_settings_is_greedy(run_dir, option):
    greedy = cli("generate", run_dir, "--prompt", "The ", "--max-bytes", "16", "--temperature", "0")
    result = cli("generate", run_dir, "--prompt", "The ", "--max-bytes", "16", "--seed", "1", *option)
    assert_ok(result)
    assert result.stdout == greedy.stdout


def test_a_prompt_of_bytes_that_are_not_utf8_is_those_bytes(run_dir):
    generation = sharnn.generate_text(run_dir, prompt="\udcff\udcfeab", max_tokens=2, seed=1)
    assert generation.prompt == b"\xff\xfeab"
    assert_ok(cli("generate", run_dir, "--prompt", "\udcff\udcfe<page>", "--max-bytes", "4"))
    with pytest.raises(ConfigError, match="the prompt is not valid text: '\\\\ud800' at character 1"):
        sharnn.generate_text(run_dir, prompt="a\ud800", max_tokens=2)


@pytest.mark.slow  # a real process, its argument bytes as a shell gives them
def test_generate_in_a_process_takes_a_prompt_that_is_not_utf8(run_dir):
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"sharnn", b"generate", bytes(run_dir), b"--prompt", b"\xff\xfe<a>",
         b"--max-bytes", b"4", b"--seed", b"1"],
        capture_output=True,
        env=SUBPROCESS_ENV,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.startswith("\ufffd\ufffd<a>".encode())


# ----------------------------------------------------------------------------- eval of a .gz


def _bomb(path: Path, size: int, tail: bytes = b"") -> Path:
    """A .gz of ``size`` zero bytes (a few kilobytes), then ``tail`` (garbage: corrupt)."""
    path.write_bytes(gzip.compress(bytes(size), compresslevel=9) + tail)
    return path


def test_eval_of_a_gz_that_inflates_past_the_limit_stops_reading(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_GZIP_BYTES", 1 << 20)
    bomb = _bomb(tmp_path / "bomb.gz", 4 << 20, tail=b"\x1f\x8b\x08garbage")  # corrupt after 4 MiB
    line = assert_user_error(cli("eval", run_dir, "--file", bomb), "decompresses to more than 1,048,576 bytes")
    assert "give the plain file" in line
    monkeypatch.setattr(corpus, "MAX_GZIP_BYTES", 8 << 20)  # read to its end: the corrupt tail shows
    assert_user_error(cli("eval", run_dir, "--file", bomb), f"cannot read {bomb}")


def test_eval_of_a_gz_within_the_limit_scores_it(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_GZIP_BYTES", 1 << 20)
    plain, packed = tmp_path / "t.txt", tmp_path / "t.txt.gz"
    plain.write_bytes(TEXT * 20)
    packed.write_bytes(gzip.compress(TEXT * 20))
    assert (
        cli("eval", run_dir, "--file", plain).stdout.splitlines()[1:]
        == (cli("eval", run_dir, "--file", packed).stdout.splitlines()[1:])
    )
    assert len(corpus.read_bytes(_bomb(tmp_path / "exact.gz", 1 << 20))) == 1 << 20  # the limit itself


# ----------------------------------------------------------------------------- train too large


def test_train_of_a_model_too_large_for_memory_is_refused_leaving_no_run_folder(tmp_path):
    data = write_small_corpus(tmp_path / "small.txt", 20_000)
    line = assert_user_error(
        cli("train", "--preset", "tiny", "--out", tmp_path / "run", "model.d_model=50000", "model.boom_dim=50000",
            f"data={data}"),
        "training a model of 52,514,900,256 parameters needs at least 782.5 GiB of memory, more than",
    )  # fmt: skip
    assert "GiB)" in line and not (tmp_path / "run").exists()
