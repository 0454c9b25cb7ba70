"""The SHA-RNN's ablation variants (``model.cell``, ``model.value_gate``, ``model.feed_forward``;
docs/model.md, "Variants"): each against its equations written out by hand with the module's
own weights, its parameter counts by formula, and each trained by ``sharnn train``, killed
with SIGKILL, resumed to exactly the weights of the uninterrupted run, exported and reloaded.
The paper's model itself is tested in tests/test_model.py.
"""

from __future__ import annotations

import json
import re
import signal

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import (
    RESUMABLE,
    assert_ok,
    assert_same_weights,
    assert_user_error,
    checkpoint_step,
    cli,
    sharnn_process,
    signal_when,
    single_thread,
)
from sharnn.config import load_config
from sharnn.models.build import parameter_count
from sharnn.models.config import SHARNNConfig
from sharnn.models.lstm import LayerNormLSTM
from sharnn.models.sharnn import MLP, SHARNN, gelu
from sharnn.training.checkpoint import load_model

V = 256
VARIANTS = ["model.cell=ln_lstm", "model.value_gate=vector", "model.feed_forward=mlp"]
VARIANT_SETTINGS = [v.removeprefix("model.").split("=") for v in VARIANTS]


def small_model(seed: int = 0, **overrides) -> SHARNN:
    """A tiny model in eval mode, every parameter perturbed so that no gain sits at 1 and
    no bias or gate at 0."""
    torch.manual_seed(seed)
    values = dict(d_model=16, n_layers=2, boom_dim=32, attention_span=32) | overrides
    model = SHARNN(SHARNNConfig(**values))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def ln(x, module: nn.LayerNorm):
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * gain + bias."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


# ----------------------------------------------------------------------------- equations


