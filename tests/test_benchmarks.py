"""Every script in benchmarks/ runs: each one's --quick case (a toy model or tiny sizes, the same code paths and
names as its full run, so a rename breaks it) exits 0 and prints its table's header; gpu_stats.py, which needs
CUDA, says so and exits 2.

The runs are subprocesses, started two at a time, longest first, when the first test of this file asks (only the
ones selected); each test then waits for its own. They measure nothing here: the figures come from the full runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # every benchmark's quick run, each in its own process

ROOT = Path(__file__).resolve().parent.parent
WORKERS = max(2, os.cpu_count() or 1)  # a run per core, at least two: most of a run is one core importing torch
CUDA = torch.cuda.is_available()


@dataclass(frozen=True)
class Quick:
    script: str  # benchmarks/<script>.py
    shows: tuple[str, ...]  # what its output must contain: its table's header (stdout; stderr for a refusal)
    args: tuple[str, ...] = ("--quick",)
    seconds: float = 5  # about how long it takes on 2 idle cores (measured one at a time): the longest start first
    exit_code: int = 0
    marks: tuple = field(default=(), compare=False)
    timeout: int = 300

    @property
    def name(self) -> str:
        return self.script


QUICK = [
    Quick("attention_layer", ("toy-llama-gqa layer 1, 256 tokens", "layer (statistics and output):"), seconds=12),
    Quick("browser_latency", ("float32 matmul rate measured first:",
                              "| page | widget | input -> idle, median s | driver -> idle, median s |",
                              "| Positional encodings | Positions (slider, pos_sin_n) |",
                              "| Positional encodings | d_model (in-chart slider of"), seconds=32,
          marks=(pytest.mark.browser,)),
    Quick("capture", ("capture overhead, toy-llama-gqa, 64 tokens, cpu time",
                      "load toy-llama-gqa as a GGUF file: first (GGUF -> safetensors)"), seconds=15),
    Quick("corpus", ("float32 matmul rate measured first", "\nlocal: ", "\nkill: ", "\nduckdb: ", "\npaper: "),
          args=("--quick", "--part", "local", "--part", "kill", "--part", "duckdb", "--part", "paper"), seconds=28),
    Quick("flow", ("tokens   attnviz.flow s   networkx s   networkx / attnviz   equal to the unit",), seconds=8),
    Quick("gemma3", ("layer kind     Sink_0^0.3  mean a0", "after layer set to", "window W  (a) full",
                     "layer head kind     prefix matching", "cross-checks against transformers' own outputs"),
          seconds=23, marks=(pytest.mark.slow,)),
    Quick("gpu_stats", ("needs a CUDA GPU",), args=(), seconds=2, exit_code=2,
          marks=(pytest.mark.skipif(CUDA, reason="with CUDA, gpu_stats.py runs in full"),)),
    Quick("kernel", ("     N  naive ms   SDPA ms  naive/SDPA",) if not CUDA else ("Triton config",), seconds=5),
    Quick("knockout", ("method", "(c) batched, first layers shared", "knockout_effects (c)"), seconds=7),
    Quick("hybrid_capture", ("run          wall s   cpu s  x forward (wall, cpu)  goal 1.5x", "capture qk"), seconds=7),
    Quick("lab", ("positions    steps to induction > 0.5  seconds  loss then  steps / rope",), seconds=8),
    Quick("load", ("visitor    own result  first chart s  waited exceptions console errors  refusals",
                   "mixed results: none"), seconds=22, marks=(pytest.mark.browser, pytest.mark.slow)),
    Quick("longcontext", ("case                                          tokens   TFLOP  seconds peak GiB   x limit",
                          "Heads page, first view", "    reruns after a head, layer, zoom and sink change:"),
          seconds=45),
    Quick("mixers", ("tokens heads decay clock GFLOP/s limit s   map s x lim  into s x lim    goal kernel s x kern",
                     "layer                        tokens heads dense map    before      peak     goal  seconds"),
          seconds=12),
    Quick("patching", ("method", "seconds   goal  x goal", "direct logit attribution, clean prompt"), seconds=7),
    Quick("positional", ("ALiBi position-only attention against distance, 4 heads x 64 tokens",), seconds=2),
    Quick("sink_variants", ("variant        first step > 0.3  seconds  loss then  best Sink",), seconds=12),
    Quick("sinks", ("setting                                           perplexity   x full   seconds",
                    "rolling KV cache, one forward call per token"), seconds=9),
    Quick("softmax", ("1. per-row softmax Jacobian norm", "3. the page's d_k sweep"), seconds=3),
]


def _run(quick: Quick) -> subprocess.CompletedProcess | subprocess.TimeoutExpired:
    try:
        return subprocess.run([sys.executable, f"benchmarks/{quick.script}.py", *quick.args], cwd=ROOT,
                              capture_output=True, text=True, timeout=quick.timeout)
    except subprocess.TimeoutExpired as expired:
        return expired


def _skipped(item) -> bool:
    return any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))


@pytest.fixture(scope="module")
def quick_runs(request):
    """{Quick: the future of its run}, for the tests of this file that will run."""
    wanted = [item.callspec.params["quick"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "quick" in item.callspec.params
              and not _skipped(item)]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield {quick: pool.submit(_run, quick) for quick in sorted(wanted, key=lambda q: -q.seconds)}


def test_every_benchmark_has_a_quick_test():
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py") if path.stem != "__init__"}
    assert scripts == {quick.script for quick in QUICK}


@pytest.mark.parametrize("quick", [pytest.param(q, id=q.name, marks=q.marks) for q in QUICK])
def test_quick_run(quick, quick_runs):
    done = quick_runs[quick].result()
    if isinstance(done, subprocess.TimeoutExpired):
        pytest.fail(f"benchmarks/{quick.script}.py {' '.join(quick.args)} ran over {quick.timeout} s")
    said = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == quick.exit_code, said
    out = done.stdout if quick.exit_code == 0 else done.stderr
    for line in quick.shows:
        assert line in out, said
