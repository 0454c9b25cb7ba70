"""End-to-end tests of the ``sharnn`` command line on a tiny model: the run
folder ``train`` writes, ``eval``, ``generate``, ``info``, ``prepare``, and one-line
errors for bad input.

Commands run in-process through click's CliRunner (an unexpected exception there is
what a traceback would be in a real process); a few run as real processes.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sharnn
from helpers import (
    SMALL,
    SUBPROCESS_ENV,
    assert_ok,
    assert_user_error,
    checkpoint_step,
    cli,
    ctrl_c_as_at_a_terminal,
    metrics,
    shared_run,
    shared_run_output,
    sharnn_process,
    write_small_corpus,
)
from sharnn.config import load_config, preset_names
from sharnn.data.corpus import load_corpus, read_bytes
from sharnn.data.tokenizer import ByteTokenizer
from sharnn.evaluation import evaluate
from sharnn.generation import generate
from sharnn.models.step import Step
from sharnn.progress import ProgressDisplay
from sharnn.training.checkpoint import load_model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished SMALL run (read only; copy it before changing anything)."""
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def corpus_file(run_dir) -> Path:
    return run_dir.parent / "small.txt"


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# --------------------------------------------------------------------------------------
# sharnn train: the run folder


def test_train_writes_config_yaml_equal_to_the_resolved_config(run_dir, corpus_file):
    stored = load_config(run_dir / "config.yaml")
    assert stored == load_config("tiny", SMALL + [f"data={corpus_file}"])
    assert (stored.model.d_model, stored.bptt, stored.max_steps, stored.data) == (32, 16, 12, str(corpus_file))


def test_train_writes_metrics_jsonl(run_dir):
    records = metrics(run_dir)
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [2, 4, 6, 8, 10, 12]  # log_every_steps=2, max_steps=12
    for r in train_records:
        assert {"bpc", "lr", "tokens_per_s", "grad_norm", "epoch"} <= r.keys()
        assert 0 < r["bpc"] < 9 and r["lr"] > 0 and r["tokens_per_s"] > 0
    assert train_records[0]["lr"] == pytest.approx(2e-3 * 2 / 5)  # warmup_steps=5
    valid = [r for r in records if r["split"] == "valid"]
    assert valid and valid[-1]["step"] == 12
    assert all(r["bpc"] == pytest.approx(r["nats"] / math.log(2)) for r in valid)
    assert records[-1]["split"] == "test"
    assert records[-1]["bpc"] == _summary(run_dir)["test_bpc"]


