"""Training the toy lab's attention variants side by side: the same config once per variant, the runs
interleaved step by step in one thread (LabRun.steps), so their curves grow together on the page."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import torch

from attnviz.lab.config import MAX_SECONDS, VARIANTS, LabConfig
from attnviz.lab.training import LabRun, RunSnapshot, take_slot, train_in_slot


class VariantComparison:
    """The same config trained once per attention variant (attnviz.lab.config.VARIANTS), the runs interleaved step
    by step in one background thread, so their curves grow side by side and the comparison takes one of the
    MAX_CONCURRENT_RUNS slots. max_seconds bounds the whole comparison; each run keeps its own snapshot.
    With auto_save, each run is saved by `owner` under its config's default name when it ends (LabRun)."""

    def __init__(self, base: LabConfig, *, variants=None, max_seconds: float = MAX_SECONDS,
                 auto_save: bool = False, owner: str | None = None):
        self.variants = tuple(variants or VARIANTS)
        configs = {v: replace(base, attention=v, positional="rope") for v in self.variants}
        self.runs = {v: LabRun(c, max_seconds=float("inf"), auto_save=c.default_name() if auto_save else None,
                               owner=owner)
                     for v, c in configs.items()}
        self.max_seconds = max_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timed_out = False

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
