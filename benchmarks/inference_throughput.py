"""Inference throughput of the SHA-RNN with a full attention memory: evaluation tokens/s
and generation bytes/s, per execution path (``--paths``, as in ``train_throughput.py``):

    fast            fast path (SDPA attention, bf16 memory) + torch.compile of the
                    attention and feed-forward sub-layers, bf16 autocast
    fast-nocompile  the same without torch.compile (what ``sharnn generate`` runs on CUDA by default)
    eager           the reference path, fp32, no autocast

Each path's model is built and prepared by the path's ``sharnn.runtime.Runtime``
(``common.PATHS``), from the preset's seed.

Evaluation (``--eval-streams`` parallel streams): the loop of ``sharnn.evaluation.evaluate``
(model.eval(), no grad, ``sharnn.evaluation.window_nll`` on each ``[T = bptt, B]`` window:
forward under the runtime's autocast carrying state and memory, summed cross-entropy
kept on the device) on seeded random bytes; the memory is filled first.

Generation (``--gen-streams`` parallel streams): ``sharnn.generation.generate``
(temperature 1, no top-k/top-p, as ``sharnn generate``) first feeds a prompt of
``attention_span`` random bytes per stream, so the memory is full, then generates a few
bytes to warm up, then ``--gen-bytes`` timed bytes per stream, ``--repeats`` times. With
one stream each byte is read with ``int()`` as it comes, as a streaming user would; with
more, the tokens stay on the device and are synchronised at the end. bytes/s counts every
stream.

The table gives medians, the JSON every repeat; a configuration that runs out of GPU
memory is recorded as OOM. The issue's generation targets (fast paths) are judged for
the enwik8-paper preset without overrides.

    PYTHONPATH=src python benchmarks/inference_throughput.py --device cuda
    PYTHONPATH=src python benchmarks/inference_throughput.py --device cuda --gen-streams 1 64 --gen-bytes 500
    python benchmarks/inference_throughput.py --device cpu --preset tiny --eval-streams 2 --gen-streams 1 2 \
        --gen-bytes 4 --steps 1 --repeats 1 --paths fast-nocompile eager \
        model.d_model=32 model.boom_dim=64 bptt=16 model.attention_span=48
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from common import (
    add_throughput_options,
    environment,
    judge,
    measure_or_oom,
    median,
    parse_throughput_args,
    peak_memory_gib,
    print_table,
    print_targets,
    start_measurement,
    time_repeats,
    time_windows,
    torch_settings,
    write_json,
)
from sharnn.evaluation import window_nll
from sharnn.generation import generate

INFERENCE_PATHS = ["fast", "fast-nocompile", "eager"]
GEN_WARMUP_BYTES = 8  # after the prompt: the T = 1 shapes compile here


def measure_eval(config, streams: int, path: str, device: torch.device, steps: int, repeats: int) -> dict:
    """Seconds of each repeat of ``steps`` evaluation windows ``[bptt, streams]``."""
    runtime, model = start_measurement(config, path, device)
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    state = None

    @torch.no_grad()
    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        nonlocal state
        nll, state = window_nll(model, inputs, targets, state, runtime.autocast_dtype)
        total.add_(nll)

    seconds = time_windows(config, streams, device, step, steps, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device)}


def measure_generation(config, streams: int, path: str, device: torch.device, gen_bytes: int, repeats: int) -> dict:
    """Seconds of each repeat of generating ``gen_bytes`` bytes in each of ``streams`` streams."""
    runtime, model = start_measurement(config, path, device)
    prompts = torch.randint(0, 256, (config.model.attention_span, streams), generator=torch.Generator().manual_seed(0))
    steps = generate(
        model,
        prompts,
        1 + GEN_WARMUP_BYTES + repeats * gen_bytes,
        seed=0,
        window=config.bptt,
        autocast_dtype=runtime.autocast_dtype,
    )
    for _ in range(1 + GEN_WARMUP_BYTES):  # the first feeds the whole prompt
        next(steps)

    def run() -> None:
        if streams == 1:
            for _ in range(gen_bytes):
                int(next(steps))  # waits for the byte, as a streaming reader does
        else:
            for _ in range(gen_bytes):
                next(steps)  # stays on the device; time_repeats synchronises at the end

    seconds = time_repeats(run, device, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device)}


def summarise(rows: list[dict], units_per_repeat, key: str) -> None:
    """Add ``key`` (units/s) and the speedup over eager (same streams) to measured rows."""
    for row in rows:
        if row["status"] == "ok":
            row[key] = units_per_repeat(row) / median(row["seconds"])
    eager = {row["streams"]: row.get(key) for row in rows if row["path"] == "eager"}
    for row in rows:
        if row["path"] != "eager" and row.get(key) and eager.get(row["streams"]):
            row["speedup_vs_eager"] = row[key] / eager[row["streams"]]


def judge_targets(gen_rows: list[dict]) -> list[dict]:
    targets = []
    for row in gen_rows:
        streams = row["streams"]
        goal = {1: 2_000, 64: 50_000}.get(streams)
        if row["path"] != "eager" and goal:
            what = "1 stream" if streams == 1 else f"{streams} streams"
            targets.append(
                judge(
                    f"generation {row['path']} {what} >= {goal:,} bytes/s",
                    row.get("bytes_per_s"),
                    goal,
                    True,
                    "bytes/s",
                )
            )
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--preset", default="enwik8-paper")
    parser.add_argument("--paths", nargs="+", default=INFERENCE_PATHS, choices=INFERENCE_PATHS)
    parser.add_argument(
        "--eval-streams", nargs="+", type=int, default=[16, 64], help="parallel streams of evaluation [16 64]"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed evaluation windows per repeat")
    parser.add_argument(
        "--gen-streams", nargs="+", type=int, default=[1, 64], help="parallel streams of generation [1 64]"
    )
    parser.add_argument("--gen-bytes", type=int, default=200, help="timed bytes per stream per repeat")
    add_throughput_options(parser, "inference_throughput_PRESET.json", "key=value config overrides")
    args, device, configs = parse_throughput_args(parser, lambda args: [args.preset])
    config = configs[args.preset]

    eval_rows, gen_rows = [], []
    for streams in args.eval_streams:
        for path in args.paths:
            print(f"measuring eval {streams} streams {path}", file=sys.stderr, flush=True)
            measure = partial(measure_eval, config, streams, path, device, args.steps, args.repeats)
            result = measure_or_oom(measure, device)
            eval_rows.append({"streams": streams, "path": path} | result)
    for streams in args.gen_streams:
        for path in args.paths:
            print(f"measuring generation {streams} streams {path}", file=sys.stderr, flush=True)
            measure = partial(measure_generation, config, streams, path, device, args.gen_bytes, args.repeats)
            result = measure_or_oom(measure, device)
            gen_rows.append({"streams": streams, "path": path} | result)
    summarise(eval_rows, lambda row: args.steps * config.bptt * row["streams"], "tokens_per_s")
    summarise(gen_rows, lambda row: args.gen_bytes * row["streams"], "bytes_per_s")
    for row in eval_rows:
        if row["status"] == "ok":
            row["ms_per_window"] = 1000 * median(row["seconds"]) / args.steps
    for row in gen_rows:
        if row["status"] == "ok":
            row["bytes_per_s_per_stream"] = row["bytes_per_s"] / row["streams"]
            row["ms_per_byte_step"] = 1000 * median(row["seconds"]) / args.gen_bytes

    env = environment(device)
    print(
        f"\n{args.preset}: device {env['device']} ({env.get('gpu', 'cpu')}), torch {env['torch']}, "
        f"span {config.model.attention_span} (memory full), {args.repeats} repeats (medians)"
    )
    print(f"\nevaluation, T = {config.bptt}, {args.steps} windows per repeat")
    print_table(
        eval_rows,
        [
            ("streams", "streams", "d"),
            ("path", "path", ""),
            ("tokens_per_s", "tokens/s", ",.0f"),
            ("ms_per_window", "ms/window", ".1f"),
            ("peak_gib", "peak GiB", ".2f"),
            ("speedup_vs_eager", "vs eager", ".2f"),
            ("status", "status", ""),
        ],
    )
    print(f"\ngeneration, {args.gen_bytes} bytes per stream per repeat")
    print_table(
        gen_rows,
        [
            ("streams", "streams", "d"),
            ("path", "path", ""),
            ("bytes_per_s", "bytes/s", ",.0f"),
            ("bytes_per_s_per_stream", "bytes/s/stream", ",.0f"),
            ("ms_per_byte_step", "ms/step", ".2f"),
            ("peak_gib", "peak GiB", ".2f"),
            ("speedup_vs_eager", "vs eager", ".2f"),
            ("status", "status", ""),
        ],
    )
    judged = args.preset == "enwik8-paper" and not args.overrides
    targets = judge_targets(gen_rows) if judged else []
    if not judged:
        print("\ntargets not judged: they are for the enwik8-paper preset without overrides")
    else:
        print_targets(targets, ",.0f")
    write_json(
        {
            "environment": env,
            "settings": torch_settings(),
            "args": vars(args),
            "eval": eval_rows,
            "generation": gen_rows,
            "targets": targets,
        },
        f"inference_throughput_{args.preset}.json",
        args.json,
    )


if __name__ == "__main__":
    main()
