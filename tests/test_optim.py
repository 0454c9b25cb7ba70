"""Min-Trust LAMB (src/sharnn/training/optim.py) against the update of docs/optimizer.md,
recomputed independently here in float64."""

import io
import math

import pytest
import torch

from sharnn.config import load_config
from sharnn.models.sharnn import SHARNN
from sharnn.training.optim import MinTrustLAMB
from sharnn.training.recipe import build_optimizer

B1, B2, EPS = 0.9, 0.999, 1e-6


def reference_lamb(theta, grads, lr, weight_decay=0.0, min_trust=0.25):
    """Plain-Python re-computation of §6; returns [(theta, trust ratio)] after each step."""
    theta = [float(x) for x in theta]
    m = [0.0] * len(theta)
    v = [0.0] * len(theta)
    history = []
    for g in grads:
        g = [float(x) for x in g]
        m = [B1 * mi + (1 - B1) * gi for mi, gi in zip(m, g)]
        v = [B2 * vi + (1 - B2) * gi * gi for vi, gi in zip(v, g)]
        u = [mi / (math.sqrt(vi) + EPS) + weight_decay * ti for mi, vi, ti in zip(m, v, theta)]
        phi = min(math.sqrt(sum(t * t for t in theta)), 10.0)
        u_norm = math.sqrt(sum(x * x for x in u))
        r = 1.0 if phi == 0 or u_norm == 0 else phi / u_norm
        r = max(r, min_trust)
        theta = [t - lr * r * ui for t, ui in zip(theta, u)]
        history.append((theta, r))
    return history


def run_optimizer(theta, grads, **kwargs):
    """Apply MinTrustLAMB to one float64 tensor; returns [(theta, trust ratio)] per step."""
    p = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    opt = MinTrustLAMB([p], **kwargs)
    history = []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        history.append((p.detach().tolist(), opt.trust_ratios[p].item()))
    return history


def assert_histories_match(got, expected):
    assert len(got) == len(expected)
    for (theta, r), (theta_ref, r_ref) in zip(got, expected):
        assert r == pytest.approx(r_ref, rel=1e-12)
        assert theta == pytest.approx(theta_ref, rel=1e-12, abs=1e-14)


def test_first_step_by_hand():
    # theta = (3, 4): ||theta|| = 5. g = (1, -2): m = 0.1 g, v = 0.001 g^2,
    # u_i = 0.1 g_i / (sqrt(0.001) |g_i| + 1e-6) ~ +-sqrt(10).
    g = (1.0, -2.0)
    u = [0.1 * gi / (math.sqrt(0.001) * abs(gi) + 1e-6) for gi in g]
    r = 5.0 / math.hypot(*u)
    lr = 0.01
    expected = [3.0 - lr * r * u[0], 4.0 - lr * r * u[1]]
    [(theta, trust)] = run_optimizer([3.0, 4.0], [g], lr=lr)
    assert trust == pytest.approx(r, rel=1e-12)
    assert r == pytest.approx(5 / math.sqrt(20), rel=1e-4)  # sanity of the hand formula
    assert theta == pytest.approx(expected, rel=1e-12)


def test_two_steps_with_weight_decay_match_reference():
    theta = [0.5, -1.5, 2.0, 0.25]
    grads = [[0.1, -0.3, 0.2, 0.05], [-0.2, 0.1, 0.4, 0.0]]
    got = run_optimizer(theta, grads, lr=0.05, weight_decay=0.01, min_trust=0.0)
    assert_histories_match(got, reference_lamb(theta, grads, lr=0.05, weight_decay=0.01, min_trust=0.0))


def test_moments_have_no_bias_correction():
    p = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    opt = MinTrustLAMB([p], lr=0.0)
    for g in ([0.5, -1.0], [1.0, 2.0]):
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    state = opt.state[p]
    m_expected = [B1 * 0.1 * 0.5 + 0.1 * 1.0, B1 * 0.1 * -1.0 + 0.1 * 2.0]
    v_expected = [B2 * 0.001 * 0.25 + 0.001 * 1.0, B2 * 0.001 * 1.0 + 0.001 * 4.0]
    assert state["exp_avg"].tolist() == pytest.approx(m_expected, rel=1e-12)
    assert state["exp_avg_sq"].tolist() == pytest.approx(v_expected, rel=1e-12)


