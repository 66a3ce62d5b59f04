"""attnviz.once.ComputeOnce: one computation per key, whatever the number of threads asking."""

import pytest

from attnviz.once import ComputeOnce


def _in_threads(targets):
    """Start one thread per callable and return them (already started)."""
    import threading

    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def test_compute_once_same_key_from_many_threads_computes_once():
    import threading

    cache = ComputeOnce(max_items=8)
    calls = []
    waiting = set()
    waiting_lock = threading.Lock()
    all_waiting = threading.Event()

    def note_wait(_seconds):
        with waiting_lock:
            waiting.add(threading.get_ident())
            if len(waiting) == 3:
                all_waiting.set()

    def compute():
        calls.append(threading.get_ident())
        assert all_waiting.wait(10), "the other three callers never waited"  # they arrive while this one runs
        return object()

    results = []
    threads = _in_threads([lambda: results.append(cache.get("k", compute, on_wait=note_wait, poll_seconds=0.01))
                           for _ in range(4)])
    for t in threads:
        t.join(20)
    assert len(calls) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert cache.get("k", compute) is results[0] and len(calls) == 1  # later callers get the cached value
    assert cache._key_locks == {}  # no per-key lock outlives its callers


def test_compute_once_different_keys_do_not_wait_for_each_other():
    import threading

    cache = ComputeOnce()
    release_a = threading.Event()
    a_started = threading.Event()
    got = {}

    def slow_a():
        a_started.set()
        assert release_a.wait(10)
        return "a"

    (thread_a,) = _in_threads([lambda: got.setdefault("a", cache.get("a", slow_a))])
    assert a_started.wait(10)
    (thread_b,) = _in_threads([lambda: got.setdefault("b", cache.get("b", lambda: "b"))])
    thread_b.join(5)
    assert got == {"b": "b"}, "key b waited for key a"  # a is still computing
    release_a.set()
    thread_a.join(10)
    assert got == {"a": "a", "b": "b"}


class _Interrupted(BaseException):
    """Like Streamlit's StopException: a BaseException raised inside a computation when a visitor moves on."""


@pytest.mark.parametrize("error", [RuntimeError("out of memory"), _Interrupted()])
def test_compute_once_failure_does_not_poison_the_key(error):
    import threading

    cache = ComputeOnce()
    calls = []
    second_waits = threading.Event()

    def failing():
        calls.append("first")
        assert second_waits.wait(10)  # fail only once the second caller is waiting for this result
        raise error

    def working():
        calls.append("second")
        return 42

    outcome = {}

    def first():
        try:
            cache.get("k", failing)
        except BaseException as exc:  # the test raises a BaseException on purpose
            outcome["first"] = exc

    def second():
        outcome["second"] = cache.get("k", working, on_wait=lambda s: second_waits.set(), poll_seconds=0.01)

    (t1,) = _in_threads([first])
    while not calls:  # the first caller holds the key before the second one asks
        threading.Event().wait(0.005)
    (t2,) = _in_threads([second])
    t1.join(20)
    t2.join(20)
    assert outcome["first"] is error  # the error goes to the caller whose computation failed
    assert outcome["second"] == 42 and calls == ["first", "second"]  # the waiter computed it itself
    assert cache.get("k", failing) == 42 and calls == ["first", "second"]
    # a failure with nobody waiting leaves nothing behind either: the next caller computes
    with pytest.raises(ZeroDivisionError):
        cache.get("z", lambda: 1 / 0)
    assert "z" not in cache and cache.get("z", lambda: "ok") == "ok"
    assert cache._key_locks == {}


def test_compute_once_keeps_the_most_recently_used():
    cache = ComputeOnce(max_items=2)
    calls = []

    def make(v):
        def compute():
            calls.append(v)
            return v
        return compute

    cache.get("a", make("a"))
    cache.get("b", make("b"))
    cache.get("a", make("a"))  # a is now the most recently used
    cache.get("c", make("c"))  # evicts b
    assert len(cache) == 2 and "a" in cache and "c" in cache and "b" not in cache
    cache.get("b", make("b"))
    assert calls == ["a", "b", "c", "b"]
    with pytest.raises(ValueError):
        ComputeOnce(max_items=0)


def test_find_gives_the_most_recently_used_match_and_never_computes():
    cache = ComputeOnce(max_items=3)
    for key in (("a", 1), ("a", 2), ("b", 1)):
        cache.get(key, lambda key=key: f"value of {key}")
    assert cache.find(lambda k: k[0] == "a") == (True, ("a", 2), "value of ('a', 2)")
    cache.peek(("a", 1))  # now the most recently used "a"
    assert cache.find(lambda k: k[0] == "a") == (True, ("a", 1), "value of ('a', 1)")
    assert cache.find(lambda k: k[0] == "c") == (False, None, None) and len(cache) == 3
    cache.get(("c", 1), lambda: "c")  # drops the least recently used: ("b", 1), the "a" keys having been found
    assert ("b", 1) not in cache and ("a", 1) in cache and ("a", 2) in cache
