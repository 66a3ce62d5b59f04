"""The Heads page's Induction test tab (a fragment): the standard test of Olsson et al. on a random sequence
repeated once, run on the page's model for each L and seed, and built ahead.

Tests are kept for every session in a budget.HeldCache (INDUCTION_TESTS_KEPT: every L of one seed and the next
seed's), their weights counted in the one memory budget and dropped before models when other work needs the room.
Where the model allows it (diagnostics.reuses_first_copies) a test starts from the seed's first copies kept
(_FIRST_COPIES), so an L of a seed already seen runs only its second copy. A first view builds the seed's first
copies to the longest L, then the seed's other L's and the next seed in the background (prefetch_induction).
"""

from __future__ import annotations

import threading

import streamlit as st

from attnviz import budget, ui
from attnviz.capture import CaptureError
from attnviz.diagnostics import SCORES
from attnviz.figures import heads as figs


@st.fragment
def induction_panel(model: str, version: tuple, layer: int, head: int, gamma: float) -> None:
    """The Induction test tab: the standard test on a random sequence repeated once, independent of the text."""
    st.write("The standard induction test, independent of your text: a random sequence of L distinct tokens, "
             "repeated once. In the second copy every token has one earlier occurrence; an induction head looks "
             "at the token that came after it (prefix matching).")
    i1, i2, i3 = st.columns(3)
    length = i1.select_slider("Length L of the random sequence", INDUCTION_LENGTHS, 50,
                              key="heads_induction_length", persist_state="session")
    seed = i2.number_input("Seed", 0, SEED_MAX, 0, key="heads_induction_seed", persist_state="session")
    column = i3.radio("Score", SCORES, key="heads_induction_score", persist_state="session")
    setting = {"model": model, "version": version, "length": length, "seed": int(seed)}
    previous = ui.last_setting("heads_induction_last", setting)
    try:
        with st.spinner(f"Running {model} on {2 * length} random tokens…"), ui.visitor_waits():
            if previous is None:  # a first view: the seed's first copies to the longest L, so that each L moved to
                first_copies_of(model, version, int(seed), INDUCTION_LENGTHS[-1])  # runs its second copy only
            test = induction_test_of(model, version, length, int(seed))
    except (CaptureError, budget.OverBudget) as exc:
        st.error(str(exc))
        return
    if test.loss_first is not None:
        st.write(f"Loss on the first copy: {test.loss_first:.2f} nats a token (random: the model cannot predict "
                 f"it); on the second: {test.loss_second:.2f}. "
                 + ("The model copies from the first copy." if test.loss_second < test.loss_first - 0.5 else
                    "The model does not use the repeat much."))
    view = (column, layer, head, gamma)
    with ui.visitor_waits():  # a build may be drawing them
        grid, detail = induction_figures(model, version, length, int(seed), *view)
    ui.plot(grid, width="stretch")
    best = test.scores.sort_values(column, ascending=False).head(5)
    st.dataframe(best, hide_index=True, width="stretch")
    st.caption("Per head, the mean over the L queries of the second copy. Chance is about 1/(position): a head "
               "spreading its weight evenly would score near 1/(1.5 L).")
    if detail is not None:
        ui.plot(detail, width="stretch")
        st.write(f"An induction head draws a stripe {length - 1} tokens below the diagonal in the lower half: each "
                 "token of the second copy looks at the token after its first occurrence.")
    prefetch_induction(setting, previous, view)


@ui.figure_cache(max_entries=8)
def induction_figures(model: str, version: tuple, length: int, seed: int, column: str, layer: int, head: int,
                      gamma: float):
    """The test's grid of `column` for every head, and head `head` of `layer` on the sequence (None when that layer
    was not captured): built once per setting for every session (the prefetch builds the next setting's)."""
    test = induction_test_of(model, version, length, seed)
    meaning = {"prefix_matching": "the token after the earlier occurrence (induction)",
               "duplicate_token": "the earlier occurrence itself", "previous_token": "the token just before"}[column]
    grid = figs.stat_grid(test.scores, column, title=f"{column}: weight on {meaning}, mean over the second copy",
                          colorbar_title="share of attention")
    if layer not in test.capture.layers:
        return grid, None
    p = test.capture.pattern[test.capture.index_of(layer), head]
    return grid, figs.head_detail(p, test.capture.tokens, gamma=gamma, causal=test.capture.causal,
                                  title=f"Layer {layer}, head {head} on the repeated random tokens")


