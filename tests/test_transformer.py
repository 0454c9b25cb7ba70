"""The decoder-only Transformer baseline (docs/transformer.md): the model against its
definition, its token state, and the commands run on a Transformer run as on an SHA-RNN
one (train, resume after kill -9, eval, generate, export and from_pretrained, info,
compress)."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch
import torch.nn.functional as F

from helpers import (
    RESUMABLE,
    SMALL,
    assert_ok,
    assert_same_weights,
    assert_user_error,
    checkpoint_step,
    cli,
    sharnn_process,
    signal_when,
    single_thread,
)
from sharnn import Transformer
from sharnn.config import load_config
from sharnn.errors import ConfigError
from sharnn.models.build import build_model, load_pretrained, parameter_count
from sharnn.models.config import SHARNNConfig
from sharnn.training.trainer import train

# A tiny Transformer (2 x 32, 4 heads, MLP 128, context 48) on SMALL's windows and streams.
TRANSFORMER = ["model.architecture=transformer", "model.n_heads=4", "model.boom_dim=128"]


def tiny(**changes) -> SHARNNConfig:
    fields = dict(architecture="transformer", vocab_size=16, d_model=8, n_layers=1, boom_dim=32, n_heads=2)
    return SHARNNConfig(**(fields | dict(attention_span=12, dropouti=0.0, dropouth=0.0, dropouto=0.0) | changes))


def test_one_block_computed_by_hand_equals_the_model():
    torch.manual_seed(0)
    model = build_model(tiny()).double().eval()
    for p in model.parameters():  # away from the init's zeros, so that every term counts
        torch.nn.init.normal_(p, 0.0, 0.3)
    tokens = torch.randint(0, 16, (5, 3))
    block, (S, d, H) = model.blocks[0], (5, 8, 2)

    def layer_norm(x, ln):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + model.config.layer_norm_eps) * ln.weight + ln.bias

    x = model.embedding.weight[tokens] + model.positions.weight[:S, None]  # [S, B, d]
    q, k, v = (layer_norm(x, block.ln_1) @ block.attn.qkv.weight.T + block.attn.qkv.bias).split(d, -1)
    heads = []
    for h in range(H):
        part = slice(h * d // H, (h + 1) * d // H)
        scores = torch.einsum("sbe,tbe->bst", q[..., part], k[..., part]) / math.sqrt(d // H)
        scores = scores.masked_fill(torch.ones(S, S).triu(1).bool(), -math.inf)  # position s sees t <= s
        heads.append(torch.einsum("bst,tbe->sbe", scores.softmax(-1), v[..., part]))
    x = x + torch.cat(heads, -1) @ block.attn.proj.weight.T + block.attn.proj.bias
    hidden = F.gelu(layer_norm(x, block.ln_2) @ block.mlp.up.weight.T + block.mlp.up.bias)
    x = x + hidden @ block.mlp.down.weight.T + block.mlp.down.bias
    expected = layer_norm(x, model.ln_f) @ model.embedding.weight.T

    for implementation in ("sdpa", "eager"):
        logits, state = model.set_attn_implementation(implementation)(tokens)
        assert (logits - expected).abs().max() < 1e-6, implementation
    assert torch.equal(state.tokens, tokens)


def test_the_carried_token_state_equals_the_concatenated_sequence_and_keeps_the_span():
    torch.manual_seed(0)
    model = build_model(tiny(n_layers=2)).eval()
    tokens = torch.randint(0, 16, (12, 2))
    whole, _ = model(tokens)
    first, state = model(tokens[:5])
    second, state = model(tokens[5:], state)
    assert torch.allclose(torch.cat([first, second]), whole, atol=1e-6)
    # past the span: each window sees the last span - T tokens before it, and the state keeps <= span
    longer = torch.randint(0, 16, (20, 2))
    _, state = model(longer[:8])
    later, state = model(longer[8:12], state)
    assert torch.allclose(later, model(longer[:12])[0][-4:], atol=1e-6)
    _, state = model(longer[12:20], state)
    assert torch.equal(state.tokens, longer[8:20])
    assert torch.allclose(
        model(longer[16:20], state)[0], model(torch.cat([longer[12:20], longer[16:20]]))[0][-4:], atol=1e-6
    )


def test_a_shorter_span_shortens_the_context_and_a_longer_one_is_refused_in_one_line(transformer_run):
    """Learned positions stop at the trained span (12): a span of 8 reads the last 8
    tokens, exactly as a cut context does; 13 is refused, in one line from the command too."""
    torch.manual_seed(0)
    model = build_model(tiny(n_layers=2)).eval()
    tokens = torch.randint(0, 16, (12, 2))
    _, state = model(tokens[:8])
    model.set_attention_span(8)
    assert torch.allclose(model(tokens[8:], state)[0], model(tokens[4:])[0][-4:], atol=1e-6)
    with pytest.raises(ConfigError, match="exceeds this Transformer's 12 learned positions; it can read at most 12"):
        model.set_attention_span(13)
    result = cli("eval", transformer_run, "--attention-span", "49")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "48 learned positions" in result.stderr


def test_parameter_count_is_the_built_models_and_refuses_a_bad_config_in_one_line(tmp_path):
    config = tiny()
    assert parameter_count(config) == build_model(config).num_parameters() == Transformer(config).num_parameters()
    counts = build_model(config).parameter_counts()
    assert sum(counts.values()) == parameter_count(config) and counts["positions"] == 12 * 8
    result = cli("train", "--preset", "tiny", "--out", tmp_path / "run", *SMALL, *TRANSFORMER, "model.n_heads=5")
    assert_user_error(result, "model.n_heads (5) must be >= 1 and divide model.d_model")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def transformer_run(tmp_path_factory, corpus_file):
    """A finished SMALL run of the tiny Transformer, through the command line."""
    run_dir = tmp_path_factory.mktemp("transformer") / "run"
    with single_thread():
        assert_ok(
            cli("train", "--preset", "tiny", "--out", run_dir, "--quiet", *SMALL, *TRANSFORMER, f"data={corpus_file}")
        )
    return run_dir


def test_eval_of_the_run_gives_its_test_figure_and_info_counts_its_parameters(transformer_run):
    summary = json.loads((transformer_run / "summary.json").read_text())
    result = cli("eval", transformer_run)
    assert_ok(result)
    assert f"bits per byte: {summary['test_bpc']:.4f}" in result.stdout
    result = cli("info", transformer_run)
    assert_ok(result)
    config = load_config("tiny", SMALL + TRANSFORMER).model
    assert f"parameters: {parameter_count(config):,} trainable" in result.stdout
    assert "architecture: transformer" in result.stdout


def test_export_and_from_pretrained_give_the_same_logits(tmp_path, transformer_run):
    assert_ok(cli("export", transformer_run, "--out", tmp_path / "exported"))
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["architecture"] == "transformer"
    assert "# Transformer byte-level language model" in (tmp_path / "exported" / "README.md").read_text()
    from sharnn.training.checkpoint import load_model

    trained, _ = load_model(transformer_run)
    tokens = torch.randint(0, 256, (20, 2))
    for loaded in (Transformer.from_pretrained(tmp_path / "exported"), load_pretrained(tmp_path / "exported")):
        assert isinstance(loaded, Transformer) and not loaded.training
        assert torch.equal(loaded(tokens)[0], trained(tokens)[0])
    result = cli("generate", tmp_path / "exported", "--prompt", "The ", "--max-bytes", "20", "--seed", "1")
    assert_ok(result)
    assert result.stdout.startswith("The ")
    assert_ok(cli("eval", tmp_path / "exported"))


@pytest.mark.slow  # a few seconds: out of the working loop
def test_compress_with_a_transformer_round_trips_and_online_mode_refuses_it(tmp_path, transformer_run, corpus_file):
    source = tmp_path / "in.txt"
    source.write_bytes(corpus_file.read_bytes()[:1500])
    assert_ok(cli("compress", "--model", transformer_run, source, "-o", tmp_path / "in.shc", "--quiet"))
    assert_ok(cli("decompress", "--model", transformer_run, tmp_path / "in.shc", "-o", tmp_path / "out.txt", "--quiet"))
    assert (tmp_path / "out.txt").read_bytes() == source.read_bytes()
    result = cli("compress", "--online", source, "-o", tmp_path / "x.shc", "model.architecture=transformer")
    assert_user_error(result, "online mode trains an SHA-RNN")
    assert not (tmp_path / "x.shc").exists()


@pytest.mark.slow
def test_resume_after_kill_9_ends_with_exactly_the_same_weights(tmp_path, corpus_file):
    overrides = RESUMABLE + TRANSFORMER + [f"data={corpus_file}"]
    reference = tmp_path / "reference"
    with single_thread():
        train(load_config("tiny", overrides), reference, quiet=True)
    run_dir = tmp_path / "killed"
    process = sharnn_process("train", "--preset", "tiny", "--out", run_dir, "--quiet", *overrides)

    def past_first_validations() -> bool:  # after the step-8 validation, the token memory full
        return (run_dir / "latest").exists() and checkpoint_step(run_dir / "latest") >= 12

    _, stderr = signal_when(process, past_first_validations, signal.SIGKILL)
    assert process.returncode in (-signal.SIGKILL, 0), stderr
    assert_ok(cli("train", "--resume", run_dir, "--quiet"))
    for link in ("best", "latest"):
        assert checkpoint_step(run_dir / link) == checkpoint_step(reference / link)
        assert_same_weights(run_dir / link, reference / link)
    ours, theirs = (json.loads((d / "summary.json").read_text()) for d in (run_dir, reference))
    assert [ours[k] for k in ("valid_bpc", "test_bpc", "steps")] == [
        theirs[k] for k in ("valid_bpc", "test_bpc", "steps")
    ]