def test_min_trust_floor_binds():
    theta = [0.01] * 100  # ||theta|| = 0.1, ||u|| ~ sqrt(100 * 10): raw ratio ~ 0.003
    grads = [[(-1.0) ** i * (1 + i / 100) for i in range(100)]]
    raw = reference_lamb(theta, grads, lr=0.01, min_trust=0.0)[0][1]
    assert raw < 0.25
    [(new_theta, trust)] = run_optimizer(theta, grads, lr=0.01)
    assert trust == 0.25
    assert_histories_match([(new_theta, trust)], reference_lamb(theta, grads, lr=0.01, min_trust=0.25))


def test_weight_norm_is_clamped_at_ten():
    theta = [10.0, 10.0, 10.0, 10.0]  # ||theta|| = 20 -> phi = 10
    grads = [[1.0, 1.0, 1.0, 1.0]]
    [(new_theta, trust)] = run_optimizer(theta, grads, lr=0.01)
    u = 0.1 / (math.sqrt(0.001) + EPS)
    assert trust == pytest.approx(10.0 / (2 * u), rel=1e-12)  # not 20 / ||u||
    assert new_theta == pytest.approx([10.0 - 0.01 * trust * u] * 4, rel=1e-12)


def test_zero_weight_norm_gives_trust_one():
    grads = [[0.3, -0.4]]
    [(new_theta, trust)] = run_optimizer([0.0, 0.0], grads, lr=0.1)
    assert trust == 1.0
    u = [0.1 * g / (math.sqrt(0.001) * abs(g) + EPS) for g in grads[0]]
    assert new_theta == pytest.approx([-0.1 * x for x in u], rel=1e-12)


def test_zero_update_gives_trust_one_and_no_change():
    [(new_theta, trust)] = run_optimizer([1.0, -2.0], [[0.0, 0.0]], lr=0.1)
    assert trust == 1.0
    assert new_theta == [1.0, -2.0]


def test_weight_decay_enters_before_the_trust_ratio():
    theta, grads, wd, lr = [3.0, 4.0], [[0.2, 0.1]], 0.5, 0.01
    [(new_theta, trust)] = run_optimizer(theta, grads, lr=lr, weight_decay=wd)
    adam = [0.1 * g / (math.sqrt(0.001) * abs(g) + EPS) for g in grads[0]]
    u = [a + wd * t for a, t in zip(adam, theta)]
    r = max(5.0 / math.hypot(*u), 0.25)
    assert trust == pytest.approx(r, rel=1e-12)
    assert new_theta == pytest.approx([t - lr * r * ui for t, ui in zip(theta, u)], rel=1e-12)
    # decay added after the trust ratio would give a different ratio
    assert trust != pytest.approx(max(5.0 / math.hypot(*adam), 0.25), rel=1e-3)


def test_parameters_without_grad_are_skipped():
    used = torch.tensor([1.0, 2.0], requires_grad=True)
    unused = torch.tensor([3.0, 4.0], requires_grad=True)
    opt = MinTrustLAMB([used, unused], lr=0.1, weight_decay=0.1)
    used.grad = torch.tensor([0.5, 0.5])
    opt.step()
    assert unused.tolist() == [3.0, 4.0]
    assert len(opt.state[unused]) == 0
    assert unused not in opt.trust_ratios
    assert used in opt.trust_ratios
    assert not torch.equal(used.detach(), torch.tensor([1.0, 2.0]))


