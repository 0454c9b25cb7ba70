"""Tests of the SHA-RNN model (src/sharnn/models/sharnn.py) against the equations of docs/model.md.

The "literal" helpers below re-derive the equations step by step (an explicit LSTM cell,
explicit gates, a per-stream softmax loop, a loop-built mask) using only the model's
parameters, so that the model's folded/fused code is checked against the text.
"""

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from sharnn.errors import ConfigError
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN, Boom, State, causal_mask, gelu

V = 256


# ----------------------------------------------------------------------------- helpers


def small_config(**overrides) -> SHARNNConfig:
    values = dict(
        vocab_size=V,
        d_model=16,
        n_layers=3,
        boom_dim=32,
        attention="single",
        attention_span=32,
        dropouti=0.1,
        dropouth=0.1,
        dropouto=0.1,
    )
    values.update(overrides)
    return SHARNNConfig(**values)


def make_model(seed: int = 0, perturb: float = 0.2, **overrides) -> SHARNN:
    """A small model in eval mode. With ``perturb``, every parameter gets Gaussian noise
    and the attention gates are drawn at random, so that no gate sits at its (symmetric)
    initial value and every term of the equations is exercised."""
    torch.manual_seed(seed)
    model = SHARNN(small_config(**overrides))
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * perturb)
            for block in model.blocks:
                if block.attention is not None:
                    for name in ("gate_q", "gate_k", "gate_v"):
                        getattr(block.attention.head, name).normal_(0.0, 1.0)
    return model.eval()


def random_tokens(T: int, B: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (T, B), generator=g)


def run_windows(model, tokens, lengths, state=None):
    """Feed ``tokens`` as consecutive windows of the given lengths, carrying the state."""
    assert sum(lengths) == tokens.shape[0]
    outputs, pos = [], 0
    for T in lengths:
        logits, state = model(tokens[pos : pos + T], state)
        outputs.append(logits)
        pos += T
    return torch.cat(outputs), state


def assert_same(a, b):
    """Bit for bit: the same computation on the same values (or a promise of exactness)."""
    torch.testing.assert_close(a, b, atol=0, rtol=0)


# Two float32 computations of one function (the model's folded, fused code against the
# literal equations; one window against several) round differently: a sum of d terms
# added in another order (another kernel, another blocking: it differs from CPU to CPU)
# differs by a few float32 ulps (eps = 1.2e-7) times sqrt(d) of the size of its terms, and
# the LayerNorms, softmaxes and the LSTM's recurrence over up to 40 positions carry that
# on. So the difference is bounded relative to the tensor's scale (its largest value),
# not to each element: a value near zero computed from terms of size 1 is as uncertain as
# they are. FLOAT32_RTOL = 1e-5, about 80 ulps, allowed relative to each element and
# again to the tensor's scale: the largest differences measured are 5 ulps of the scale
# on an AMD CPU (one window against several) and 16 ulps on an Intel CPU with AMX (an
# LSTM block's h against its literal form). A real mistake (a wrong sign, a missing term,
# a wrong scale) moves outputs by percents of their scale, a thousand times more: the
# tests below check that deliberately wrong variants fail this tolerance.
FLOAT32_RTOL = 1e-5


def float32_tolerance(expected) -> dict:
    """``assert_close``'s rtol and atol for ``expected`` computed in float32 another way."""
    return dict(rtol=FLOAT32_RTOL, atol=FLOAT32_RTOL * expected.abs().max().item())


def assert_float32_close(actual, expected):
    """``actual`` and ``expected`` are one function computed in float32 in two ways (or
    ``expected`` exactly, in float64): equal up to float32 rounding (see FLOAT32_RTOL)."""
    torch.testing.assert_close(actual, expected, **float32_tolerance(expected))


def assert_not_float32_close(actual, wrong):
    """A deliberately wrong variant ``wrong`` of ``actual``'s function fails the tolerance
    of :func:`assert_float32_close`, with a margin of ten."""
    excess = (actual - wrong).abs() - 10 * (float32_tolerance(wrong)["atol"] + FLOAT32_RTOL * wrong.abs())
    assert excess.max().item() > 0, "a wrong variant passes the float32 tolerance"


