"""Correctness of the fast path against the eager reference path, on the same weights.

Two checks, each judged against thresholds stated below; the exit status is 1 when any
check fails, 0 when all pass.

(a) Outputs and gradients. One model with every dropout at 0 and its weights redrawn
    so that every part of it matters (see :func:`redraw_weights`), copied into a
    reference instance (eager path, fp32, no autocast, no TF32 on CUDA) and a fast
    instance prepared by a ``sharnn.runtime.Runtime`` (SDPA attention, bf16 memory,
    torch.compile of the attention and feed-forward sub-layers unless ``--no-compile``,
    under the runtime's bf16 autocast). Both run ``--windows``
    consecutive windows of fresh random bytes, each path carrying its own state, so the
    memory goes from empty through partly full to full and cut. Per window, the relative
    errors ``||fast - ref|| / ||ref||`` of: each attention head's output (its worst query
    row; forward hook) and the gradients it sends back to its query input and to its
    keys/values (full backward hook: what a wrong attention backward changes); the
    logits; the loss; every parameter's gradient of that window's loss (median and max
    over parameters, and the worst one's name); the state carried out of the window
    (memory, LSTM h and c; worst block).

(b) Training. The real recipe, ``sharnn.training.trainer.train``, runs twice into a temporary
    folder from the same seed (so from the same init, with the preset's dropout,
    Min-Trust LAMB and learning-rate schedule): the eager path in fp32
    (``fast_path=off precision=fp32``) and the fast path in bf16 (``fast_path=on
    precision=bf16``, ``compile`` as for (a)). Both train on the bundled ``enwik8-head``
    corpus for ``--steps`` steps (``max_steps``; ``epochs`` large enough that they do
    not end it), in ``--streams`` streams of windows ``T = --bptt`` long
    (``bptt_jitter=false``), contiguous, the state carried; every step is logged
    (``log_every_steps=1``), no validation before the end, no checkpoint before the end,
    no sample. After the steps each run validates and tests as every run does (outside
    what is compared). The per-step training losses are read from each run's
    ``metrics.jsonl`` (train records: ``bpc``; nats = bpc x ln 2), its training seconds
    from ``summary.json`` (``train_seconds``: wall clock, the final validation
    included) and its tokens/s as the median of the logged steps. The table shows
    both loss curves as means over blocks of 25 steps (bits per byte); the check is the
    difference of the two final 50-step mean losses. The two paths draw different
    dropout masks (SDPA's fused dropout and compiled dropout use the RNG differently
    from eager dropout), so the curves differ by noise even where both paths are right. This
    checks that bf16 training follows fp32 training (no drift, no instability); it does
    not catch a broken attention, which (a) does: from the paper's init the head is
    barely used in the first hundreds of steps (its value gate starts near 0.03).

Sizes: ``--streams`` (default 8) parallel streams and ``--bptt`` (default 256) for both parts.
``--windows`` defaults to ``ceil(span / bptt) + 1``: the memory fills, is cut to
``span - bptt`` and is read full twice (21 windows for enwik8-paper at bptt 256). The
defaults are meant to keep ``enwik8-paper`` well inside 10 minutes on one H100 (an
estimate, not yet timed there): the eager fp32 half of (b) is the slow part, each run
of (b) also validates and tests once at its end, and the fast path compiles twice (once
per part). ``--bptt 1024`` gives the paper's window
(about 4x the work of (b) per step, and fewer windows in (a)).

GPU (from the repository root)::

    PYTHONPATH=src python benchmarks/check_fast_path.py --device cuda
    PYTHONPATH=src python benchmarks/check_fast_path.py --device cuda --preset enwik8-paper-4head
    PYTHONPATH=src python benchmarks/check_fast_path.py --device cuda --bptt 1024 --steps 300

CPU smoke test (tiny sizes, no compile)::

    python benchmarks/check_fast_path.py --device cpu --no-compile --windows 4 --steps 10 \\
        --streams 2 --bptt 16 model.d_model=32 model.boom_dim=64 model.attention_span=48

JSON in ``benchmarks/results/check_fast_path.json`` unless ``--json PATH``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import environment, parse_args_with_overrides, print_table, random_windows, write_json
from sharnn import SHARNN, load_config
from sharnn.errors import ConfigError, TrainingDiverged
from sharnn.models.sharnn import Attention
from sharnn.runtime import Runtime, resolve_device
from sharnn.training.metrics import read_records
from sharnn.training.trainer import train

# ----------------------------------------------------------------------------- thresholds
#
# bf16 keeps 8 significant bits (a rounding moves a value by up to 2^-9 = 0.2%), and under
# autocast every matmul input is rounded, the LSTMs' included, so even a correct fast path
# is some tenths of a percent away from the fp32 reference after each layer; without
# autocast (fp32 with only the memory in bf16) the errors are about ten times smaller.
# Calibrated on CPU under bf16 autocast (CUDA's bf16 kernels also accumulate in fp32;
# not measured there yet): the limits sit at least 2.5x above the worst value a correct
# fast path gave at d 256 and d 1024 with span 5000, bptt 256, 21 windows, and 4x or more
# below what broken fast paths gave on the same weights: the mask aligned top-left (what
# is_causal=True does here), no mask, the mask one position too far either way, an extra
# 1/sqrt(d), a dropped query, key or value gate, keys, values or query cut from the
# gradient, memory or LSTM state not carried, a Boom without its GELU.

ATTENTION_ROW_RTOL = 5e-2  # attention output (value gate applied, before the residual) of the
#                            worst query row, worst head: a wrong mask changes a few rows
#                            entirely, which a norm over the whole window would dilute
ATTENTION_GRAD_QUERY_RTOL = 2.5e-1  # gradient the head sends back to its query input: a sum over
#                                     keys with weights summing to 0, in which the keys' common
#                                     part cancels but its rounding does not (floor 6e-2 at d 1024)
ATTENTION_GRAD_KV_RTOL = 5e-2  # gradient the head sends back to its keys/values, memory rows included
LOGITS_RTOL = 2e-2  # ||fast - ref|| / ||ref|| of the window's logits
LOSS_RTOL = 2e-2  # |fast - ref| / ref of the window's mean cross-entropy (a sanity check: the
#                   loss averages errors away, and no broken path above moved it by 5%)
GRAD_MEDIAN_RTOL = 5e-2  # median over parameters of their gradients' relative error. The
#                          worst parameter is reported, not judged: a LayerNorm shift's gradient
#                          is a sum over every position of the window that largely cancels
#                          (LN_mem's shift moves all keys alike, which the softmax ignores), so
#                          its relative error grows with streams x bptt (0.36 at 8 x 256, d 256)
STATE_RTOL = 3e-2  # memory and LSTM (h, c) carried out of the window, worst block
TRAIN_FINAL_TOL_NATS = 0.05  # (b): |fast - eager| of the final 50-step mean loss, nats per byte

LIMITS = {  # (a): the limit of each per-window error (None, e.g. without an attention head, is not judged)
    "attention_row_rel_err": ATTENTION_ROW_RTOL,
    "attention_grad_query_rel_err": ATTENTION_GRAD_QUERY_RTOL,
    "attention_grad_kv_rel_err": ATTENTION_GRAD_KV_RTOL,
    "logits_rel_err": LOGITS_RTOL,
    "loss_rel_err": LOSS_RTOL,
    "grad_rel_err_median": GRAD_MEDIAN_RTOL,
    "memory_rel_err": STATE_RTOL,
    "lstm_h_rel_err": STATE_RTOL,
    "lstm_c_rel_err": STATE_RTOL,
}

TRAIN_BLOCK_STEPS = 25  # (b): loss curves are means over blocks of this many steps
TRAIN_FINAL_STEPS = 50  # (b): the final mean is over this many steps

# (a) redraws the weights at unit gain (see redraw_weights) and sharpens the attention.
QUERY_GAIN = 4.0  # LN_query's gain: with it the attention scores have a spread of a few units


def ieee_fp32() -> None:
    """No TF32 anywhere, so that the reference is fp32 (cuDNN's LSTMs use TF32 by default).
    Set through the legacy flag and the per-operator settings alike: torch refuses to read
    the legacy flag when the two disagree."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    torch.backends.cuda.matmul.fp32_precision = "ieee"


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64 (0 when both are 0, inf when only ``b`` is, or when
    the shapes differ)."""
    if a.shape != b.shape:
        return math.inf
    diff, ref = (a.double() - b.double()).norm(), b.double().norm()
    if ref == 0:
        return 0.0 if diff == 0 else math.inf
    return float(diff / ref)


@torch.no_grad()
def redraw_weights(model: SHARNN, seed: int) -> None:
    """Weights in which every part of the model matters to the output.

    At the paper's init (Linear and Embedding weights N(0, (0.1/sqrt(d))^2), gates and biases
    0, LayerNorm gains 1) the Boom, the value gate (about 0.03) and the logits are small
    next to their inputs and every gate is 1/2 in every feature, so a broken attention or
    a swapped gate hides under bf16 rounding. Here Linear and Embedding weights are drawn
    at unit gain, N(0, 1/d); biases, gate vectors and LayerNorm shifts N(0, 0.5^2);
    LayerNorm gains 1 + N(0, 0.5^2), the query's LayerNorm gain times ``QUERY_GAIN`` so
    that the attention is peaked rather than uniform; the LSTMs keep their init."""
    generator = torch.Generator().manual_seed(seed)
    std = 1.0 / math.sqrt(model.config.d_model)

    def draw(p: torch.Tensor, mean: float, scale: float) -> None:
        p.copy_(mean + scale * torch.randn(p.shape, generator=generator))

    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            draw(module.weight, 0.0, std)
            if getattr(module, "bias", None) is not None:
                draw(module.bias, 0.0, 0.5)
        elif isinstance(module, nn.LayerNorm):
            gain = QUERY_GAIN if module_name.endswith("ln_query") else 1.0
            draw(module.weight, gain, 0.5 * gain)
            draw(module.bias, 0.0, 0.5)
        elif isinstance(module, Attention):
            for name in ("gate_q", "gate_k", "gate_v", "value_gate"):
                if hasattr(module, name):
                    draw(getattr(module, name), 0.0, 0.5)
    draw(model.output_bias, 0.0, 0.5)


def worst_error(fast: list, ref: list, error=rel_error) -> float | None:
    """The largest ``error(f, r)`` over matching items of the two paths (blocks, heads):
    None when neither path has any, inf where they disagree on how many or which exist."""
    if len(fast) != len(ref):
        return math.inf
    errors = [
        math.inf if (f is None) != (r is None) else error(f, r)
        for f, r in zip(fast, ref)
        if f is not None or r is not None
    ]
    return max(errors, default=None)


def worst_row_rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``||a_i - b_i|| / ||b_i||`` over the rows ``i`` (last dimension the row)."""
    if a.shape != b.shape:
        return math.inf
    a, b = a.double().flatten(0, -2), b.double().flatten(0, -2)
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())


