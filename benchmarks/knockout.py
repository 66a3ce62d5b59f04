"""Knocking out every head of SmolLM2-135M (30 layers x 9 heads = 270) on a 64-token text, one head at a time
against batched, and the effect of sharing the untouched first layers of a batch.

    .venv/bin/python benchmarks/knockout.py [--tokens 64] [--batch 16] [--single 2]
    .venv/bin/python benchmarks/knockout.py --quick    toy-gpt2's 8 heads on 16 tokens, batches of 4

Three ways, timed batch by batch in turn so that the load other programs put on the machine falls on all three
alike: (a) one forward pass per head (every --single-th batch's first head, extrapolated to all 270); (b) batches
of --batch rows, each row knocking out its own head, the whole model run for every row; (c) the same with each
batch's untouched first layers run once and shared (what attnviz.knockout does). Then knockout_effects, the call the
page makes, timed on its own (its clean pass and the losses included). Losses of (b) and (c), and of (a) on the
heads it ran, are checked against each other. The load average is printed: on a busy machine the seconds grow with
it, the ratios much less. All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import knockout as ko
from attnviz import lm
from attnviz.models import load_model

TEXT = ("The quick brown fox jumps over the lazy dog. Attention lets each token look at the tokens before it, and "
        "a head that matters changes the loss when it is removed. The quick brown fox jumps over the lazy dog. "
        "Attention lets each token look at the tokens before it, and a head that matters changes the loss.")


def timed_losses(loaded, ids, rows, share):
    """(seconds, mean next-token loss of each row) of one batched pass."""
    start = time.perf_counter()
    logits = ko.knocked_logits(loaded, ids, rows, share_prefix=share)
    return time.perf_counter() - start, [float(lm.token_losses(row, ids).mean()) for row in logits]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--single", type=int, default=2,
                        help="time one head alone in every SINGLE-th batch (extrapolated to all heads)")
    parser.add_argument("--quick", action="store_true", help="the smallest case: toy-gpt2, 16 tokens, batch 4")
    args = parser.parse_args()
    name, title = "smollm2-135m", "SmolLM2-135M"
    if args.quick:
        name, title, args.tokens, args.batch = "toy-gpt2", "toy-gpt2", 16, 4

    loaded = load_model(name)
    ids = loaded.tokenizer(TEXT).input_ids[:args.tokens]
    rows = ko.every_head(loaded)
    print(f"{title}, {len(ids)} tokens, {len(rows)} heads, batch {args.batch}, {torch.get_num_threads()} torch "
          "threads")
    # two heads of layer 1: a warm-up, and the once-per-model check of shared first layers
    ko.knocked_logits(loaded, ids, rows[loaded.shape.heads:][:2])
    load_before = os.getloadavg()[0]

    seconds = {"a": 0.0, "b": 0.0, "c": 0.0}
    loss = {"a": [], "b": [], "c": []}
    single_rows = []
    order = sorted(rows, key=lambda r: r[0][0])  # as knockout_effects orders them
    for i, start in enumerate(range(0, len(order), args.batch)):
        chunk = order[start:start + args.batch]
        for method, share in (("b", False), ("c", True)):
            t, got = timed_losses(loaded, ids, chunk, share)
            seconds[method] += t
            loss[method].extend(got)
        if i % max(1, args.single) == 0:
            t, got = timed_losses(loaded, ids, chunk[:1], False)
            seconds["a"] += t
            loss["a"].extend(got)
            single_rows.append(start)
    seconds["a"] *= len(rows) / len(single_rows)
    start = time.perf_counter()
    result = ko.knockout_effects(loaded, ids, rows, batch=args.batch)
    effects_s = time.perf_counter() - start
    load_after = os.getloadavg()[0]

    print(f"load average {load_before:.1f} before the timings, {load_after:.1f} after, on {os.cpu_count()} cores")
    print(f"{'method':<60}{'seconds':>9}{'x (a)':>8}")
    rows_of = {"a": f"(a) one head per forward pass (extrapolated from {len(single_rows)})",
               "b": "(b) batched, whole model per row", "c": "(c) batched, first layers shared"}
    for method, label in rows_of.items():
        print(f"{label:<60}{seconds[method]:>9.1f}{seconds['a'] / seconds[method]:>8.2f}")
    print(f"{'knockout_effects (c) with its clean pass and losses':<60}{effects_s:>9.1f}"
          f"{seconds['a'] / effects_s:>8.2f}")
    by_row = {r: x for r, x in zip(order, loss["c"])}
    ours = np.array([by_row[r] for r in rows])
    print(f"max |loss (b) - loss (c)| = {np.abs(np.array(loss['b']) - np.array(loss['c'])).max():.2e} nats; "
          f"max |loss (a) - loss (c)| = "
          f"{max(abs(a - by_row[order[s]]) for a, s in zip(loss['a'], single_rows)):.2e} nats; "
          f"max |knockout_effects - (c)| = {np.abs(result.loss - ours).max():.2e} nats")
    top = np.argsort(-result.delta_loss)[:5]
    print("largest loss increases: " + ", ".join(f"L{rows[i][0][0]}H{rows[i][0][1]} +{result.delta_loss[i]:.3f}"
                                                 for i in top))


if __name__ == "__main__":
    main()
