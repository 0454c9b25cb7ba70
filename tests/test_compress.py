"""sharnn compress / decompress: byte-exact round trips, a file format that refuses
corruption, truncation and the wrong model, and a code length equal to the model's."""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_ok, assert_user_error, cli, shared_run
from safetensors.torch import load_file, save_file

import sharnn.compress as compression
from sharnn.checkpoint import load_model
from sharnn.compress import (
    START_BYTE, compress, decompress, model_sha256, online_config, online_model, read_header, stream_lengths,
)
from sharnn.errors import CheckpointError, ConfigError, DataError

TEXT = ("Ünïcödé ✓ — 日本語のテキスト, emoji 🙂, and plain ASCII.\n" * 12).encode("utf-8")
TINY_ONLINE = ["model.d_model=32", "model.boom_dim=64", "model.attention_span=48", "bptt=16"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def model(run_dir):
    return load_model(run_dir)[0]


@pytest.fixture
def other_model_dir(tmp_path, run_dir) -> Path:
    """A copy of the run's checkpoint with one weight changed by 1e-3: same config, other model."""
    target = tmp_path / "other"
    shutil.copytree((run_dir / "best").resolve(), target)
    weights = load_file(target / "model.safetensors")
    weights["output_bias"] = weights["output_bias"] + 1e-3
    save_file(weights, target / "model.safetensors")
    return target


def test_stream_lengths_cut_the_file_into_contiguous_nearly_equal_streams():
    assert stream_lengths(10, 3) == [4, 3, 3]
    assert stream_lengths(9, 3) == [3, 3, 3]
    assert stream_lengths(2, 8) == [1, 1]  # never an empty stream
    assert stream_lengths(0, 8) == []


@pytest.mark.parametrize(
    "data, streams",
    [
        (b"", 1),
        (b"", 8),
        (b"x", 1),
        (b"x", 8),
        (TEXT, 1),
        (TEXT, 7),  # len(TEXT) is not a multiple of 7
        (bytes(range(256)) * 3 + b"\x00\xff", 5),
    ],
    ids=["empty-1", "empty-8", "one-byte-1", "one-byte-8", "utf8-1", "utf8-7", "binary-5"],
)
def test_round_trip_is_byte_exact(model, data, streams):
    assert len(TEXT) % 7 != 0
    blob = compress(data, model, streams=streams)
    assert decompress(blob, model) == data
    header, _ = read_header(blob)
    assert header.length == len(data)
    assert header.streams == min(streams, len(data))


def test_64_kb_of_random_bytes_round_trip(model):
    data = np.random.default_rng(0).integers(0, 256, 65_536, dtype=np.uint8).tobytes()
    blob = compress(data, model, streams=64)
    assert decompress(blob, model) == data
    # random bytes cannot be compressed: about 8 bits per byte (the model's excess is small)
    assert 8.0 <= 8 * len(blob) / len(data) < 8.5


def test_online_mode_round_trip_without_a_model_file():
    config = online_config(TINY_ONLINE)
    data = TEXT * 3
    blob = compress(data, online_model(config), streams=2, online=config)
    header, payload = read_header(blob)
    assert header.mode == "online" and header.online["bptt"] == 16
    assert decompress(blob) == data  # the model is rebuilt from the header and trained identically
    # it learns: the repeated text costs far fewer bits than 8 per byte
    assert 8 * len(payload) / len(data) < 5


def test_header_records_streams_crcs_and_the_model(model):
    data = TEXT
    blob = compress(data, model, streams=3)
    header, payload = read_header(blob)
    lengths = stream_lengths(len(data), 3)
    starts = np.cumsum([0, *lengths])
    assert header.stream_crc32 == [zlib.crc32(data[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    assert header.model_sha256 == model_sha256(model)
    assert header.mode == "model" and header.tokenizer == "bytes" and header.payload_bytes == len(payload)
    assert header.environment["device"] == "cpu" and header.environment["threads"] == torch.get_num_threads()


def _ideal_bits(model, data: bytes, streams: int) -> float:
    """Sum of -log2 p(byte) over every byte, the streams laid out as compress() lays them
    out, computed by a forward over whole windows (not the coder's one-position path)."""
    total = 0.0
    start = 0
    with torch.no_grad():
        for n in stream_lengths(len(data), streams):
            piece = torch.tensor([START_BYTE, *data[start : start + n]]).view(-1, 1)
            start += n
            state = None
            for a in range(0, n, 32):
                window = piece[a : min(a + 32, n) + 1]
                logits, state = model(window[:-1], state)
                total += F.cross_entropy(logits.flatten(0, 1), window[1:].flatten(), reduction="sum").item()
    return total / math.log(2)


def test_code_length_is_the_models_information_content(model):
    """The range coder spends what the model predicts: the payload is within 0.5% (plus a
    few bytes of flush) of the sum of -log2 p over the bytes."""
    data = TEXT * 2
    blob = compress(data, model, streams=2)
    _, payload = read_header(blob)
    ideal = _ideal_bits(model, data, streams=2)
    assert 8 * len(payload) == pytest.approx(ideal, rel=0.005, abs=64)


def test_a_probability_that_differs_on_the_decoder_is_a_crc_error_not_wrong_bytes(model, monkeypatch):
    blob = compress(TEXT, model, streams=2)
    probabilities = compression._probabilities

    def off_by_a_little(logits):
        probs = probabilities(logits)
        probs[:, 0] += 1e-3  # as another machine's rounding might, a little differently
        return probs

    monkeypatch.setattr(compression, "_probabilities", off_by_a_little)
    with pytest.raises(DataError, match="fail its CRC32 check"):
        decompress(blob, model)


def test_the_wrong_model_and_missing_model_are_refused(model, other_model_dir):
    blob = compress(TEXT, model)
    with pytest.raises(CheckpointError, match="not the model it was compressed with"):
        decompress(blob, load_model(other_model_dir)[0])
    with pytest.raises(CheckpointError, match="give it with --model"):
        decompress(blob)
    online = compress(TEXT[:50], online_model(online_config(TINY_ONLINE)), online=online_config(TINY_ONLINE))
    with pytest.raises(ConfigError, match="online mode"):
        decompress(online, model)


# ---------------------------------------------------------------------------- the command line


def _files_besides(folder: Path, *names: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in names)


def test_cli_round_trip_reports_sizes_and_rate(tmp_path, run_dir):
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    packed, unpacked = tmp_path / "text.shz", tmp_path / "text.out"
    result = cli("compress", source, packed, "--model", run_dir, "--streams", "3", "--quiet")
    assert_ok(result)
    line = result.stdout.strip()
    assert f"{len(TEXT):,} -> {packed.stat().st_size:,} bytes" in line
    assert f"{8 * packed.stat().st_size / len(TEXT):.4f} bits per byte" in line and "bytes/s" in line
    result = cli("decompress", packed, unpacked, "--model", run_dir, "--quiet")
    assert_ok(result)
    assert unpacked.read_bytes() == TEXT
    assert "CRC32 of 3 streams checked" in result.stdout
    assert _files_besides(tmp_path, "text.txt", "text.shz", "text.out") == []  # no temporary files left


def test_cli_standard_input_and_output(run_dir):
    from click.testing import CliRunner

    from sharnn.cli import main

    runner = CliRunner()
    packed = runner.invoke(main, ["compress", "-", "-", "--model", str(run_dir), "--quiet"], input=TEXT)
    assert packed.exit_code == 0, packed.stderr
    assert "bits per byte" in packed.stderr  # the closing line keeps out of the data
    unpacked = runner.invoke(main, ["decompress", "-", "-", "--model", str(run_dir), "--quiet"], input=packed.stdout_bytes)
    assert unpacked.exit_code == 0, unpacked.stderr
    assert unpacked.stdout_bytes == TEXT


def test_cli_online_mode(tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    assert_ok(cli("compress", source, tmp_path / "p", "--online", "--streams", "2", "--quiet", *TINY_ONLINE))
    assert_ok(cli("decompress", tmp_path / "p", tmp_path / "out", "--quiet"))
    assert (tmp_path / "out").read_bytes() == TEXT


@pytest.fixture
def packed(tmp_path, run_dir) -> Path:
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    assert_ok(cli("compress", source, tmp_path / "text.shz", "--model", run_dir, "--streams", "2", "--quiet"))
    return tmp_path / "text.shz"


def _refused(tmp_path: Path, packed: Path, model, *fragments: str) -> None:
    """decompress fails with one line, and leaves no output file and no temporary file."""
    out = tmp_path / "restored"
    assert_user_error(cli("decompress", packed, out, "--model", model, "--quiet"), *fragments)
    assert not out.exists()
    assert _files_besides(tmp_path, "text.txt", "text.shz", "other") == []


@pytest.mark.parametrize("where", ["payload", "header"])
def test_cli_a_flipped_byte_is_refused(tmp_path, packed, run_dir, where):
    blob = bytearray(packed.read_bytes())
    position = len(blob) - 3 if where == "payload" else 20
    blob[position] ^= 0x01
    packed.write_bytes(bytes(blob))
    _refused(tmp_path, packed, run_dir, "corrupt", f"its {where} fails its CRC32 check")


@pytest.mark.parametrize("keep", [0, 5, 40, -4])
def test_cli_a_truncated_file_is_refused(tmp_path, packed, run_dir, keep):
    blob = packed.read_bytes()
    packed.write_bytes(blob[:keep] if keep >= 0 else blob[:keep])
    _refused(tmp_path, packed, run_dir, "text.shz")


def test_cli_another_model_is_refused(tmp_path, packed, other_model_dir):
    _refused(tmp_path, packed, other_model_dir, "not the model it was compressed with")


def test_cli_refuses_to_overwrite_and_bad_arguments(tmp_path, run_dir, packed):
    source = tmp_path / "text.txt"
    before = packed.read_bytes()
    assert_user_error(cli("compress", source, packed, "--model", run_dir), "exists; give --force")
    assert packed.read_bytes() == before
    assert_user_error(cli("compress", source, source, "--model", run_dir, "--force"), "is the input file")
    assert_user_error(cli("compress", source, tmp_path / "x"), "give --model")
    assert_user_error(cli("compress", source, tmp_path / "x", "--model", run_dir, "lr=1"), "for --online only")
    assert_user_error(cli("compress", tmp_path / "missing", tmp_path / "x", "--model", run_dir), "cannot read")
    assert_user_error(cli("compress", source, tmp_path / "no" / "x", "--model", run_dir), "no folder")
    assert_user_error(cli("decompress", source, tmp_path / "x"), "not a sharnn compressed file")
    assert_user_error(cli("decompress", packed, tmp_path / "x"), "give it with --model")
    assert_ok(cli("compress", source, packed, "--model", run_dir, "--force", "--quiet", "--streams", "1"))
    assert read_header(packed.read_bytes())[0].streams == 1


def _as_if_coded_on_cuda(blob: bytes) -> bytes:
    header, payload = read_header(blob)
    header.environment |= {"device": "cuda", "gpu": "NVIDIA H200"}
    return compression._pack(header) + payload


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_file_coded_on_cuda_is_refused_without_cuda(tmp_path, run_dir, model):
    blob = _as_if_coded_on_cuda(compress(TEXT, model))
    with pytest.raises(ConfigError, match="compressed on CUDA"):
        decompress(_as_if_coded_on_cuda(compress(TEXT, online_model(online_config(TINY_ONLINE)),
                                                 online=online_config(TINY_ONLINE))))
    (tmp_path / "cuda.shz").write_bytes(blob)
    assert_user_error(cli("decompress", tmp_path / "cuda.shz", tmp_path / "out", "--model", run_dir),
                      "compressed on CUDA (NVIDIA H200)")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_round_trip_on_cuda(run_dir):
    cuda_model = load_model(run_dir, device="cuda")[0]
    blob = compress(TEXT, cuda_model, streams=3)
    assert read_header(blob)[0].environment["device"] == "cuda"
    assert decompress(blob, cuda_model) == TEXT