class AttentionProbe:
    """What every attention head of a model computed in the last window: its outputs, and
    the gradients its backward sent to its inputs (the query input ``r`` and the
    keys/values ``kv``, memory rows included), through forward and full backward hooks
    on each block's head (``block.attention.head``)."""

    def __init__(self, model: SHARNN):
        self.outputs: list[torch.Tensor] = []
        self.input_grads: list[tuple[torch.Tensor | None, ...]] = []
        for block in model.blocks:
            if block.attention is not None:
                block.attention.head.register_forward_hook(self._forward)
                block.attention.head.register_full_backward_hook(self._backward)

    def _forward(self, module, args, output):
        self.outputs.append(output.detach().float())

    def _backward(self, module, grad_input, grad_output):
        self.input_grads.append(tuple(None if g is None else g.detach().float() for g in grad_input))  # (r, kv)

    def clear(self) -> None:
        self.outputs.clear()
        self.input_grads.clear()


def window_pass(model: SHARNN, runtime: Runtime, inputs, targets, state):
    """Forward (under the runtime's autocast) and backward of one window from ``state``:
    (logits fp32, loss, grads by name (zeros for a parameter that got none), detached state)."""
    model.zero_grad(set_to_none=True)
    with runtime.autocast():
        logits, state = model(inputs, state)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    grads = {
        name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()
    }
    return logits.detach().float(), loss.detach(), grads, state.detach()