def test_train_writes_tensorboard_events_and_png(run_dir):
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"train/bpc", "train/lr", "valid/bpc", "test/bpc"} <= tags
    assert [e.step for e in accumulator.Scalars("train/bpc")] == [2, 4, 6, 8, 10, 12]
    assert (run_dir / "bpc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_writes_latest_and_best_checkpoints_and_collects_old_ones(run_dir):
    for name in ("latest", "best"):
        link = run_dir / name
        assert link.is_symlink() and link.is_dir()
        assert (link / "model.safetensors").is_file() and (link / "config.yaml").is_file()
        assert load_config(link / "config.yaml") == load_config(run_dir / "config.yaml")
    assert (run_dir / "latest" / "trainer.pt").is_file()
    assert (run_dir / "latest" / "state.safetensors").is_file()  # stopped mid-epoch: the state is kept
    trainer = torch.load(run_dir / "latest" / "trainer.pt", weights_only=True)  # no pickled objects
    progress = json.loads(trainer["progress"])
    assert progress["step"] == 12 and progress["finished"] is True
    assert checkpoint_step(run_dir / "latest") == 12
    # checkpoints were written at steps 4, 8 and 12; only the linked ones are left, and no
    # half-written staging folders
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    linked = sorted({(run_dir / n).resolve().name for n in ("latest", "best")})
    assert left == linked
    assert not list(run_dir.glob(".*.tmp")) and not list((run_dir / "checkpoints").glob(".*"))


def test_train_writes_summary_and_prints_test_bpc(run_dir):
    summary = _summary(run_dir)
    assert {"valid_bpc", "test_bpc", "steps", "best_step", "parameters", "parameters_collapsed"} <= summary.keys()
    assert summary["steps"] == 12 and 0 < summary["test_bpc"] < 9 and 0 < summary["valid_bpc"] < 9
    assert summary["valid_bpc"] == min(r["bpc"] for r in metrics(run_dir) if r["split"] == "valid")
    assert checkpoint_step(run_dir / "best") == summary["best_step"]
    stdout, stderr = shared_run_output()
    last = stdout.strip().splitlines()[-1]
    assert f"test {summary['test_bpc']:.4f} BPC" in last, last
    assert f"valid {summary['valid_bpc']:.4f} BPC" in stderr  # progress lines go to stderr
    assert "Traceback" not in stderr


def test_train_from_a_config_file_with_overrides(tmp_path, run_dir, corpus_file):
    out = tmp_path / "from-config"
    result = cli(
        "train", "--quiet", "--config", run_dir / "config.yaml", "--out", out, "max_steps=2", "log_every_steps=1"
    )
    assert_ok(result)
    assert load_config(out / "config.yaml") == load_config(
        "tiny", SMALL + [f"data={corpus_file}", "max_steps=2", "log_every_steps=1"]
    )
    assert [r["step"] for r in metrics(out) if r["split"] == "train"] == [1, 2]


# --------------------------------------------------------------------------------------
# sharnn eval


def _numbers(stdout: str) -> dict[str, float]:
    found = {}
    for key, label in (("bits", "bits per byte"), ("nats", "nats per byte"), ("perplexity", "perplexity")):
        match = re.search(rf"^{label}:\s+([0-9.]+)\s*$", stdout, re.M)
        assert match, f"no {label!r} line in:\n{stdout}"
        found[key] = float(match.group(1))
    return found


def _assert_consistent(numbers: dict[str, float]) -> None:
    # printed with 4 decimals: bits = nats / ln 2, perplexity = e^nats
    assert numbers["bits"] == pytest.approx(numbers["nats"] / math.log(2), abs=2e-4)
    assert numbers["perplexity"] == pytest.approx(math.exp(numbers["nats"]), rel=1e-4, abs=1e-4)


def test_eval_run_folder_reports_the_summary_test_bpc(run_dir):
    result = cli("eval", run_dir)
    assert_ok(result)
    numbers = _numbers(result.stdout)
    _assert_consistent(numbers)
    assert f"{numbers['bits']:.4f}" == f"{_summary(run_dir)['test_bpc']:.4f}"
    assert "(test)" in result.stdout


def test_eval_best_checkpoint_on_valid(run_dir):
    result = cli("eval", run_dir / "best", "--split", "valid")
    assert_ok(result)
    numbers = _numbers(result.stdout)
    _assert_consistent(numbers)
    assert f"{numbers['bits']:.4f}" == f"{_summary(run_dir)['valid_bpc']:.4f}"
    assert "(valid)" in result.stdout


def test_eval_any_file(tmp_path, run_dir):
    text = tmp_path / "notes.txt"
    text.write_bytes(("The quick brown fox jumps over the lazy dog. " * 40).encode())
    result = cli("eval", run_dir, "--file", text)
    assert_ok(result)
    numbers = _numbers(result.stdout)
    _assert_consistent(numbers)
    model, config = load_model(run_dir)
    expected = evaluate(model, read_bytes(text), config.test_streams, config.bptt)
    assert f"{numbers['bits']:.4f}" == f"{expected.bpc:.4f}"
    assert str(text) in result.stdout
    # streams and window are options
    result = cli("eval", run_dir, "--file", text, "--streams", "1", "--bptt", "8")
    assert_ok(result)
    assert "1 stream, windows of 8" in result.stdout
    _assert_consistent(_numbers(result.stdout))


def test_eval_with_another_attention_span_scores_what_the_model_computes_at_it(tmp_path, run_dir):
    """``--attention-span`` (paper §3.1: a memory longer than the trained one) gives what
    the model set to that span computes; a span shorter than the window is refused in one
    line, as is a span below 1."""
    text = tmp_path / "notes.txt"
    text.write_bytes(bytes(read_bytes(run_dir.parent / "small.txt")[:3000]))
    result = cli("eval", run_dir, "--file", text, "--attention-span", "160")
    assert_ok(result)
    assert "2 streams, windows of 16, attention span 160" in result.stdout
    model, config = load_model(run_dir)
    trained = evaluate(model, read_bytes(text), config.test_streams, config.bptt)
    longer = evaluate(model.set_attention_span(160), read_bytes(text), config.test_streams, config.bptt)
    assert f"bits per byte: {longer.bpc:.4f}" in result.stdout and longer.nats != trained.nats
    python = sharnn.evaluate_checkpoint(run_dir, file=text, attention_span=160, quiet=True)
    assert python.result.nats == longer.nats and python.attention_span == 160
    assert_user_error(
        cli("eval", run_dir, "--file", text, "--attention-span", "8"),
        "windows of 16 tokens exceed model.attention_span (8)",
    )
    assert cli("eval", run_dir, "--attention-span", "0").exit_code == 2


def test_eval_of_a_blown_up_checkpoint_prints_inf_perplexity(checkpoint_copy):
    """An output bias of 1000 on one byte: ~1000 nats on every other byte, beyond what
    e^x holds in a float; the perplexity prints as inf instead of crashing."""
    file = checkpoint_copy / "model.safetensors"
    tensors = load_file(file)
    tensors["output_bias"][0] = 1000.0
    save_file(tensors, file)
    result = cli("eval", checkpoint_copy)
    assert_ok(result)
    assert re.search(r"^perplexity:\s+inf$", result.stdout, re.M), result.stdout
    assert float(re.search(r"^bits per byte:\s+(\S+)$", result.stdout, re.M).group(1)) > 1000


def test_evaluation_progress_without_a_terminal_is_plain_lines_to_100_percent(run_dir, capsys):
    model, _ = load_model(run_dir)
    evaluate(
        model, read_bytes(run_dir.parent / "small.txt")[:4000], 2, 16, progress=ProgressDisplay("eval", every_seconds=0)
    )
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 125 and all(line.startswith("eval ") for line in lines)  # 1999 predicted rows / 16
    assert lines[-1].startswith("eval 100% |")
    assert all(
        re.fullmatch(r"eval +\d+% \| tok_s [\d,]+ \| elapsed \d\d:\d\d, left \d\d:\d\d", line) for line in lines
    ), lines[:3]


# --------------------------------------------------------------------------------------
# sharnn generate


def _generate(run_dir: Path, *args: str) -> str:
    result = cli("generate", run_dir, *args)
    assert_ok(result)
    return result.stdout


def test_generate_prints_prompt_then_sampled_text_reproducibly(run_dir):
    first = _generate(run_dir, "--prompt", "<page>", "--max-bytes", "50", "--seed", "1")
    assert first.startswith("<page>") and len(first) > len("<page>") + 10
    assert first.endswith("\n")
    assert _generate(run_dir, "--prompt", "<page>", "--max-bytes", "50", "--seed", "1") == first
    assert _generate(run_dir, "--prompt", "<page>", "--max-bytes", "50", "--seed", "2") != first
    assert _generate(run_dir, "--prompt", "<page>", "--max-bytes", "0") == "<page>\n"


def test_generate_greedy_is_deterministic_and_top_k_1_is_greedy(run_dir):
    greedy = _generate(run_dir, "--prompt", "<page>", "--max-bytes", "40", "--temperature", "0")
    assert _generate(run_dir, "--prompt", "<page>", "--max-bytes", "40", "--temperature", "0", "--seed", "7") == greedy
    for seed in ("1", "2"):
        assert _generate(run_dir, "--prompt", "<page>", "--max-bytes", "40", "--top-k", "1", "--seed", seed) == greedy
    # and greedy is the argmax of the model, byte after byte
    model, _ = load_model(run_dir)
    tokens = [int(t[0]) for t in generate(model, ByteTokenizer().encode("<page>").view(-1, 1), 40, temperature=0)]
    assert greedy == ByteTokenizer().decode(ByteTokenizer().encode("<page>").tolist() + tokens) + "\n"


def test_generate_prompt_file_equals_prompt(tmp_path, run_dir):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes("<page>\n  <title>Zürich</title>".encode())
    from_file = _generate(run_dir, "--prompt-file", prompt, "--max-bytes", "30", "--seed", "3")
    from_text = _generate(run_dir, "--prompt", "<page>\n  <title>Zürich</title>", "--max-bytes", "30", "--seed", "3")
    assert from_file == from_text and from_file.startswith("<page>\n  <title>Zürich</title>")
    assert_user_error(cli("generate", run_dir, "--prompt", "x", "--prompt-file", prompt))


def test_generate_shows_invalid_utf8_as_replacement_characters(tmp_path, run_dir):
    prompt = tmp_path / "bad.bin"
    prompt.write_bytes(b"\xff\xfe")
    out = _generate(run_dir, "--prompt-file", prompt, "--max-bytes", "50", "--seed", "1")
    assert out.startswith("\ufffd\ufffd")
    # a hot, near-uniform sample is full of invalid sequences; it must never crash
    out = _generate(run_dir, "--prompt", "\u00e9", "--max-bytes", "300", "--temperature", "3", "--seed", "5")
    assert out.startswith("\u00e9") and "\ufffd" in out


def test_generate_carries_state_instead_of_re_encoding_the_prompt(run_dir, monkeypatch):
    """The incremental path (prompt fed once in windows, then one byte at a time with the
    carried state, through the inference step) gives the same next-byte logits as one
    eval forward over prompt + sampled bytes; and every byte is fed exactly once (but the
    last sample, which nothing follows)."""
    model, _ = load_model(run_dir)
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode("<page>\n  <title>Anarchism</title>")
    assert len(prompt) == 33
    calls = []
    original_forward = model.forward

    def spy(tokens, state=None):
        logits, new_state = original_forward(tokens, state)
        calls.append((tokens.clone(), logits.clone()))
        return logits, new_state

    def step_spy(step, tokens):
        logits = original_step(step, tokens)
        calls.append((tokens.view(1, -1).clone(), logits.unsqueeze(0).clone()))
        return logits

    original_step = Step.__call__
    monkeypatch.setattr(Step, "__call__", step_spy)
    model.forward = spy
    sampled = [int(t[0]) for t in generate(model, prompt.view(-1, 1), 12, temperature=1.0, seed=11, window=10)]
    model.forward = original_forward

    fed = torch.cat([tokens.view(-1) for tokens, _ in calls])
    assert fed.tolist() == prompt.tolist() + sampled[:-1]  # each byte fed once, in order
    assert [t.shape[0] for t, _ in calls[:4]] == [10, 10, 10, 3]  # the prompt, in windows
    assert all(t.shape[0] == 1 for t, _ in calls[4:])  # then one byte at a time

    sequence = torch.tensor(prompt.tolist() + sampled[:-1]).view(-1, 1)
    assert sequence.shape[0] <= model.config.attention_span
    with torch.no_grad():
        full, _ = model.eval()(sequence)
    incremental = torch.cat([logits for _, logits in calls])[: sequence.shape[0]]
    torch.testing.assert_close(incremental, full, rtol=1e-4, atol=1e-4)
    next_probs = torch.softmax(full[len(prompt) - 1 :, 0], -1)
    torch.testing.assert_close(torch.softmax(incremental[len(prompt) - 1 :, 0], -1), next_probs, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------
# sharnn info


def test_info_paper_preset_parameter_counts():
    result = cli("info", "enwik8-paper")
    assert_ok(result)
    for text in ("53,825,792", "51,726,592", "53.83M", "51.73M"):
        assert text in result.stdout


def test_info_lists_presets():
    result = cli("info")
    assert_ok(result)
    for name in ("enwik8-paper", "enwik8-paper-4head", "enwik8-paper-noattn", "tiny"):
        assert name in result.stdout
    assert set(preset_names()) >= {"enwik8-paper", "enwik8-paper-4head", "enwik8-paper-noattn", "tiny"}


def test_info_tiny_config_file_and_run_folder(tmp_path, run_dir):
    tiny = load_config("tiny")
    result = cli("info", "tiny")
    assert_ok(result)
    assert f"d_model: {tiny.model.d_model}" in result.stdout and "parameters:" in result.stdout

    config_file = tmp_path / "mine.yaml"
    config_file.write_text("model:\n  d_model: 64\n  boom_dim: 128\n  n_layers: 3\n  attention: all\n")
    result = cli("info", config_file)
    assert_ok(result)
    assert "d_model: 64" in result.stdout and "n_layers: 3" in result.stdout

    summary = _summary(run_dir)
    best = (run_dir / "best").resolve()
    for target in (run_dir, run_dir / "best"):
        result = cli("info", target)
        assert_ok(result)
        assert "d_model: 32" in result.stdout
        assert f"{summary['parameters']:,} trainable" in result.stdout
        assert f"{summary['parameters_collapsed']:,} collapsed" in result.stdout
        assert result.stdout.splitlines()[-1] == (
            f"checkpoint {best}: step {summary['best_step']}, epoch {summary['epochs']:.2f}, "
            f"valid {summary['valid_bpc']:.4f} BPC, test {summary['test_bpc']:.4f} BPC"
        )


# --------------------------------------------------------------------------------------
# Bad input: one line, non-zero exit, no traceback


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("foo=1", "foo"),
        ("model.foo=1", "model.foo"),
        ("lr=abc", "lr"),
        ("train_streams=1.5", "train_streams"),
        ("model.dropouth=-0.1", "dropouth"),
        ("model.attention_span=0", "attention_span"),
        ("bptt=0", "bptt"),
        ("model.n_layers=0", "n_layers"),
        ("model.attention=[7]", "7"),
        ("model.attention=bogus", "attention"),
        ("model.boom_dim=100", "boom_dim"),
        ("bptt=64", "attention_span"),  # window longer than the attention span
        ("lr", "key=value"),  # no '='
    ],
)
def test_train_rejects_bad_overrides(tmp_path, corpus_file, override, fragment):
    out = tmp_path / "run"
    result = cli("train", "--preset", "tiny", "--out", out, *SMALL, f"data={corpus_file}", override)
    assert_user_error(result, fragment)
    assert not out.exists()