INDUCTION_LENGTHS, SEED_MAX = [10, 25, 50, 100, 200], 1_000_000  # the test's L slider, its largest seed


def prefetch_induction(setting: dict, previous: dict | None, view: tuple) -> None:
    """Runs in the background, with their figures for `view` (induction_figures' column, layer, head, gamma), the
    tests a visitor is likely to ask for next (setting, previous: {"model", "version", "length", "seed"} of this run
    and of the last, None on a first view). A first view: the seed's L one step either way, the next seed, then
    the seed's other L's, nearest first (its own run built the seed's first copies to the longest L). An L moved:
    the next L the way it moved, the seed's first copies to the longest L (first_copies_of: every L of the seed
    then runs only its second copy), then its other L's and the next seed. A seed moved: the next seed the way it
    moved.
    Nothing when neither moved. Every L of a seed together holds 219 MiB for SmolLM2 (INDUCTION_TESTS_KEPT)."""
    here = INDUCTION_LENGTHS.index(setting["length"])
    ladder = sorted((n for n in INDUCTION_LENGTHS if n != setting["length"]),  # nearest first, the longer first
                    key=lambda n: (abs(INDUCTION_LENGTHS.index(n) - here), -n))
    others = [{**setting, "length": n} for n in ladder]
    seed = [{**setting, "seed": setting["seed"] + 1}] if setting["seed"] < SEED_MAX else []
    if previous is None:
        near = [s for s in others if abs(INDUCTION_LENGTHS.index(s["length"]) - here) == 1]
        wanted, first = near + seed + [s for s in others if s not in near], []
    elif previous["length"] != setting["length"]:
        wanted = ui.moved_neighbours(setting, previous, {"length": INDUCTION_LENGTHS})[:1]
        wanted += [s for s in others if s not in wanted] + seed
        first = [("first copies", (setting["model"], setting["version"], setting["seed"], INDUCTION_LENGTHS[-1]))]
    else:
        wanted, first = ui.moved_neighbours(setting, previous, {"seed": (0, SEED_MAX)})[:1], []
    figures = [("figures", (s["model"], s["version"], s["length"], s["seed"], *view)) for s in wanted]
    ui.build_in_background(_build_ahead, figures[:1] + first + figures[1:], "attnviz-induction-next")


def _build_ahead(kind: str, args: tuple) -> None:
    """One of prefetch_induction's builds: a setting's figures (and so its test), or a seed's first copies."""
    (induction_figures if kind == "figures" else first_copies_of)(*args)


def induction_test_of(model: str, version: tuple, length: int, seed: int):
    """attnviz.diagnostics.induction_test on the model, kept for every session (_TESTS; read-only: its capture's
    arrays are frozen) under the memory budget: admitted by its peak, a capture with its weights and the logits,
    then holding what it keeps."""
    loaded = ui.cached_model(model, version)
    n = 2 * length + 1
    need = ui.capture_need(loaded, n, None, "pattern") + n * loaded.model.config.get_text_config().vocab_size * 12
    return _TESTS.get((model, version, length, seed), lambda: _run_test(model, version, loaded, length, seed),
                      need=need, keep=(model, version), what=f"The induction test at L = {length}")


def _run_test(model: str, version: tuple, loaded, length: int, seed: int):
    """The test, started from the seed's first copies kept where the model allows it (first_copies_of), so a new L
    of a seed already seen runs only its second copy; the first copies it ran kept in their place."""
    from attnviz.diagnostics import induction_test, reuse_test, reuses_first_copies

    if not reuses_first_copies(loaded):
        with ui.foreground_work():  # a visitor's (not in a prefetch): the prefetches wait
            test = induction_test(loaded, length, seed=seed)
    else:
        key = (model, version, seed)
        with _FIRST_COPIES.building(key):  # a prefetch building them: wait for it (outside foreground_work, which
            kept = _FIRST_COPIES.get(key)  # would pause it), not run L twice as long
        with ui.foreground_work():
            test, first = reuse_test(loaded, length, seed=seed, first=kept, logits=False)
        _FIRST_COPIES.keep(key, first)
    test.capture.pattern.flags.writeable = False
    test.capture.logits = None  # the tab draws none: 75 of the 240 MiB a test of L = 200 holds for SmolLM2
    return test


