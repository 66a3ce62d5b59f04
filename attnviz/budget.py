"""One memory budget for the long work of every visitor at once.

A Streamlit server runs every browser session in its own thread of one process. Two visitors who each start a long
capture would each be within limits alone and exhaust the machine together. MemoryBudget admits work by its
estimated bytes under one global limit: work that does not fit now waits (first come, first served) until earlier
work finishes, and the caller is told it is waiting, so the page can say so; work that could never fit is refused at
once with the reason.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator

from attnviz.errors import AttnvizError
from attnviz.shape import hidden_size, n_heads as heads_of
from attnviz.once import ComputeOnce


class OverBudget(AttnvizError, ValueError):
    """The work needs more memory than the whole budget: it can never run here."""


def physical_memory_bytes() -> int:
    """This machine's physical memory, or 8 GiB where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_budget_bytes() -> int:
    """ATTNVIZ_MEMORY_BUDGET_MB when set, else 40% of physical memory: room for the models, Streamlit and the
    operating system beside the visitors' work."""
    value = os.environ.get("ATTNVIZ_MEMORY_BUDGET_MB", "").strip()
    if value:
        try:
            return max(1, int(float(value) * 2**20))
        except ValueError:
            pass
    return int(0.4 * physical_memory_bytes())


COLLECT_BEFORE_BYTES = 256 * 2**20  # work at least this large may first run a full garbage collection (_short_of)


def available_bytes() -> int | None:
    """The memory the system says it can give without swapping (Linux's MemAvailable), None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _short_of(nbytes: int) -> bool:
    """Whether work of nbytes should free unreachable cycles first: the system's available memory is under twice
    nbytes, or the system does not say."""
    available = available_bytes()
    return available is None or available < 2 * nbytes


def two_sizes(a: int, b: int) -> tuple[str, str]:
    """a and b in one binary unit, the largest in which the smaller is at least 1 and the two show apart at two
    decimals ("0.98 GiB" twice would read as equal sizes where one is refused for exceeding the other)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        shown = f"{a / scale:,.2f} {unit}", f"{b / scale:,.2f} {unit}"
        if min(a, b) >= scale and shown[0] != shown[1]:
            return shown
    return f"{a:,} B", f"{b:,} B"


class MemoryBudget:
    """Admits work by estimated bytes under a limit shared by every thread of the process.

    with budget.admit(nbytes, on_wait=...): the block runs once `nbytes` fit beside the work already admitted;
    waiting works are served in the order they asked. on_wait(held_bytes, queue_position) is called once, before
    waiting, when the work cannot start at once; on_poll() every poll_seconds while it waits after that (a
    Streamlit page touches an element there, which lets Streamlit stop a run whose visitor left). Raises OverBudget when
    nbytes exceeds the whole limit, and TimeoutError when timeout (seconds) passes first.
    """

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.held = 0
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._queue: list[int] = []
        self._caches: list[HeldCache] = []  # results kept for later use, dropped (cheapest first) to make room

    @contextlib.contextmanager
    def admit(self, nbytes: int, **wait) -> Iterator[None]:
        """Runs the block once `nbytes` are admitted (acquire), and gives them back after it (release)."""
        nbytes = self.acquire(nbytes, **wait)
        try:
            yield
        finally:
            self.release(nbytes)

    def acquire(self, nbytes: int, *, on_wait: Callable[[int, int], None] | None = None,
                on_poll: Callable[[], None] | None = None, timeout: float | None = None, poll_seconds: float = 0.5,
                what: str = "This work", keep=None) -> int:
        """Holds `nbytes` of the budget until release(nbytes), waiting (first come, first served) until they fit.
        Before waiting, results kept for later use (HeldCache) are dropped to make room, except the one under the
        key `keep` (the model this work runs on: dropped, it would be loaded again beside the copy in use, or wait
        for the very bytes this work holds). Returns the bytes held."""
        nbytes = max(0, int(nbytes))
        pinned = sum(cache.held_by(keep) for cache in self._caches) if keep is not None else 0
        if nbytes >= COLLECT_BEFORE_BYTES and _short_of(nbytes):
            # The app turns off Streamlit's full collection after every run (.streamlit/config.toml: it held up
            # every view change): unreachable cycles are freed here instead, before a large allocation that the
            # machine's free memory does not hold twice over (a collection takes 0.3 s in a server with a model).
            gc.collect()
        if nbytes + pinned > self.limit:
            need, limit = two_sizes(nbytes + pinned, self.limit)
            with_model = " with the model it runs on" if pinned else ""
            raise OverBudget(f"{what} needs about {need}{with_model}, more than the {limit} this server gives all "
                             "visitors' work at once: make it smaller.")
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                told = False
                deadline = None if timeout is None else time.monotonic() + timeout
                while not (self._queue[0] == ticket and self.held + nbytes <= self.limit):
                    kept = sum(cache.held for cache in self._caches)
                    if self._queue[0] == ticket and self.held - kept + nbytes <= self.limit:  # dropping can help
                        self._cond.release()  # a cache that drops a result calls release(), which takes the lock
                        try:
                            freed = self.make_room(keep)
                        finally:
                            self._cond.acquire()
                        if freed:
                            continue
                    if not told and on_wait is not None:
                        told = True
                        on_wait(self.held, self._queue.index(ticket))
                    elif on_poll is not None:  # a caller that may be stopped (a Streamlit run) gets its chance
                        on_poll()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"{what} waited {timeout:g} s for memory held by other visitors.")
                    self._cond.wait(poll_seconds if left is None else min(poll_seconds, left))
                self.held += nbytes
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
        return nbytes

    def release(self, nbytes: int) -> None:
        """Gives back bytes that acquire() held."""
        with self._cond:
            self.held -= int(nbytes)
            self._cond.notify_all()

    def make_room(self, keep=None) -> bool:
        """Drops the least recently used result (never `keep`'s) of the cheapest cache that holds one; whether one
        was dropped."""
        return any(cache.drop_oldest(keep) for cache in sorted(self._caches, key=lambda c: c.priority))


