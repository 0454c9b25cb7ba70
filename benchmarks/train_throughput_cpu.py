"""Training throughput of a preset on CPU, next to a bare stack of the same layers.

The bare stack is the floor: the same ``nn.Embedding``, ``nn.LSTM`` and ``nn.Linear``
layers (Boom up-projection with its chunk sum, the attention's query projection), the
same tied softmax, Min-Trust LAMB and gradient clip, but no LayerNorms, no attention
over the memory, no gates and no dropout. Both are timed in the same process,
interleaved, on the same windows of the bundled enwik8 bytes; the table gives the
median tokens/s over repeats and the ratio sharnn / bare.

    python benchmarks/train_throughput_cpu.py                # tiny; JSON in benchmarks/results/
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from sharnn import SHARNN, MinTrustLAMB, load_config, load_corpus
from sharnn.data import batchify, get_batch


class BareStack(nn.Module):
    """Embedding -> per block: LSTM -> [query Linear] -> Linear(d -> F) summed over F/d
    chunks -> tied logits. The same big layers as the SHA-RNN and nothing else."""

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

    def forward(self, tokens, state=None):
        x = self.embedding(tokens)
        state = state or [None] * len(self.lstms)
        new_state = []
        for lstm, query, boom, s in zip(self.lstms, self.queries, self.booms, state):
            x, s = lstm(x, s)
            x = boom(query(x)).unflatten(-1, (-1, self.d_model)).sum(-2)
            new_state.append(tuple(t.detach() for t in s))
        return F.linear(x, self.embedding.weight, self.output_bias), new_state


def make_step(model, config):
    optimizer = MinTrustLAMB(model.parameters(), lr=config.lr, min_trust=config.min_trust)
    state = None

    def step(inputs, targets):
        nonlocal state
        logits, state = model(inputs, state)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if hasattr(state, "detach"):
            state = state.detach()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, as for sharnn train")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="results file [default: benchmarks/results/train_throughput_cpu_PRESET.json]")
    args = parser.parse_args()

    config = load_config(args.preset, args.overrides)
    torch.manual_seed(0)
    corpus = load_corpus(config.data, config.valid_fraction, config.test_fraction)
    batched = batchify(corpus.train, config.batch_size)
    T = config.bptt
    windows = [get_batch(batched, i * T, T) for i in range(args.warmup + args.steps)]

    sharnn_model = SHARNN(config.model).train()
    bare_model = BareStack(sharnn_model).train()
    candidates = {"sharnn": make_step(sharnn_model, config), "bare": make_step(bare_model, config)}
    for step in candidates.values():
        for inputs, targets in windows[: args.warmup]:
            step(inputs, targets)

    rates = {name: [] for name in candidates}
    for _ in range(args.repeats):
        for name, step in candidates.items():  # interleaved, so drift hits both alike
            start = time.perf_counter()
            for inputs, targets in windows[args.warmup :]:
                step(inputs, targets)
            rates[name].append(args.steps * T * config.batch_size / (time.perf_counter() - start))

    median = {name: statistics.median(r) for name, r in rates.items()}
    ratio = median["sharnn"] / median["bare"]
    params = {"sharnn": sharnn_model.num_parameters(), "bare": sum(p.numel() for p in bare_model.parameters())}
    print(f"preset {args.preset}: batch {config.batch_size}, bptt {T}, d {config.model.d_model}, "
          f"{config.model.n_layers} layers, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':<8} {'params':>10} {'median tokens/s':>16} {'min':>10} {'max':>10}")
    for name in candidates:
        print(f"{name:<8} {params[name]:>10,} {median[name]:>16,.0f} {min(rates[name]):>10,.0f} {max(rates[name]):>10,.0f}")
    print(f"ratio sharnn / bare (medians): {ratio:.3f}")
    result = {
        "preset": args.preset, "overrides": args.overrides, "batch_size": config.batch_size, "bptt": T,
        "steps": args.steps, "repeats": args.repeats, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "machine": platform.machine(), "processor": platform.processor(),
        "tokens_per_s": rates, "median_tokens_per_s": median, "ratio": ratio, "parameters": params,
    }
    path = Path(args.json) if args.json else Path(__file__).parent / "results" / f"train_throughput_cpu_{args.preset}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
