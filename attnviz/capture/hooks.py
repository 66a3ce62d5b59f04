"""Forward hooks that every session shares on one cached model.

A cached model is shared by every browser session. The capture and every intervention (attnviz.interventions:
knock-outs, patching, the massive-activation edit) need hooks on it while they run, and each reads what to do from
a ContextVar of its own thread, so that two sessions
never see each other's work. The hooks themselves are installed by the first user and removed by the last
(SharedHooks: a reference count per model under one lock), so a model outside any of them runs unhooked.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch


class SharedHooks:
    """install(model) -> the hook handles it registered; on(model) keeps them while any thread is inside."""

    def __init__(self, install: Callable[[torch.nn.Module], list]):
        self._install = install
        self._lock = threading.Lock()
        self._entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [users, handles]

    @contextlib.contextmanager
    def on(self, model) -> Iterator[None]:
        with self._lock:
            entry = self._entries.setdefault(model, [0, []])
            if entry[0] == 0:
                entry[1] = list(self._install(model))
            entry[0] += 1
        try:
            yield
        finally:
            with self._lock:
                entry[0] -= 1
                if entry[0] == 0:
                    for handle in entry[1]:
                        handle.remove()
                    entry[1] = []

    @contextlib.contextmanager
    def serving(self, model, state: ContextVar, value, *, hooked: bool = True) -> Iterator[None]:
        """on(model) while this thread's `state` holds `value` (what the hooks read; other threads see their own,
        so two sessions never see each other's work); state is reset afterwards, also on an exception. hooked=False:
        the state only (a model whose own code reads it needs no hooks)."""
        with self.on(model) if hooked else contextlib.nullcontext():
            token = state.set(value)
            try:
                yield
            finally:
                state.reset(token)

    def users(self, model) -> int:
        """How many blocks are inside on(model) now."""
        with self._lock:
            entry = self._entries.get(model)
            return 0 if entry is None else entry[0]

    def installed(self, model) -> int:
        """How many hook handles are on the model now."""
        with self._lock:
            entry = self._entries.get(model)
            return 0 if entry is None else len(entry[1])
