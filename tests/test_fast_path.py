"""The fast path computes the reference path's function, checked on CPU (CI has no GPU):
SDPA with the bottom-right causal mask, the gate folding (dropout included), the memory
in bf16 and its round trip through a checkpoint, compiled sub-layers, activation
recompute, the fast path in training, and sampling many streams at once.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import SMALL, assert_same_weights, metrics, write_small_corpus
from sharnn.config import load_config
from sharnn.errors import Interrupted
from sharnn.generation import filter_logits, generate
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN, causal_mask, sdpa_attention
from sharnn.models.step import Step
from sharnn.runtime import Runtime
from sharnn.training import checkpoint
from sharnn.training.trainer import train

CPU = torch.device("cpu")


def make_model(dropout: float = 0.0, seed: int = 0, **overrides) -> SHARNN:
    """Three blocks, attention in all of them, span 24; gates and LayerNorms randomised
    so that none of them is an identity that could hide a misplaced gate."""
    torch.manual_seed(seed)
    fields = (
        dict(
            d_model=32,
            n_layers=3,
            boom_dim=64,
            attention="all",
            attention_span=24,
            dropouti=dropout,
            dropouth=dropout,
            dropouto=dropout,
        )
        | overrides
    )
    model = SHARNN(SHARNNConfig(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate" in name or "ln_" in name:
                p.normal_(0.0, 0.5).add_(1.0 if name.endswith("weight") else 0.0)
    return model


def windows(lengths=(10, 7, 12, 10), B=3, seed=1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (inputs, targets) windows of random bytes; with span 24 the memory is
    partly full after the first window and full from the third."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (sum(lengths) + 1, B), generator=g)
    out, row = [], 0
    for T in lengths:
        out.append((data[row : row + T], data[row + 1 : row + T + 1]))
        row += T
    return out


def run(model: SHARNN, batches, train_mode: bool, seed: int = 7):
    """Forward (and, in train mode, backward) over the windows, carrying the state.
    Returns (logits per window, final state, loss sum, grads by name)."""
    model.train(train_mode)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    state, all_logits, total = None, [], 0.0
    with torch.set_grad_enabled(train_mode):
        for inputs, targets in batches:
            logits, state = model(inputs, state)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            if train_mode:
                loss.backward()
            state = state.detach()
            all_logits.append(logits.detach())
            total += loss.item()
    # named as in a checkpoint (activation recompute wraps modules but keeps those names)
    grads = {n: p.grad.clone() for n, p in model.state_dict(keep_vars=True).items() if p.grad is not None}
    return all_logits, state, total, grads


def on_fast_path(model: SHARNN, **settings) -> SHARNN:
    """``model`` set up for the fast path on CPU by the runtime (SDPA, bf16 memory)."""
    return Runtime(CPU, fast_path=True, **settings).prepare(model)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ----------------------------------------------------------------------------- SDPA and the mask


@pytest.mark.parametrize("T,M", [(1, 0), (1, 9), (6, 0), (6, 9), (8, 16)])
def test_sdpa_attention_equals_explicit_bottom_right_masked_softmax(T, M):
    torch.manual_seed(T * 100 + M)
    q, kv = torch.randn(T, 3, 16, dtype=torch.float64), torch.randn(M + T, 3, 16, dtype=torch.float64)
    scores = torch.einsum("tbd,sbd->bts", q, kv).masked_fill(~causal_mask(T, M), float("-inf"))
    expected = torch.einsum("bts,sbd->tbd", torch.softmax(scores, dim=-1), kv)
    torch.testing.assert_close(sdpa_attention(q, kv, kv), expected, rtol=1e-10, atol=1e-12)


def test_sdpa_attention_sees_all_memory_and_no_later_window_position():
    """Changing window position j moves the outputs of queries t >= j only; changing any
    memory position moves every query's output."""
    torch.manual_seed(0)
    T, M = 6, 5
    q, kv = torch.randn(T, 2, 8, dtype=torch.float64), torch.randn(M + T, 2, 8, dtype=torch.float64)
    base = sdpa_attention(q, kv, kv)
    for j in range(T):
        moved = kv.clone()
        moved[M + j] += 1.0
        changed = (sdpa_attention(q, moved, moved) - base).abs().amax(dim=(1, 2)) > 1e-9
        assert changed.tolist() == [t >= j for t in range(T)], j
    moved = kv.clone()
    moved[0] += 1.0
    assert bool(((sdpa_attention(q, moved, moved) - base).abs().amax(dim=(1, 2)) > 1e-9).all())


