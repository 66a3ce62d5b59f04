"""Training the toy lab's attention variants side by side: the same config once per variant, the runs
interleaved step by step in one thread (LabRun.steps), so their curves grow together on the page; then the
trained variants' attention maps on one text (VariantComparison.patterns)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import torch

from attnviz.lab.config import MAX_SECONDS, VARIANTS, LabConfig
from attnviz.lab.tasks import example_text
from attnviz.lab.training import LabRun, LabStateError, RunSnapshot, take_slot, train_in_slot
from attnviz.capture import capture_attention
from attnviz.loaded_model import LoadedModel, ModelSpec
from attnviz.tokenizer import byte_tokenizer


class VariantComparison:
    """The same config trained once per attention variant (attnviz.lab.config.VARIANTS), the runs interleaved step
    by step in one background thread, so their curves grow side by side and the comparison takes one of the
    MAX_CONCURRENT_RUNS slots. max_seconds bounds the whole comparison; each run keeps its own snapshot.
    With auto_save, each run is saved by `owner` under its config's default name when it ends (LabRun)."""

    default_variants = VARIANTS

    def __init__(self, base: LabConfig, *, variants=None, max_seconds: float = MAX_SECONDS,
                 auto_save: bool = False, owner: str | None = None):
        self.variants = tuple(variants or self.default_variants)
        self.runs = {v: self.make_run(base, v, auto_save=auto_save, owner=owner) for v in self.variants}
        self.max_seconds = max_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timed_out = False

    def make_run(self, base: LabConfig, variant: str, *, auto_save: bool, owner: str | None) -> LabRun:
        """The run of one variant: `base` with that attention (on RoPE), no time limit of its own."""
        config = replace(base, attention=variant, positional="rope")
        return LabRun(config, max_seconds=float("inf"), auto_save=config.default_name() if auto_save else None,
                      owner=owner)

    def snapshots(self) -> dict[str, RunSnapshot]:
        return {v: r.snapshot() for v, r in self.runs.items()}

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.snapshots().values())

    def stop(self) -> None:
        self._stop.set()
        for r in self.runs.values():
            r.stop()

    def start(self) -> VariantComparison:
        """Trains in a background thread. Raises LabBusyError when MAX_CONCURRENT_RUNS runs are training."""
        take_slot(self)
        self._thread = train_in_slot(self, "attnviz-lab-variants")
        return self

    def join(self, timeout: float | None = None) -> dict[str, RunSnapshot]:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.snapshots()

    def run(self) -> dict[str, RunSnapshot]:
        """Trains every variant in the calling thread, one step of each in turn."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        try:
            loops = [r.steps() for r in self.runs.values()]
            while loops:
                if not self.timed_out and time.perf_counter() - t0 > self.max_seconds:
                    self.timed_out = True
                    for r in self.runs.values():
                        r.stop()
                for loop in list(loops):
                    try:
                        next(loop)
                    except StopIteration:
                        loops.remove(loop)
        finally:
            torch.set_num_threads(threads)
        return self.snapshots()

    def map_text(self) -> str:
        """The text the variants' maps are drawn on: the task's example (attnviz.lab.tasks.example_text), cut to
        the training rows' length, so that every position is one the models were trained at."""
        config = next(iter(self.runs.values())).config
        return example_text(config)[:config.seq_len - 1]  # <bos> is the first token

    def patterns(self, text: str) -> tuple[list[str], dict[str, np.ndarray]]:
        """Every variant's attention on the same text, captured by attnviz.capture from the model as trained (its
        eager attention, the gate included). Returns (tokens, variant -> [layer, head, query, key] float32). A row
        of off_by_one or learned_sink sums to less than 1: the rest went to the sink logit, to no token.
        RuntimeError while the variants are still training (their weights change under the capture)."""
        if not self.finished:
            raise LabStateError("the variants are still training; their maps are drawn once they finish")
        tokens, maps = [], {}
        for name, run in self.runs.items():
            spec = ModelSpec(f"the {name} variant", "gpt_oss", "lab", True, None, "a toy-lab comparison's model")
            capture = capture_attention(LoadedModel(run.model, byte_tokenizer(), spec), text)
            tokens, maps[name] = capture.tokens, capture.pattern
        return tokens, maps


def weight_on_tokens(pattern: np.ndarray) -> np.ndarray:
    """The mean over queries of each row's total weight on tokens. [..., query, key] -> [...]. 1 for softmax; below 1
    where a sink logit (off by one, learned sink) takes its share of the row."""
    return np.asarray(pattern, dtype=np.float64).sum(-1).mean(-1)