def test_train_rejects_unknown_preset_and_conflicting_options(tmp_path, run_dir):
    out = tmp_path / "run"
    assert_user_error(cli("train", "--preset", "no-such-preset", "--out", out), "no-such-preset")
    assert_user_error(cli("train", "--config", tmp_path / "missing.yaml", "--out", out), "missing.yaml")
    assert_user_error(cli("train", "--preset", "tiny", "--config", run_dir / "config.yaml", "--out", out))
    assert_user_error(cli("train", "--out", out))
    assert not out.exists()


def _bad_gzip(folder: Path) -> Path:
    path = folder / "garbage.gz"
    path.write_bytes(b"this is not gzip data at all")
    return path


def _truncated_gzip(folder: Path) -> Path:
    path = folder / "truncated.gz"
    path.write_bytes(gzip.compress(bytes(range(256)) * 400)[:300])
    return path


def _too_small(folder: Path) -> Path:
    return write_small_corpus(folder / "sixty-bytes.txt", size=60)  # train split 54 < 4 x 17


@pytest.mark.parametrize(
    "make_data, fragments",
    [
        (lambda folder: folder / "nonexistent", ("not found",)),
        (_bad_gzip, ("garbage.gz",)),
        (_truncated_gzip, ("truncated.gz",)),
        (_too_small, ("window",)),
    ],
    ids=["missing", "corrupt-gzip", "truncated-gzip", "smaller-than-a-window"],
)
def test_train_rejects_bad_data(tmp_path, make_data, fragments):
    data = make_data(tmp_path)
    out = tmp_path / "run"
    assert_user_error(cli("train", "--preset", "tiny", "--out", out, *SMALL, f"data={data}"), *fragments)
    assert not out.exists()


