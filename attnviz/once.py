"""ComputeOnce: a bounded, thread-safe cache that computes each key once, however many sessions ask at once.

The app shares models, captures and experiments between every browser session. Streamlit's st.cache_data would
record and replay the progress a computation reports while it runs; this cache lets the computation report its
progress to the session that started it while the others wait for the same result.

Every shared ComputeOnce of the app is a module-level constant of the attnviz/ui module that uses it, made when
the module is imported (`_RESULTS = ComputeOnce(max_items=32)`): one per process, shared by every session; a module
Streamlit reloads after its file changed starts with an empty one, so no result of the old code is served, and a
test resets one by monkeypatching the module's name with a new ComputeOnce. (attnviz.budget.HeldCache, which
registers with the memory budget when made, is made on first use instead: ui._caches.)"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

class ComputeOnce:
    """A bounded, thread-safe cache that computes each key once, however many threads ask for it at the same time.

    get(key, compute) returns the cached value, or runs compute() and caches what it returns. A second caller of a
    key being computed waits for that result instead of computing it again; callers of different keys never wait
    on each other (each key has its own lock, taken from a dict under one short global lock, and compute() runs
    outside the global lock). If compute() raises, nothing is cached and the exception goes to its caller only; a
    caller that was waiting then computes the key itself, so a failed or interrupted run does not poison the key.
    At most max_items values are kept, the least recently used going first; on_evict(key, value), when given, is
    called for each value dropped (outside the lock), so a holder of memory can give it back.
    """

    def __init__(self, max_items: int = 64, on_evict: Callable[[Hashable, object], None] | None = None):
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self.max_items = int(max_items)
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self._values: OrderedDict = OrderedDict()
        self._key_locks: dict = {}  # key -> [its lock, number of callers holding or waiting for it]

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._values

    def peek(self, key: Hashable):
        """(True, value) when key is cached (marking it recently used), else (False, None); never computes."""
        with self._lock:
            return self._cached(key)

    def find(self, match: Callable[[Hashable], bool]):
        """(True, key, value) of the most recently used cached key for which match(key) is true (marking it
        recently used), else (False, None, None); never computes."""
        with self._lock:
            key = next((k for k in reversed(self._values) if match(k)), None)
            if key is None:
                return False, None, None
            return True, key, self._cached(key)[1]

    def _cached(self, key):
        """(True, value) when key is cached (and marks it recently used), else (False, None). Hold self._lock."""
        if key in self._values:
            self._values.move_to_end(key)
            return True, self._values[key]
        return False, None

    def get(self, key: Hashable, compute: Callable[[], object], *,
            on_wait: Callable[[float], None] | None = None, poll_seconds: float = 0.5):
        """The value of key, computed by compute() at most once at a time across threads.

        on_wait(seconds waited) is called every poll_seconds while another thread computes the same key (a page
        can show that it is waiting, and a caller that must stop can raise from it).
        """
        with self._lock:
            hit, value = self._cached(key)
            if hit:
                return value
            entry = self._key_locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            key_lock = entry[0]
            start = time.monotonic()
            while not key_lock.acquire(timeout=poll_seconds):
                if on_wait is not None:
                    on_wait(time.monotonic() - start)
            try:
                with self._lock:  # the caller before us may have finished it while we waited
                    hit, value = self._cached(key)
                if hit:
                    return value
                value = compute()
                with self._lock:
                    self._values[key] = value
                    self._values.move_to_end(key)
                    dropped = [self._values.popitem(last=False) for _ in range(len(self._values) - self.max_items)]
                self._evicted(dropped)
                return value
            finally:
                key_lock.release()
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._key_locks[key]

    def pop_oldest(self, keep: Hashable = None) -> bool:
        """Drops the least recently used value (never `keep`); False when there is nothing to drop."""
        with self._lock:
            oldest = next((k for k in self._values if k != keep), None)
            if oldest is None:
                return False
            dropped = [(oldest, self._values.pop(oldest))]
        self._evicted(dropped)
        return True

    def _evicted(self, dropped: list) -> None:
        if self._on_evict is not None:
            for key, value in dropped:
                self._on_evict(key, value)