def assert_differs(a, b, min_diff=1e-4):
    assert (a - b).abs().max().item() > min_diff


def ln(x, module: nn.LayerNorm):
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * gain + bias."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


def literal_lstm(lstm: nn.LSTM, x, state=None):
    """One LSTM layer, one time step at a time (gate order i, f, g, o)."""
    T, B, d = x.shape
    if state is None:
        h, c = x.new_zeros(B, d), x.new_zeros(B, d)
    else:
        h, c = state[0][0], state[1][0]
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0
    outputs = []
    for t in range(T):
        gates = x[t] @ lstm.weight_ih_l0.T + h @ lstm.weight_hh_l0.T + bias
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), (h[None], c[None])


def literal_value_gate(attn):
    """[c ; f] = value_gate_net(sigmoid(gate_v)), c the first d outputs; g_v = sigmoid(f) tanh(c)."""
    d = attn.gate_q.numel()
    out = attn.value_gate_net.weight @ torch.sigmoid(attn.gate_v) + attn.value_gate_net.bias
    c, f = out[:d], out[d:]
    return torch.sigmoid(f) * torch.tanh(c)


def literal_attention(attn, r, kv, allowed):
    """The attention head in eval mode, gates applied exactly where the text puts them.
    ``allowed`` is a ``[T, S]`` bool matrix, True where query t may see key s."""
    d = r.shape[-1]
    Q = torch.sigmoid(attn.gate_q) * ln(r @ attn.query.weight.T + attn.query.bias, attn.ln_query)
    K = torch.sigmoid(attn.gate_k) * kv
    Vg = literal_value_gate(attn) * kv
    out = torch.empty_like(r)
    for b in range(r.shape[1]):
        scores = Q[:, b] @ K[:, b].T / math.sqrt(d)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[:, b] = torch.softmax(scores, dim=-1) @ Vg[:, b]
    return out


