"""Work on every core at once, one core each (attnviz.cores), and the streamed statistics pass that runs its blocks
of rows that way: the same numbers bit for bit whatever the number of workers, and the thread count of the rest of
the process untouched."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
import torch

from attnviz import cores
from attnviz.attention import LayerInputs, MaskRule, causal_mask, kv_head_of
from attnviz.stats import InductionMatch, streamed_stats


def _in_new_thread(fn):
    got = []
    worker = threading.Thread(target=lambda: got.append(fn()))
    worker.start()
    worker.join()
    return got[0]


def test_on_linux_the_workers_are_held_to_one_core_each_and_the_process_keeps_its_count():
    """torch.set_num_threads(1) in a worker would also set the count every thread started later takes (a
    Streamlit rerun's thread would run the model on one core); the workers set only their own. (torch's Linux
    builds use GNU OpenMP, whose count is kept per thread; elsewhere the items run in the calling thread.)"""
    before, before_new = torch.get_num_threads(), _in_new_thread(torch.get_num_threads)
    seen: list[tuple[int, int, int]] = []

    def record(item):
        time.sleep(0.002)  # long enough that every worker takes some items
        seen.append((item, torch.get_num_threads(), threading.get_ident()))

    cores.run_each(record, range(40), n_workers=3)
    assert sorted(item for item, _, _ in seen) == list(range(40))  # each item once
    if sys.platform == "linux":
        assert {count for _, count, _ in seen} == {1}
        assert len({ident for _, _, ident in seen}) == 3
        assert cores.workers() == torch.get_num_threads()
    assert torch.get_num_threads() == before
    assert _in_new_thread(torch.get_num_threads) == before_new


def test_workers_keep_the_callers_inference_mode_and_its_first_error_is_raised():
    with torch.inference_mode():
        out = torch.zeros(10)  # an inference tensor: written in place only inside inference mode
        cores.run_each(lambda i: out.__setitem__(i, float(i)), range(10), n_workers=2)
    assert out.tolist() == [float(i) for i in range(10)]

    def fails(i):
        if i == 3:
            raise ValueError("item 3")

    with pytest.raises(ValueError, match="item 3"):
        cores.run_each(fails, range(8), n_workers=2)


def test_the_workers_are_started_once_and_a_workers_own_run_each_runs_in_place():
    """A pool per call started two threads a layer (more than a layer's tiles cost at 512 tokens); the pool is
    kept, and the corpus engine's windows, each on a worker, run their own streamed pass there."""
    if cores.workers() == 1 and sys.platform != "linux":
        pytest.skip("the items run in the calling thread where a worker cannot be held to one core")
    first, second, inner = set(), set(), []
    cores.run_each(lambda i: (time.sleep(0.002), first.add(threading.get_ident())), range(8), n_workers=2)
    cores.run_each(lambda i: (time.sleep(0.002), second.add(threading.get_ident())), range(8), n_workers=2)
    assert first == second and len(first) == 2 and threading.get_ident() not in first

    def nested(i):
        seen = set()
        cores.run_each(lambda j: seen.add(threading.get_ident()), range(4), n_workers=2)
        inner.append(seen == {threading.get_ident()})

    cores.run_each(nested, range(4), n_workers=2)
    assert inner == [True] * 4


def test_an_error_is_raised_only_once_every_item_has_ended():
    ended = []

    def item(i):
        if i == 0:
            raise ValueError("item 0")
        time.sleep(0.05)
        ended.append(i)

    with pytest.raises(ValueError, match="item 0"):
        cores.run_each(item, range(5), n_workers=2)
    assert sorted(ended) == [1, 2, 3, 4]


def _layer(n: int = 300, heads: int = 6, kv: int = 2, d: int = 16):
    g = torch.Generator().manual_seed(11)
    x = LayerInputs(q=torch.randn(heads, n, d, generator=g) * 2, k=torch.randn(kv, n, d, generator=g) * 2,
                    kv_head_of=tuple(kv_head_of(heads, kv)), scaling=d ** -0.5,
                    mask=MaskRule.from_bool(causal_mask(n)), sink=torch.randn(heads, generator=g))
    ids = list(np.random.default_rng(3).integers(0, 9, n))  # many repeats: many induction pairs per tile
    return x, ids, torch.randn(kv, n, d, generator=g)


def test_the_pass_gives_the_same_numbers_bit_for_bit_on_one_thread_and_on_several(monkeypatch):
    """Each block of rows is computed alone and its sums kept per block, added in order at the end; pooled row bins
    that span two blocks are merged under a lock (max is exact): no order of the blocks changes a bit."""
    x, ids, v = _layer()
    kwargs = dict(block=16, key_block=64, pool=7, overview=11, values=v)
    threads = torch.get_num_threads()
    monkeypatch.setattr(cores, "workers", lambda: 1)
    try:
        torch.set_num_threads(1)  # the one-thread pass on one core, as each worker runs
        alone = streamed_stats(x, ids, **kwargs)
    finally:
        torch.set_num_threads(threads)
    for n_workers in (2, 5):
        monkeypatch.setattr(cores, "workers", lambda n=n_workers: n)
        got = streamed_stats(x, ids, **kwargs)
        assert set(got) == set(alone)
        for name in alone:
            np.testing.assert_array_equal(got[name], alone[name], err_msg=f"{name}, {n_workers} workers")


def test_a_texts_induction_pairs_are_kept_for_the_next_layer_up_to_the_bound(monkeypatch):
    """The pairs a tile matched are kept for the same tile of the next layer, in one block sized to the text's
    number of pairs (counted here by brute force) or the bound; past MAX_KEPT_PAIRS they are matched again. Either
    way the induction scores equal those of a fresh match."""
    x, ids, _ = _layer()
    want = streamed_stats(x, ids, block=16, key_block=64)["induction"]
    for bound, all_kept in ((10**9, True), (500, False)):
        monkeypatch.setattr(InductionMatch, "MAX_KEPT_PAIRS", bound)
        match = InductionMatch(ids)
        for _ in range(2):  # two layers of one text
            np.testing.assert_array_equal(streamed_stats(x, match, block=16, key_block=64)["induction"], want)
        assert 0 < match.n_kept <= bound
        pairs = sum(int((match.before[None, :] == match.ids[:, None])[q, :q].sum()) for q in range(len(ids)))
        assert (match.n_kept == pairs) == all_kept
        assert match.store.shape == (2, min(bound, pairs))  # one block, sized to the text's pairs or the bound


def test_one_core_holds_only_the_calling_thread_to_one_core_while_the_block_runs():
    """The Softmax page's autograd runs inside one_core: one torch thread there, the thread's own count back after,
    and no other thread (a model's forward in another session) touched."""
    torch.set_num_threads(2)
    seen_elsewhere = []
    with cores.one_core():
        inside = torch.get_num_threads()
        seen_elsewhere.append(_in_new_thread(torch.get_num_threads))
    assert torch.get_num_threads() == 2
    assert seen_elsewhere == [2]
    if sys.platform == "linux":
        assert inside == 1
