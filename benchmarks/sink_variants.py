"""Toy lab: how many training steps until the sink metric passes 0.3, for each attention variant.

Trains the same small gpt-oss model once per attention variant (softmax, off by one, learned sink, head-wise
gate), on one CPU thread each, one after the other, for --steps steps or --seconds seconds, and watches its sink
metric Sink_0^0.3 (the share of (text, layer, head) triples whose alpha_0 on <bos> exceeds 0.3, on the task's fixed
probe texts; Gu et al., ICLR 2025) every --eval-every steps. Prints, from this one run, each variant's first step
and seconds with the metric above 0.3 (or "not within"), its loss then, the highest and the final value of the
metric, the final loss, and the load of the machine while it ran.

    .venv/bin/python benchmarks/sink_variants.py [--task text] [--steps 1000] [--seconds 120] [--eval-every 25]
        [--layers 2] [--heads 4] [--width 64] [--lr 3e-3] [--weight-decay 0.01] [--text-len 64]
    .venv/bin/python benchmarks/sink_variants.py --quick    10 steps per variant, the metric every 5 (the table only)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import lab

TARGET = 0.3


def until_sink(config: lab.LabConfig, seconds: float) -> dict:
    """Trains `config` for its steps or `seconds`; the first checkpoint whose sink metric passes TARGET."""
    reached: dict = {}

    def check(checkpoint) -> None:
        if checkpoint.sink_rate > TARGET and "step" not in reached:
            reached.update(step=checkpoint.step, loss=checkpoint.loss, seconds=time.perf_counter() - t0)

    run = lab.LabRun(config, max_seconds=seconds, on_checkpoint=check)
    t0 = time.perf_counter()
    snap = run.run()
    last = snap.checkpoints[-1]
    return dict(reached, best=max(c.sink_rate for c in snap.checkpoints), final=last.sink_rate, steps_run=snap.step,
                seconds_run=time.perf_counter() - t0, final_loss=last.loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="text", choices=lab.TASKS)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=120.0, help="per variant")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--text-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 steps per variant, the metric every 5")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_every = 10, 5
    base = lab.LabConfig(task=args.task, positional="rope", steps=args.steps, eval_every=args.eval_every,
                         n_layers=args.layers, n_heads=args.heads, d_model=args.width, lr=args.lr,
                         weight_decay=args.weight_decay, text_len=args.text_len, seed=args.seed)
    print(f"task {args.task}, {args.layers} layers x {args.heads} heads, d_model {args.width}, lr {args.lr:g}, "
          f"weight decay {args.weight_decay:g}, batch {base.batch_size}, rows of {base.seq_len} tokens, seed "
          f"{args.seed}; sink metric every {args.eval_every} steps; at most {args.steps} steps and "
          f"{args.seconds:.0f} s per variant; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'variant':<14}{'first step > 0.3':>17}{'seconds':>9}{'loss then':>11}{'best Sink':>11}"
          f"{'final Sink':>12}{'final loss':>12}{'steps run':>11}{'s/step':>8}")
    for variant in lab.VARIANTS:
        r = until_sink(replace(base, attention=variant), args.seconds)
        per_step = r["seconds_run"] / max(r["steps_run"], 1)
        first = (f"{r['step']:>17}{r['seconds']:>9.0f}{r['loss']:>11.3f}" if "step" in r
                 else f"{'not within':>17}{'-':>9}{'-':>11}")
        print(f"{variant:<14}{first}{r['best']:>11.1%}{r['final']:>12.1%}{r['final_loss']:>12.3f}"
              f"{r['steps_run']:>11}{per_step:>8.3f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end (2 cores shared: seconds grow with the load)")


if __name__ == "__main__":
    main()
