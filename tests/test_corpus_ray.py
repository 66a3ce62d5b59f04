"""attnviz.corpus.ray: a corpus run on a local Ray of 2 CPUs, with 2 actors (the size at which a pool holding every
CPU starved Ray Data and hung), against the local engine's run of the same arguments: the same tables, a worker
killed in the middle of a run changing nothing, a resumed run computing only the missing shards.

The bound is exact equality: both engines compute each window with the same function (shard_rows) on the same
weights, and the local reference runs with the actors' torch thread count (one each here), so nothing may differ.
Every test has a deadline (SIGALRM), so that a pipeline that waits forever fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time

import pandas as pd
import pytest
import torch

from attnviz.corpus import CorpusError, CorpusRun, corpus_run
from attnviz.corpus.ray import actor_sizing, run_on_ray
from attnviz.corpus.store import RunFolder

pytestmark = pytest.mark.slow  # a local Ray cluster started per test

ray = pytest.importorskip("ray")

MODEL = "toy-gpt2"
WINDOW = 32
SHARD = 2  # windows per shard: many shards, so that a kill lands while most are still to come
ACTORS = 2
DEADLINE = 120  # seconds per test
TEXTS = ["The quick brown fox jumps over the lazy dog, then naps. ", "A cat sat on the mat; the mat sat still. ",
         "Rain on the roof of the old barn, all night long. "]


@pytest.fixture(scope="module")
def local_ray():
    """A Ray of 2 CPUs for the module, modest (small object store, no dashboard), shut down after it."""
    ray.init(num_cpus=2, object_store_memory=128 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def deadline():
    def expire(signum, frame):
        raise TimeoutError(f"the test ran past {DEADLINE} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    for i, text in enumerate(TEXTS):
        (folder / f"doc{i}.txt").write_text(text * (8 + 4 * i), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The local engine's run, at the actors' torch thread count."""
    _, _, threads = actor_sizing(2, 2, ACTORS)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return corpus_run(MODEL, data, window=WINDOW, out=tmp_path_factory.mktemp("local") / "run",
                          shard_windows=SHARD)
    finally:
        torch.set_num_threads(saved)


def on_ray(data, out, progress=None):
    return corpus_run(MODEL, data, window=WINDOW, out=out, shard_windows=SHARD, engine="ray", actors=ACTORS,
                      progress=progress)


def stats(run: CorpusRun) -> pd.DataFrame:
    return run.sql("SELECT * FROM stats ORDER BY window_id, layer, head")


def assert_same_run(run: CorpusRun, reference: CorpusRun) -> None:
    """The same plan and the same statistics, bit for bit, and every window in exactly one row per head."""
    assert run.complete
    pd.testing.assert_frame_equal(run.folder.windows(), reference.folder.windows())
    pd.testing.assert_frame_equal(stats(run), stats(reference), check_exact=True)
    heads = reference.manifest["layers"] * reference.manifest["heads"]
    counts = run.sql("SELECT window_id, count(*) AS n FROM stats GROUP BY window_id ORDER BY window_id")
    assert counts["window_id"].tolist() == list(range(reference.manifest["n_windows"]))
    assert (counts["n"] == heads).all()


def test_actors_share_all_but_one_cpu():
    assert actor_sizing(2, 2, 2) == (2, 0.5, 1)  # this machine: one CPU left to Ray Data's tasks, a core each
    assert actor_sizing(2, 2, 1) == (1, 1.0, 2)  # one actor: Ray holds one CPU for it, it runs on both cores
    assert actor_sizing(1, 1, 1) == (1, 0.5, 1)
    assert actor_sizing(64, 16, 4, nodes=4) == (4, 15.0, 16)  # whole CPUs, each actor on a node of its own
    assert actor_sizing(32, 16, 1, nodes=2) == (1, 16.0, 16)  # never more than a node holds
    assert actor_sizing(16, 16, 4) == (4, 3.0, 4)  # four actors on one node split its cores


def test_a_ray_run_equals_the_local_run(local_ray, data, reference, tmp_path):
    calls = []
    run = on_ray(data, tmp_path / "run", progress=lambda done, total: calls.append((done, total)))
    assert_same_run(run, reference)
    total = reference.manifest["n_windows"]
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) == 1 + reference.manifest["n_shards"]  # one call per shard, as each is written


def test_a_worker_killed_mid_run_changes_nothing(local_ray, data, reference, tmp_path):
    out = tmp_path / "run"
    killed = []
    stop = threading.Event()

    def kill_one_worker():
        """Once the first shard is written: SIGKILL one actor's process (a Ray worker titled MapWorker)."""
        while not stop.is_set():
            if any((out / "shards").glob("shard-*.parquet")):
                workers = [p for p in _descendants() if "MapWorker" in p[1]]
                if workers:
                    killed.append((workers[0][0], len(RunFolder(out).done_shards())))
                    os.kill(workers[0][0], signal.SIGKILL)
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    try:
        run = on_ray(data, out)
    finally:
        stop.set()
        killer.join(5)
    assert killed and killed[0][1] < reference.manifest["n_shards"], "no worker was killed before the run ended"
    assert_same_run(run, reference)


def test_a_resumed_run_computes_only_the_missing_shards(local_ray, data, reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference.folder.path, out)
    shards = sorted((out / "shards").glob("shard-*.parquet"))
    for path in shards[1::2]:
        path.unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in shards[::2]}
    calls = []
    run = on_ray(data, out, progress=lambda done, total: calls.append(done))
    assert {p.name: p.stat().st_mtime_ns for p in shards[::2]} == kept  # the shards there were left alone
    assert_same_run(run, reference)
    size, total = SHARD, reference.manifest["n_windows"]
    assert calls[0] == sum(min(size, total - int(name[6:11]) * size) for name in kept)
    assert len(calls) == 1 + len(shards[1::2])


def test_an_actor_with_other_weights_is_refused_and_the_pool_ends(local_ray, reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference.folder.path, out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    manifest["model_fingerprint"] = "0" * 64  # as if the run had been planned with other weights
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    next((out / "shards").glob("shard-*.parquet")).unlink()
    with pytest.raises(CorpusError, match="other weights"):
        run_on_ray(MODEL, None, RunFolder(out))
    for _ in range(100):  # the actors give their CPUs back (asynchronously)
        if ray.available_resources().get("CPU") == 2:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2


def test_a_model_object_or_a_missing_ray_is_refused(data, reference, tmp_path, monkeypatch):
    from attnviz.models import load_model

    with pytest.raises(CorpusError, match="name, a folder or a .gguf file"):
        corpus_run(load_model(MODEL), data, window=WINDOW, out=tmp_path / "run", shard_windows=SHARD, engine="ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(CorpusError, match=r"pip install attnviz\[cluster\]"):
        run_on_ray(MODEL, None, RunFolder(reference.folder.path))


def _descendants() -> list[tuple[int, str]]:
    """(pid, process title) of every process below this one: the Ray this module started, its workers included."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            found.append((process.pid, process.name()))
        except psutil.Error:
            pass
    return found
