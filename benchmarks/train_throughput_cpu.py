"""Training throughput of a preset on CPU, next to a bare stack of the same layers.

The bare stack is the floor: the same ``nn.Embedding``, ``nn.LSTM`` and ``nn.Linear``
layers (Boom up-projection with its chunk sum, the attention's query projection), the
same tied softmax, but no LayerNorms, no attention over the memory, no gates and no
dropout. Both train with the same code, ``sharnn.training.recipe.train_step`` (forward under the
runtime's autocast, cross-entropy, backward, gradient clip, optimizer step, the state
carried and detached), with the optimizer of ``sharnn.training.recipe.build_optimizer`` (Min-Trust
LAMB) and the loss scaler of the preset's ``sharnn.runtime.Runtime`` on CPU (what
``sharnn train device=cpu`` runs: fp32 and the eager path unless the preset says
otherwise; the SHA-RNN is prepared by it). Both are timed in the same process,
interleaved, on the same windows of the preset's corpus (``train_streams`` streams of
``bptt`` bytes); the table gives the median tokens/s over repeats and the ratio
sharnn / bare.

    python benchmarks/train_throughput_cpu.py                # tiny; JSON in benchmarks/results/
    python benchmarks/train_throughput_cpu.py --steps 1 --repeats 2 --warmup 1 \\
        model.d_model=32 model.boom_dim=64 train_streams=2 bptt=16
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import print_table, time_repeats, write_json
from sharnn import SHARNN, load_config, load_corpus
from sharnn.data.corpus import batchify, get_batch
from sharnn.models.lstm import run_lstm
from sharnn.models.sharnn import State
from sharnn.runtime import Runtime
from sharnn.training.recipe import build_optimizer, train_step


class BareStack(nn.Module):
    """Embedding -> per block: LSTM -> [query Linear] -> Linear(d -> F) summed over F/d
    chunks -> tied logits. The same big layers as the SHA-RNN and nothing else; its
    state is a :class:`sharnn.models.sharnn.State` (LSTM states, no memory), so that
    ``sharnn.training.recipe.train_step`` drives it as it drives the model."""

    def __init__(self, model: SHARNN):
        super().__init__()
        c = model.config
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.lstms = nn.ModuleList(nn.LSTM(c.d_model, c.d_model) for _ in range(c.n_layers))
        self.booms = nn.ModuleList(nn.Linear(c.d_model, c.boom_dim) for _ in range(c.n_layers))
        self.queries = nn.ModuleList(
            nn.Linear(c.d_model, c.d_model) if b.attention is not None else nn.Identity() for b in model.blocks
        )
        self.output_bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.d_model = c.d_model

    def forward(self, tokens: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        x = self.embedding(tokens)
        lstm_states = state.lstm if state is not None else [None] * len(self.lstms)
        new_states = []
        for lstm, query, boom, s in zip(self.lstms, self.queries, self.booms, lstm_states):
            x, s = run_lstm(lstm, x, s)  # as the model runs its LSTMs (under autocast too)
            x = boom(query(x)).unflatten(-1, (-1, self.d_model)).sum(-2)
            new_states.append(s)
        logits = F.linear(x, self.embedding.weight, self.output_bias)
        return logits, State(lstm=new_states, memory=[None] * len(new_states))


def make_step(model: nn.Module, config, runtime: Runtime):
    """One training step of ``model`` per call, through ``sharnn.training.recipe.train_step``."""
    optimizer = build_optimizer(model, config)
    scaler = runtime.grad_scaler()
    state = None

    def step(inputs, targets):
        nonlocal state
        _, _, state = train_step(model, optimizer, scaler, inputs, targets, state, config.clip, runtime.autocast_dtype)

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, as for sharnn train")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--json", default=None, help="results file [default: benchmarks/results/train_throughput_cpu_PRESET.json]"
    )
    args = parser.parse_args()

    config = load_config(args.preset, args.overrides)
    runtime = Runtime.for_training(dataclasses.replace(config, device="cpu"))
    torch.manual_seed(0)
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    batched = batchify(corpus.train, config.train_streams)
    T, streams = config.bptt, config.train_streams
    windows = [get_batch(batched, i * T, T) for i in range(args.warmup + args.steps)]

    sharnn_model = runtime.prepare(SHARNN(config.model)).train()
    bare_model = BareStack(sharnn_model).to(runtime.device).train()
    candidates = {"sharnn": make_step(sharnn_model, config, runtime), "bare": make_step(bare_model, config, runtime)}
    for step in candidates.values():
        for inputs, targets in windows[: args.warmup]:
            step(inputs, targets)

    def run(step) -> None:
        for inputs, targets in windows[args.warmup :]:
            step(inputs, targets)

    rates = {name: [] for name in candidates}
    for _ in range(args.repeats):
        for name, step in candidates.items():  # interleaved, so drift hits both alike
            (seconds,) = time_repeats(partial(run, step), runtime.device, 1)
            rates[name].append(args.steps * T * streams / seconds)

    median = {name: statistics.median(r) for name, r in rates.items()}
    ratio = median["sharnn"] / median["bare"]
    params = {"sharnn": sharnn_model.num_parameters(), "bare": sum(p.numel() for p in bare_model.parameters())}
    print(
        f"preset {args.preset}: {streams} streams, bptt {T}, d {config.model.d_model}, "
        f"{config.model.n_layers} layers, {runtime.describe()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print_table(
        [
            {
                "model": name,
                "params": params[name],
                "median": median[name],
                "min": min(rates[name]),
                "max": max(rates[name]),
            }
            for name in candidates
        ],
        [
            ("model", "model", ""),
            ("params", "params", ","),
            ("median", "median tokens/s", ",.0f"),
            ("min", "min", ",.0f"),
            ("max", "max", ",.0f"),
        ],
    )
    print(f"ratio sharnn / bare (medians): {ratio:.3f}")
    result = {
        "preset": args.preset,
        "overrides": args.overrides,
        "streams": streams,
        "bptt": T,
        "steps": args.steps,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "runtime": runtime.describe(),
        "tokens_per_s": rates,
        "median_tokens_per_s": median,
        "ratio": ratio,
        "parameters": params,
    }
    write_json(result, f"train_throughput_cpu_{args.preset}.json", args.json)


if __name__ == "__main__":
    main()