def check_outputs(config, device: torch.device, windows: int, compile: bool) -> dict:
    """Part (a): per-window relative errors of the fast path against the reference."""
    model_config = dataclasses.replace(config.model, dropouti=0.0, dropouth=0.0, dropouto=0.0)
    torch.manual_seed(config.seed)
    reference = SHARNN(model_config)
    redraw_weights(reference, config.seed)
    ref_runtime = Runtime.resolve(str(device), precision="fp32", fast_path="off")
    fast_runtime = Runtime.resolve(str(device), precision="bf16", fast_path="on", compile=compile)
    fast = fast_runtime.prepare(copy.deepcopy(reference)).train()
    reference = ref_runtime.prepare(reference).train()
    batches = random_windows(config.bptt, config.train_streams, windows, device, seed=config.seed)
    span, T = model_config.attention_span, config.bptt

    ref_attention, fast_attention = AttentionProbe(reference), AttentionProbe(fast)
    rows, ref_state, fast_state = [], None, None
    for i, (inputs, targets) in enumerate(batches):
        held = [m.shape[0] for m in ref_state.memory if m is not None] if ref_state else []
        memory_read = min(max(held, default=0), span - T)
        ref_attention.clear()
        fast_attention.clear()
        ref_logits, ref_loss, ref_grads, ref_state = window_pass(reference, ref_runtime, inputs, targets, ref_state)
        fast_logits, fast_loss, fast_grads, fast_state = window_pass(fast, fast_runtime, inputs, targets, fast_state)
        grad_errors = {name: rel_error(fast_grads[name], ref_grads[name]) for name in ref_grads}
        worst = max(grad_errors, key=grad_errors.get)
        fast_grads_in, ref_grads_in = fast_attention.input_grads, ref_attention.input_grads
        row = {
            "window": i + 1,
            "memory_read": memory_read,
            "loss_ref_nats": float(ref_loss),
            "loss_fast_nats": float(fast_loss),
            "attention_row_rel_err": worst_error(fast_attention.outputs, ref_attention.outputs, worst_row_rel_error),
            "attention_grad_query_rel_err": worst_error([g[0] for g in fast_grads_in], [g[0] for g in ref_grads_in]),
            "attention_grad_kv_rel_err": worst_error([g[1] for g in fast_grads_in], [g[1] for g in ref_grads_in]),
            "logits_rel_err": rel_error(fast_logits, ref_logits),
            "loss_rel_err": rel_error(fast_loss, ref_loss),
            "grad_rel_err_median": statistics.median(grad_errors.values()),
            "grad_rel_err_max": grad_errors[worst],
            "grad_worst_param": worst,
            "memory_rel_err": worst_error(fast_state.memory, ref_state.memory),
            "lstm_h_rel_err": worst_error([h for h, _ in fast_state.lstm], [h for h, _ in ref_state.lstm]),
            "lstm_c_rel_err": worst_error([c for _, c in fast_state.lstm], [c for _, c in ref_state.lstm]),
            "grad_rel_err": grad_errors,
        }
        row["failed"] = [key for key, limit in LIMITS.items() if row[key] is not None and not row[key] <= limit]
        row["passed"] = not row["failed"]
        rows.append(row)
    return {"windows": rows, "passed": all(r["passed"] for r in rows)}


