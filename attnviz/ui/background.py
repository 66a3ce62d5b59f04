"""Builds ahead, in background threads, what a visitor is likely to ask for next; and the work a visitor is waiting
for, which those builds give way to.

build_in_background(cached, calls, name) calls a cached function with each argument tuple in a daemon thread. At most
BACKGROUND_BUILDS run at once for all visitors together: a prefetch is only a guess, so one asked for while they are
busy is skipped rather than queued behind a slider's every move.

foreground_work() marks a block a visitor waits for (a model run). A background build starts its next call only
when no such block is running (or after FOREGROUND_WAIT_S), so a guess does not take the cores from what was asked
for: on 2 cores, the induction test's L = 200 took 1.25 s beside a prefetch of the next seed and 0.55 s alone. A
call already started pauses instead at its next torch module (a forward pre-hook on every module, a no-op outside
a build), so a visitor's model run does not share the cores with a guess's for longer than one layer: on 2 cores the
L = 200 test took 1.5 s beside a prefetch's model run, 0.5 s alone. Lowering a build's priority instead inverted it:
a visitor waiting on that very call's lock waited for a starved thread; so a foreground_work block must not wait on
a lock a build may hold (take it before the block). Work inside a build does not count as a visitor's.
"""

from __future__ import annotations

import contextlib
import sys
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

    _pause_modules_for_visitors()

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


def _give_way() -> None:
    """Inside a build, waits (FOREGROUND_WAIT_S at most) while a visitor's foreground_work runs; else nothing."""
    if getattr(_in_build, "active", False) and _running["blocks"]:
        with _foreground:
            _foreground.wait_for(lambda: _running["blocks"] == 0, timeout=FOREGROUND_WAIT_S)


def _pause_modules_for_visitors() -> None:
    """Makes every torch module's forward call _give_way first (once, when torch is in use): a build's model run
    pauses at its next module while a visitor's runs."""
    if _hooked["done"] or "torch" not in sys.modules:
        return
    with _foreground:
        if not _hooked["done"]:
            from torch.nn.modules.module import register_module_forward_pre_hook

            register_module_forward_pre_hook(lambda _module, _args: _give_way())
            _hooked["done"] = True


_hooked = {"done": False}
