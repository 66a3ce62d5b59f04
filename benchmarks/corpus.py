"""Corpus runs (attnviz.corpus), every figure measured in this one run against this machine's own limits.

  local    SmolLM2-135M over windows of 512 tokens of the bundled corpus (data/corpus), every head's statistics,
           against the FLOP limit: the forward passes' matmul FLOPs (benchmarks/longcontext.forward_flops, per
           window) at the float32 matmul rate measured first. Goal: within 1.5x. Peak memory of the process (the
           one worker). Goal: under 2 GiB.
  ray      the same windows through --engine ray on a local Ray started here (every CPU of the machine): windows
           per second once the first shard is written, against the local engine's; the start-up (Ray, the actors
           loading the model) stated apart. Goal: at least 0.8x.
  kill     a run SIGKILLed mid-shard in a child process and started again: the windows computed twice, against the
           shard size. Goal: at most one shard's work lost.
  duckdb   CorpusRun.summary() over 1,000,000 statistics rows (random values in the run's own layout). Goal: under
           1 s.
  paper    from the local rate: core-hours for 1 B tokens of 512-token windows, and the wall time over N Ray nodes.

    python benchmarks/corpus.py                 every part (about 10 minutes on 2 cores)
    python benchmarks/corpus.py --quick         the smallest case of each part (a toy model, a few windows)
    python benchmarks/corpus.py --part duckdb   one part
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attnviz.kernels  # noqa: E402,F401  (Triton's backend chosen before a model imports triton.language)
from benchmarks.longcontext import forward_flops, matmul_rate  # noqa: E402

DATA = ROOT / "data" / "corpus" / "world_english_bible"
PARTS = ("local", "ray", "kill", "duckdb", "paper")


def timed_run(model, out, *, window, windows, engine="local"):
    """(seconds, seconds until the first shard was written, windows done) of one corpus_run."""
    from attnviz.corpus import corpus_run

    marks = []
    started = time.perf_counter()
    corpus_run(model, DATA, window=window, out=out, max_windows=windows, engine=engine,
               progress=lambda done, total: marks.append((time.perf_counter(), done)))
    first = next(((t, d) for t, d in marks if d > 0), (started, 0))
    return time.perf_counter() - started, first, marks[-1][1]


def local_part(model, window, windows, rate, work) -> float:
    from attnviz.corpus import CorpusRun
    from attnviz.models import load_model

    loaded = load_model(model)
    seconds, _, done = timed_run(loaded, work / "local", window=window, windows=windows)
    plan = CorpusRun(work / "local").folder.windows(columns=["n_tokens"])
    flops = sum(forward_flops(loaded, int(n)) for n in plan["n_tokens"])
    limit = flops / rate
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    peer = peer_seconds(loaded, work / "local", sample=20)
    print(f"local: {done} windows of {window} tokens ({plan['n_tokens'].sum():,} tokens) in {seconds:.1f} s, "
          f"{done / seconds:.2f} windows/s; FLOP limit {limit:.1f} s -> {seconds / limit:.2f}x the limit "
          f"(goal 1.5x: {'met' if seconds / limit <= 1.5 else 'NOT met'}); transformers' own forward (SDPA, no "
          f"statistics) over the first 20 windows: {peer:.3f} s a window, the run {seconds / done / peer:.2f}x that; "
          f"peak memory {peak:.2f} GiB (goal 2 GiB: {'met' if peak < 2 else 'NOT met'})")
    return done / seconds


def peer_seconds(loaded, folder, *, sample: int) -> float:
    """Seconds a window of transformers' own forward pass up to the last layer (its SDPA attention, no capture, no
    statistics) over the run's first `sample` windows: the peer the local engine is compared with."""
    import torch

    from attnviz.corpus import CorpusRun

    ids = CorpusRun(folder).folder.windows(columns=["ids"])["ids"].tolist()[:sample]
    config = loaded.model.config
    kept, config._attn_implementation = config._attn_implementation, "sdpa"
    try:
        with torch.inference_mode():
            base = loaded.model.base_model  # the decoder stack, without the LM head (as forward_flops counts)
            base(torch.tensor([list(ids[0])]))  # warm
            started = time.perf_counter()
            for window in ids:
                base(torch.tensor([list(window)]))
            return (time.perf_counter() - started) / len(ids)
    finally:
        config._attn_implementation = kept


def ray_part(model, window, windows, local_rate, work) -> None:
    seconds, (first_at, first_done), done = timed_run(model, work / "ray", window=window, windows=windows,
                                                      engine="ray")
    started = time.perf_counter() - seconds
    steady = (done - first_done) / max(1e-9, started + seconds - first_at)
    print(f"ray: {done} windows in {seconds:.1f} s; start-up (Ray and the actors loading the model, until the first "
          f"shard) {first_at - started:.1f} s; then {steady:.2f} windows/s = {steady / local_rate:.2f}x the local "
          f"engine (goal 0.8x: {'met' if steady / local_rate >= 0.8 else 'NOT met'})")