# (b): the settings of both runs (after the preset and the user's overrides), and of each.
TRAIN_SETTINGS = [
    "data=enwik8-head",
    "bptt_jitter=false",
    "log_every_steps=1",
    "valid_every_steps=0",
    "sample_bytes=0",
    f"checkpoint_every_steps={10**9}",
]
TRAIN_PATHS = {"eager": ["fast_path=off", "precision=fp32"], "fast": ["fast_path=on", "precision=bf16"]}


def training_configs(preset: str, overrides: list[str], device: torch.device, steps: int, compile: bool) -> dict:
    """Part (b)'s two run configurations, ``{"eager": TrainConfig, "fast": TrainConfig}``:
    the preset with the user's ``overrides`` (streams and bptt included), then
    :data:`TRAIN_SETTINGS` and each path's. Raises ``ConfigError``."""
    settings = [
        *overrides,
        *TRAIN_SETTINGS,
        f"max_steps={steps}",
        f"epochs={steps}",
        f"device={device}",
        f"compile={str(compile).lower()}",
    ]  # an epoch has at least one step: epochs=steps never ends a run
    # the run's closing validation and test, which part (b) does not compare: 8 windows each
    base = load_config(preset, settings)
    settings += [
        f"valid_max_bytes={8 * base.valid_streams * base.bptt}",
        f"test_max_bytes={8 * base.test_streams * base.bptt}",
    ]
    return {path: load_config(preset, settings + extra) for path, extra in TRAIN_PATHS.items()}


