"""The inference step (sharnn.models.step.Step): the model's function one position at a time
for every variant (its memory a ring that wraps), prepared again after the weights change,
continued exactly from a prompt's state; compress, decompress and generate run on it, and
its files (format version 6; 5 before the line ends were folded, 4 before the mixing, 3
before the integer step) round-trip byte for byte while a Transformer's keep version 2."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import sharnn.coding.arithmetic as arithmetic
import sharnn.coding.codec as codec
import sharnn.coding.container as container
from helpers import assert_ok, cli, older_header, shared_run
from sharnn.coding.arithmetic import DEFAULT_MIXING
from sharnn.coding.codec import compress, decompress, stream_lengths
from sharnn.coding.container import read_header
from sharnn.coding.online import online_config, online_model
from sharnn.errors import ConfigError
from sharnn.generation import filter_logits, generate
from sharnn.models.build import build_model
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN
from sharnn.models.step import Step
from sharnn.training.checkpoint import load_model

TEXT = ("Ünïcödé ✓ — 日本語のテキスト, emoji 🙂, and plain ASCII.\n" * 8).encode("utf-8")
RANDOM = np.random.default_rng(0).integers(0, 256, 700, dtype=np.uint8).tobytes()
SPAN = 24


def peaked_model(seed: int = 0, collapse: bool = False, **overrides) -> SHARNN:
    """Three blocks of width 16, span 24, in eval mode, its predictions peaked as a trained
    model's: gates and LayerNorms randomised (none an identity that could hide a misplaced
    gate), every other weight five times its initialisation."""
    torch.manual_seed(seed)
    fields = dict(d_model=16, n_layers=3, boom_dim=32, attention_span=SPAN, dropouti=0.0, dropouth=0.0, dropouto=0.0)
    model = SHARNN(SHARNNConfig(**(fields | overrides)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate" in name or "ln_" in name:
                p.normal_(0.0, 0.5).add_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.mul_(5.0)
    return (model.collapse() if collapse else model).eval()


def largest_difference(model: SHARNN, tokens: torch.Tensor, step: Step, state=None) -> tuple[float, float]:
    """Run ``tokens [N, B]`` one position at a time through ``model(...)`` (from ``state``)
    and ``step``: the largest difference of their float64 probabilities (as the coder
    computes them), and the largest probability."""
    worst = peak = 0.0
    with torch.no_grad():
        for row in tokens:
            logits, state = model(row.view(1, -1), state)
            expected = arithmetic.probabilities(logits[0])
            worst = max(worst, float(np.abs(arithmetic.probabilities(step(row)) - expected).max()))
            peak = max(peak, float(expected.max()))
    return worst, peak


def random_tokens(positions: int, streams: int, vocab: int = 256, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (positions, streams), generator=torch.Generator().manual_seed(seed))


VARIANTS = {
    "single": {},
    "all": dict(attention="all"),
    "none": dict(attention="none"),
    "collapsed": dict(attention="all", collapse=True),
    "value-gate-vector": dict(value_gate="vector"),
    "value-gate-vector-collapsed": dict(value_gate="vector", collapse=True),
    "mlp": dict(feed_forward="mlp"),
    "ln-lstm": dict(cell="ln_lstm", attention="all"),
    "vocab-300-no-table": dict(vocab_size=300),
}


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_the_step_computes_the_models_function_over_a_wrapping_ring(variant):
    """320 positions with a span of 24: the ring wraps 13 times. In fp32 the probabilities
    agree within 1e-6; in fp64, within 1e-12: the same function, rounded otherwise."""
    model = peaked_model(**VARIANTS[variant])
    tokens = random_tokens(320, 3, model.config.vocab_size)
    worst, peak = largest_difference(model, tokens, Step(model, 3))
    assert worst < 1e-6 and peak > 5 / model.config.vocab_size, (worst, peak)  # peaked, not near uniform
    double = copy.deepcopy(model).double()
    worst, _ = largest_difference(double, tokens[:100], Step(double, 3))
    assert worst < 1e-12, worst


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_bf16_probabilities_are_close_to_fp32s(variant):
    """Precision bf16 (products and memory in bfloat16) over 160 positions: every probability
    within 1e-2 of fp32's (measured: at most 5.4e-3), the fp32 distribution's excess code
    length under bf16's (its KL divergence) below 1e-3 bits per position (measured: at most
    1.5e-4), and not fp32's computation (differences above 1e-5)."""
    model = peaked_model(**VARIANTS[variant])
    fp32, bf16 = Step(model, 3), Step(model, 3, precision="bf16")
    worst = excess = 0.0
    for row in random_tokens(160, 3, model.config.vocab_size):
        p, q = arithmetic.probabilities(fp32(row)), arithmetic.probabilities(bf16(row))
        worst = max(worst, float(np.abs(p - q).max()))
        excess += float((p * np.log2(p / q)).sum(1).mean()) / 160
    assert 1e-5 < worst < 1e-2 and excess < 1e-3, (worst, excess)
    assert all(ring is None or ring.dtype == torch.bfloat16 for ring in bf16.memory)


