"""Activation patching of every SmolLM2-135M head (30 layers x 9 heads = 270) on a 16-token prompt pair, attribution
patching of every head, and how well the two agree; then the heads an IOI-style template picks out in SmolLM2 and
in Gemma 3 270M (real patching, attribution patching and direct logit attribution).

    .venv/bin/python benchmarks/patching.py [--batch 16] [--top 5] [--repeat 3]
    .venv/bin/python benchmarks/patching.py --quick    toy-gpt2 on a byte-level name-swap pair, one repeat

Goals: real patching of all 270 heads in under 30 s, attribution patching in under 3 s. Real patching is timed as
the page calls it (activation_patching: the two unpatched runs and every batch), with the layers below each batch's
first patch shared and without; attribution patching (the two unpatched runs, one forward and one backward pass)
beside them; each is the median of --repeat interleaved runs. The load average is printed: on a busy machine the
seconds grow with it. All numbers come from this one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz.interventions import hooks as intervention_hooks
from attnviz import logit_attribution as dla
from attnviz import patching as P
from attnviz.models import load_model

IOI_16 = P.PromptPair("ioi-16", "Then, when Mary and John went to the store, John gave a drink to",
                      "Then, when Mary and John went to the store, Mary gave a drink to", " Mary", " John")
# --quick: the same swap for a byte tokenizer (" Mary" and " John" both start with a space there)
TOY_PAIR = P.PromptPair("toy", "When Mary and John went, John gave it to", "When Mary and John went, Mary gave it to",
                        "M", "J")


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def top_cells(grid: np.ndarray, k: int) -> str:
    """The k cells of largest |value| as L{layer}H{head} +value."""
    order = np.argsort(-np.abs(grid).ravel(), kind="stable")[:k]
    return ", ".join(f"L{i // grid.shape[1]}H{i % grid.shape[1]} {grid.ravel()[i]:+.3f}" for i in order)


def speed(loaded, args, prompts: P.PromptPair = IOI_16, title: str = "SmolLM2-135M") -> None:
    pair = P.tokenize_pair(loaded, prompts)
    heads = loaded.shape.layers * loaded.shape.heads
    print(f"{title}, {pair.n}-token pair {prompts.clean!r} / ...{prompts.corrupted[-25:]!r}, "
          f"{heads} heads, batch {args.batch}, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    layer = min(9, loaded.shape.layers - 1)
    P.patched_logits(loaded, pair, [(("heads", layer, 0),), (("heads", layer, 1),)])  # warm up, the prefix check
    P.attribution_patching(loaded, pair)
    load_before = os.getloadavg()[0]
    runs = {"shared": [], "full": [], "atp": []}
    for _ in range(args.repeat):  # interleaved, so that other programs' load falls on every method alike
        runs["shared"].append(timed(P.activation_patching, loaded, pair, "heads", batch=args.batch))
        with mock.patch.object(intervention_hooks, "prefix_ok", lambda model, ids: False):
            runs["full"].append(timed(P.activation_patching, loaded, pair, "heads", batch=args.batch))
        runs["atp"].append(timed(P.attribution_patching, loaded, pair))
    (shared_s, shared), (full_s, full), (atp_s, atp) = (
        (statistics.median(t for t, _ in runs[k]), runs[k][0][1]) for k in ("shared", "full", "atp"))
    load_after = os.getloadavg()[0]
    cmp = P.compare(shared, atp["heads"], top=args.top)
    print(f"load average {load_before:.1f} before the timings, {load_after:.1f} after")
    print(f"median of {args.repeat} interleaved runs each")
    print(f"{'method':<58}{'seconds':>9}{'goal':>7}{'x goal':>8}")
    for label, seconds, goal in ((f"activation patching, {heads} heads, first layers shared", shared_s, 30.0),
                                 (f"activation patching, {heads} heads, whole model per row", full_s, 30.0),
                                 ("attribution patching, every head", atp_s, 3.0)):
        print(f"{label:<58}{seconds:>9.2f}{goal:>7.0f}{seconds / goal:>8.2f}")
    print(f"shared / whole-model rows: {shared_s / full_s:.2f}; attribution / real patching: {atp_s / shared_s:.3f}")
    print(f"max |shared - whole-model| = {np.abs(shared.values - full.values).max():.2e} (logit difference)")
    print(f"clean logit difference {shared.clean_value:+.3f}, corrupted {shared.corrupted_value:+.3f}")
    print(f"Pearson(real, attribution) over {heads} heads = {cmp.pearson:.3f}")
    print("largest disagreements (real vs attribution): " + ", ".join(
        f"L{r}H{c} {p:+.3f} vs {a:+.3f}" for r, c, p, a in cmp.disagreements))


def findings(name: str, args, prompts: P.PromptPair = P.READY_PAIRS["ioi"]) -> None:
    """The heads an IOI-style pair (the ready-made one) picks out in one model."""
    loaded = load_model(name, device="cpu")
    pair = P.tokenize_pair(loaded, prompts)
    seconds, cmp = timed(P.patching_with_attribution, loaded, pair, "heads", batch=args.batch, top=args.top)
    attribution = dla.pair_attribution(loaded, pair)
    real = cmp.patched
    print(f"\n{name}: IOI-style pair {prompts.clean!r} -> {prompts.answer!r} vs {prompts.wrong!r} ({pair.n} tokens); "
          f"logit difference clean {real.clean_value:+.3f}, corrupted {real.corrupted_value:+.3f}; "
          f"{real.values.size} heads in {seconds:.1f} s")
    print(f"  activation patching (normalised):  {top_cells(real.normalised, args.top)}")
    print(f"  attribution patching (normalised): {top_cells(cmp.attributed, args.top)}; Pearson {cmp.pearson:.3f}")
    print(f"  direct logit attribution, clean prompt (logits): {top_cells(attribution.heads, args.top)}; "
          f"MLPs {top_cells(attribution.mlp[:, None], 2).replace('H0', '')}; "
          f"embeddings {attribution.embeddings:+.3f}; "
          f"sum of parts {attribution.total:+.4f} = model {attribution.logit_diff:+.4f}")
    for kind in ("resid", "attn", "mlp"):
        grid = P.activation_patching(loaded, pair, kind, batch=args.batch).normalised
        best = np.unravel_index(np.argmax(np.abs(grid)), grid.shape)
        print(f"  {kind:<5} patching: largest at layer {best[0]}, position {best[1]} "
              f"({pair.position_labels()[best[1]]!r}) {grid[best]:+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the smallest case: toy-gpt2, a byte-level pair")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.batch = 1, 4
        speed(load_model("toy-gpt2", device="cpu"), args, TOY_PAIR, "toy-gpt2")
        findings("toy-gpt2", args, TOY_PAIR)
        return
    speed(load_model("smollm2-135m", device="cpu"), args)
    for name in ("smollm2-135m", "gemma3-270m"):
        findings(name, args)


if __name__ == "__main__":
    main()