def literal_ln_lstm(cell: LayerNormLSTM, x, h, c):
    """Ba et al. 2016, §3.1, one position at a time, gates in the paper's order f, i, o, g:
    (f, i, o, g) = LN(W_h h) + LN(W_x x) + b; c = s(f) c + s(i) tanh(g); h = s(o) tanh(LN(c))."""
    outputs = []
    for t in range(x.shape[0]):
        gates = ln(h @ cell.weight_hh.T, cell.ln_hh) + ln(x[t] @ cell.weight_ih.T, cell.ln_ih) + cell.bias
        f, i, o, g = gates.split(h.shape[-1], dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(ln(c, cell.ln_cell))
        outputs.append(h)
    return torch.stack(outputs), h, c


@pytest.mark.parametrize("T", [1, 7])
def test_ln_lstm_matches_the_layer_normalised_lstm_equations(T):
    block = small_model(cell="ln_lstm").double().blocks[0]
    torch.manual_seed(1)
    x, h0, c0 = torch.randn(T, 3, 16).double(), torch.randn(1, 3, 16).double(), torch.randn(1, 3, 16).double()
    with torch.no_grad():
        u, (h, c) = block.recurrence(x, (h0, c0))
        u_ref, h_ref, c_ref = literal_ln_lstm(block.lstm, x, h0[0], c0[0])
        zeros = block.recurrence(x, None)[0]
        zeros_ref = literal_ln_lstm(block.lstm, x, torch.zeros_like(h0[0]), torch.zeros_like(c0[0]))[0]
    for ours, theirs in ((u, u_ref), (h[0], h_ref), (c[0], c_ref), (zeros, zeros_ref)):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert h.shape == c.shape == (1, 3, 16)
    assert u.abs().max() > 1e-2


@pytest.mark.parametrize("T", [1, 7])
def test_ln_lstm_gradients_through_its_written_out_backward_are_autograds_of_the_equations(T):
    """The recurrence's one autograd node (its backward written out) gives, in float64, the
    gradients autograd gives for the literal equations: of the input, the state and every
    weight, for a loss that reads every output, the last h and the last c."""
    cell = small_model(cell="ln_lstm").double().blocks[0].lstm
    with torch.no_grad():
        for p in cell.parameters():
            p.add_(0.3 * torch.randn_like(p))  # LayerNorm gains and biases off their initial 1 and 0
    torch.manual_seed(2)
    x, h0, c0 = (torch.randn(*shape).double().requires_grad_() for shape in ((T, 3, 16), (1, 3, 16), (1, 3, 16)))
    leaves = [x, h0, c0, *cell.parameters()]

    def gradients(run) -> list[torch.Tensor]:
        u, h, c = run()
        weights = torch.arange(u.numel(), dtype=u.dtype).view_as(u).sin()
        return torch.autograd.grad((u * weights).sum() + 1.3 * h.sum() + (c * c).sum(), leaves)

    ours = gradients(lambda: (lambda u, s: (u, s[0][0], s[1][0]))(*cell(x, (h0, c0))))
    literal = gradients(lambda: literal_ln_lstm(cell, x, h0[0], c0[0]))
    for got, expected in zip(ours, literal, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    assert all(g.abs().max() > 1e-3 for g in ours)


def test_ln_lstm_starts_as_the_lstm_does_and_runs_under_bf16_autocast():
    model = SHARNN(SHARNNConfig(d_model=16, n_layers=2, boom_dim=32, attention_span=32, cell="ln_lstm"))
    cell = model.blocks[0].lstm
    bound = 1 / 16**0.5
    assert all(p.abs().max() <= bound and p.std() > 0.5 * bound / 3**0.5 for p in (cell.weight_ih, cell.bias))
    for norm in (cell.ln_ih, cell.ln_hh, cell.ln_cell):
        assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.count_nonzero(norm.bias) == 0
    tokens = torch.randint(0, V, (9, 2), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, state = model(tokens[:-1])
        F.cross_entropy(logits.float().reshape(-1, V), tokens[1:].reshape(-1)).backward()
    assert all(t.dtype == torch.float32 for hc in state.lstm for t in hc)  # the state reads as in fp32
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_vector_value_gate_is_the_sigmoid_of_a_vector_that_starts_at_zero():
    fresh = SHARNN(SHARNNConfig(d_model=16, n_layers=2, boom_dim=32, attention_span=32, value_gate="vector"))
    head = fresh.blocks[0].attention.head
    assert torch.equal(head.value_gate_vector(), torch.full((16,), 0.5))
    assert not hasattr(head, "value_gate_net")
    head = small_model(value_gate="vector").blocks[0].attention.head
    torch.manual_seed(2)
    r, kv = torch.randn(5, 2, 16), torch.randn(8, 2, 16)  # 3 positions of memory, then the window
    with torch.no_grad():
        Q = torch.sigmoid(head.gate_q) * ln(r @ head.query.weight.T + head.query.bias, head.ln_query)
        K, Vg = torch.sigmoid(head.gate_k) * kv, torch.sigmoid(head.gate_v) * kv
        scores = torch.einsum("tbd,sbd->bts", Q, K) / 4.0  # sqrt(d)
        scores = scores.masked_fill(~torch.ones(5, 8, dtype=torch.bool).tril(3), float("-inf"))
        expected = torch.einsum("bts,sbd->tbd", scores.softmax(-1), Vg)
        torch.testing.assert_close(head(r, kv), expected, atol=1e-6, rtol=0)


def test_collapse_of_the_vector_gate_keeps_outputs_and_parameter_count():
    model = small_model(value_gate="vector", attention="all")
    tokens = torch.randint(0, V, (12, 2), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, count = model(tokens)[0], model.num_parameters()
        assert model.num_parameters(collapsed=True) == count  # the d-vector gate_v becomes the d-vector g_v
        model.collapse()
        torch.testing.assert_close(model(tokens)[0], before, atol=1e-7, rtol=0)
    assert model.num_parameters() == count and model.config.collapsed
    reloaded = SHARNN(model.config).eval()
    reloaded.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens)[0], before, atol=1e-7, rtol=0)


def test_mlp_feed_forward_is_up_gelu_down_between_the_same_layer_norms():
    feed_forward = small_model(feed_forward="mlp").blocks[0].feed_forward
    assert feed_forward.boom is None and isinstance(feed_forward.mlp, MLP)
    torch.manual_seed(4)
    y = torch.randn(5, 3, 16)
    mlp = feed_forward.mlp
    with torch.no_grad():
        hidden = gelu(ln(y, feed_forward.ln_xff) @ mlp.up.weight.T + mlp.up.bias)  # [T, B, F]
        expected = ln(y, feed_forward.ln_ff) + hidden @ mlp.down.weight.T + mlp.down.bias
        torch.testing.assert_close(feed_forward(y), expected, atol=1e-6, rtol=0)
    assert mlp.up.weight.shape == (32, 16) and mlp.down.weight.shape == (16, 32)


def test_mlp_starts_as_the_boom_linear_does():
    torch.manual_seed(0)
    model = SHARNN(SHARNNConfig(d_model=128, n_layers=1, boom_dim=512, attention="none", feed_forward="mlp"))
    mlp = model.blocks[0].feed_forward.mlp
    for linear in (mlp.up, mlp.down):
        assert linear.weight.std().item() == pytest.approx(0.1 / 128**0.5, rel=0.05)
        assert torch.count_nonzero(linear.bias) == 0


# ----------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("cell", ["lstm", "ln_lstm"])
@pytest.mark.parametrize("value_gate", ["overparam", "vector"])
@pytest.mark.parametrize("feed_forward", ["boom", "mlp"])
def test_parameter_counts_by_part_follow_the_formulas(cell, value_gate, feed_forward):
    d, F_, n = 1024, 4096, 4
    with torch.device("meta"):
        model = SHARNN(SHARNNConfig(cell=cell, value_gate=value_gate, feed_forward=feed_forward))
    lstm = 8 * d * d + 8 * d if cell == "lstm" else 8 * d * d + 4 * d + 2 * (2 * 4 * d) + 2 * d  # + LN_ih, LN_hh, LN_c
    gate_net = 2 * d * d + 2 * d if value_gate == "overparam" else 0
    inner = d * F_ + F_ if feed_forward == "boom" else d * F_ + F_ + F_ * d + d
    counts = {
        "embedding + output bias": V * d + V,
        cell: n * lstm,
        "attention": (d * d + d) + 2 * d + 3 * d + gate_net,  # query, LN_q, gates, value-gate network
        feed_forward: n * inner,
        "layernorm": n * 3 * 2 * d + 2 * 2 * d,
    }
    assert model.parameter_counts() == counts
    assert model.num_parameters() == sum(counts.values())
    assert model.num_parameters(collapsed=True) == sum(counts.values()) - gate_net


def test_a_bad_variant_is_one_line(tmp_path):
    assert_user_error(
        cli("train", "--preset", "tiny", "--out", tmp_path / "run", "model.cell=gru"), "model.cell", "gru"
    )
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- the commands


@pytest.mark.slow
@pytest.mark.parametrize("variant", [*VARIANTS, "model.attention=none", "model.attention=all"])
def test_a_variant_trains_resumes_exactly_after_kill_9_exports_and_reloads(tmp_path, corpus_file, variant):
    """Every SHA-RNN variant of the ablation grid (benchmarks/ablations.yaml; the
    optimizer's are in test_train.py, the Transformer's in test_transformer.py)."""
    settings = [*RESUMABLE, f"data={corpus_file}", variant]
    reference, run_dir = tmp_path / "reference", tmp_path / "killed"
    with single_thread():
        assert_ok(cli("train", "--preset", "tiny", "--out", reference, "--quiet", *settings))
    process = sharnn_process("train", "--preset", "tiny", "--out", run_dir, "--quiet", *settings)
    _, stderr = signal_when(
        process, lambda: (run_dir / "latest").exists() and checkpoint_step(run_dir / "latest") >= 12, signal.SIGKILL
    )
    assert process.returncode in (-signal.SIGKILL, 0) and "Traceback" not in stderr, stderr
    with single_thread():
        assert_ok(cli("train", "--resume", run_dir, "--quiet"))
    for link in ("best", "latest"):
        assert checkpoint_step(run_dir / link) == checkpoint_step(reference / link)
        assert_same_weights(run_dir / link, reference / link)

    key, value = variant.removeprefix("model.").split("=")
    assert_ok(cli("export", run_dir, "--out", tmp_path / "exported"))
    assert json.loads((tmp_path / "exported" / "config.json").read_text())[key] == value
    exported, trained = SHARNN.from_pretrained(tmp_path / "exported"), load_model(run_dir)[0].eval()
    tokens = torch.randint(0, V, (16, 2), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(exported(tokens)[0], trained(tokens)[0])
    info = cli("info", run_dir)
    assert_ok(info)
    parts = set(re.findall(r"^  ([a-z_ +]+?) {2,}[\d,]+$", info.stdout, re.MULTILINE))  # "  name   12,345"
    cell, feed_forward = ("ln_lstm" if value == "ln_lstm" else "lstm"), ("mlp" if value == "mlp" else "boom")
    attention = set() if value == "none" else {"attention"}
    assert parts == {"embedding + output bias", cell, feed_forward, "layernorm"} | attention
    assert f"{exported.num_parameters():,} trainable" in info.stdout


def test_the_model_card_names_a_variant_and_keeps_the_papers_card(tmp_path):
    """The card of a variant says what differs from the paper's model; the paper's own
    card has no such rows."""
    variant = SHARNN(SHARNNConfig(d_model=16, n_layers=2, boom_dim=32, attention_span=16, **dict(VARIANT_SETTINGS)))
    variant.save_pretrained(tmp_path / "variant")
    card = (tmp_path / "variant" / "README.md").read_text()
    assert "| LSTM cell | `ln_lstm`" in card and "| feed-forward | `mlp`" in card
    assert "a learned vector through a sigmoid" in card
    small_model().save_pretrained(tmp_path / "paper")
    card = (tmp_path / "paper" / "README.md").read_text()
    assert "| LSTM cell" not in card and "| feed-forward" not in card and "value-gate network |" in card


def test_info_counts_a_variant_given_as_settings(tmp_path):
    """`sharnn info PRESET KEY=VALUE...` shows the variant's parts and total; settings with
    a folder are refused in one line (they would describe another model than the folder's)."""
    result = cli("info", "ablation-small", "model.feed_forward=mlp", "model.cell=ln_lstm")
    assert_ok(result)
    model = load_config("ablation-small", ["model.feed_forward=mlp", "model.cell=ln_lstm"]).model
    assert f"parameters: {parameter_count(model):,} trainable" in result.stdout
    assert re.search(r"^  mlp +[\d,]+$", result.stdout, re.MULTILINE)
    assert re.search(r"^  ln_lstm +[\d,]+$", result.stdout, re.MULTILINE)
    assert_user_error(cli("info", tmp_path, "model.cell=ln_lstm"), "is a folder", "preset")
    assert_user_error(cli("info", "ablation-small", "model.cell=gru"), "model.cell", "gru")