def literal_boom(boom, x):
    """Boom: Linear(d -> F), x * sigmoid(1.702 x), chunk n = features n*d .. n*d+d-1, summed."""
    h = x @ boom.linear.weight.T + boom.linear.bias
    h = h * torch.sigmoid(1.702 * h)
    d = x.shape[-1]
    return sum(h[..., n * d : (n + 1) * d] for n in range(h.shape[-1] // d))


def bottom_right_mask(T: int, M: int) -> torch.Tensor:
    allowed = torch.zeros(T, M + T, dtype=torch.bool)
    for t in range(T):
        for s in range(M + T):
            allowed[t, s] = s < M or s - M <= t
    return allowed


def literal_block(block, x, lstm_state=None, memory=None, allowed=None):
    """u = LSTM(LN_start(x)); y = LN_mid(u) + Attn(LN_mid(u), [mem ; LN_mem(u)]);
    z = LN_ff(y) + Boom(LN_xff(y)). Incoming memory is cut to its last span - T positions.
    Returns (z, (h, c), keys/values)."""
    u, new_state = literal_lstm(block.lstm, ln(x, block.ln_start), lstm_state)
    kv = None
    if block.attention is None:
        y = u
    else:
        attention = block.attention
        r, s = ln(u, attention.ln_mid), ln(u, attention.ln_mem)
        if memory is not None:
            keep = attention.span - x.shape[0]
            memory = memory[memory.shape[0] - min(keep, memory.shape[0]) :]
            kv = torch.cat([memory, s])
        else:
            kv = s
        if allowed is None:
            allowed = bottom_right_mask(x.shape[0], kv.shape[0] - x.shape[0])
        y = r + literal_attention(attention.head, r, kv, allowed)
    ff = block.feed_forward
    z = ln(y, ff.ln_ff) + literal_boom(ff.boom, ln(y, ff.ln_xff))
    return z, new_state, kv


def literal_model(model, tokens, lengths):
    """The whole text at once, as the windows ``lengths`` would see it: a query in the window
    starting at p with length T sees positions max(0, p + T - span) .. itself (memory keeps
    everything up to the span and is cut to span - T on entry)."""
    L, span = tokens.shape[0], model.config.attention_span
    allowed = torch.zeros(L, L, dtype=torch.bool)
    p = 0
    for T in lengths:
        first = max(0, p + T - span)
        for t in range(T):
            allowed[p + t, first : p + t + 1] = True
        p += T
    x = model.embedding.weight[tokens]
    for block in model.blocks:
        x, _, _ = literal_block(block, x, allowed=allowed)
    return x @ model.embedding.weight.T + model.output_bias


def wrong_blocks(block):
    """Copies of ``block``, each with one deliberate mistake: the LSTM's second bias missing
    (a missing term), LN_ff's bias negated (a wrong sign) and, in an attention block, the
    scores scaled by 1/d instead of 1/sqrt(d) (a wrong scale: the query a quarter, d = 16)."""
    with torch.no_grad():
        missing = copy.deepcopy(block)
        missing.lstm.bias_hh_l0.zero_()
        yield "missing LSTM bias", missing
        sign = copy.deepcopy(block)
        sign.feed_forward.ln_ff.bias.neg_()
        yield "negated LN_ff bias", sign
        if block.attention is not None:
            scale = copy.deepcopy(block)
            head = scale.attention.head
            head.ln_query.weight.div_(math.sqrt(head.gate_q.numel()))
            head.ln_query.bias.div_(math.sqrt(head.gate_q.numel()))
            yield "scores over d", scale


def attention_block(model):
    return next(b for b in model.blocks if b.attention is not None)


# ----------------------------------------------------------------------------- causality


@pytest.mark.parametrize("attention", ["single", "all"])
def test_future_byte_never_changes_earlier_outputs_within_a_window(attention):
    model = make_model(attention=attention)
    tokens = random_tokens(20)
    changed = tokens.clone()
    changed[12, 0] = (changed[12, 0] + 1) % V
    with torch.no_grad():
        a, _ = model(tokens)
        b, _ = model(changed)
    assert_same(a[:12], b[:12])
    assert_differs(a[12:, 0], b[12:, 0])
    assert_same(a[:, 1], b[:, 1])  # the other stream is independent


@pytest.mark.parametrize("attention", ["single", "all"])
def test_future_byte_never_changes_earlier_outputs_across_windows(attention):
    model = make_model(attention=attention)
    w1, w2 = random_tokens(12, seed=1), random_tokens(10, seed=2)
    with torch.no_grad():
        out1, state = model(w1)
        out2, _ = model(w2, state)
        for pos in (3, 8):  # early and late in window 2
            changed = w2.clone()
            changed[pos, 0] = (changed[pos, 0] + 7) % V
            out1_again, state_again = model(w1)
            out2_changed, _ = model(changed, state_again)
            assert_same(out1_again, out1)
            assert_same(out2_changed[:pos], out2[:pos])  # the same computation, as within a window
            assert_differs(out2_changed[pos:, 0], out2[pos:, 0])


@pytest.mark.parametrize("attention", ["none", "single", "all"])
def test_changing_window_one_changes_window_two_through_state_and_memory(attention):
    model = make_model(attention=attention)
    w1, w2 = random_tokens(12, seed=1), random_tokens(10, seed=2)
    changed = w1.clone()
    changed[0, 0] = (changed[0, 0] + 1) % V  # the first byte: far from window 2
    with torch.no_grad():
        _, state = model(w1)
        _, state_changed = model(changed)
        out2, _ = model(w2, state)
        out2_changed, _ = model(w2, state_changed)
    assert_differs(out2[:, 0], out2_changed[:, 0], min_diff=1e-6)
    assert_same(out2[:, 1], out2_changed[:, 1])


def test_memory_alone_carries_information_into_the_next_window():
    model = make_model(attention="single")
    with torch.no_grad():
        _, state = model(random_tokens(12, seed=1))
        i = model.config.attention_blocks()[0]
        other = State(lstm=state.lstm, memory=list(state.memory))
        other.memory[i] = state.memory[i] + 0.5 * torch.randn_like(state.memory[i])
        w2 = random_tokens(6, seed=2)
        assert_differs(model(w2, state)[0], model(w2, other)[0])


# ----------------------------------------------------------------------------- windows and memory


@pytest.mark.parametrize("attention", ["single", "all"])
@pytest.mark.parametrize("lengths", [[7, 13, 1, 19], [20, 20], [5] * 8, [1, 1, 38], [1] * 40])
def test_one_window_equals_several_windows_within_the_span(attention, lengths):
    """With L <= span every query sees every earlier position either way. Windows of one
    position run the LSTM through its cell (generation, compression)."""
    model = make_model(attention=attention, attention_span=40)
    tokens = random_tokens(40)
    with torch.no_grad():
        whole, whole_state = model(tokens)
        chunked, chunked_state = run_windows(model, tokens, lengths)
    assert_float32_close(chunked, whole)
    for (h1, c1), (h2, c2) in zip(whole_state.lstm, chunked_state.lstm):
        assert_float32_close(h2, h1)
        assert_float32_close(c2, c1)
    for m1, m2 in zip(whole_state.memory, chunked_state.memory):
        assert (m1 is None) == (m2 is None)
        if m1 is not None:
            assert_float32_close(m2, m1)


@pytest.mark.parametrize("attention", ["single", "all"])
@pytest.mark.parametrize("lengths", [[10, 7, 13, 5, 12, 9], [8] * 7, [24, 24, 8]])
def test_windows_beyond_the_span_match_a_literal_recomputation(attention, lengths):
    """For L > span each window sees the last span - T earlier positions; recompute that from
    the equations over the whole text with an explicit per-window visibility mask."""
    model = make_model(attention=attention, attention_span=24)
    tokens = random_tokens(sum(lengths))
    with torch.no_grad():
        chunked, _ = run_windows(model, tokens, lengths)
        literal = literal_model(model, tokens, lengths)
    assert_float32_close(chunked, literal)


def test_one_window_literal_recomputation_matches_model():
    model = make_model(attention="all", attention_span=40)
    tokens = random_tokens(30)
    with torch.no_grad():
        assert_float32_close(model(tokens)[0], literal_model(model, tokens, [30]))


def test_memory_length_and_content_after_each_window():
    span = 24
    model = make_model(attention="single", attention_span=span)
    i = model.config.attention_blocks()[0]
    stored = []
    model.blocks[i].attention.ln_mem.register_forward_hook(lambda mod, args, out: stored.append(out))
    tokens = random_tokens(61)
    state, pos, expected_len, previous = None, 0, 0, None
    with torch.no_grad():
        for T in [5, 8, 10, 7, 3, 24, 4]:
            _, state = model(tokens[pos : pos + T], state)
            pos += T
            expected_len = min(expected_len + T, span)
            memory = state.memory[i]
            assert memory.shape == (expected_len, 2, 16)
            assert_same(memory[-T:], stored[-1])  # this window's LN_mem(u)
            if previous is not None and expected_len > T:
                assert_same(memory[:-T], previous[-(expected_len - T) :])
            assert all(m is None for j, m in enumerate(state.memory) if j != i)
            previous = memory


def test_stored_memory_is_detached_in_training():
    model = make_model(attention="all").train()
    _, state = model(random_tokens(8))
    assert all(not m.requires_grad for m in state.memory)


@pytest.mark.parametrize("attention", ["single", "all"])
def test_a_longer_span_set_after_training_reads_the_whole_past_like_one_window(attention):
    """The head has no position encoding (§3.1), so a model made with a span of 16 reads
    a memory of 40 once set to it: windows then equal one pass over the whole text, which
    they do not at the span it was made with."""
    model = make_model(attention=attention, attention_span=16)
    tokens = random_tokens(40)
    with torch.no_grad():
        short, _ = run_windows(model, tokens, [8] * 5)
        model.set_attention_span(40)
        whole, _ = model(tokens)
        chunked, state = run_windows(model, tokens, [8] * 5)
    assert_float32_close(chunked, whole)
    assert_differs(short[16:], whole[16:], min_diff=1e-4)
    assert_same(short[:16], chunked[:16])  # within the old span nothing changes
    i = model.config.attention_blocks()[0]
    assert state.memory[i].shape[0] == 40 and model.config.attention_span == 40


def test_a_shorter_span_cuts_the_memory_a_longer_one_left():
    """Memory carried from a span of 40 is cut to the new span's last span - T positions:
    the same as a model that ran at the shorter span throughout, from that window on
    (the head in the last block, so that no LSTM state depends on the span)."""
    model = make_model(attention=[2], attention_span=40)
    tokens = random_tokens(40)
    with torch.no_grad():
        _, state = run_windows(model, tokens[:32], [8] * 4)
        model.set_attention_span(16)
        after, _ = model(tokens[32:], state)
        reference = literal_model(model, tokens, [8] * 5)[32:]
    assert_float32_close(after, reference)
    with pytest.raises(ConfigError, match="attention_span must be >= 1"):
        model.set_attention_span(0)
    assert model.config.attention_span == 16


@pytest.mark.parametrize("T", [1, 8, 20, 24])
def test_next_window_sees_exactly_the_last_span_minus_T_memory_positions(T):
    span = 24
    model = make_model(attention="single", attention_span=span)
    i = model.config.attention_blocks()[0]
    with torch.no_grad():
        _, state = run_windows(model, random_tokens(30, seed=1), [10, 10, 10])
        assert state.memory[i].shape[0] == span
        window = random_tokens(T, seed=2)
        reference, _ = model(window, state)
        first_kept = state.memory[i].shape[0] - (span - T)  # older positions are dropped

        def perturbed(position):
            memory = state.memory[i].clone()
            memory[position] += 3.0 * torch.randn_like(memory[position])
            changed = State(lstm=state.lstm, memory=list(state.memory))
            changed.memory[i] = memory
            return model(window, changed)[0]

        assert_same(perturbed(first_kept - 1), reference)
        assert_same(perturbed(0), reference)
        if first_kept < span:
            assert_differs(perturbed(first_kept), reference, min_diff=1e-6)


def test_causal_mask_is_bottom_right_aligned():
    for T, M in [(4, 0), (4, 3), (1, 5), (5, 1)]:
        mask = causal_mask(T, M)
        assert mask.shape == (T, M + T)
        assert mask.dtype == torch.bool
        assert torch.equal(mask, bottom_right_mask(T, M))
    assert torch.equal(causal_mask(3, 0), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))


# ----------------------------------------------------------------------------- equations


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("M", [0, 6])
def test_attention_matches_literal_equations(M, implementation):
    """Both implementations fold the key gate into the query and apply the value gate after
    the sum; the literal text gates keys and values. Same function, in float32."""
    model = make_model(attention="single").set_attn_implementation(implementation)
    attn = attention_block(model).attention.head
    torch.manual_seed(3)
    T, B, d = 7, 3, 16
    r, kv = torch.randn(T, B, d), torch.randn(M + T, B, d)
    allowed = bottom_right_mask(T, M)
    with torch.no_grad():
        out = attn(r, kv)
        ref = copy.deepcopy(attn).double()
        expected = literal_attention(ref, r.double(), kv.double(), allowed)
        ref.ln_query.weight.div_(math.sqrt(d))  # a wrong scale: the scores over d, not sqrt(d)
        ref.ln_query.bias.div_(math.sqrt(d))
        wrong = literal_attention(ref, r.double(), kv.double(), allowed)
    assert_float32_close(out.double(), expected)  # float32 against float64
    assert_not_float32_close(out.double(), wrong)
    assert expected.abs().max() > 1e-2  # the comparison is not between two near-zero tensors


def test_value_gate_uses_first_half_as_c_and_second_half_as_f():
    attn = attention_block(make_model()).attention.head
    with torch.no_grad():
        assert_float32_close(attn.value_gate_vector(), literal_value_gate(attn))
        d = attn.gate_q.numel()
        out = attn.value_gate_net(torch.sigmoid(attn.gate_v))
        swapped = torch.sigmoid(out[:d]) * torch.tanh(out[d:])
        assert_differs(attn.value_gate_vector(), swapped, min_diff=1e-3)


@pytest.mark.parametrize("has_attention", [True, False])
@pytest.mark.parametrize("M", [0, 5, 30])
def test_block_matches_literal_equations(has_attention, M):
    model = make_model(attention="single", attention_span=32)
    i = model.config.attention_blocks()[0]
    block = model.blocks[i if has_attention else i + 1]
    torch.manual_seed(4)
    T, B, d = 6, 2, 16
    x = torch.randn(T, B, d)
    state = (torch.randn(1, B, d), torch.randn(1, B, d))
    memory = torch.randn(M, B, d) if M else None
    with torch.no_grad():
        z, (h, c), new_memory = block(x, state, memory)
        z_ref, (h_ref, c_ref), kv_ref = literal_block(block, x, state, memory)
    assert_float32_close(z, z_ref)
    assert_float32_close(h, h_ref)
    assert_float32_close(c, c_ref)
    if has_attention:
        assert new_memory.shape[0] == min(M + T, 32)
        assert_float32_close(new_memory, kv_ref)
    else:
        assert new_memory is None
    for mistake, wrong in wrong_blocks(block):
        z_wrong, (h_wrong, c_wrong), _ = literal_block(wrong, x, state, memory)
        changed = (z_wrong, h_wrong, c_wrong) if mistake == "missing LSTM bias" else (z_wrong,)
        for ours, theirs in zip((z, h, c), changed):
            assert_not_float32_close(ours, theirs)


def test_gelu_is_the_sigmoid_approximation():
    x = torch.linspace(-6, 6, 101)
    assert_float32_close(gelu(x), x * torch.sigmoid(1.702 * x))
    assert_differs(gelu(x), F.gelu(x), min_diff=1e-3)  # not erf-GELU


def test_boom_is_linear_gelu_and_chunk_sum_without_down_projection():
    torch.manual_seed(5)
    boom = Boom(d_model=8, boom_dim=32, dropout=0.0)
    nn.init.normal_(boom.linear.weight)
    nn.init.normal_(boom.linear.bias)
    x = torch.randn(5, 3, 8)
    assert_float32_close(boom(x), literal_boom(boom, x))
    assert sorted(n for n, _ in boom.named_parameters()) == ["linear.bias", "linear.weight"]
    assert boom.linear.weight.shape == (32, 8)


def test_output_is_tied_to_the_embedding():
    model = make_model(perturb=0.0, attention="none")
    shapes = [p.shape for p in model.parameters()]
    assert shapes.count(torch.Size([V, 16])) == 1
    tokens = torch.zeros(8, 2, dtype=torch.long)  # only byte 0 is ever embedded
    logits, _ = model(tokens)
    logits[..., 200].sum().backward()
    # row 200 is reached only through the output projection
    assert model.embedding.weight.grad[200].abs().sum() > 0
    assert model.embedding.weight.grad[201].abs().sum() == 0


# ----------------------------------------------------------------------------- initialisation


@pytest.fixture(scope="module")
def wide_model():
    torch.manual_seed(0)
    return SHARNN(SHARNNConfig(d_model=192, n_layers=2, boom_dim=384, attention="all", attention_span=16))


def test_embedding_and_linear_weights_are_normal_with_std_point_one_over_sqrt_d(wide_model):
    std = 0.1 / math.sqrt(192)
    linears = [m for m in wide_model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 3  # boom, query, value-gate network in each block
    for weight in [wide_model.embedding.weight] + [m.weight for m in linears]:
        assert weight.std().item() == pytest.approx(std, rel=0.05)
        assert abs(weight.mean().item()) < 0.05 * std
    for m in linears:
        assert torch.count_nonzero(m.bias) == 0


def test_layer_norms_start_at_gain_one_bias_zero_eps_1e_12(wide_model):
    norms = [m for m in wide_model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * (3 + 2 + 1)  # start/ff/xff, mid/mem, query
    for m in norms:
        assert torch.equal(m.weight, torch.ones_like(m.weight))
        assert torch.equal(m.bias, torch.zeros_like(m.bias))
        assert m.eps == 1e-12


def test_lstm_keeps_pytorch_default_uniform_init(wide_model):
    bound = 1 / math.sqrt(192)
    for block in wide_model.blocks:
        for name, p in block.lstm.named_parameters():
            assert p.abs().max().item() <= bound
            if name.startswith("weight"):
                assert p.std().item() == pytest.approx(1 / math.sqrt(3 * 192), rel=0.05)
            else:
                assert p.std().item() > 0.5 / math.sqrt(3 * 192)


def test_gates_and_output_bias_start_at_zero(wide_model):
    for block in wide_model.blocks:
        for name in ("gate_q", "gate_k", "gate_v"):
            assert torch.count_nonzero(getattr(block.attention.head, name)) == 0
    assert torch.count_nonzero(wide_model.output_bias) == 0


def test_initial_loss_is_close_to_log_vocab():
    torch.manual_seed(0)
    model = SHARNN(small_config(d_model=64, n_layers=2, boom_dim=128, attention_span=64)).eval()
    tokens = random_tokens(65, B=4)
    with torch.no_grad():
        logits, _ = model(tokens[:-1])
    loss = F.cross_entropy(logits.reshape(-1, V), tokens[1:].reshape(-1))
    assert loss.item() == pytest.approx(math.log(V), abs=0.05)


# ----------------------------------------------------------------------------- parameter counts


def formula_count(d, F_, n_layers, n_attention, vocab=V, collapsed=False):
    """Per-component counts with V = 256 (docs/model.md, "Collapse")."""
    lstm = 8 * d * d + 8 * d
    boom = d * F_ + F_
    block_norms = 3 * 2 * d
    attention = (d * d + d) + 2 * d + 3 * d + 2 * 2 * d  # query, LN_q, gates, ln_mid + ln_mem
    if not collapsed:
        attention += 2 * d * d + 2 * d  # value-gate network
    return vocab * d + vocab + n_layers * (lstm + boom + block_norms) + n_attention * attention


def meta_model(**overrides):
    with torch.device("meta"):
        return SHARNN(SHARNNConfig(**overrides))


def test_paper_model_parameter_count():
    model = meta_model()
    assert model.num_parameters() == 53_825_792
    assert model.num_parameters(collapsed=True) == 51_726_592
    assert model.num_parameters() == formula_count(1024, 4096, 4, 1)


@pytest.mark.parametrize("attention, n_attention", [("none", 0), ("single", 1), ("all", 4), ([0, 2], 2)])
def test_parameter_counts_follow_the_per_component_formulas(attention, n_attention):
    model = meta_model(attention=attention)
    assert model.num_parameters() == formula_count(1024, 4096, 4, n_attention)
    assert model.num_parameters(collapsed=True) == formula_count(1024, 4096, 4, n_attention, collapsed=True)


def test_parameter_counts_by_part_add_up_to_the_total():
    d, F_ = 1024, 4096
    model = meta_model()
    assert model.parameter_counts() == {
        "embedding + output bias": V * d + V,
        "lstm": 4 * (8 * d * d + 8 * d),
        "attention": (d * d + d) + 2 * d + 3 * d + (2 * d * d + 2 * d),  # query, LN_q, gates, value-gate network
        "boom": 4 * (d * F_ + F_),
        "layernorm": 4 * 3 * 2 * d + 2 * 2 * d,  # start/ff/xff in every block, mid/mem in the attention block
    }
    assert sum(model.parameter_counts().values()) == model.num_parameters()


# ----------------------------------------------------------------------------- collapse


def test_collapse_keeps_outputs_and_drops_the_value_gate_network():
    model = make_model(attention="all")
    d, n_attention = 16, 3
    tokens = random_tokens(20)
    with torch.no_grad():
        before, _ = run_windows(model, tokens, [12, 8])
        count_before = model.num_parameters()
        expected_collapsed = model.num_parameters(collapsed=True)
        model.collapse()
        after, _ = run_windows(model, tokens, [12, 8])
    assert_same(after, before)  # exactly: the same vector (docs/model.md, "Collapse")
    assert model.num_parameters() == count_before - n_attention * (2 * d * d + 2 * d)
    assert model.num_parameters() == expected_collapsed
    assert model.config.collapsed is True
    assert all(not hasattr(b.attention.head, "value_gate_net") for b in model.blocks)

    fresh = SHARNN(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert_same(run_windows(fresh, tokens, [12, 8])[0], before)


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "attention, n_layers, expected",
    [
        ("none", 3, []),
        ("single", 3, [1]),
        ("single", 4, [2]),
        ("single", 2, [0]),
        ("all", 3, [0, 1, 2]),
        ([0, 2], 3, [0, 2]),
    ],
)
def test_attention_placement(attention, n_layers, expected):
    model = SHARNN(small_config(attention=attention, n_layers=n_layers))
    assert [i for i, b in enumerate(model.blocks) if b.attention is not None] == expected
    assert model.config.attention_blocks() == expected


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attention=[3]),
        dict(attention=[-1]),
        dict(attention="every"),
        dict(attention="Single"),
        dict(dropouth=-0.1),
        dict(dropouti=1.0),
        dict(dropouto=1.5),
        dict(attention_span=0),
        dict(n_layers=0),
        dict(boom_dim=40),
        dict(d_model=0),
    ],
)
def test_invalid_config_raises_value_error(overrides):
    config = small_config(**overrides)
    with pytest.raises(ValueError):
        config.validate()
    with pytest.raises(ValueError):
        SHARNN(small_config(**overrides))