class HeldCache:
    """A ComputeOnce whose results hold their memory in a MemoryBudget for as long as they are kept.

    get(key, compute, need=...) admits `need` bytes (the computation's peak: it waits, or is refused, like any
    work), computes, then keeps holding only what the result itself takes (held_bytes(result)) until the result is
    dropped: by the cache's own bound, or by the budget when other work needs the room (cheapest priority first:
    a capture is dropped before a model, which costs more to make again). A result a session still uses stays in
    memory until that session lets go of it: the budget then counts it a little late, never twice.
    """

    def __init__(self, budget: MemoryBudget, max_items: int, priority: int = 0):
        self.budget = budget
        self.priority = priority
        self._held: dict = {}
        self._lock = threading.Lock()
        self._once = ComputeOnce(max_items=max_items, on_evict=self._evicted)
        budget._caches.append(self)

    def peek(self, key):
        return self._once.peek(key)

    def find(self, match):
        return self._once.find(match)

    @property
    def held(self) -> int:
        """The bytes its kept results hold."""
        with self._lock:
            return sum(self._held.values())

    def __len__(self) -> int:
        return len(self._once)

    def get(self, key, compute: Callable[[], object], *, need: int, on_wait_other=None, **wait):
        """The cached result of key, or compute()'s under the budget; **wait goes to MemoryBudget.acquire,
        on_wait_other(seconds) is called while another session computes the same key."""
        def admitted():
            held = self.budget.acquire(need, **wait)
            try:
                value = compute()
            except BaseException:
                self.budget.release(held)
                raise
            kept = min(held, held_bytes(value))
            self.budget.release(held - kept)
            with self._lock:
                self._held[key] = kept
            return value

        return self._once.get(key, admitted, on_wait=on_wait_other)

    def drop_oldest(self, keep=None) -> bool:
        return self._once.pop_oldest(keep)

    def clear(self) -> None:
        """Drops every result kept, giving back the bytes each held."""
        while self.drop_oldest():
            pass

    def held_by(self, key) -> int:
        """The bytes the result kept under `key` holds (0 when none is kept)."""
        with self._lock:
            return self._held.get(key, 0)

    def _evicted(self, key, _value) -> None:
        with self._lock:
            held = self._held.pop(key, 0)
        self.budget.release(held)


def overview_bytes(n_heads: int, n_layers: int, n_tokens: int) -> int:
    """What the statistics pass of a long text keeps beside the table (attnviz.stats.streaming_attend's overview):
    from views.OVERVIEW_IN_PASS_FROM tokens, each head's One head overview twice (the sink shown and hidden, float16)
    and each query row's weight off the sink (float32)."""
    from attnviz.views import overview_in_pass

    size = overview_in_pass(n_tokens)
    if size is None:
        return 0
    side = min(size, n_tokens)
    return n_layers * n_heads * (2 * side * side * 2 + n_tokens * 4)


def held_bytes(value, depth: int = 3) -> int:
    """The bytes of the numpy arrays and torch tensors a value holds: itself, or in its fields, dicts, lists and
    tuples, `depth` levels down (a model's parameters, a capture's pattern and per-layer q and k)."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, torch.nn.Module):
        return sum(int(t.numel() * t.element_size()) for t in (*value.parameters(), *value.buffers()))
    if depth == 0:
        return 0
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dict__"):
        items = vars(value).values()
    else:
        return 0
    return sum(held_bytes(v, depth - 1) for v in items)


BUDGET = MemoryBudget(default_budget_bytes())


def forward_bytes(config, n_tokens: int, *, batch: int = 1, eager: bool = True) -> int:
    """Estimated peak bytes of one forward pass beyond the model's weights: hidden states and MLP activations
    (float32, a few copies) for `batch` texts of n_tokens, plus, when attention runs eager, one layer's [head, n, n]
    scores, weights and a copy."""
    from attnviz.capture import pattern_bytes

    hidden = hidden_size(config)
    inner = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    activations = n_tokens * (8 * hidden + 3 * inner) * 4
    eager_layer = pattern_bytes(1, heads_of(config), n_tokens, 4) * 3 if eager else 0
    return int(batch * (activations + eager_layer))


def capture_working_bytes(config, n_tokens: int, n_layers: int, *, store: str, itemsize: int = 4,
                          uses_sdpa: bool = True, maps: int | None = None) -> int:
    """Estimated peak bytes of one capture beyond the model's weights: what it keeps (the dense pattern, or q and k
    per layer) plus the forward pass's working set (forward_bytes; eager attention for the pattern store and for
    families read by hooks, uses_sdpa=False, in either store). maps: how many N x N maps the pattern store keeps
    (attnviz.capture.run.dense_maps: a hybrid's linear mixers count at their own heads); n_layers x the model's
    heads when None."""
    from attnviz.capture import inputs_bytes, pattern_bytes

    keeps = inputs_bytes(config, n_layers, n_tokens)
    if store == "qk":
        keeps += overview_bytes(heads_of(config), n_layers, n_tokens)
    if store == "pattern":
        keeps += (pattern_bytes(n_layers, heads_of(config), n_tokens, itemsize) if maps is None
                  else pattern_bytes(1, maps, n_tokens, itemsize))
    eager = store == "pattern" or not uses_sdpa  # a family read by hooks (BLOOM) runs eager even in the qk store
    return int(forward_bytes(config, n_tokens, eager=eager) + keeps)
