"""The StreamingLLM eviction experiment on SmolLM2-135M over the shipped text, and what decoding it token by token
would cost instead.

    .venv/bin/python benchmarks/sinks.py [--window 256] [--sinks 4] [--rolling-tokens N]
    .venv/bin/python benchmarks/sinks.py --quick    toy-llama-gqa on the text's first 96 tokens, window 16

Prints (a) full attention, (b) a window of the last W tokens, (c) the window plus the first sink tokens, each as
perplexity over the whole text with the wall time of its single masked forward pass; then times the literal
rolling KV cache (one forward call per token) on the first tokens, checks it gives the same losses, and
extrapolates its cost to the whole text. All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import streaming
from attnviz.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=streaming.DEFAULT_WINDOW)
    parser.add_argument("--sinks", type=int, default=streaming.DEFAULT_SINKS)
    parser.add_argument("--rolling-tokens", type=int, default=None,
                        help="tokens decoded one by one for the timing (default: window + sinks + 64, so the cache "
                             "fills up and evicts)")
    parser.add_argument("--quick", action="store_true", help="the smallest case: a toy model, 96 tokens")
    args = parser.parse_args()
    name, title, tokens = "smollm2-135m", "SmolLM2-135M", None
    if args.quick:
        name, title, tokens, args.window = "toy-llama-gqa", "toy-llama-gqa", 96, 16

    loaded = load_model(name)
    ids = torch.as_tensor(loaded.tokenizer(streaming.shipped_text())["input_ids"][:tokens])
    n = len(ids)
    print(f"{title} on {streaming.STREAMING_TEXT.name}: {n} tokens, window {args.window}, {args.sinks} sink tokens, "
          f"{torch.get_num_threads()} torch threads")

    result = streaming.streaming_experiment(loaded.model, ids, window=args.window, n_sinks=args.sinks)
    start = time.perf_counter()
    original = streaming.streaming_token_losses(loaded.model, ids, window=args.window, n_sinks=args.sinks,
                                            positions="original")
    original_s = time.perf_counter() - start
    full = result.perplexity[streaming.SETTINGS[0]]
    print(f"{'setting':<48}{'perplexity':>12}{'x full':>9}{'seconds':>10}")
    rows = [(f"({'abc'[i]}) {name}", result.perplexity[name], result.seconds[name])
            for i, name in enumerate(streaming.SETTINGS)]
    rows.append(("(c') as (c), sinks at their text positions", streaming.perplexity(original), original_s))
    for label, ppl, seconds in rows:
        print(f"{label:<48}{ppl:>12.2f}{ppl / full:>9.2f}{seconds:>10.1f}")
    print(streaming.describe_experiment(result, title))

    m = min(n, args.rolling_tokens or args.window + args.sinks + 64)
    w, s = args.window, args.sinks
    head = ids[:m]
    start = time.perf_counter()
    rolling = streaming.rolling_cache_token_losses(loaded.model, head, window=w, n_sinks=s)
    rolling_s = time.perf_counter() - start
    start = time.perf_counter()
    one_pass = streaming.streaming_token_losses(loaded.model, head, window=w, n_sinks=s)
    one_pass_s = time.perf_counter() - start
    per_token = rolling_s / m
    print(f"rolling KV cache, one forward call per token, first {m} tokens (window {w}, {s} sinks): "
          f"{per_token * 1000:.0f} ms per token, {rolling_s:.1f} s; one masked pass over the same tokens: "
          f"{one_pass_s:.2f} s ({rolling_s / one_pass_s:.0f}x faster); "
          f"max |loss difference| {np.abs(rolling - one_pass).max():.1e} nats")
    c_seconds = result.seconds[streaming.SETTINGS[2]]
    print(f"extrapolated: the rolling cache over all {n} tokens would take ~{per_token * n / 60:.0f} min per setting "
          f"against {c_seconds:.0f} s for the masked pass of (c)")


if __name__ == "__main__":
    main()