def test_forward_rejects_window_longer_than_span():
    model = make_model(attention_span=16)
    model(random_tokens(16))  # exactly the span is fine
    with pytest.raises(ValueError, match="attention_span"):
        model(random_tokens(17))


def test_without_attention_a_window_may_be_longer_than_the_span():
    """The span bounds what a window attends to; a model without attention has none, and
    one long window equals the same text in short windows with the state carried."""
    model = make_model(attention="none", attention_span=8)
    tokens = random_tokens(20)
    with torch.no_grad():
        whole, _ = model(tokens)
        chunked, _ = run_windows(model, tokens, [8, 8, 4])
    assert_float32_close(chunked, whole)


def test_unknown_attention_implementation_is_refused():
    with pytest.raises(ValueError, match="eager, sdpa"):
        make_model().set_attn_implementation("flash")


def test_forward_rejects_state_with_wrong_number_of_blocks():
    model = make_model(n_layers=3)
    _, state = make_model(n_layers=2)(random_tokens(4))
    with pytest.raises(ValueError):
        model(random_tokens(4), state)


# ----------------------------------------------------------------------------- state


def test_state_detach_cuts_gradients():
    model = make_model(attention="all").train()
    _, state = model(random_tokens(6))
    assert state.lstm[0][0].requires_grad
    detached = state.detach()
    for h, c in detached.lstm:
        assert not h.requires_grad and not c.requires_grad
        assert h.grad_fn is None and c.grad_fn is None
    assert all(m.grad_fn is None for m in detached.memory)
    for (h, _), (hd, _) in zip(state.lstm, detached.lstm):
        assert torch.equal(h, hd)


