"""The runtime (src/sharnn/runtime.py): device, precision and fast path resolved once, one
autocast context, and a model set up for the path from outside its code."""

from __future__ import annotations

import pytest
import torch

from helpers import SMALL
from sharnn.config import load_config
from sharnn.errors import ConfigError
from sharnn.models.config import SHARNNConfig
from sharnn.models.sharnn import SHARNN, Attention, AttentionSublayer
from sharnn.runtime import Runtime, resolve_device

CPU = torch.device("cpu")


def small_model() -> SHARNN:
    torch.manual_seed(0)
    return SHARNN(SHARNNConfig(d_model=16, n_layers=2, boom_dim=32, attention="all", attention_span=24))


@pytest.fixture()
def pretend_cuda(monkeypatch):
    """Resolve settings as on a one-GPU machine (nothing is run on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_on_cpu_auto_means_fp32_on_the_eager_path():
    runtime = Runtime.resolve("cpu")
    assert runtime == Runtime(CPU, None, fast_path=False, compile=False, recompute=False)
    if not torch.cuda.is_available():
        assert Runtime.resolve() == runtime
    assert runtime.describe() == "cpu, fp32, eager reference path"
    assert Runtime.resolve("cpu", "bf16").autocast_dtype == torch.bfloat16


def test_on_cuda_auto_means_bf16_and_the_fast_path(pretend_cuda):
    runtime = Runtime.resolve("cuda", compile=True)
    assert (runtime.device.type, runtime.autocast_dtype, runtime.fast_path, runtime.compile) == (
        "cuda",
        torch.bfloat16,
        True,
        True,
    )
    assert runtime.describe() == "cuda, bf16 autocast, fast path (compiled)"
    assert not Runtime.resolve("cuda", fast_path="off", compile=True).fast_path
    assert not Runtime.resolve("cuda", fast_path="off", compile=True).compile  # compile goes with the fast path
    assert Runtime.resolve("cuda", "fp16").grad_scaler().is_enabled()


def test_fast_path_setting_auto_means_cuda_only(pretend_cuda):
    assert (
        Runtime.resolve("cuda", fast_path="auto").fast_path and not Runtime.resolve("cpu", fast_path="auto").fast_path
    )
    assert Runtime.resolve("cpu", fast_path="on").fast_path and not Runtime.resolve("cuda", fast_path="off").fast_path


def test_settings_that_cannot_run_here_are_refused():
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        Runtime.resolve("cpu", "fp16")
    with pytest.raises(ConfigError, match="precision must be one of"):
        Runtime.resolve("cpu", "fp8")
    with pytest.raises(ConfigError, match="fast_path one of"):
        Runtime.resolve("cpu", fast_path="sometimes")
    for name, fragment in [("tpu", "tpu"), ("not a device", "unknown device")]:
        with pytest.raises(ConfigError, match=fragment):
            resolve_device(name)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")


def test_a_gpu_index_the_machine_does_not_have_is_refused(pretend_cuda):
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="has 1 GPU"):
        resolve_device("cuda:3")


def test_one_autocast_context():
    x = torch.randn(4, 4)
    with Runtime(CPU).autocast():
        assert not torch.is_autocast_enabled("cpu") and (x @ x).dtype == torch.float32
    with Runtime(CPU, torch.bfloat16).autocast():
        assert torch.is_autocast_enabled("cpu") and (x @ x).dtype == torch.bfloat16
    assert not Runtime(CPU, torch.bfloat16).grad_scaler().is_enabled()


def test_for_training_reads_the_config():
    config = load_config(
        "tiny", SMALL + ["device=cpu", "precision=bf16", "fast_path=on", "compile=false", "recompute=true"]
    )
    assert Runtime.for_training(config) == Runtime(CPU, torch.bfloat16, fast_path=True, compile=False, recompute=True)


def test_prepare_sets_the_attention_implementation_once_for_every_head():
    model = Runtime(CPU, fast_path=True).prepare(small_model())
    heads = [m for m in model.modules() if isinstance(m, Attention)]
    sublayers = [m for m in model.modules() if isinstance(m, AttentionSublayer)]
    assert len(heads) == len(sublayers) == 2
    assert all(h.attn_implementation == "sdpa" for h in heads)
    assert all(s.memory_dtype == torch.bfloat16 for s in sublayers)
    eager = Runtime(CPU).prepare(small_model())
    assert all(m.attn_implementation == "eager" for m in eager.modules() if isinstance(m, Attention))


def test_recompute_wraps_the_sublayers_and_keeps_checkpoint_names():
    plain = small_model()
    names = list(plain.state_dict())
    model = Runtime(CPU, recompute=True).prepare(small_model())
    wrapped = [name for name, m in model.named_modules() if type(m).__name__ == "CheckpointWrapper"]
    assert sorted(wrapped) == sorted(f"blocks.{i}.{part}" for i in range(2) for part in ("attention", "feed_forward"))
    assert list(model.state_dict()) == names
    model.load_state_dict(plain.state_dict())  # checkpoints load either way


def test_compile_applies_to_every_sublayer_and_nothing_else():
    model = Runtime(CPU, fast_path=True, compile=True).prepare(small_model())
    compiled = [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled == model.sublayers() and len(compiled) == 4
