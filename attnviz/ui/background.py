"""Builds ahead, in background threads, what a visitor is likely to ask for next; and the work a visitor is waiting
for, which those builds give way to.

build_in_background(cached, calls, name) calls a cached function with each argument tuple in a daemon thread. At most
BACKGROUND_BUILDS run at once for all visitors together: a prefetch is only a guess, so one asked for while they are
busy is skipped rather than queued behind a slider's every move. A newer build under the same name supersedes an
older one: the older stops before its next call (a visitor who moved on wants the new setting's neighbours).

How a build shares the cores (_pace, at each of its calls and, where torch is in use, before each torch module's
forward: a global forward pre-hook that does nothing outside a build):
- while a foreground_work block runs (a visitor's own model run) it waits, at its next module: on 2 cores the
  induction test's L = 200 took 1.5 s beside a prefetch's model run and 0.5 s alone;
- while a visitor_waits block runs (a visitor waiting for a result, which may be this build's) its torch uses every
  core;
- otherwise its torch uses one core (attnviz.cores): the browser drawing the page, on the same laptop, keeps the
  other (the first L step of the induction test went from 0.8 to 0.3 s).
Lowering a build's priority instead inverted it: a visitor waiting on that very call's lock waited for a starved
thread; so a foreground_work block must not wait on a lock a build may hold (take it before the block), and a wait
for a result goes in visitor_waits. Work inside a build counts as no visitor's.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator

BACKGROUND_BUILDS = 2  # prefetch threads for the whole server; a build asked for while they are busy is skipped
FOREGROUND_WAIT_S = 10.0  # the longest a build waits at one step for a visitor's work to end
_background = threading.BoundedSemaphore(BACKGROUND_BUILDS)
_foreground = threading.Condition()
_running = {"blocks": 0, "waiting": 0}  # foreground_work and visitor_waits blocks running, every session together
_newest: dict[str, int] = {}  # build name: the number of its newest build
_waiting: dict[str, threading.Timer] = {}  # build name: its build waiting to start (wait_s)
_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # every build's thread, and waiting timer
_in_build = threading.local()


@contextlib.contextmanager
def _counted(kind: str) -> Iterator[None]:
    if getattr(_in_build, "active", False):
        yield
        return
    with _foreground:
        _running[kind] += 1
    try:
        yield
    finally:
        with _foreground:
            _running[kind] -= 1
            _foreground.notify_all()


def foreground_work():
    """A block of work a visitor waits for, run in their own thread: background builds wait while it runs (inside a
    build's own call it marks nothing)."""
    return _counted("blocks")


def visitor_waits():
    """A block in which a visitor waits for a result a background build may be making: builds use every core."""
    return _counted("waiting")


def build_in_background(cached, calls: list[tuple], name: str, *, wait_s: float = 0.0) -> bool:
    """Calls the cached function `cached` (st.cache_resource or st.cache_data) with each argument tuple of `calls`
    in a daemon thread, paced by _pace, so the results a visitor is likely to ask for next are in the shared cache
    by then; a call already cached costs nothing, and one a visitor asks for while it is being built waits for it
    (the cache's own lock per key). Returns whether the build started: False (nothing started) when
    BACKGROUND_BUILDS are running already. wait_s: the build starts that many seconds later, unless a newer build
    under the same name is asked for meanwhile (a guess less likely than another's, left until the visitor has
    stopped moving): asking supersedes at once, even with no calls, the build of that name waiting or running; the
    waiting one takes no thread of BACKGROUND_BUILDS, and gets none if they are busy when it is due. Returns whether
    it was scheduled."""
    if wait_s <= 0:
        return _start(cached, calls, name)
    with _foreground:
        number = _newest[name] = _newest.get(name, 0) + 1
        superseded = _waiting.pop(name, None)
        if calls:
            later = _waiting[name] = threading.Timer(wait_s, _start, (cached, calls, name, number))
            later.daemon, later.name = True, f"{name} (waiting)"
    if superseded is not None:
        superseded.cancel()
    if calls:
        _threads.add(later)
        later.start()
    return bool(calls)


def running_builds() -> list[threading.Thread]:
    """The threads of the builds running now and of those waiting to start (a test waits for them to end)."""
    return [thread for thread in list(_threads) if thread.is_alive()]


def _start(cached, calls: list[tuple], name: str, number: int | None = None) -> bool:
    """Starts build_in_background's thread, if a slot is free: a build asked for now (number None) takes the next
    number of its name, superseding the older; a waiting one (its number) starts only if still the newest."""
    if number is not None:
        with _foreground:
            if _waiting.get(name) is threading.current_thread():  # (a Timer runs _start in its own thread)
                del _waiting[name]
    if not calls or not _background.acquire(blocking=False):
        return False
    with _foreground:
        if number is None:
            number = _newest[name] = _newest.get(name, 0) + 1
        elif _newest.get(name) != number:
            _background.release()
            return False
    _pause_modules_for_visitors()

    def build():
        _in_build.active, _in_build.cores, _in_build.every = True, None, None
        try:
            for args in calls:
                if _newest.get(name) != number:  # superseded
                    break
                _pace()
                cached(*args)
        finally:
            if _in_build.cores not in (None, _in_build.every):  # (a test may run build in its own thread)
                from attnviz import cores

                cores.set_own_threads(_in_build.every)
            _in_build.active = False
            _background.release()

    thread = threading.Thread(target=build, daemon=True, name=name)
    _threads.add(thread)
    thread.start()
    return True


def _pace() -> None:
    """Inside a build: waits (FOREGROUND_WAIT_S at most) while a visitor's foreground_work runs, then sets this
    thread's torch to every core while a visitor waits, else to one core. Outside a build: nothing."""
    if not getattr(_in_build, "active", False):
        return
    if _running["blocks"]:
        with _foreground:
            _foreground.wait_for(lambda: _running["blocks"] == 0, timeout=FOREGROUND_WAIT_S)
    if "torch" in sys.modules:
        import torch

        from attnviz import cores

        if _in_build.every is None:  # nothing set in this thread yet: the process's count
            _in_build.every = torch.get_num_threads()
        wanted = _in_build.every if _running["waiting"] else 1
        if _in_build.cores != wanted and cores.set_own_threads(wanted):
            _in_build.cores = wanted


def _pause_modules_for_visitors() -> None:
    """Makes every torch module's forward call _pace first (once, when torch is in use)."""
    if _hooked["done"] or "torch" not in sys.modules:
        return
    with _foreground:
        if not _hooked["done"]:
            from torch.nn.modules.module import register_module_forward_pre_hook

            register_module_forward_pre_hook(lambda _module, _args: _pace())
            _hooked["done"] = True


_hooked = {"done": False}