def test_float32_parameter_matches_reference():
    theta = [0.5, -1.5, 2.0]
    grads = [[0.1, -0.3, 0.2], [0.3, 0.1, -0.2], [0.0, 0.2, 0.1]]
    p = torch.tensor(theta, requires_grad=True)
    opt = MinTrustLAMB([p], lr=0.05, weight_decay=0.01)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    expected = reference_lamb(theta, grads, lr=0.05, weight_decay=0.01)[-1][0]
    assert p.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def saved_and_loaded(state_dict):
    """Through bytes, as a checkpoint would (in-process, state_dict() shares the moment tensors)."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_round_trip_resumes_identically():
    torch.manual_seed(0)
    shapes = [(4, 3), (3,), (2, 2)]
    params_a = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(6)]
    opt_a = MinTrustLAMB(params_a, lr=0.01, weight_decay=0.001)

    def step(opt, params, gs):
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()

    for gs in grads[:3]:
        step(opt_a, params_a, gs)
    params_b = [p.detach().clone().requires_grad_() for p in params_a]
    opt_b = MinTrustLAMB(params_b, lr=0.5)  # hyper-parameters come back from the state_dict
    opt_b.load_state_dict(saved_and_loaded(opt_a.state_dict()))
    for gs in grads[3:]:
        step(opt_a, params_a, gs)
        step(opt_b, params_b, gs)
    for a, b in zip(params_a, params_b):
        assert torch.equal(a, b)
    assert opt_b.param_groups[0]["lr"] == 0.01


def test_restored_moments_matter():
    """Guard for the round-trip test: restarting without the saved state gives other values."""
    torch.manual_seed(0)
    p_a = torch.randn(5, dtype=torch.float64, requires_grad=True)
    grads = [torch.randn(5, dtype=torch.float64) for _ in range(4)]
    opt_a = MinTrustLAMB([p_a], lr=0.01)
    for g in grads[:2]:
        p_a.grad = g.clone()
        opt_a.step()
    p_b = p_a.detach().clone().requires_grad_()
    opt_b = MinTrustLAMB([p_b], lr=0.01)  # no load_state_dict
    for g in grads[2:]:
        p_a.grad, p_b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert not torch.allclose(p_a, p_b)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=-1e-3),
        dict(betas=(1.0, 0.999)),
        dict(betas=(0.9, 1.0)),
        dict(betas=(-0.1, 0.999)),
        dict(eps=-1.0),
        dict(weight_decay=-0.1),
        dict(min_trust=-0.5),
    ],
)
def test_constructor_rejects_invalid_values(kwargs):
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError):
        MinTrustLAMB([p], **kwargs)


# --------------------------------------------------------------------------------------
# The optimizer a training config builds (sharnn.training.recipe.build_optimizer)

TINY_MODEL = ["model.d_model=16", "model.boom_dim=32", "model.attention_span=48", "bptt=16"]


def built(*overrides: str) -> tuple[SHARNN, torch.optim.Optimizer]:
    config = load_config("tiny", [*TINY_MODEL, *overrides])
    torch.manual_seed(0)
    model = SHARNN(config.model)
    return model, build_optimizer(model, config)


def test_adamw_decays_matrices_and_embeddings_only_as_nanogpt_does():
    model, opt = built("optimizer=adamw", "weight_decay=0.1", "lr=0.01", "betas=[0.8,0.99]", "eps=1e-7")
    assert type(opt) is torch.optim.AdamW
    decayed, plain = opt.param_groups
    names = {p: name for name, p in model.named_parameters()}
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert {names[p] for p in decayed["params"]} == {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert {names[p] for p in plain["params"]} == {n for n, p in model.named_parameters() if p.dim() < 2}
    assert "embedding.weight" in {names[p] for p in decayed["params"]}
    assert {"output_bias", "blocks.0.ln_start.weight", "blocks.0.lstm.bias_ih_l0"} <= {
        names[p] for p in plain["params"]
    }
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))  # the tied embedding once
    for group in opt.param_groups:
        assert (group["lr"], group["betas"], group["eps"]) == (0.01, (0.8, 0.99), 1e-7)
    # a step with zero gradients only decays: matrices shrink by (1 - lr wd), the rest stay
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        expected = before[name] * (1 - 0.01 * 0.1) if p.dim() >= 2 else before[name]
        assert torch.allclose(p, expected, rtol=0, atol=1e-7), name
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.dim() >= 2)


def test_lamb_is_the_default_and_min_trust_0_is_plain_lamb():
    _, opt = built()
    assert type(opt) is MinTrustLAMB and len(opt.param_groups) == 1
    assert (opt.param_groups[0]["min_trust"], opt.param_groups[0]["weight_decay"]) == (0.25, 0.0)
    model, opt = built("min_trust=0")
    assert type(opt) is MinTrustLAMB and opt.param_groups[0]["min_trust"] == 0.0
    tokens = torch.randint(0, 256, (17, 4), generator=torch.Generator().manual_seed(1))
    logits, _ = model(tokens[:-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[1:].flatten()).backward()
    opt.step()
    ratios = [float(r) for r in opt.trust_ratios.values()]
    assert len(ratios) == len(list(model.parameters()))
    assert min(ratios) < 0.25  # no floor: ratios the default would have raised to 0.25