def train_run(config, run_dir: Path) -> tuple[list[float], float, float]:
    """One ``sharnn.training.trainer.train`` run of ``config`` into ``run_dir``: its per-step training
    losses (nats, from ``metrics.jsonl``), its training seconds (``summary.json``) and
    tokens/s (the median of its logged steps). A run that diverges ends its losses with a
    NaN (so the check fails) and has NaN seconds."""
    try:
        seconds = train(config, run_dir, quiet=True)["train_seconds"]
    except TrainingDiverged:
        seconds = math.nan
    records = [r for r in read_records(run_dir) if r["split"] == "train"]
    losses = [r["bpc"] * math.log(2) for r in records] + ([math.nan] if math.isnan(seconds) else [])
    return losses, seconds, statistics.median(r["tokens_per_s"] for r in records) if records else math.nan


def block_means(values: list[float], size: int) -> list[float]:
    return [statistics.fmean(values[i : i + size]) for i in range(0, len(values), size)]


def check_training(configs: dict, steps: int) -> dict:
    """Part (b): the recipe run twice from the same seed on the same batches, eager fp32
    against fast bf16 (``configs`` from :func:`training_configs`)."""
    with tempfile.TemporaryDirectory(prefix="check_fast_path-") as folder:
        eager_losses, eager_seconds, eager_rate = train_run(configs["eager"], Path(folder) / "eager")
        fast_losses, fast_seconds, fast_rate = train_run(configs["fast"], Path(folder) / "fast")

    eager_blocks, fast_blocks = (
        block_means(eager_losses, TRAIN_BLOCK_STEPS),
        block_means(fast_losses, TRAIN_BLOCK_STEPS),
    )
    final = min(TRAIN_FINAL_STEPS, steps)
    eager_final, fast_final = statistics.fmean(eager_losses[-final:]), statistics.fmean(fast_losses[-final:])
    finite = all(math.isfinite(x) for x in eager_losses + fast_losses)
    final_diff = fast_final - eager_final
    return {
        "steps": steps,
        "block_steps": TRAIN_BLOCK_STEPS,
        "final_steps": final,
        "eager": {
            "loss_nats": eager_losses,
            "block_mean_bpc": [x / math.log(2) for x in eager_blocks],
            "final_mean_nats": eager_final,
            "seconds": eager_seconds,
            "tokens_per_s": eager_rate,
        },
        "fast": {
            "loss_nats": fast_losses,
            "block_mean_bpc": [x / math.log(2) for x in fast_blocks],
            "final_mean_nats": fast_final,
            "seconds": fast_seconds,
            "tokens_per_s": fast_rate,
        },
        "max_block_diff_bpc": max(abs(a - b) for a, b in zip(eager_blocks, fast_blocks)) / math.log(2),
        "final_diff_nats": final_diff,
        "final_tolerance_nats": TRAIN_FINAL_TOL_NATS,
        "all_finite": finite,
        "passed": finite and abs(final_diff) <= TRAIN_FINAL_TOL_NATS,
    }


def print_outputs(outputs: dict) -> None:
    """Part (a)'s table, one row per window, and the limits."""
    columns = [
        ("window", "window", ""),
        ("memory_read", "memory", ""),
        ("loss_ref_nats", "loss ref", ".4f"),
        ("attention_row_rel_err", "attn row", ".2e"),
        ("attention_grad_query_rel_err", "attn grad q", ".2e"),
        ("attention_grad_kv_rel_err", "attn grad kv", ".2e"),
        ("logits_rel_err", "logits", ".2e"),
        ("loss_rel_err", "loss", ".2e"),
        ("grad_rel_err_median", "grad median", ".2e"),
        ("grad_rel_err_max", "grad max", ".2e"),
        ("grad_worst_param", "worst param", ""),
        ("memory_rel_err", "memory out", ".2e"),
        ("lstm_h_rel_err", "lstm h", ".2e"),
        ("lstm_c_rel_err", "lstm c", ".2e"),
        ("verdict", "verdict", ""),
    ]
    header = {key: name for key, name, _ in columns}
    print_table(
        [
            r | {"verdict": "ok" if r["passed"] else "FAIL: " + ", ".join(header[k] for k in r["failed"])}
            for r in outputs["windows"]
        ],
        columns,
    )
    print("limits: " + ", ".join(f"{header[key]} {limit:g}" for key, limit in LIMITS.items()))