def test_refresh_follows_changed_weights_and_keeps_the_state():
    """Online mode changes the weights in place between positions: after refresh() the
    step computes with the new weights, from the state it had; without it, with the old."""
    model = peaked_model(attention="all")
    tokens = random_tokens(80, 2)
    stale, fresh, state = Step(model, 2), Step(model, 2), None
    with torch.no_grad():
        for row in tokens[:40]:
            _, state = model(row.view(1, -1), state)
            stale(row), fresh(row)
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    fresh.refresh()
    assert largest_difference(model, tokens[40:], stale, state)[0] > 1e-4
    worst, _ = largest_difference(model, tokens[40:], fresh, state)
    assert worst < 1e-6, worst


@pytest.mark.parametrize("prompt", [10, 40], ids=["memory-partly-full", "memory-full"])
def test_the_step_continues_exactly_from_a_prompts_state(prompt):
    """generate() feeds the prompt through model(...) in windows, then continues with the
    step from that state: (h, c) and the memory are copied bitwise."""
    model = peaked_model(attention="all")
    tokens = random_tokens(prompt + 30, 2)
    state = None
    with torch.no_grad():
        for start in range(0, prompt, 20):
            _, state = model(tokens[start : min(start + 20, prompt)], state)
    step = Step(model, 2, positions=prompt + 30)
    step.load_state(state)
    assert step.position == min(prompt, SPAN) == state.memory[0].shape[0]
    for (h, c), (h0, c0), ring, memory in zip(step.lstm, state.lstm, step.memory, state.memory):
        assert torch.equal(h, h0[0]) and torch.equal(c, c0[0])
        assert torch.equal(ring[:, : step.position], memory.transpose(0, 1))
    worst, _ = largest_difference(model, tokens[prompt:], step, state)
    assert worst < 1e-6, worst


def test_the_step_refuses_what_it_cannot_run():
    transformer = build_model(SHARNNConfig(architecture="transformer", d_model=16, n_layers=1, boom_dim=32, n_heads=2))
    with pytest.raises(ConfigError, match="runs an SHA-RNN, not a Transformer"):
        Step(transformer, 2)
    model = peaked_model()
    with pytest.raises(ConfigError, match="precision must be fp32 or bf16, got 'fp16'"):
        Step(model, 2, precision="fp16")
    step = Step(model, 2, positions=3)
    for row in random_tokens(3, 2):
        step(row)
    with pytest.raises(ValueError, match="made for 3 positions"):
        step(row)
    with torch.no_grad():
        _, state = model(random_tokens(5, 3))
    with pytest.raises(ValueError, match="not of 2 streams"):
        Step(model, 2).load_state(state)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generation_through_the_step_draws_what_the_forward_draws(temperature):
    """Not promised bitwise in general (probabilities within 1e-6 may draw differently in
    rare cases); for this model, 60 tokens of 2 streams, greedy and seeded, are the same."""
    model = peaked_model(attention="all")
    prompts = random_tokens(12, 2)
    generator = torch.Generator().manual_seed(5)
    expected = []
    with torch.no_grad():
        logits, state = model(prompts)
        for _ in range(60):
            tokens = torch.multinomial(filter_logits(logits[-1], temperature), 1, generator=generator).squeeze(1)
            expected.append(tokens)
            logits, state = model(tokens.view(1, -1), state)
    drawn = torch.stack(list(generate(model, prompts, 60, temperature=temperature, seed=5)))
    assert torch.equal(drawn, torch.stack(expected))


