"""Work split over the CPU's cores as Python threads that each run torch on one core.

A small product such as streamed_stats' q·k tile ([384, 64] x [64, 512]) runs nearer the matmul rate when each core
runs a tile of its own than when torch splits it over the cores (benchmarks/attention_layer.py measures both); the
elementwise passes over a tile gain too (no fork and join per operator).
torch releases the GIL inside its operators, so Python threads run tiles at the same time.

The workers cannot call torch.set_num_threads(1): it also sets the process-wide count that every thread started
afterwards takes for itself (Streamlit starts one per rerun, which would then run the model on one core). Each
worker sets its own thread's OpenMP and MKL thread counts instead, which those libraries keep per thread, after
torch's own per-thread set-up (which would undo them). Where they cannot be set (a torch without GNU OpenMP, or a
platform without /proc/self/maps), `workers()` is 1 and the work runs in the calling thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch


@functools.cache
def _thread_controls() -> tuple[Callable[[int], object], ...] | None:
    """The per-thread setters of torch's own OpenMP and MKL libraries (the ones loaded in this process), or None
    when setting them in a new thread does not give that thread one torch thread."""
    try:
        loaded = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}
        gomp = [p for p in loaded if Path(p).name.startswith("libgomp")]
        if len(gomp) != 1:
            return None
        setters = [ctypes.CDLL(gomp[0]).omp_set_num_threads]
        if torch.backends.mkl.is_available():
            cpu = [p for p in loaded if Path(p).name == "libtorch_cpu.so"]
            setters.append(ctypes.CDLL(cpu[0]).MKL_Set_Num_Threads_Local)  # by value (mkl_service.h's C name)
    except (OSError, AttributeError, IndexError):
        return None
    seen = []
    probe = threading.Thread(target=lambda: (_one_thread(setters), seen.append(torch.get_num_threads())))
    probe.start()
    probe.join()
    return tuple(setters) if seen == [1] else None


def _one_thread(setters) -> None:
    torch.get_num_threads()  # torch's per-thread set-up first: it sets this thread's counts to the process's
    for set_count in setters:
        set_count(1)


def set_own_threads(n: int) -> bool:
    """Sets the calling thread's torch thread count (its OpenMP and MKL counts, kept per thread) to n; False where
    per-thread counts cannot be set. A thread's count starts as the process's (torch.get_num_threads() in a fresh
    thread)."""
    setters = _thread_controls()
    if setters is None:
        return False
    torch.get_num_threads()  # torch's per-thread set-up first
    for set_count in setters:
        set_count(n)
    return True


def workers() -> int:
    """How many single-core workers `run_each` uses: torch's thread count where each can be held to one core."""
    n = torch.get_num_threads()
    return n if n > 1 and _thread_controls() is not None else 1


def run_each(fn: Callable, items: Iterable, n_workers: int | None = None) -> None:
    """fn(item) for every item, on up to `n_workers` (default workers()) threads that each run torch on one core,
    each taking the next item as it frees up (give the longest first); in the calling thread when that is 1.

    The caller's grad and inference modes hold in the workers (torch keeps them per thread). The first exception
    raised by fn is raised here once every started item has ended."""
    items = list(items)
    n_workers = min(workers() if n_workers is None else n_workers, len(items))
    if n_workers <= 1 or _thread_controls() is None or getattr(_IN_WORKER, "active", False):
        for item in items:
            fn(item)
        return
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def one(item):
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            fn(item)

    done = [_pool(n_workers).submit(one, item) for item in items]
    wait(done)
    for future in done:
        future.result()


@contextlib.contextmanager
def one_core():
    """torch on one core in the calling thread while the block runs, for work made of small products: a second
    thread costs more than it gives there, and on a loaded machine every product waits until another core is free
    (autograd through a [256, 64] attention took 0.15 s on two threads and 2 ms on one, on a loaded 2-core machine).
    The thread's own count comes back afterwards; nothing changes where per-thread counts cannot be set."""
    if _thread_controls() is None or getattr(_IN_WORKER, "active", False):
        yield
        return
    before = torch.get_num_threads()
    set_own_threads(1)
    try:
        yield
    finally:
        set_own_threads(before)


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_IN_WORKER = threading.local()


def _pool(n_workers: int) -> ThreadPoolExecutor:
    """The process's pool of n_workers single-core threads, started once: a thread started per call cost more than
    a layer's tiles at 512 tokens (starting it, and torch's per-thread set-up on its first operator). Callers on
    several threads (a page's sessions) share it; a worker's own run_each runs in place (see run_each)."""
    with _POOLS_LOCK:
        if n_workers not in _POOLS:
            _POOLS[n_workers] = ThreadPoolExecutor(n_workers, thread_name_prefix="attnviz-core",
                                                   initializer=_worker_start, initargs=(_thread_controls(),))
        return _POOLS[n_workers]


def _worker_start(setters) -> None:
    _IN_WORKER.active = True
    _one_thread(setters)


def _forget_pools() -> None:
    """A forked child has none of its parent's threads: it starts pools of its own."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)