def test_train_refuses_an_existing_run_folder_and_leaves_it_untouched(tmp_path, corpus_file):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert_user_error(cli("train", "--preset", "tiny", "--out", out, *SMALL, f"data={corpus_file}"), "exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("where", ["a-file/run", "/proc/sharnn-run"])
def test_a_run_folder_that_cannot_be_created_is_one_line(tmp_path, corpus_file, where):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / where if not where.startswith("/") else Path(where)
    assert_user_error(
        cli("train", "--preset", "tiny", "--out", out, *SMALL, f"data={corpus_file}"),
        f"cannot create the run folder {out}",
    )
    assert not out.exists() and (tmp_path / "a-file").read_text() == "not a folder"


def test_the_sample_is_set_apart_from_its_prompt(tmp_path, corpus_file):
    result = cli(
        "train", "--preset", "tiny", "--out", tmp_path / "run", *SMALL, f"data={corpus_file}", "sample_bytes=40"
    )
    assert_ok(result)
    assert "--- prompt: the first 256 bytes of the test split ---" in result.stderr
    assert "--- sample: 40 bytes generated at temperature 0.8 ---" in result.stderr
    prompt = bytes(load_corpus(str(corpus_file)).test[:256]).decode("utf-8", errors="replace")
    assert result.stdout.startswith(prompt + "\n")


def test_resume_takes_no_out_preset_or_init_from(tmp_path, run_dir):
    assert_user_error(cli("train", "--resume", run_dir, "--out", tmp_path / "x"), "--resume")
    assert_user_error(cli("train", "--resume", run_dir, "--preset", "tiny"), "--resume")
    assert_user_error(cli("train", "--resume", run_dir, "--init-from", run_dir), "--resume")
    assert not (tmp_path / "x").exists()


@pytest.fixture
def checkpoint_copy(tmp_path, run_dir) -> Path:
    target = tmp_path / "checkpoint"
    shutil.copytree((run_dir / "best").resolve(), target)
    return target


def test_eval_checkpoint_whose_config_does_not_match_its_weights(checkpoint_copy):
    config = checkpoint_copy / "config.yaml"
    text = config.read_text()
    assert "d_model: 32" in text
    config.write_text(text.replace("d_model: 32", "d_model: 64"))
    assert_user_error(cli("eval", checkpoint_copy), "does not match")
    assert_user_error(cli("generate", checkpoint_copy, "--max-bytes", "5"), "does not match")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_eval_corrupt_weights(checkpoint_copy, damage):
    weights_file = checkpoint_copy / "model.safetensors"
    if damage == "garbage":
        weights_file.write_bytes(b"\x00\x01 not a safetensors file")
    else:
        weights_file.write_bytes(weights_file.read_bytes()[:5000])
    assert_user_error(cli("eval", checkpoint_copy), "model.safetensors")


def test_eval_corrupt_config(checkpoint_copy):
    (checkpoint_copy / "config.yaml").write_text("model: [unbalanced\n")
    assert_user_error(cli("eval", checkpoint_copy))
    (checkpoint_copy / "config.yaml").write_text("model:\n  d_model: -3\n")
    assert_user_error(cli("eval", checkpoint_copy), "d_model")


def test_eval_and_generate_nonexistent_checkpoint(tmp_path):
    assert_user_error(cli("eval", tmp_path / "nowhere"), "no checkpoint")
    assert_user_error(cli("generate", tmp_path / "nowhere", "--prompt", "x"), "no checkpoint")
    assert_user_error(cli("info", tmp_path / "nowhere"), "nowhere")


def test_eval_and_generate_refuse_settings_out_of_range_with_one_line(run_dir):
    assert_user_error(cli("eval", run_dir, "--bptt", "49"), "--bptt", "attention_span (48)")
    for option, value in [
        ("--temperature", "nan"),
        ("--temperature", "inf"),
        ("--temperature", "-1"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--top-p", "nan"),
    ]:
        assert_user_error(cli("generate", run_dir, "--prompt", "x", option, value), "temperature")
    assert_user_error(cli("eval", run_dir, "--device", "tpu"), "tpu")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "RUN", "--top-k", "-1"], "--top-k"),
        (["eval", "RUN", "--streams", "0"], "--streams"),
        (["eval", "RUN", "--split", "train"], "--split"),
        (["export"], "CHECKPOINT"),
        (["bogus"], "bogus"),
        (["train", "--bogus"], "--bogus"),
        (["--bogus"], "--bogus"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(run_dir, args, fragment):
    result = cli(*[run_dir if a == "RUN" else a for a in args])
    assert_user_error(result, fragment, "--help")
    assert result.exit_code == 2


def test_eval_file_errors(tmp_path, run_dir):
    assert_user_error(cli("eval", run_dir, "--file", tmp_path / "missing.txt"), "missing.txt")
    tiny = tmp_path / "one-byte.txt"
    tiny.write_bytes(b"x")
    assert_user_error(cli("eval", run_dir, "--file", tiny))


def test_prepare_enwik8_refuses_wrong_files(tmp_path):
    wrong = tmp_path / "not-enwik8"
    wrong.write_bytes(b"<mediawiki>" * 1000)
    out = tmp_path / "enwik8"
    assert_user_error(cli("prepare", "enwik8", "--source", wrong, "--out", out), "100,000,000")
    # a zip without the enwik8 member, and a truncated zip
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("something-else", b"x" * 1000)
    assert_user_error(cli("prepare", "enwik8", "--source", archive, "--out", out), "enwik8")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", bytes(range(256)) * 4000)
    archive.write_bytes(archive.read_bytes()[:2000])
    assert_user_error(cli("prepare", "enwik8", "--source", archive, "--out", out))
    assert_user_error(cli("prepare", "enwik8", "--source", tmp_path / "missing.zip", "--out", out), "missing.zip")
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".enwik8")]  # no staging left


