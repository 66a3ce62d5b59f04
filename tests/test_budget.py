"""attnviz.budget: one memory budget for every visitor's long work, tested with threads."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from attnviz.budget import COLLECT_BEFORE_BYTES, MemoryBudget, OverBudget, capture_working_bytes


def test_work_that_does_not_fit_waits_is_told_and_starts_when_the_first_finishes():
    budget = MemoryBudget(100)
    events, told = [], []
    first_in, release = threading.Event(), threading.Event()

    def first():
        with budget.admit(60):
            events.append("first in")
            first_in.set()
            release.wait(5)
            events.append("first out")

    def second():
        first_in.wait(5)
        with budget.admit(60, on_wait=lambda held, ahead: told.append((held, ahead))):
            events.append("second in")
            assert budget.held == 60

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    first_in.wait(5)
    time.sleep(0.2)  # the second is now waiting: 60 + 60 > 100
    assert events == ["first in"] and told == [(60, 0)] and budget.held == 60
    release.set()
    for t in threads:
        t.join(5)
    assert events == ["first in", "first out", "second in"]
    assert budget.held == 0


def test_small_work_runs_side_by_side_and_order_is_first_come_first_served():
    budget = MemoryBudget(100)
    order = []
    gate = threading.Event()
    with budget.admit(90):  # holds most of the budget while three others queue
        def worker(name, size, delay):
            time.sleep(delay)
            with budget.admit(size):
                order.append(name)
                gate.wait(0.05)

        threads = [threading.Thread(target=worker, args=(name, size, delay))
                   for name, size, delay in (("a", 50, 0.0), ("b", 5, 0.1), ("c", 50, 0.2))]
        for t in threads:
            t.start()
        time.sleep(0.4)
        assert order == []  # b (5 bytes) would fit now, but waits behind a: first come, first served
    for t in threads:
        t.join(5)
    assert order[0] == "a" and sorted(order) == ["a", "b", "c"] and budget.held == 0


def refused_sizes(message: str) -> tuple[float, float]:
    """The two sizes a refusal states, in bytes, read back from its words."""
    scale = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}
    found = re.search(r"needs about ([\d,.]+) (GiB|MiB|KiB|B), more than the ([\d,.]+) (GiB|MiB|KiB|B) ", message)
    assert found, message
    need, need_unit, limit, limit_unit = found.groups()
    return float(need.replace(",", "")) * scale[need_unit], float(limit.replace(",", "")) * scale[limit_unit]


@pytest.mark.parametrize("need, limit", [(101, 100), (1_052_000_000, 1_048_576_000), (600_000, 500_000),
                                         (5 * 2**30, 4 * 2**30)])
def test_a_refusal_states_both_sizes_apart_and_to_within_rounding(need, limit):
    with pytest.raises(OverBudget) as refused:
        MemoryBudget(limit).acquire(need, what="This capture")
    shown_need, shown_limit = refused_sizes(str(refused.value))
    assert shown_need > shown_limit  # "0.98 GiB, more than the 0.98 GiB" would read as a contradiction
    for shown, true in ((shown_need, need), (shown_limit, limit)):
        assert abs(shown - true) <= 0.005 * max(true, 2**10) or shown == true


def test_work_larger_than_the_whole_budget_is_refused_at_once_and_errors_release():
    budget = MemoryBudget(100)
    with pytest.raises(OverBudget, match="more than the"):
        with budget.admit(101, what="Capturing 9,000 tokens"):
            pass
    with pytest.raises(RuntimeError):
        with budget.admit(80):
            raise RuntimeError("the capture failed")
    assert budget.held == 0
    with budget.admit(30), pytest.raises(TimeoutError):
        with budget.admit(80, timeout=0.1):
            pass
    assert budget.held == 0


def test_the_estimate_grows_with_the_text_and_the_dense_store_costs_more():
    from attnviz.models import load_model

    config = load_model("toy-llama-gqa").model.config
    small = capture_working_bytes(config, 100, 2, store="qk")
    assert capture_working_bytes(config, 1000, 2, store="qk") > 9 * small
    assert capture_working_bytes(config, 1000, 2, store="pattern") > capture_working_bytes(config, 1000, 2, store="qk")
    # the dense pattern alone: 2 layers x 4 heads x 1000^2 float32
    assert capture_working_bytes(config, 1000, 2, store="pattern") >= 2 * 4 * 1000 * 1000 * 4


def test_a_waiting_caller_is_polled_and_can_give_up_by_raising():
    budget = MemoryBudget(100)
    polls = []

    class Stop(Exception):
        pass

    def on_poll():
        polls.append(1)
        if len(polls) == 3:
            raise Stop  # what Streamlit does to a run whose visitor left

    with budget.admit(90):
        with pytest.raises(Stop):
            with budget.admit(20, on_wait=lambda held, ahead: None, on_poll=on_poll, poll_seconds=0.01):
                pass
        assert budget.held == 90 and not budget._queue  # the quitter left the queue
    with budget.admit(100):  # and nothing is left held
        pass


def test_large_work_first_frees_unreachable_cycles_when_memory_is_short(monkeypatch):
    """Streamlit's collection after every run is off (.streamlit/config.toml); a large admission collects first when
    the system's available memory is under twice its size (or unknown), so a capture dropped in a reference cycle
    does not hold its memory while the next one is admitted. With room to spare it does not collect (0.3 s in a
    server)."""
    import gc
    import tomllib
    import weakref

    from attnviz import budget as budget_module

    config = tomllib.loads((Path(__file__).resolve().parent.parent / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False

    class Big:
        pass

    gc.disable()  # only the admission may collect during this test
    try:
        cycle = Big()
        cycle.self = cycle  # unreachable once dropped, freed only by a collection
        alive = weakref.ref(cycle)
        del cycle
        budget = MemoryBudget(2**40)
        with budget.admit(1024):  # small work: no collection
            pass
        assert alive() is not None
        monkeypatch.setattr(budget_module, "available_bytes", lambda: 3 * COLLECT_BEFORE_BYTES)  # room to spare
        with budget.admit(COLLECT_BEFORE_BYTES):
            pass
        assert alive() is not None
        monkeypatch.setattr(budget_module, "available_bytes", lambda: COLLECT_BEFORE_BYTES)
        with budget.admit(COLLECT_BEFORE_BYTES):
            pass
        assert alive() is None
        cycle = Big()
        cycle.self = cycle
        alive = weakref.ref(cycle)
        del cycle
        monkeypatch.setattr(budget_module, "available_bytes", lambda: None)  # the system does not say
        with budget.admit(COLLECT_BEFORE_BYTES):
            pass
        assert alive() is None
    finally:
        gc.enable()


def test_the_estimate_counts_the_overview_a_long_statistics_pass_keeps(monkeypatch):
    """From views.OVERVIEW_IN_PASS_FROM tokens the Heads page's pass keeps every head's overview in the capture: the
    admission estimate holds those bytes, measured on a capture made that way (the threshold lowered to a short
    text)."""
    from attnviz import views
    from attnviz.budget import held_bytes, overview_bytes
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import streaming_attend

    loaded = load_model("toy-llama-gqa")
    text = "the overview is kept with the capture " * 4
    n = len(loaded.tokenizer(text).input_ids)
    config = loaded.model.config
    assert overview_bytes(4, 2, n) == 0  # below the threshold nothing is kept
    monkeypatch.setattr(views, "OVERVIEW_IN_PASS_FROM", 64)
    monkeypatch.setattr(views, "OVERVIEW", 40)
    cap = capture_attention(loaded, text, store="qk", during=streaming_attend(loaded.tokenizer(text).input_ids, pool=8))
    kept = sum(held_bytes(cap.summary[layer][key]) for layer in cap.layers
               for key in ("_overview", "_overview_nosink", "_kept"))
    assert kept > 0 and kept == overview_bytes(len(cap.kv_head_of), cap.n_layers, n)
    with_overview = capture_working_bytes(config, n, 2, store="qk")
    monkeypatch.setattr(views, "OVERVIEW_IN_PASS_FROM", 10**9)  # a text below it: no overview
    assert with_overview - capture_working_bytes(config, n, 2, store="qk") == kept