# ----------------------------------------------------------------------------- gate folding


def literal_attention_train(attn, r, kv):
    """§3.3 with dropout, gates where the text puts them: Q = Drop(sig(theta_q) LN_q(W r + b)),
    K = sig(theta_k) kv, V = Drop(g_v kv), out = Drop(softmax(Q K^T / sqrt(d) + mask)) V.
    Dropout masks are drawn in this order: Q, V, probabilities (as the model does)."""
    T, S, d = r.shape[0], kv.shape[0], r.shape[-1]
    Q = attn.drop(torch.sigmoid(attn.gate_q) * attn.ln_query(attn.query(r)))
    K = torch.sigmoid(attn.gate_k) * kv
    V = attn.drop(attn.value_gate_vector() * kv)
    scores = torch.einsum("tbd,sbd->bts", Q, K) / math.sqrt(d)
    probs = attn.drop(torch.softmax(scores.masked_fill(~causal_mask(T, S - T), float("-inf")), dim=-1))
    return torch.einsum("bts,sbd->tbd", probs, V)


def test_gates_folded_out_of_the_memory_give_the_same_function_under_dropout():
    """The key gate folds into the query and the value gate moves after the weighted sum:
    with the same dropout masks the outputs (and gradients) are those of the literal text."""
    attn = next(b for b in make_model(dropout=0.3).blocks if b.attention is not None).attention.head.double().train()
    r = torch.randn(7, 2, 32, dtype=torch.float64)
    kv = torch.randn(12, 2, 32, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    ours = attn(r, kv)
    torch.manual_seed(5)
    literal = literal_attention_train(attn, r, kv)
    torch.testing.assert_close(ours, literal, rtol=1e-10, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.square().sum(), kv)
    (g_literal,) = torch.autograd.grad(literal.square().sum(), kv)
    torch.testing.assert_close(g_ours, g_literal, rtol=1e-10, atol=1e-12)
    torch.manual_seed(6)
    assert (attn(r, kv) - ours).abs().max() > 1e-3  # the dropout is really on


def test_fast_attention_applies_dropout_in_training_only():
    model = make_model(dropout=0.3)
    attn = next(b for b in model.blocks if b.attention is not None).attention.head
    r, kv = torch.randn(5, 2, 32), torch.randn(9, 2, 32)
    model.set_attn_implementation("sdpa")
    attn.train()
    assert (attn(r, kv) - attn(r, kv)).abs().max() > 1e-3
    attn.eval()
    sdpa = attn(r, kv)
    model.set_attn_implementation("eager")
    torch.testing.assert_close(sdpa, attn(r, kv), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- memory in bf16


def test_fast_path_keeps_memory_in_bf16_rounded_from_the_reference_keys():
    model = make_model()
    batches = windows()
    _, ref_state, _, _ = run(model, batches[:1], train_mode=False)
    _, fast_state, _, _ = run(on_fast_path(model), batches[:1], train_mode=False)
    for ref, fast in zip(ref_state.memory, fast_state.memory):
        assert ref.dtype == torch.float32 and fast.dtype == torch.bfloat16
        assert ref.shape == fast.shape == (10, 3, 32)
    # the first block's keys are computed before any attention: exactly the rounded reference
    assert torch.equal(fast_state.memory[0], ref_state.memory[0].to(torch.bfloat16))


def test_bf16_memory_round_trips_through_a_checkpoint_bit_for_bit(tmp_path):
    model = on_fast_path(make_model()).eval()
    batches = windows()
    with torch.no_grad():
        _, state = model(batches[0][0])
        _, state = model(batches[1][0], state)
        config = load_config("tiny", ["model.d_model=32", "model.n_layers=3", "model.boom_dim=64"])
        saved = {"model": model.state_dict(), "recurrent_state": state, "trainer": {"note": "test"}}
        checkpoint.write_checkpoint(tmp_path / "ckpt", config, saved)
        loaded = checkpoint.read_checkpoint(tmp_path / "ckpt", 3)["recurrent_state"]
        for saved, back in zip(state.memory, loaded.memory):
            assert back.dtype == torch.bfloat16 and torch.equal(saved, back)
        for (h, c), (h2, c2) in zip(state.lstm, loaded.lstm):
            assert torch.equal(h, h2) and torch.equal(c, c2)
        continued, _ = model(batches[2][0], state)
        from_disk, _ = model(batches[2][0], loaded)
    assert torch.equal(continued, from_disk)


def test_paths_can_hand_state_to_each_other():
    """A fast-path state (bf16 memory) continues on the reference path and the reverse:
    memory takes the reading path's dtype."""
    model = make_model().eval()
    batches = windows()
    with torch.no_grad():
        model.set_attn_implementation("sdpa", torch.bfloat16)
        _, fast_state = model(batches[0][0])
        model.set_attn_implementation("eager")
        logits, ref_state = model(batches[1][0], fast_state)
        assert all(m.dtype == torch.float32 for m in ref_state.memory)
        model.set_attn_implementation("sdpa", torch.bfloat16)
        logits_fast, back = model(batches[1][0], fast_state)
        _, again = model(batches[2][0], ref_state)
    assert all(m.dtype == torch.bfloat16 for m in back.memory + again.memory)
    assert rel_error(logits_fast, logits) < 1e-2


# ----------------------------------------------------------------------------- whole model


def test_fast_path_with_fp32_memory_is_the_reference_function():
    """With the memory kept in fp32, SDPA with the folded gates gives the reference's
    logits, loss and every gradient to fp32 rounding: any algebra slip shows here."""
    model = make_model(dropout=0.0)
    batches = windows()
    ref_logits, _, ref_loss, ref_grads = run(model, batches, train_mode=True)
    model.set_attn_implementation("sdpa", memory_dtype=None)
    fast_logits, state, fast_loss, fast_grads = run(model, batches, train_mode=True)
    assert all(m.dtype == torch.float32 for m in state.memory)
    assert fast_loss == pytest.approx(ref_loss, rel=1e-6)
    assert max(rel_error(f, r) for f, r in zip(fast_logits, ref_logits)) < 1e-5
    assert ref_grads.keys() == fast_grads.keys() and len(ref_grads) == len(list(model.parameters()))
    for name in ref_grads:
        assert rel_error(fast_grads[name], ref_grads[name]) < 1e-4, name


def test_fast_path_with_bf16_memory_matches_reference_within_bf16_tolerance():
    """bf16 keys and values (relative rounding 2^-9) move the logits by well under 1%, and
    the gradients as a whole by about as much. Single small query-side gradients that are
    a difference of near-equal terms can move far more, as with any bf16 attention."""
    model = make_model()
    batches = windows()
    ref_logits, ref_state, ref_loss, ref_grads = run(model, batches, train_mode=True)
    fast_logits, fast_state, fast_loss, fast_grads = run(on_fast_path(model), batches, train_mode=True)
    errors = [rel_error(f, r) for f, r in zip(fast_logits, ref_logits)]
    assert 0 < errors[-1] and max(errors) < 1e-2, errors  # > 0: the bf16 memory is really used
    assert fast_loss == pytest.approx(ref_loss, rel=1e-3)
    for (h, c), (h_ref, c_ref) in zip(fast_state.lstm, ref_state.lstm):
        assert rel_error(h, h_ref) < 1e-2 and rel_error(c, c_ref) < 1e-2
    flat = lambda grads: torch.cat([grads[n].flatten() for n in sorted(grads)])  # noqa: E731
    assert rel_error(flat(fast_grads), flat(ref_grads)) < 1e-2
    per_parameter = sorted(rel_error(fast_grads[n], ref_grads[n]) for n in ref_grads)
    assert per_parameter[len(per_parameter) // 2] < 1e-2, per_parameter


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_bf16_autocast_matches_fp32(implementation):
    """bf16 autocast (how CUDA trains) keeps LayerNorm statistics, softmax and loss in fp32."""
    model = make_model()
    batches = windows()
    ref_logits, _, ref_loss, _ = run(model, batches, train_mode=False)
    model.set_attn_implementation(implementation, torch.bfloat16 if implementation == "sdpa" else None)
    with Runtime(CPU, torch.bfloat16).autocast():
        bf16_logits, _, bf16_loss, _ = run(model, batches, train_mode=False)
    assert all(logits.dtype == torch.bfloat16 for logits in bf16_logits)
    assert bf16_loss == pytest.approx(ref_loss, rel=2e-2)
    assert max(rel_error(b, r) for b, r in zip(bf16_logits, ref_logits)) < 5e-2


def test_under_autocast_the_lstm_runs_in_the_autocast_dtype_and_keeps_its_state_in_fp32():
    """(CUDA's autocast alone would run cuDNN's LSTM in fp16.) The block runs it in bf16,
    gradients reach the fp32 weights, and (h, c) stay fp32 so any path can read them."""
    block = make_model().blocks[0]
    x = torch.randn(9, 2, 32)
    seen = []
    hook = block.lstm.register_forward_hook(lambda module, inputs, output: seen.append(output[0].dtype))
    with Runtime(CPU, torch.bfloat16).autocast():
        u, (h, c) = block.recurrence(x, None)
        u2, _ = block.recurrence(x, (h, c))
    hook.remove()
    assert seen == [torch.bfloat16, torch.bfloat16] and u.dtype == torch.bfloat16
    assert h.dtype == c.dtype == torch.float32
    reference, (h_ref, _) = block.lstm(x)
    assert rel_error(u, reference) < 2e-2 and rel_error(h, h_ref) < 2e-2
    u2.float().sum().backward()
    assert block.lstm.weight_hh_l0.grad.dtype == torch.float32 and block.lstm.weight_hh_l0.grad.norm() > 0


@pytest.mark.slow
def test_compiled_fast_path_matches_the_uncompiled_one():
    """torch.compile of the LayerNorm/Boom sub-layers (inductor, CPU here): the same
    losses and gradients over windows of changing length, and the same eval logits."""
    model = make_model()
    batches = windows(lengths=(10, 7, 12))
    compiled = on_fast_path(copy.deepcopy(model), compile=True)
    model = on_fast_path(model)
    _, _, loss, grads = run(model, batches, train_mode=True)
    eval_logits, _, _, _ = run(model, batches, train_mode=False)
    _, _, compiled_loss, compiled_grads = run(compiled, batches, train_mode=True)
    compiled_eval_logits, _, _, _ = run(compiled, batches, train_mode=False)
    assert compiled_loss == pytest.approx(loss, rel=1e-5)
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    for a, b in zip(compiled_eval_logits, eval_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- recompute


@pytest.mark.parametrize("fast_path", [False, True], ids=["reference", "fast"])
def test_recompute_gives_identical_gradients_with_dropout(fast_path):
    model = make_model(dropout=0.2)
    batches = windows()
    recomputed = Runtime(CPU, fast_path=fast_path, recompute=True).prepare(copy.deepcopy(model))
    model = Runtime(CPU, fast_path=fast_path).prepare(model)
    _, _, loss, grads = run(model, batches, train_mode=True)
    _, _, loss_recomputed, grads_recomputed = run(recomputed, batches, train_mode=True)
    assert grads.keys() == grads_recomputed.keys() and len(grads) == len(list(model.parameters()))
    assert loss_recomputed == loss
    for name in grads:
        assert torch.equal(grads_recomputed[name], grads[name]), name


def test_recompute_stores_fewer_activations_for_backward():
    model = make_model(boom_dim=256).train()
    inputs, targets = windows(lengths=(12,))[0]

    def saved_bytes() -> int:
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits, _ = model(inputs)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        return total

    stored = saved_bytes()
    Runtime(CPU, recompute=True).prepare(model)
    assert saved_bytes() < 0.6 * stored  # what is left: the LSTMs, the sub-layers' inputs, the softmax


# ----------------------------------------------------------------------------- training settings


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    return write_small_corpus(tmp_path_factory.mktemp("data") / "small.txt", size=20_000)


FAST = SMALL + [
    "fast_path=on",
    "compile=false",
    "model.dropouth=0.1",
    "model.dropouti=0.1",
    "max_steps=16",
    "valid_every_steps=8",
    "log_every_steps=1",
]


def test_fast_path_training_resumes_exactly_with_bf16_memory(tmp_path, corpus_file):
    """A stop at step 6 and resume ends exactly like the run that was never stopped: the
    bf16 memory comes back from state.safetensors bit for bit."""
    config = load_config("tiny", FAST + [f"data={corpus_file}"])
    train(config, tmp_path / "reference", quiet=True)
    with pytest.raises(Interrupted):
        train(config, tmp_path / "run", quiet=True, should_stop=lambda progress: progress.step == 6)
    state = checkpoint.read_checkpoint((tmp_path / "run" / "latest").resolve(), 2)["recurrent_state"]
    assert [m.dtype for m in state.memory if m is not None] == [torch.bfloat16]
    train(config, tmp_path / "run", resume=True, quiet=True)
    assert_same_weights(tmp_path / "run" / "latest", tmp_path / "reference" / "latest")
    bpc = lambda run: [(r["split"], r["step"], r["bpc"]) for r in metrics(run)]  # noqa: E731
    assert bpc(tmp_path / "run") == bpc(tmp_path / "reference")


def test_max_seconds_stops_training_then_validates_and_tests(tmp_path, corpus_file):
    config = load_config("tiny", SMALL + [f"data={corpus_file}", "max_steps=0", "epochs=1000", "max_seconds=2"])
    summary = train(config, tmp_path / "run", quiet=True)
    records = metrics(tmp_path / "run")
    assert 2.0 <= summary["train_seconds"] < 30 and summary["epochs"] < 1000
    assert records[-2]["split"] == "valid" and records[-1]["split"] == "test"
    assert math.isfinite(summary["test_bpc"])
    seconds = [r["seconds"] for r in records if r["split"] == "train"]
    assert seconds == sorted(seconds) and seconds[-1] <= summary["train_seconds"]


# ----------------------------------------------------------------------------- sampling many streams


def test_filter_logits_works_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(5, 40) * 3
    for settings in [
        dict(temperature=0.7),
        dict(top_k=4),
        dict(top_p=0.6),
        dict(temperature=1.3, top_k=9, top_p=0.8),
        dict(temperature=0),
    ]:
        batched = filter_logits(logits, **settings)
        rows = torch.stack([filter_logits(row, **settings) for row in logits])
        torch.testing.assert_close(batched, rows)
        torch.testing.assert_close(batched.sum(-1), torch.ones(5))
    assert (filter_logits(logits, top_k=4) > 0).sum(-1).tolist() == [4] * 5
    assert filter_logits(logits, temperature=0).argmax(-1).tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_greedy_sampling_of_many_streams_equals_one_stream_at_a_time(fast):
    model = make_model().set_attn_implementation("sdpa" if fast else "eager")
    prompts = torch.randint(0, 256, (30, 4), generator=torch.Generator().manual_seed(3))
    together = torch.stack(list(generate(model, prompts, 15, temperature=0, window=8)))
    assert together.shape == (15, 4) and together.dtype == torch.int64
    for b in range(4):
        alone = [int(tokens[0]) for tokens in generate(model, prompts[:, b : b + 1], 15, temperature=0, window=8)]
        assert together[:, b].tolist() == alone, b


def test_under_bf16_autocast_the_sampled_tokens_run_through_the_bf16_inference_step():
    """The fast path generates through the bf16 Step from the prompt's state, not the
    forward, which copies the whole memory at every token (benchmarks/records/gpu-h200-2026-11-26)."""
    model = make_model().set_attn_implementation("sdpa", memory_dtype=torch.bfloat16).eval()
    prompts = torch.randint(0, 256, (12, 3), generator=torch.Generator().manual_seed(5))
    got = torch.stack(list(generate(model, prompts, 10, temperature=0, autocast_dtype=torch.bfloat16)))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        logits, state = model(prompts)
    step = Step(model, 3, 12 + 10, precision="bf16")
    step.load_state(state)
    want = [logits[-1].float().argmax(-1)]
    for _ in range(9):
        want.append(step(want[-1]).argmax(-1))
    assert torch.equal(got, torch.stack(want))
    fp32 = torch.stack(list(generate(model, prompts, 10, temperature=0)))  # the same model in fp32: nearly the same
    assert (fp32 == got).float().mean() > 0.8


def test_seeded_sampling_of_many_streams_is_reproducible_and_streams_differ():
    model = make_model()
    prompts = torch.zeros(5, 6, dtype=torch.long)  # the same prompt in every stream
    first = torch.stack(list(generate(model, prompts, 40, seed=1, autocast_dtype=torch.bfloat16)))
    again = torch.stack(list(generate(model, prompts, 40, seed=1, autocast_dtype=torch.bfloat16)))
    assert torch.equal(first, again)
    assert len({tuple(first[:, b].tolist()) for b in range(6)}) > 1  # independent draws per stream
    with pytest.raises(ValueError, match="prompts"):
        next(generate(model, torch.zeros(0, 2, dtype=torch.long), 3))
    with pytest.raises(ValueError, match="prompts"):
        next(generate(model, torch.zeros(5, dtype=torch.long), 3))  # one stream is [N, 1]
