"""Training throughput (tokens/s) and peak GPU memory of the SHA-RNN, per preset, number
of streams and execution path, next to the floor: the bare LSTM stack alone.

Every row is one real training step repeated (``sharnn.training.recipe.train_step``: forward under
the runtime's autocast, cross-entropy, backward, gradient clip, the optimizer of
``sharnn.training.recipe.build_optimizer``, Min-Trust LAMB), on windows of ``T = bptt`` seeded
random bytes in ``--streams`` parallel streams (no jitter, no corpus), the LSTM state and
attention memory carried between windows. The model is built and prepared by the
path's ``sharnn.runtime.Runtime`` (``common.PATHS``), as ``sharnn train`` does; the loss
scaler is the runtime's. Paths (``--paths``):

    fast            fast path (SDPA attention, bf16 memory) + torch.compile of the
                    attention and feed-forward sub-layers, bf16 autocast
    fast-nocompile  the same without torch.compile
    fast-recompute  fast, with activation recompute of the attention and feed-forward sub-layers
    eager           the reference path, fp32, no autocast

The floor is the model's ``n_layers`` LSTMs and nothing else (no embedding, attention,
Boom, LayerNorm, loss or optimizer), run as the model runs them (``Block.recurrence``:
cuDNN, bf16 under the bf16 autocast of ``sharnn.runtime``): forward + backward over
``[T, B, d]``, the input requiring grad as in the model, the state carried between
windows. ``model/floor`` = ms/step of the row / ms/step of the floor (same preset and
streams); ``vs eager`` = eager ms/step / the row's ms/step.

Each configuration first runs enough windows to fill the attention memory and to compile
(``common.warmup_windows``), then ``--repeats`` times ``--steps`` timed steps; the table
gives medians, the JSON every repeat. A configuration that runs out of GPU memory is
recorded as OOM and the run goes on. The issue's targets are judged at the end (only for
rows that were measured, and only without overrides, which change the presets).

    PYTHONPATH=src python benchmarks/train_throughput.py --device cuda      # all three presets
    # or one preset per command (each compiles its fast rows; JSON per preset set):
    PYTHONPATH=src python benchmarks/train_throughput.py --device cuda --presets enwik8-paper
    PYTHONPATH=src python benchmarks/train_throughput.py --device cuda --presets enwik8-paper-4head
    PYTHONPATH=src python benchmarks/train_throughput.py --device cuda --presets enwik8-paper-noattn
    PYTHONPATH=src python benchmarks/train_throughput.py --device cuda --presets enwik8-paper \
        --streams 64 --paths fast fast-recompute fast-nocompile
    python benchmarks/train_throughput.py --device cpu --presets tiny --streams 2 --steps 1 \
        --repeats 1 --paths fast-nocompile eager model.d_model=32 model.boom_dim=64 bptt=16 model.attention_span=48
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from common import (
    PATHS,
    add_throughput_options,
    build_model,
    environment,
    judge,
    measure_or_oom,
    median,
    parse_throughput_args,
    peak_memory_gib,
    print_table,
    print_targets,
    reset_peak_memory,
    start_measurement,
    time_repeats,
    time_windows,
    torch_settings,
    write_json,
)
from sharnn.runtime import Runtime
from sharnn.training.recipe import build_optimizer, train_step

DEFAULT_PRESETS = ["enwik8-paper", "enwik8-paper-4head", "enwik8-paper-noattn"]
FLOOR_WARMUP = 3


def measure_model(config, streams: int, path: str, device: torch.device, steps: int, repeats: int) -> dict:
    """Seconds of each repeat of ``steps`` training steps of the SHA-RNN on ``path``."""
    runtime, model = start_measurement(config, path, device)
    model.train()
    optimizer = build_optimizer(model, config)
    scaler = runtime.grad_scaler()
    state = loss = None

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        nonlocal state, loss
        loss, _, state = train_step(
            model, optimizer, scaler, inputs, targets, state, config.clip, runtime.autocast_dtype
        )

    seconds = time_windows(config, streams, device, step, steps, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device), "last_loss": float(loss)}


def measure_floor(config, streams: int, device: torch.device, steps: int, repeats: int) -> dict:
    """Seconds of each repeat of ``steps`` forward + backward passes of the bare LSTM stack:
    the model's own ``Block.recurrence`` (cuDNN's LSTM, run in bf16 under autocast) and
    nothing else."""
    reset_peak_memory(device)
    runtime = Runtime(device, autocast_dtype=torch.bfloat16)  # the reference path under bf16 autocast
    blocks = build_model(config, runtime).blocks
    x = torch.randn(config.bptt, streams, config.model.d_model, device=device, requires_grad=True)  # [T, B, d]
    state = [None] * len(blocks)
    lstm_dtype = None

    def run(n: int) -> None:
        nonlocal state, lstm_dtype
        for _ in range(n):
            with runtime.autocast():
                h, new_state = x, []
                for block, s in zip(blocks, state):
                    h, s = block.recurrence(h, s)
                    new_state.append(s)
            lstm_dtype = h.dtype
            h.float().sum().backward()
            for p in blocks.parameters():
                p.grad = None
            x.grad = None
            state = [(h_.detach(), c_.detach()) for h_, c_ in new_state]

    run(FLOOR_WARMUP)
    seconds = time_repeats(lambda: run(steps), device, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device), "lstm_dtype": str(lstm_dtype)}


def summarise(group: list[dict], tokens_per_step: int, steps: int) -> list[dict]:
    """Add ms/step, tokens/s, model/floor and speedup over eager to the rows of one
    preset and number of streams (the floor first)."""
    for row in group:
        if row["status"] == "ok":
            step_s = median(row["seconds"]) / steps
            row["ms_per_step"], row["tokens_per_s"] = 1000 * step_s, tokens_per_step / step_s
    ms = {row["path"]: row.get("ms_per_step") for row in group}
    for row in group:
        if row["path"] != "floor" and row.get("ms_per_step"):
            if ms["floor"]:
                row["floor_ratio"] = row["ms_per_step"] / ms["floor"]
            if row["path"] != "eager" and ms.get("eager"):
                row["speedup_vs_eager"] = ms["eager"] / row["ms_per_step"]
    return group


def judge_targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, for the rows that exist."""
    row = {(r["preset"], r["streams"], r["path"]): r for r in rows}
    targets = []
    if r := row.get(("enwik8-paper", 16, "fast")):
        targets.append(
            judge("enwik8-paper 16 streams fast >= 150,000 tokens/s", r.get("tokens_per_s"), 150_000, True, "tokens/s")
        )
        targets.append(judge("enwik8-paper 16 streams fast model/floor <= 1.5", r.get("floor_ratio"), 1.5, False, "x"))
    if r := row.get(("enwik8-paper", 64, "fast")):
        targets.append(
            judge("enwik8-paper 64 streams fast >= 400,000 tokens/s", r.get("tokens_per_s"), 400_000, True, "tokens/s")
        )
    for (preset, streams, path), r in row.items():
        if path == "fast" and (preset, streams, "eager") in row:
            targets.append(
                judge(f"{preset} {streams} streams fast >= 4x eager", r.get("speedup_vs_eager"), 4.0, True, "x")
            )
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--presets", nargs="+", default=DEFAULT_PRESETS)
    parser.add_argument("--streams", nargs="+", type=int, default=[8, 16, 64], help="parallel streams B [8 16 64]")
    parser.add_argument("--paths", nargs="+", default=["fast", "eager"], choices=list(PATHS))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    add_throughput_options(
        parser, "train_throughput_PRESETS.json", "key=value config overrides applied to every preset"
    )
    args, device, configs = parse_throughput_args(parser, lambda args: args.presets)

    rows = []
    for preset, config in configs.items():
        for streams in args.streams:
            group = []
            for path in ["floor", *args.paths]:
                print(f"measuring {preset} {streams} streams {path}", file=sys.stderr, flush=True)
                if path == "floor":
                    measure = partial(measure_floor, config, streams, device, args.steps, args.repeats)
                else:
                    measure = partial(measure_model, config, streams, path, device, args.steps, args.repeats)
                group.append({"preset": preset, "streams": streams, "path": path} | measure_or_oom(measure, device))
            rows += summarise(group, config.bptt * streams, args.steps)

    env = environment(device)
    print(
        f"\ntraining throughput, T = bptt, device {env['device']} ({env.get('gpu', 'cpu')}), torch {env['torch']}, "
        f"{args.steps} steps x {args.repeats} repeats (medians)"
    )
    print_table(
        rows,
        [
            ("preset", "preset", ""),
            ("streams", "streams", "d"),
            ("path", "path", ""),
            ("tokens_per_s", "tokens/s", ",.0f"),
            ("ms_per_step", "ms/step", ".1f"),
            ("peak_gib", "peak GiB", ".2f"),
            ("floor_ratio", "model/floor", ".2f"),
            ("speedup_vs_eager", "vs eager", ".2f"),
            ("status", "status", ""),
        ],
    )
    targets = [] if args.overrides else judge_targets(rows)
    if args.overrides:
        print("\ntargets not judged: the overrides change the presets")
    else:
        print_targets(targets, ",.2f")
    write_json(
        {"environment": env, "settings": torch_settings(), "args": vars(args), "rows": rows, "targets": targets},
        f"train_throughput_{'+'.join(args.presets)}.json",
        args.json,
    )


if __name__ == "__main__":
    main()
