"""Inference throughput of the SHA-RNN with a full attention memory: evaluation tokens/s
and generation bytes/s, per execution path (``--paths``, as in ``train_throughput.py``):

    fast            fast path (SDPA attention, bf16 memory) + torch.compile, bf16 autocast
    fast-nocompile  the same without torch.compile (what ``sharnn generate`` runs)
    eager           the reference path, fp32, no autocast

Evaluation (``--eval-batches`` streams): the inner loop of ``sharnn.evaluate`` (model.eval(),
no grad, forward of a ``[T = bptt, B]`` window carrying state and memory, summed
cross-entropy kept on the device) on seeded random bytes; the memory is filled first.

Generation (``--gen-batches`` streams): ``sharnn.sample`` (temperature 1, no top-k/top-p,
as ``sharnn generate``) first feeds a prompt of ``attention_span`` random bytes per stream,
so the memory is full, then generates a few bytes to warm up, then ``--gen-bytes`` timed
bytes per stream, ``--repeats`` times. With one stream each byte is read with ``int()`` as
it comes, as a streaming user would; with more, the tokens stay on the device and are
synchronised at the end. bytes/s counts every stream.

The table gives medians, the JSON every repeat; a configuration that runs out of GPU
memory is recorded as OOM. The issue's generation targets (fast paths) are judged for
the enwik8-paper preset without overrides.

    PYTHONPATH=src python benchmarks/inference_throughput.py --device cuda
    PYTHONPATH=src python benchmarks/inference_throughput.py --device cuda --gen-batches 1 64 --gen-bytes 500
    python benchmarks/inference_throughput.py --device cpu --preset tiny --eval-batches 2 --gen-batches 1 2 \
        --gen-bytes 4 --steps 1 --repeats 1 --paths fast-nocompile eager \
        model.d_model=32 model.boom_dim=64 bptt=16 model.attention_span=48
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from common import (
    PATHS, environment, measure_or_oom, median, parse_args_with_overrides, peak_memory_gib, print_table,
    print_targets, torch_settings,
    random_windows, reset_peak_memory, time_repeats, warmup_windows, write_json,
)
from sharnn import SHARNN, load_config, sample
from sharnn.errors import ConfigError
from sharnn.train import resolve_device

INFERENCE_PATHS = ["fast", "fast-nocompile", "eager"]
GEN_WARMUP_BYTES = 8  # after the prompt: the T = 1 shapes compile here
DATA_WINDOWS = 4  # distinct random windows, cycled


def build_model(config, path: str, device: torch.device) -> SHARNN:
    torch.manual_seed(config.seed)
    return SHARNN(config.model).to(device).eval().set_execution(**PATHS[path][0])


def measure_eval(config, batch: int, path: str, device: torch.device, steps: int, repeats: int) -> dict:
    """Seconds of each repeat of ``steps`` evaluation windows ``[bptt, batch]``."""
    reset_peak_memory(device)
    amp_dtype = PATHS[path][1]
    model = build_model(config, path, device)
    windows = random_windows(config.bptt, batch, DATA_WINDOWS, device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    state, done = None, 0

    @torch.no_grad()
    def run(n: int) -> None:
        nonlocal state, done
        for _ in range(n):
            inputs, targets = windows[done % DATA_WINDOWS]
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                logits, state = model(inputs, state)
            total.add_(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double())
            done += 1

    run(warmup_windows(config))
    seconds = time_repeats(lambda: run(steps), device, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device)}


def measure_generation(config, batch: int, path: str, device: torch.device, gen_bytes: int, repeats: int) -> dict:
    """Seconds of each repeat of generating ``gen_bytes`` bytes in each of ``batch`` streams."""
    reset_peak_memory(device)
    amp_dtype = PATHS[path][1]
    model = build_model(config, path, device)
    prompts = torch.randint(0, 256, (config.model.attention_span, batch), generator=torch.Generator().manual_seed(0))
    steps = sample(model, prompts, 1 + GEN_WARMUP_BYTES + repeats * gen_bytes, seed=0,
                   window=config.bptt, autocast_dtype=amp_dtype)
    for _ in range(1 + GEN_WARMUP_BYTES):  # the first feeds the whole prompt
        next(steps)

    def run() -> None:
        if batch == 1:
            for _ in range(gen_bytes):
                int(next(steps))  # waits for the byte, as a streaming reader does
        else:
            for _ in range(gen_bytes):
                next(steps)  # stays on the device; time_repeats synchronises at the end

    seconds = time_repeats(run, device, repeats)
    return {"seconds": seconds, "peak_gib": peak_memory_gib(device)}


def summarise(rows: list[dict], units_per_repeat, key: str) -> None:
    """Add ``key`` (units/s) and the speedup over eager (same batch) to measured rows."""
    for row in rows:
        if row["status"] == "ok":
            row[key] = units_per_repeat(row) / median(row["seconds"])
    eager = {row["batch"]: row.get(key) for row in rows if row["path"] == "eager"}
    for row in rows:
        if row["path"] != "eager" and row.get(key) and eager.get(row["batch"]):
            row["speedup_vs_eager"] = row[key] / eager[row["batch"]]


def judge_targets(gen_rows: list[dict]) -> list[dict]:
    targets = []
    for row in gen_rows:
        goal = {1: 2_000, 64: 50_000}.get(row["batch"])
        if row["path"] != "eager" and goal:
            value = row.get("bytes_per_s")
            targets.append({"target": f"generation {row['path']} batch {row['batch']} >= {goal:,} bytes/s",
                            "measured": value, "unit": "bytes/s", "pass": None if value is None else value >= goal})
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--preset", default="enwik8-paper")
    parser.add_argument("--paths", nargs="+", default=INFERENCE_PATHS, choices=INFERENCE_PATHS)
    parser.add_argument("--eval-batches", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--steps", type=int, default=10, help="timed evaluation windows per repeat")
    parser.add_argument("--gen-batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--gen-bytes", type=int, default=200, help="timed bytes per stream per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/inference_throughput_PRESET.json]")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parse_args_with_overrides(parser)
    try:
        device = resolve_device(args.device)
        config = load_config(args.preset, args.overrides)
    except ConfigError as e:
        parser.error(str(e))

    eval_rows, gen_rows = [], []
    for batch in args.eval_batches:
        for path in args.paths:
            print(f"measuring eval batch {batch} {path}", file=sys.stderr, flush=True)
            result = measure_or_oom(lambda: measure_eval(config, batch, path, device, args.steps, args.repeats), device)
            eval_rows.append({"batch": batch, "path": path} | result)
    for batch in args.gen_batches:
        for path in args.paths:
            print(f"measuring generation batch {batch} {path}", file=sys.stderr, flush=True)
            result = measure_or_oom(lambda: measure_generation(config, batch, path, device, args.gen_bytes, args.repeats), device)
            gen_rows.append({"batch": batch, "path": path} | result)
    summarise(eval_rows, lambda row: args.steps * config.bptt * row["batch"], "tokens_per_s")
    summarise(gen_rows, lambda row: args.gen_bytes * row["batch"], "bytes_per_s")
    for row in eval_rows:
        if row["status"] == "ok":
            row["ms_per_window"] = 1000 * median(row["seconds"]) / args.steps
    for row in gen_rows:
        if row["status"] == "ok":
            row["bytes_per_s_per_stream"] = row["bytes_per_s"] / row["batch"]
            row["ms_per_byte_step"] = 1000 * median(row["seconds"]) / args.gen_bytes

    env = environment(device)
    print(f"\n{args.preset}: device {env['device']} ({env.get('gpu', 'cpu')}), torch {env['torch']}, "
          f"span {config.model.attention_span} (memory full), {args.repeats} repeats (medians)")
    print(f"\nevaluation, T = {config.bptt}, {args.steps} windows per repeat")
    print_table(eval_rows, [
        ("batch", "batch", "d"), ("path", "path", ""), ("tokens_per_s", "tokens/s", ",.0f"),
        ("ms_per_window", "ms/window", ".1f"), ("peak_gib", "peak GiB", ".2f"),
        ("speedup_vs_eager", "vs eager", ".2f"), ("status", "status", ""),
    ])
    print(f"\ngeneration, {args.gen_bytes} bytes per stream per repeat")
    print_table(gen_rows, [
        ("batch", "streams", "d"), ("path", "path", ""), ("bytes_per_s", "bytes/s", ",.0f"),
        ("bytes_per_s_per_stream", "bytes/s/stream", ",.0f"), ("ms_per_byte_step", "ms/step", ".2f"),
        ("peak_gib", "peak GiB", ".2f"), ("speedup_vs_eager", "vs eager", ".2f"), ("status", "status", ""),
    ])
    judged = args.preset == "enwik8-paper" and not args.overrides
    targets = judge_targets(gen_rows) if judged else []
    if not judged:
        print("\ntargets not judged: they are for the enwik8-paper preset without overrides")
    else:
        print_targets(targets, ",.0f")
    write_json({"environment": env, "settings": torch_settings(), "args": vars(args), "eval": eval_rows,
                "generation": gen_rows, "targets": targets}, f"inference_throughput_{args.preset}.json", args.json)


if __name__ == "__main__":
    main()
