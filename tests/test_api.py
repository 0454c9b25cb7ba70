"""The library under the command line (sharnn.api): each function does what its command
does, with its defaults and its errors, and the command prints what the function returns."""

from __future__ import annotations

import pytest

import sharnn
from helpers import assert_ok, cli, shared_run
from sharnn.errors import CheckpointError, ConfigError, DataError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished SMALL run (read only)."""
    return shared_run(tmp_path_factory)


def test_load_gives_the_model_its_config_and_tokenizer(run_dir, tmp_path):
    model, config, tokenizer = sharnn.load(run_dir)
    assert isinstance(model, sharnn.SHARNN) and not model.training
    assert config.model == model.config and config.bptt == 16
    assert tokenizer.is_bytes
    model.save_pretrained(tmp_path / "plain")
    assert sharnn.load(tmp_path / "plain").config is None  # a plain save_pretrained folder records no training
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        sharnn.load(tmp_path / "nothing")


def test_evaluate_checkpoint_is_what_eval_prints(run_dir):
    scored = sharnn.evaluate_checkpoint(run_dir, device="cpu", quiet=True)
    assert (scored.streams, scored.window) == (2, 16)  # the run's test_streams and bptt
    assert scored.data.endswith("small.txt (test)")
    model, config, _ = sharnn.load(run_dir)
    direct = sharnn.evaluate(model, sharnn.load_corpus(config.data).test, 2, 16)
    assert scored.result.nats == direct.nats and scored.result.tokens == direct.tokens
    result = cli("eval", run_dir, "--device", "cpu")
    assert_ok(result)
    assert result.stdout == scored.format() + "\n"


def test_evaluate_checkpoint_refuses_before_any_work(run_dir, tmp_path):
    with pytest.raises(ConfigError, match="--bptt: windows of 1000 tokens exceed"):
        sharnn.evaluate_checkpoint(run_dir, bptt=1000, device="cpu")
    with pytest.raises(DataError, match="unknown split"):
        sharnn.evaluate_checkpoint(run_dir, split="bogus", device="cpu")
    sharnn.load(run_dir).model.save_pretrained(tmp_path / "plain")
    with pytest.raises(CheckpointError, match="records no training data"):
        sharnn.evaluate_checkpoint(tmp_path / "plain")


def test_generate_text_streams_what_generate_prints(run_dir):
    text = sharnn.generate_text(run_dir, "Hello", max_tokens=30, seed=3, device="cpu")
    assert text.prompt == b"Hello"
    pieces = list(text.token_bytes())
    assert len(pieces) == 30 and all(isinstance(p, bytes) and len(p) == 1 for p in pieces)  # one byte per token
    again = sharnn.generate_text(run_dir, b"Hello", max_tokens=30, seed=3, device="cpu")
    shown = "".join(again.text())
    assert shown == (b"Hello" + b"".join(pieces)).decode("utf-8", errors="replace")  # the same seed, the same bytes
    looped = list(sharnn.generate_text(run_dir, "Hello", max_tokens=30, seed=3, device="cpu"))
    assert all(isinstance(piece, str) and piece for piece in looped)  # text to print, never b'...'
    assert "Hello" + "".join(looped) == shown
    result = cli("generate", run_dir, "--prompt", "Hello", "--max-bytes", 30, "--seed", 3, "--device", "cpu")
    assert_ok(result)
    assert result.stdout == shown + "\n"
    assert sharnn.generate_text(run_dir, "", max_tokens=1, device="cpu").prompt == b"\n"  # empty: after a newline


def test_generate_text_refuses_at_the_call_not_the_first_token(run_dir, tmp_path):
    with pytest.raises(ConfigError, match="temperature must be"):
        sharnn.generate_text(run_dir, temperature=-1)
    with pytest.raises(ConfigError, match="not both"):
        sharnn.generate_text(run_dir, "a", prompt_file=tmp_path / "p")
    with pytest.raises(CheckpointError):
        sharnn.generate_text(tmp_path / "nothing")


@pytest.mark.slow  # a few seconds: out of the working loop
def test_compress_file_and_decompress_file_round_trip(run_dir, tmp_path):
    source, packed, unpacked = tmp_path / "text.txt", tmp_path / "text.shz", tmp_path / "text.out"
    data = sharnn.load_corpus(sharnn.load(run_dir).config.data).test[:3000].tobytes()
    source.write_bytes(data)
    done = sharnn.compress_file(source, packed, model=run_dir, streams=3, quiet=True)
    assert done.compressed and (done.read, done.written) == (3000, packed.stat().st_size)
    assert done.header.streams == 3 and done.format(source).startswith(f"compressed {source}: 3,000 -> ")
    back = sharnn.decompress_file(packed, unpacked, model=run_dir, quiet=True)
    assert unpacked.read_bytes() == data
    assert not back.compressed and (back.read, back.written) == (done.written, 3000)
    assert "CRC32 of 3 streams checked" in back.format(packed)


def test_compress_file_refuses_and_leaves_the_destination(run_dir, tmp_path):
    source, dest = tmp_path / "text.txt", tmp_path / "taken"
    source.write_bytes(b"some text")
    dest.write_bytes(b"mine")
    with pytest.raises(ConfigError, match="exists; give --force"):
        sharnn.compress_file(source, dest, model=run_dir)
    assert dest.read_bytes() == b"mine"
    with pytest.raises(ConfigError, match="give --model or --online, not both"):
        sharnn.compress_file(source, tmp_path / "new", model=run_dir, online=True)
    with pytest.raises(ConfigError, match="are for --online only"):
        sharnn.compress_file(source, tmp_path / "new", model=run_dir, settings=["lr=1"])
    with pytest.raises(DataError, match="cannot read"):
        sharnn.compress_file(tmp_path / "missing", tmp_path / "new", model=run_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken", "text.txt"]


def test_analyze_tokenization_returns_the_report_and_writes_nothing(run_dir):
    report, folder = sharnn.analyze_tokenization(run_dir, max_tokens=200, device="cpu", quiet=True)
    assert folder == run_dir / "analysis" and not folder.exists()
    assert (report["kind"], report["tokens"], report["split"], report["bptt"]) == ("bytes", 200, "test", 16)
    with pytest.raises(ConfigError, match="is not a run folder: give --out DIR"):
        sharnn.analyze_tokenization(run_dir / "best", max_tokens=200)


def test_info_is_what_info_prints(run_dir):
    for target in (None, "tiny", run_dir):
        result = cli("info", *([target] if target else []))
        assert_ok(result)
        assert result.stdout == sharnn.info(target) + "\n"
    assert sharnn.info().startswith("presets: ")


def test_train_run_refuses_conflicting_sources(run_dir):
    with pytest.raises(ConfigError, match="not both"):
        sharnn.train_run(preset="tiny", config_file="x.yaml")
    with pytest.raises(ConfigError, match="--resume continues a run with its own config"):
        sharnn.train_run(preset="tiny", resume=run_dir)
    with pytest.raises(ConfigError, match="give --preset NAME or --config FILE"):
        sharnn.train_run()