def print_training(training: dict, steps: int, compile: bool) -> None:
    """Part (b)'s loss curves in blocks of steps, and the final comparison."""
    block_rows = [
        {
            "steps": f"{i * TRAIN_BLOCK_STEPS + 1}-{min((i + 1) * TRAIN_BLOCK_STEPS, steps)}",
            "eager": e,
            "fast": f,
            "diff": f - e,
        }
        for i, (e, f) in enumerate(zip(training["eager"]["block_mean_bpc"], training["fast"]["block_mean_bpc"]))
    ]
    print_table(
        block_rows,
        [
            ("steps", "steps", ""),
            ("eager", "eager BPC", ".4f"),
            ("fast", "fast BPC", ".4f"),
            ("diff", "fast - eager", "+.4f"),
        ],
    )
    eager, fast = training["eager"], training["fast"]
    print(
        f"max |block difference| {training['max_block_diff_bpc']:.4f} BPC; final {training['final_steps']}-step "
        f"mean eager {eager['final_mean_nats']:.4f} nats, fast {fast['final_mean_nats']:.4f} nats, difference "
        f"{training['final_diff_nats']:+.4f} (limit +-{TRAIN_FINAL_TOL_NATS}); {eager['seconds']:.1f} s eager, "
        f"{fast['seconds']:.1f} s fast (training wall clock, the final validation"
        + (" and compilation" if compile else "")
        + " included)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="enwik8-paper")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--streams", type=int, default=8, help="parallel streams B, both parts [8]")
    parser.add_argument("--bptt", type=int, default=256, help="window length T, both parts [256]")
    parser.add_argument(
        "--windows",
        type=int,
        default=None,
        help="windows of part (a) [ceil(span / bptt) + 1: the memory fills and is cut]",
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps of part (b) per path [300]")
    parser.add_argument("--no-compile", action="store_true", help="fast path without torch.compile")
    parser.add_argument("--json", default=None, help="results file [benchmarks/results/check_fast_path.json]")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (model.d_model=32 ...)")
    args = parse_args_with_overrides(parser)

    options = {"train_streams": "--streams", "bptt": "--bptt"}
    for item in args.overrides:
        key = item.split("=", 1)[0]
        if key in options:
            parser.error(f"set {key} with {options[key]}, not as an override")
    if args.steps < 1 or args.streams < 1 or args.bptt < 1 or (args.windows is not None and args.windows < 1):
        parser.error("--steps, --streams, --bptt and --windows must be >= 1")
    overrides = [*args.overrides, f"train_streams={args.streams}", f"bptt={args.bptt}"]
    compile = not args.no_compile
    try:
        config = load_config(args.preset, overrides)
        device = resolve_device(args.device)
        train_configs = training_configs(args.preset, overrides, device, args.steps, compile)
    except ConfigError as e:
        parser.error(str(e))
    windows = args.windows or -(-config.model.attention_span // config.bptt) + 1
    ieee_fp32()

    print(
        f"preset {args.preset} {' '.join(args.overrides)}: d {config.model.d_model}, {config.model.n_layers} layers, "
        f"attention {config.model.attention_blocks()}, span {config.model.attention_span}, "
        f"{config.train_streams} streams, bptt {config.bptt}; device {device}; "
        f"fast path bf16 autocast{', compiled' if compile else ''} vs eager fp32"
    )

    print(
        f"\n(a) outputs and gradients, {windows} windows, weights redrawn, dropout 0 "
        f"(relative errors ||fast - ref|| / ||ref||)"
    )
    outputs = check_outputs(config, device, windows, compile)
    print_outputs(outputs)

    print(
        f"\n(b) training {args.steps} steps on enwik8-head from one init, dropout as configured "
        f"(loss in bits per byte, means over {TRAIN_BLOCK_STEPS} steps)"
    )
    training = check_training(train_configs, args.steps)
    print_training(training, args.steps, compile)

    passed = outputs["passed"] and training["passed"]
    print(f"\n(a) outputs and gradients: {'PASS' if outputs['passed'] else 'FAIL'}")
    print(f"(b) training: {'PASS' if training['passed'] else 'FAIL'}")
    result = {
        "environment": environment(device),
        "preset": args.preset,
        "overrides": args.overrides,
        "streams": config.train_streams,
        "bptt": config.bptt,
        "windows": windows,
        "compile": compile,
        "reference": "eager path, fp32 (IEEE on CUDA: no TF32), no autocast",
        "fast": "fast path, bf16 memory, bf16 autocast" + (", torch.compile" if compile else ""),
        "thresholds": LIMITS | {"train_final_tol_nats": TRAIN_FINAL_TOL_NATS},
        "outputs": outputs,
        "training": training,
        "passed": passed,
    }
    write_json(result, "check_fast_path.json", args.json)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
