"""Toy lab: how many steps and seconds until an induction head forms, for each positional scheme.

Trains the page's default run (induction over 8 letters, 2 layers x 4 heads, d_model 64, seed 0) once per scheme on
one CPU thread and stops it when the best layer-1 head's induction score passes 0.5 (checked every 25 steps on the
fixed probe). Prints steps, seconds, the loss then, and each scheme's steps relative to RoPE, all from one run.

    python benchmarks/lab.py [max_steps]
    python benchmarks/lab.py --quick    10 steps per scheme, a checkpoint every 5 (the table, not a finding)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import lab

THRESHOLD = 0.5


def steps_to_induction(config: lab.LabConfig) -> tuple[int | None, float, float]:
    """(first checkpoint step with a layer-1 induction score above THRESHOLD or None, seconds, loss there)."""
    run = lab.LabRun(config, max_seconds=float("inf")).start()
    t0 = time.perf_counter()
    seen = 0
    while True:
        snap = run.snapshot()
        for c in snap.checkpoints[seen:]:
            if c.step and c.induction[1:].max() > THRESHOLD:
                run.stop()
                run.join()
                return c.step, time.perf_counter() - t0, c.loss
        seen = len(snap.checkpoints)
        if snap.finished:
            return None, time.perf_counter() - t0, snap.checkpoints[-1].loss
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("max_steps", nargs="?", type=int, default=1500)
    parser.add_argument("--quick", action="store_true", help="10 steps per scheme, a checkpoint every 5")
    args = parser.parse_args()
    steps, eval_every = (10, 5) if args.quick else (min(args.max_steps, lab.MAX_STEPS), 25)
    base = replace(lab.LabConfig(), steps=steps, eval_every=eval_every)
    print(f"induction task, {base.n_letters} letters, L = {base.segment_len}, {base.n_layers} layers x {base.n_heads} "
          f"heads, d_model {base.d_model}, batch {base.batch_size}, lr {base.lr:g}, seed {base.seed}, "
          f"up to {base.steps} steps; chance loss {lab.chance_loss(base.n_letters):.2f} nats")
    results = {}
    for positional in ("rope", "learned", "sinusoidal", "alibi"):
        results[positional] = steps_to_induction(replace(base, positional=positional))
    rope_steps = results["rope"][0]
    print(f"{'positions':<11} {'steps to induction > 0.5':>25} {'seconds':>8} {'loss then':>10} {'steps / rope':>13}")
    for positional, (steps, seconds, loss) in results.items():
        ratio = f"{steps / rope_steps:.2f}" if steps and rope_steps else "-"
        shown = str(steps) if steps else f"not by {base.steps}"
        print(f"{positional:<11} {shown:>25} {seconds:>8.1f} {loss:>10.2f} {ratio:>13}")


if __name__ == "__main__":
    main()