KILLED = """
import sys
from attnviz.corpus import corpus_run
corpus_run(sys.argv[1], sys.argv[2], window=int(sys.argv[3]), out=sys.argv[4], max_windows=int(sys.argv[5]),
           progress=lambda done, total: print(done, flush=True))
"""


def kill_part(model, window, windows, work) -> None:
    from attnviz.corpus import CorpusRun, corpus_run

    out = work / "killed"
    child = subprocess.Popen([sys.executable, "-c", KILLED, model, str(DATA), str(window), str(out), str(windows)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    reported = [int(child.stdout.readline()) for _ in range(3)][-1]  # two shards written, the third under way
    time.sleep(0.5 * (time.perf_counter() % 1))
    child.send_signal(signal.SIGKILL)
    child.wait()
    size = CorpusRun(out).manifest["shard_windows"]
    computed = []
    run = corpus_run(model, DATA, window=window, out=out, max_windows=windows,
                     progress=lambda done, total: computed.append(done))
    whole, total = computed[0], run.manifest["n_windows"]
    print(f"kill: SIGKILL mid-shard after the child reported {reported} windows; {whole} windows were in whole "
          f"shards; the resumed run computed the other {total - whole} and no more: the work lost is the shard in "
          f"flight, under {size} windows (goal one shard: {'met' if whole >= reported else 'NOT met'})")


def duckdb_part(rows: int, work) -> None:
    import numpy as np
    import pandas as pd

    from attnviz.corpus import CorpusRun
    from attnviz.corpus.store import FORMAT, RunFolder
    from attnviz.stats import COLUMNS

    heads, shard_windows = 270, 400  # SmolLM2's 30 x 9 heads
    n_windows = rows // heads
    folder = RunFolder(work / "duck")
    plan = pd.DataFrame({"window_id": np.arange(n_windows), "window": 512, "doc": 0, "source": "synthetic",
                         "offset": np.arange(n_windows) * 512, "n_tokens": 513, "text": "", "ids": [[0]] * n_windows})
    folder.start({"format": FORMAT, "windows": [512], "layers": 30, "heads": 9, "model": "synthetic",
                  "n_windows": n_windows, "shard_windows": shard_windows,
                  "n_shards": -(-n_windows // shard_windows)}, plan)
    g = np.random.default_rng(0)
    for shard in range(-(-n_windows // shard_windows)):
        ids = np.arange(shard * shard_windows, min(n_windows, (shard + 1) * shard_windows))
        frame = pd.DataFrame({"window_id": np.repeat(ids, heads), "layer": np.tile(np.arange(heads) // 9, len(ids)),
                              "head": np.tile(np.arange(heads) % 9, len(ids)),
                              "kv_head": np.tile(np.arange(heads) % 9 // 3, len(ids))})
        for c in COLUMNS:
            frame[c] = g.random(len(frame))
        folder.write_shard(shard, frame)
    run = CorpusRun(folder.path)
    run.summary()  # DuckDB's first query reads the file footers
    best = min(_seconds(run.summary) for _ in range(3))
    print(f"duckdb: summary over {n_windows * heads:,} rows ({n_windows:,} windows x {heads} heads) in "
          f"{best:.2f} s (goal 1 s: {'met' if best < 1 else 'NOT met'})")


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def paper_part(windows_per_s: float, window: int) -> None:
    cores = os.cpu_count() or 1
    tokens_per_s = windows_per_s * window
    core_hours = 1e9 / tokens_per_s / 3600 * cores
    print(f"paper: {tokens_per_s:,.0f} tokens/s on {cores} cores -> {core_hours:,.0f} core-hours for 1 B tokens; "
          + "; ".join(f"{n} node{'s' if n > 1 else ''} of 32 cores: {core_hours / (n * 32) / 0.8:,.1f} h"
                      for n in (1, 8, 64))
          + " (at the 0.8x Ray efficiency the goal allows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, action="append", help="one part (repeat for several)")
    parser.add_argument("--quick", action="store_true", help="the smallest case of each part")
    args = parser.parse_args()
    parts = args.part or PARTS
    model, window, windows, rows = (("toy-gpt2", 64, 20, 20_000) if args.quick
                                    else ("smollm2-135m", 512, 200, 1_000_000))
    rate = matmul_rate()
    print(f"float32 matmul rate measured first: {rate / 1e9:.0f} GFLOP/s; load average {os.getloadavg()[0]:.1f}; "
          f"{os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        local_rate = None
        if {"local", "ray", "paper"} & set(parts):
            local_rate = local_part(model, window, windows, rate, work)
        if "ray" in parts:
            ray_part(model, window, windows, local_rate, work)
        if "kill" in parts:
            kill_part(model, window, 64, work)
        if "duckdb" in parts:
            duckdb_part(rows, work)
        if "paper" in parts:
            paper_part(local_rate, window)


if __name__ == "__main__":
    main()