def test_prepare_enwik8_right_size_wrong_checksum(tmp_path):
    fake = tmp_path / "enwik8"
    with open(fake, "wb") as f:
        f.truncate(100_000_000)  # sparse: 100,000,000 zero bytes
    out = tmp_path / "prepared"
    assert_user_error(cli("prepare", "enwik8", "--source", fake, "--out", out), "MD5")
    assert not out.exists()


@pytest.mark.slow
def test_user_error_in_a_real_process_is_one_line_without_traceback(tmp_path):
    process = sharnn_process("train", "--preset", "tiny", "--out", tmp_path / "run", "model.foo=1")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert stderr.strip() == "error: unknown config key 'model.foo'"
    assert stdout == ""


# --------------------------------------------------------------------------------------
# Answers at once, and Ctrl-C at any moment


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)


def test_help_version_and_usage_errors_do_not_import_torch():
    """`sharnn --help`, `--version`, `train --help` and a refused option answer from click
    alone; `import sharnn` and its version need no torch either."""
    done = _python(
        "import sys, sharnn, sharnn.cli\n"
        "codes = []\n"
        "for args in (['--help'], ['--version'], ['train', '--help'], ['train', '--bogus']):\n"
        "    try:\n"
        "        sharnn.cli.main.main(args, prog_name='sharnn', standalone_mode=True)\n"
        "    except SystemExit as e:\n"
        "        codes.append(e.code)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print(codes, sharnn.__version__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"[0, 0, 0, 2] {sharnn.__version__}"
    assert done.stderr.splitlines() == [
        "error: No such option '--bogus'. Did you mean '--out'? (see `sharnn train --help`)"
    ]


@pytest.mark.slow
def test_public_names_load_on_first_use_and_evaluate_is_the_function():
    done = _python(
        "import sys, sharnn\n"
        "assert 'torch' not in sys.modules\n"
        "from sharnn import SHARNN, TrainingState, evaluate, generate\n"
        "import sharnn.evaluation, sharnn.generation\n"
        "assert sharnn.evaluate is evaluate is sharnn.evaluation.evaluate and callable(evaluate)\n"
        "assert sharnn.generate is generate is sharnn.generation.generate\n"
        "assert all(getattr(sharnn, name) is not None for name in sharnn.__all__)\n"
        "assert set(sharnn.__all__) <= set(dir(sharnn))\n"
        # submodules, as an eager package has them
        "assert sharnn.loading.load_model.__module__ == 'sharnn.loading'\n"
        "assert callable(sharnn.coding.codec.compress) and callable(sharnn.data.corpus.load_corpus)\n"
        "try:\n"
        "    sharnn.nothing\n"
        "except AttributeError as e:\n"
        "    assert str(e) == \"module 'sharnn' has no attribute 'nothing'\"\n"
        "print(SHARNN.__module__, TrainingState.__module__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sharnn.models.sharnn", "sharnn.training.recipe"]


def test_version_in_a_real_process():
    done = subprocess.run(
        [sys.executable, "-m", "sharnn", "--version"], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"version {sharnn.__version__}")  # the installed metadata, the package's own


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0, 1.5, 2.5])
def test_ctrl_c_while_a_command_loads_is_one_line(delay):
    """SIGINT at any moment of `sharnn info` (while torch imports, or while it runs): one
    line, `interrupted`, and status 130; or, when the command had finished, nothing more
    (0, or death by SIGINT while the interpreter exits, which a shell reports as 130)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sharnn", "info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr
    assert process.returncode in (0, 130, -signal.SIGINT), (process.returncode, stderr)
    assert stderr in ("", "interrupted\n"), stderr
    if process.returncode == 130:
        assert stderr == "interrupted\n"


SIGNAL_IN_A_CONSTRUCTOR = """
import sys, click, tqdm
from sharnn.console import Group
from sharnn.files import Terminated

