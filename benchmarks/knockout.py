"""Knocking out every head of SmolLM2-135M (30 layers x 9 heads = 270) on a 64-token text, one head at a time
against batched, and the effect of sharing the untouched first layers of a batch.

    .venv/bin/python benchmarks/knockout.py [--tokens 64] [--batch 16] [--single 27]

Prints (a) one forward pass per head, timed on the first --single heads and extrapolated to all 270; (b) every head
in batches of --batch rows, each row knocking out its own head, the whole model run for every row; (c) the same
with each batch's untouched first layers run once and shared (what attnviz.knockout does). (b) and (c) time all
270 heads, and their losses are checked against each other and against (a) on the heads (a) ran. Besides wall
time it prints the process's CPU time (all torch threads together): on a machine other programs also load, the
wall time grows with their load and the CPU time much less. All numbers come from this one run.
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

from attnviz import knockout as ko  # noqa: E402
from attnviz import lm  # noqa: E402
from attnviz.models import load_model  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. Attention lets each token look at the tokens before it, and "
        "a head that matters changes the loss when it is removed. The quick brown fox jumps over the lazy dog. "
        "Attention lets each token look at the tokens before it, and a head that matters changes the loss.")


def losses(loaded, ids, rows, batch, share):
    out = []
    for start in range(0, len(rows), batch):
        logits = ko.knocked_logits(loaded, ids, rows[start:start + batch], share_prefix=share)
        out.extend(float(lm.token_losses(row, ids).mean()) for row in logits)
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--single", type=int, default=27, help="heads timed one forward pass at a time")
    args = parser.parse_args()

    loaded = load_model("smollm2-135m")
    ids = loaded.tokenizer(TEXT).input_ids[:args.tokens]
    rows = ko.every_head(loaded)
    print(f"SmolLM2-135M, {len(ids)} tokens, {len(rows)} heads, batch {args.batch}, "
          f"{torch.get_num_threads()} torch threads")
    ko.knocked_logits(loaded, ids, rows[9:11])  # warm up, and the once-per-model check of shared first layers
    load_before = os.getloadavg()[0]

    start, cpu = time.perf_counter(), time.process_time()
    single = losses(loaded, ids, rows[:args.single], 1, False)
    single_s = (time.perf_counter() - start) * len(rows) / args.single
    single_cpu = (time.process_time() - cpu) * len(rows) / args.single
    start, cpu = time.perf_counter(), time.process_time()
    full = losses(loaded, ids, rows, args.batch, False)
    full_s, full_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    result = ko.knockout_effects(loaded, ids, rows, batch=args.batch)
    shared_s, shared_cpu = time.perf_counter() - start, time.process_time() - cpu

    print(f"load average before the timings: {load_before:.1f} on {os.cpu_count()} cores")
    print(f"{'method':<56}{'wall s':>8}{'CPU s':>8}{'x (a) wall':>12}")
    print(f"{'(a) one head per forward pass (extrapolated from ' + str(args.single) + ')':<56}{single_s:>8.1f}"
          f"{single_cpu:>8.1f}{1:>12.2f}")
    print(f"{'(b) batched, whole model per row':<56}{full_s:>8.1f}{full_cpu:>8.1f}{single_s / full_s:>12.2f}")
    print(f"{'(c) batched, first layers shared (knockout_effects)':<56}{shared_s:>8.1f}{shared_cpu:>8.1f}"
          f"{single_s / shared_s:>12.2f}")
    print(f"max |loss (b) - loss (c)| = {np.abs(full - result.loss).max():.2e} nats; "
          f"max |loss (a) - loss (c)| = {np.abs(single - result.loss[:args.single]).max():.2e} nats")
    top = np.argsort(-result.delta_loss)[:5]
    print("largest loss increases: " + ", ".join(f"L{rows[i][0][0]}H{rows[i][0][1]} +{result.delta_loss[i]:.3f}"
                                                 for i in top))


if __name__ == "__main__":
    main()
