"""Training throughput on a shared CPU: tokens/s of a preset's training steps on a quiet
machine and beside busy processes, for each way of running torch's threads (docs/training.md,
"Threads on a shared CPU"; it chose ``sharnn``'s default).

Each setting trains in a fresh child process (the OpenMP runtime reads its environment when
torch loads): the preset's model on its corpus, ``--warmup`` steps, then as many steps as
fit in ``--seconds``, through ``sharnn.training.recipe.train_step`` as ``sharnn train``
runs it. The settings:

- ``spin``: all cores' threads, libgomp's default wait policy (a thread that waits spins
  for a while before sleeping): what torch does when nothing is set;
- ``passive``: all cores' threads, ``OMP_WAIT_POLICY=PASSIVE`` (a waiting thread sleeps at
  once): what the ``sharnn`` command sets unless the environment says otherwise;
- ``1-thread``: one thread.

Each runs quiet, then beside ``--busy`` processes that spin in pure Python (another program
on the machine). The table gives tokens/s and, per setting, busy / quiet; the JSON has it all.

    python benchmarks/train_contention.py                  # tiny, 40 s per cell
    python benchmarks/train_contention.py --seconds 5 --warmup 1 model.d_model=64 model.boom_dim=128
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from common import environment, print_table, write_json

SETTINGS = {
    "spin": {"OMP_WAIT_POLICY": None},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1-thread": {"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}
BUSY = [sys.executable, "-c", "while True: pass"]


def child(preset: str, overrides: list[str], seconds: float, warmup: int) -> dict:
    """Train in this process for ``seconds`` after ``warmup`` steps; tokens/s and threads."""
    import torch

    from sharnn import SHARNN, load_config, load_corpus
    from sharnn.data.corpus import batchify, get_batch
    from sharnn.runtime import Runtime
    from sharnn.training.recipe import build_optimizer, train_step

    config = load_config(preset, overrides)
    runtime = Runtime.for_training(dataclasses.replace(config, device="cpu"))
    torch.manual_seed(0)
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    batches = batchify(corpus.train, config.train_streams)
    model = runtime.prepare(SHARNN(config.model)).train()
    optimizer, scaler, state = build_optimizer(model, config), runtime.grad_scaler(), None
    T, windows = config.bptt, (len(batches) - 1) // config.bptt

    def step(i: int) -> None:
        nonlocal state
        inputs, targets = get_batch(batches, (i % windows) * T, T)
        _, _, state = train_step(model, optimizer, scaler, inputs, targets, state, config.clip, runtime.autocast_dtype)

    for i in range(warmup):
        step(i)
    started, steps = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        step(warmup + steps)
        steps += 1
    spent = time.perf_counter() - started
    tokens_per_s = steps * T * config.train_streams / spent
    return {"tokens_per_s": tokens_per_s, "steps": steps, "threads": torch.get_num_threads()}


def measure(setting: str, busy: int, args) -> dict:
    """One cell: the child of ``setting`` beside ``busy`` spinning processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update({k: v for k, v in SETTINGS[setting].items() if v is not None})
    command = [sys.executable, __file__, "--child", "--preset", args.preset, "--seconds", str(args.seconds)]
    command += ["--warmup", str(args.warmup), *args.overrides]
    spinners = [subprocess.Popen(BUSY) for _ in range(busy)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return {"setting": setting, "busy": busy} | json.loads(done.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, as for sharnn train")
    parser.add_argument("--seconds", type=float, default=40.0, help="timed seconds per cell")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside the busy cells")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/train_contention.json]")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.preset, args.overrides, args.seconds, args.warmup)))
        return

    rows = [measure(setting, busy, args) for busy in (0, args.busy) for setting in SETTINGS]
    quiet = {r["setting"]: r["tokens_per_s"] for r in rows if r["busy"] == 0}
    fastest = max(quiet.values())
    for r in rows:
        r["of_quiet"] = r["tokens_per_s"] / quiet[r["setting"]]
        r["of_fastest_quiet"] = r["tokens_per_s"] / fastest
    print(f"preset {args.preset} {' '.join(args.overrides)}, {os.cpu_count()} CPUs, {args.seconds:g} s per cell")
    print_table(
        rows,
        [
            ("setting", "setting", ""),
            ("threads", "threads", ""),
            ("busy", "busy processes", ""),
            ("tokens_per_s", "tokens/s", ",.0f"),
            ("of_quiet", "/ its quiet", ".2f"),
            ("of_fastest_quiet", "/ fastest quiet", ".2f"),
        ],
    )
    import torch

    result = {
        "preset": args.preset,
        "overrides": args.overrides,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "busy": args.busy,
        "cpus": os.cpu_count(),
        "rows": rows,
        **environment(torch.device("cpu")),
    }
    write_json(result, "train_contention.json", args.json)


if __name__ == "__main__":
    main()