def first_copies_of(model: str, version: tuple, seed: int, length: int) -> None:
    """Makes sure the seed's first copies kept are at least `length` long (attnviz.diagnostics.first_copies, one
    pass over the first copy): a prefetch, after which every L up to `length` of this seed runs only its second
    copy. Nothing for a model that cannot reuse them."""
    from attnviz.diagnostics import first_copies, reuses_first_copies

    key = (model, version, seed)
    loaded = ui.cached_model(model, version)
    with _FIRST_COPIES.building(key), ui.foreground_work():  # the lock first: a build holding it is not paused
        kept = _FIRST_COPIES.get(key)
        if (kept is None or kept.length < length) and reuses_first_copies(loaded):
            _FIRST_COPIES.keep(key, first_copies(loaded, length, seed=seed))


class _Longest:
    """{(model, version, seed): the longest attnviz.diagnostics.FirstCopies built} for the last `max_items` keys,
    shared by every session (a lock around each read and write; the longer of two kept for one key wins), and a
    lock per key held while they are built (building), which a test of that seed waits on. SmolLM2's at L = 200:
    87 MiB (weights 44, logits 40, keys and values 9). With a `memory` budget (budget.MemoryBudget) each one kept
    holds its bytes there, is not kept when they do not fit at once (a later test runs its first copy again), and
    is dropped first when other work needs the room (the budget's caches of priority 0)."""

    priority = 0

    def __init__(self, max_items: int, memory=None):
        self.max_items, self._items, self._lock, self._builds = max_items, {}, threading.Lock(), {}
        self._held, self._memory = {}, memory
        if memory is not None:
            memory._caches.append(self)

    def building(self, key) -> threading.Lock:
        with self._lock:
            if len(self._builds) > 4 * self.max_items:  # forget the locks of keys dropped and not being built
                for old in [k for k, lock in self._builds.items() if k not in self._items and not lock.locked()]:
                    del self._builds[old]
            return self._builds.setdefault(key, threading.Lock())

    def get(self, key):
        with self._lock:
            return self._items.get(key)

    def keep(self, key, first) -> None:
        with self._lock:
            if key in self._items and self._items[key].length >= first.length:
                self._items[key] = self._items.pop(key)  # the most recently kept
                return
        nbytes = budget.held_bytes(first) if self._memory is not None else 0
        if nbytes:
            try:  # outside the lock: making room may drop one of these
                self._memory.acquire(nbytes, timeout=0, what="The induction test's first copy")
            except (TimeoutError, budget.OverBudget):
                return
        with self._lock:
            if key in self._items and self._items[key].length >= first.length:  # a longer one kept meanwhile
                freed = [nbytes]
            else:
                freed = [self._release(key)]
                self._items[key], self._held[key] = first, nbytes
            while len(self._items) > self.max_items:
                freed.append(self._release(next(iter(self._items))))  # the least recently kept
        self._give_back(sum(freed))

    def _release(self, key) -> int:
        self._items.pop(key, None)
        return self._held.pop(key, 0)

    def _give_back(self, nbytes: int) -> None:
        if nbytes:
            self._memory.release(nbytes)

    # what budget.MemoryBudget asks of the caches it drops results from
    @property
    def held(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def held_by(self, key) -> int:
        with self._lock:
            return self._held.get(key, 0)

    def drop_oldest(self, keep=None) -> bool:
        with self._lock:
            oldest = next((k for k in self._items if k != keep), None)
            freed = None if oldest is None else self._release(oldest)
        if freed is None:
            return False
        self._give_back(freed)
        return True


_FIRST_COPIES = _Longest(max_items=2, memory=budget.BUDGET)
INDUCTION_TESTS_KEPT = 6  # every L of one seed (219 MiB together for SmolLM2) and the next seed's
_TESTS = budget.HeldCache(budget.BUDGET, max_items=INDUCTION_TESTS_KEPT, priority=0)
