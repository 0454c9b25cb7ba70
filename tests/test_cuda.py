"""The fast path on a CUDA GPU: fused attention for the model's shapes, agreement with the
eager reference, and no host-device synchronisation inside a training step.

Skipped without CUDA (CI has none). On a GPU machine: ``PYTHONPATH=src python -m pytest
tests/test_cuda.py``. The fuller comparison (paper sizes, a few hundred training steps)
is ``benchmarks/check_fast_path.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sharnn.data.corpus import batchify, get_batch
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN, causal_mask, sdpa_attention
from sharnn.runtime import Runtime
from sharnn.training.optim import MinTrustLAMB
from sharnn.training.recipe import train_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("T,M", [(1, 3976), (1024, 0), (1024, 3976)])
def test_memory_efficient_kernel_runs_the_paper_attention_shape(T, M):
    """One head of width 1024 over a 5000-position span, bf16, bottom-right causal: the
    fused memory-efficient kernel takes it (forward and backward) and agrees with the
    explicit fp32 computation to bf16 accuracy."""
    torch.manual_seed(0)
    B, d = 4, 1024
    q = (torch.randn(T, B, d, device=CUDA) / d**0.5).bfloat16().requires_grad_()
    kv = torch.randn(M + T, B, d, device=CUDA).bfloat16().requires_grad_()
    backends = [SDPBackend.EFFICIENT_ATTENTION] if T > 1 else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(backends):
        out = sdpa_attention(q, kv, kv)
        out.float().square().sum().backward()
    scores = torch.einsum("tbd,sbd->bts", q.float(), kv.float()).masked_fill(~causal_mask(T, M, CUDA), float("-inf"))
    expected = torch.einsum("bts,sbd->tbd", torch.softmax(scores, -1), kv.float())
    assert rel_error(out, expected) < 1e-2
    assert torch.isfinite(q.grad).all() and torch.isfinite(kv.grad).all()


def small_model() -> SHARNN:
    torch.manual_seed(0)
    config = SHARNNConfig(
        d_model=256,
        n_layers=3,
        boom_dim=1024,
        attention="all",
        attention_span=192,
        dropouti=0.0,
        dropouth=0.0,
        dropouto=0.0,
    )
    return SHARNN(config).to(CUDA)


def windows(B: int = 4, T: int = 64, n: int = 4):
    data = torch.randint(0, 256, (n * T + 1, B), generator=torch.Generator().manual_seed(1)).to(CUDA)
    return [(data[i * T : (i + 1) * T], data[i * T + 1 : (i + 1) * T + 1]) for i in range(n)]


def losses_and_grads(model: SHARNN, autocast: bool):
    model.zero_grad(set_to_none=True)
    state, losses = None, []
    for inputs, targets in windows():
        with Runtime(CUDA, torch.bfloat16 if autocast else None).autocast():
            logits, state = model(inputs, state)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        state = state.detach()
        losses.append(loss.item())
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return losses, grads


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_fast_path_matches_the_fp32_reference_on_cuda(compile):
    model = small_model()
    ref_losses, ref_grads = losses_and_grads(model, autocast=False)
    fast = Runtime(CUDA, torch.bfloat16, fast_path=True, compile=compile).prepare(model)
    fast_losses, fast_grads = losses_and_grads(fast, autocast=True)
    assert fast_losses == pytest.approx(ref_losses, rel=1e-2)
    assert rel_error(fast_grads, ref_grads) < 3e-2


def test_the_lstm_runs_in_bf16_under_bf16_autocast_not_fp16():
    block = small_model().blocks[0]
    seen = []
    block.lstm.register_forward_hook(lambda module, inputs, output: seen.append(output[0].dtype))
    with Runtime(CUDA, torch.bfloat16).autocast():
        _, (h, _) = block.recurrence(torch.randn(16, 2, 256, device=CUDA), None)
    assert seen == [torch.bfloat16] and h.dtype == torch.float32


def test_training_step_never_waits_for_the_gpu():
    """No .item(), no synchronising copy: CUDA's sync debug mode raises on any."""
    model = Runtime(CUDA, torch.bfloat16, fast_path=True).prepare(small_model())
    optimizer = MinTrustLAMB(model.parameters())
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    batched = batchify(torch.randint(0, 256, (4 * 1000,), dtype=torch.uint8).numpy(), 4)
    state = None
    for step in range(3):
        inputs, targets = get_batch(batched, step * 64, 64, CUDA)
        if step == 2:  # after warm-up (cuDNN and allocator set-up may synchronise once)
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss, grad_norm, state = train_step(model, optimizer, scaler, inputs, targets, state, 0.25, torch.bfloat16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss) and torch.isfinite(grad_norm)


def test_batches_reach_the_gpu_as_int64_equal_to_the_bytes():
    batched = batchify(torch.randint(0, 256, (3 * 500,), dtype=torch.uint8).numpy(), 3)
    inputs, targets = get_batch(batched, 10, 32, CUDA)
    cpu_inputs, cpu_targets = get_batch(batched, 10, 32)
    assert inputs.device.type == "cuda" and inputs.dtype == torch.int64
    assert torch.equal(inputs.cpu(), cpu_inputs) and torch.equal(targets.cpu(), cpu_targets)