def stopped(*args, **kwargs):
    raise {exception}()

tqdm.tqdm._get_free_pos = stopped  # the signal lands while the bar is half built

@click.group(cls=Group)
def main():
    pass

@main.command()
def download():
    with tqdm.tqdm(total=10):
        pass

main(["download"])
"""


@pytest.mark.parametrize(
    ("exception", "status", "line"), [("Terminated", 143, "terminated"), ("KeyboardInterrupt", 130, "interrupted")]
)
def test_a_signal_inside_a_constructor_still_ends_in_one_line(exception, status, line):
    """A signal that lands inside tqdm's constructor leaves a half-built bar whose destructor
    fails at shutdown; the command still prints its one line and nothing after it (CI
    caught this once: `'tqdm' object has no attribute 'pos'` after `terminated`)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_IN_A_CONSTRUCTOR.format(exception=exception)],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (status, f"{line}\n")


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_commands_let_openmp_threads_sleep_unless_told_otherwise(given, seen):
    """The command line loads torch with OMP_WAIT_POLICY=PASSIVE (docs/training.md), and a
    policy the user set is kept."""
    env = {k: v for k, v in SUBPROCESS_ENV.items() if k != "OMP_WAIT_POLICY"} | (
        {"OMP_WAIT_POLICY": given} if given else {}
    )
    code = (
        "import os; from sharnn.console import _import_torch; _import_torch('sharnn'); "
        "print(os.environ['OMP_WAIT_POLICY'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() == seen, done.stderr


def test_torchs_objects_are_frozen_and_the_collector_is_back_on():
    """While torch loads, Python's cyclic collector is off; what the import made is then
    frozen (never read by the collector again) and the collector is on for the command."""
    code = (
        "import gc; from sharnn.console import _import_torch; _import_torch('sharnn'); "
        "print(gc.isenabled(), gc.get_freeze_count())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    enabled, frozen = done.stdout.split()
    assert enabled == "True" and int(frozen) > 10_000, done.stderr
