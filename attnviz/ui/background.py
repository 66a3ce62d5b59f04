"""Builds ahead, in background threads, what a visitor is likely to ask for next; and the work a visitor is waiting
for, which those builds give way to.

build_in_background(cached, calls, name) calls a cached function with each argument tuple in a daemon thread. At most
BACKGROUND_BUILDS run at once for all visitors together: a prefetch is only a guess, so one asked for while they are
busy is skipped rather than queued behind a slider's every move.

foreground_work() marks a block a visitor waits for (a model run). A background build starts its next call only
when no such block is running (or after FOREGROUND_WAIT_S), so a guess does not take the cores from what was asked
for: on 2 cores, the induction test's L = 200 took 1.25 s beside a prefetch of the next seed and 0.55 s alone. A
call already started runs on (lowering its priority instead inverted it: a visitor waiting on that very call's lock
waited for a starved thread). Work inside a build does not count as a visitor's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

BACKGROUND_BUILDS = 2  # prefetch threads for the whole server; a build asked for while they are busy is skipped
FOREGROUND_WAIT_S = 10.0  # the longest a build's next call waits for a visitor's work to end
_background = threading.BoundedSemaphore(BACKGROUND_BUILDS)
_foreground = threading.Condition()
_running = {"blocks": 0}  # foreground_work blocks running now, every session together
_in_build = threading.local()


@contextlib.contextmanager
def foreground_work() -> Iterator[None]:
    """A block of work a visitor waits for: no background build starts a call while it runs (inside a build's own
    call it marks nothing)."""
    if getattr(_in_build, "active", False):
        yield
        return
    with _foreground:
        _running["blocks"] += 1
    try:
        yield
    finally:
        with _foreground:
            _running["blocks"] -= 1
            _foreground.notify_all()


def build_in_background(cached, calls: list[tuple], name: str) -> bool:
    """Calls the cached function `cached` (st.cache_resource or st.cache_data) with each argument tuple of `calls`
    in a daemon thread, each call once no foreground_work runs, so the results a visitor is likely to ask for next
    are in the shared cache by then; a call already cached costs nothing, and one a visitor asks for while it is
    being built waits for it (the cache's own lock per key). Returns False (nothing started) when BACKGROUND_BUILDS
    are running already."""
    if not calls or not _background.acquire(blocking=False):
        return False

    def build():
        _in_build.active = True
        try:
            for args in calls:
                with _foreground:
                    _foreground.wait_for(lambda: _running["blocks"] == 0, timeout=FOREGROUND_WAIT_S)
                cached(*args)
        finally:
            _in_build.active = False  # (a test may run build in its own thread)
            _background.release()

    threading.Thread(target=build, daemon=True, name=name).start()
    return True