# ---------------------------------------------------------------------------- compression


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


def version(blob: bytes) -> int:
    """The format version of a compressed file (bytes 8-9, little-endian)."""
    return int.from_bytes(blob[8:10], "little")


@pytest.mark.slow  # a few seconds: out of the working loop
@pytest.mark.parametrize("streams", [1, 3, 8])
@pytest.mark.parametrize("data", [b"", b"x", RANDOM, TEXT], ids=["empty", "one-byte", "random", "text"])
def test_version_6_round_trips_byte_exactly_through_the_command_line(tmp_path, run_dir, data, streams):
    """The command line's file (coded by the integer step mixed with context models, or
    stored raw when that is smaller) and the coded file (in-process, never stored) decode
    to the input, both of version 6; the same payload framed as version 5 (these inputs
    have no CRLF to fold; the random bytes, not text, are coded without the model, which
    version 5 cannot record), the integer step's unmixed payload framed as version 4, and the
    float step's framed as version 3, decode too."""
    source, packed, out = tmp_path / "in", tmp_path / "in.shz", tmp_path / "out"
    source.write_bytes(data)
    assert_ok(cli("compress", source, "-o", packed, "--model", run_dir, "--streams", streams, "--quiet"))
    assert version(packed.read_bytes()) == 6
    assert_ok(cli("decompress", packed, "-o", out, "--model", run_dir, "--quiet"))
    assert out.read_bytes() == data
    model = load_model(run_dir)[0]
    header, payload = codec.encode(data, model, streams=streams, online=None, progress=None)
    blob = container.pack(header) + payload
    assert version(blob) == 6 and read_header(blob)[0].streams == len(stream_lengths(len(data), streams))
    assert header.precision == "integer" and header.portable and header.mixing == DEFAULT_MIXING and header.crlf == 0
    assert decompress(blob, model) == data
    if data == RANDOM:  # not text: coded without the model, which version 5 cannot record
        assert header.model_input is False
    else:
        assert decompress(container.pack(older_header(header, data), 5) + payload, model) == data
    header, payload = codec.encode(data, model, streams=streams, online=None, progress=None, adapt=False)
    assert decompress(container.pack(older_header(header, data), 4) + payload, model) == data
    header, payload = codec.encode(data, model, streams=streams, online=None, progress=None, precision="fp32")
    assert decompress(container.pack(older_header(header, data), 3) + payload, model) == data


def test_online_mode_writes_version_6_in_fp32_unmixed_and_round_trips():
    """Online mode trains between positions: both sides prepare the step again after every
    update. It trains in floating point, so its files are fp32 and not portable."""
    config = online_config(["model.d_model=32", "model.boom_dim=64", "model.attention_span=24", "bptt=16"])
    data = TEXT[:500]
    header, payload = codec.encode(data, online_model(config), streams=3, online=config, progress=None)
    blob = container.pack(header) + payload
    assert version(blob) == 6 and header.mode == "online" and len(data) % 3
    assert header.precision == "fp32" and not header.portable and header.integer_step is header.mixing is None
    assert decompress(blob) == data


def test_a_transformer_keeps_writing_version_2():
    torch.manual_seed(0)
    config = SHARNNConfig(architecture="transformer", d_model=16, n_layers=1, boom_dim=32, attention_span=16, n_heads=2)
    model = build_model(config).eval()
    blob = compress(TEXT[:200], model, streams=2)
    assert version(blob) == 2 and b'"precision"' not in blob  # a key of version 3
    assert decompress(blob, model) == TEXT[:200]
    crlf = TEXT[:200].replace(b"\n", b"\r\n")  # version 2 has no key for folded line ends: coded as it is
    header, payload = codec.encode(crlf, model, streams=2, online=None, progress=None)
    assert header.crlf == 0 and decompress(container.pack(header, 2) + payload, model) == crlf
    with pytest.raises(ConfigError, match="precision bf16 runs the SHA-RNN's inference step; a Transformer codes"):
        compress(TEXT[:200], model, streams=2, precision="bf16")