def test_state_tensors_round_trip():
    model = make_model(attention="single")
    with torch.no_grad():
        _, state = model(random_tokens(6, seed=1))
        restored = State.from_tensors(state.tensors(), n_layers=3)
        for (h, c), (h2, c2) in zip(state.lstm, restored.lstm):
            assert torch.equal(h, h2) and torch.equal(c, c2)
        assert [m is None for m in restored.memory] == [True, False, True]
        assert torch.equal(restored.memory[1], state.memory[1])
        w2 = random_tokens(5, seed=2)
        assert torch.equal(model(w2, restored)[0], model(w2, state)[0])


# ----------------------------------------------------------------------------- training mode


def test_dropout_is_active_in_training_and_off_in_eval():
    model = make_model(attention="all", perturb=0.0)
    tokens = random_tokens(10)
    with torch.no_grad():
        assert torch.equal(model(tokens)[0], model(tokens)[0])
        model.train()
        assert not torch.equal(model(tokens)[0], model(tokens)[0])


def test_every_parameter_gets_a_finite_gradient():
    torch.manual_seed(0)
    model = SHARNN(small_config(attention="all", n_layers=2)).train()
    _, state = model(random_tokens(10, seed=1))
    tokens = random_tokens(11, seed=2)
    logits, _ = model(tokens[:-1], state.detach())
    F.cross_entropy(logits.reshape(-1, V), tokens[1:].reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    for block in model.blocks:
        attn = block.attention.head
        for p in (attn.gate_q, attn.gate_k, attn.gate_v, attn.value_gate_net.weight, attn.query.weight):
            assert torch.count_nonzero(p.grad) > 0
