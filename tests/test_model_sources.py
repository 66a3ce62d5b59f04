"""Model sources a server's operator controls (attnviz.models roots, attnviz.ui's picker) and the memory budget for
model loads (attnviz.budget.HeldCache): a visitor opens the listed models and folders under the allowed roots only,
learns nothing about the rest of the disk, and a load that can never fit is refused before it starts."""

from __future__ import annotations

import os

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import budget, models
from attnviz.capture import capture_attention
from attnviz.models import NOT_AVAILABLE, ModelError, allowed_roots, load_model


def _save_toy(folder):
    loaded = load_model("toy-llama-gqa")
    folder.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return loaded


@pytest.fixture()
def tree(tmp_path):
    """An allowed root holding one model folder, a model folder outside it, and links from inside to outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    original = _save_toy(root / "mine")
    _save_toy(outside / "theirs")
    (root / "link-out").symlink_to(outside / "theirs")
    sneaky = root / "sneaky"  # a folder inside whose weights are a link to a file outside
    sneaky.mkdir()
    for f in (root / "mine").iterdir():
        (sneaky / f.name).write_bytes(f.read_bytes())
    (sneaky / "model.safetensors").unlink()
    (sneaky / "model.safetensors").symlink_to(outside / "theirs" / "model.safetensors")
    return root, outside, original


def test_roots_are_resolved_and_missing_ones_left_out(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    value = os.pathsep.join([str(tmp_path / "a" / ".." / "a"), "~/a", str(tmp_path / "missing"), ""])
    assert allowed_roots(value) == (tmp_path.resolve() / "a",)
    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    assert allowed_roots() == ()


def test_a_folder_under_the_roots_loads_the_same_model(tree):
    root, _, original = tree
    loaded = load_model(str(root / "mine"), roots=(root.resolve(),))
    assert loaded.spec.source == "local"
    np.testing.assert_array_equal(capture_attention(loaded, "abcabc").pattern,
                                  capture_attention(original, "abcabc").pattern)
    # .. that comes back inside is resolved before the check, and so is ~
    assert load_model(str(root / "mine" / ".." / "mine"), roots=(root.resolve(),)).spec.source == "local"


@pytest.mark.parametrize("where", ["outside/theirs", "root/link-out", "root/sneaky", "root/../outside/theirs",
                                   "root/no-such-folder", "/etc", "/", "~", "/proc/self/cwd"])
def test_everything_else_gets_one_message_naming_nothing(tree, tmp_path, where):
    root = tree[0]
    name = where if where.startswith(("/", "~")) else str(tmp_path / where)
    with pytest.raises(ModelError) as refused:
        load_model(name, roots=(root.resolve(),))
    assert str(refused.value) == NOT_AVAILABLE
    with pytest.raises(ModelError) as estimated:  # the memory estimate, read before loading, refuses alike
        models.load_bytes(name, roots=(root.resolve(),))
    assert str(estimated.value) == NOT_AVAILABLE


def test_hub_ids_are_refused_unless_the_hub_cache_is_under_a_root(tmp_path, monkeypatch):
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--owner--tiny"
    _save_toy(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError) as refused:
        load_model("owner/tiny", roots=((tmp_path / "elsewhere").resolve(),))
    assert str(refused.value) == NOT_AVAILABLE
    with pytest.raises(ModelError) as uncached:
        load_model("owner/not-cached", roots=((tmp_path / "hub").resolve(),))
    assert str(uncached.value) == NOT_AVAILABLE
    assert load_model("owner/tiny", roots=((tmp_path / "hub").resolve(),)).spec.source == "hub"


def test_refusals_inside_the_roots_name_no_file(tree, tmp_path):
    import torch

    root = tree[0]
    pickled = root / "pickled"
    loaded = load_model("toy-gpt2")
    loaded.model.config.save_pretrained(pickled)
    torch.save(loaded.model.state_dict(), pickled / "secret_name.bin")
    corrupt = root / "damaged"
    _save_toy(corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    notes = root / "notes"
    notes.mkdir()
    (notes / "secret_name.txt").write_text("not a model")
    for folder, said in ((pickled, "pickle weights"), (corrupt, "could not load"), (notes, "no config.json")):
        with pytest.raises(ModelError, match=said) as refused:
            load_model(str(folder), roots=(root.resolve(),))
        message = str(refused.value)
        assert str(tmp_path) not in message and "secret_name" not in message and folder.name not in message
        assert refused.value.detail  # what the operator needs goes to the log


def test_load_bytes_counts_every_weight_as_float32(tree):
    root, _, original = tree
    n = sum(p.numel() for p in original.model.state_dict().values() if p.dtype.is_floating_point)
    got = models.load_bytes(str(root / "mine"))
    # tied or shared tensors are stored once; every stored tensor is counted at 4 bytes
    stored = {k: v for k, v in original.model.state_dict().items()}
    assert got - models.LOAD_OVERHEAD_BYTES <= 4 * n
    assert got - models.LOAD_OVERHEAD_BYTES >= 4 * max(v.numel() for v in stored.values())


def test_a_load_that_can_never_fit_is_refused_before_loading(tree):
    root = tree[0]
    need = models.load_bytes(str(root / "mine"))
    cache = budget.HeldCache(budget.MemoryBudget(need - 1), max_items=2)
    calls = []
    with pytest.raises(budget.OverBudget, match="Loading mine needs about"):
        cache.get("mine", lambda: calls.append(1), need=need, what="Loading mine")
    assert calls == [] and cache.budget.held == 0


def test_kept_results_hold_their_bytes_until_dropped_and_captures_go_before_models():
    import torch

    pool = budget.MemoryBudget(1000)
    models_cache = budget.HeldCache(pool, max_items=2, priority=1)
    captures = budget.HeldCache(pool, max_items=2, priority=0)
    model = models_cache.get("m", lambda: torch.zeros(100), need=600)  # 400 bytes kept of the 600 admitted
    assert pool.held == 400 and budget.held_bytes(model) == 400
    captures.get("c", lambda: np.zeros(50), need=500)  # 400 kept
    assert pool.held == 800
    captures.get("d", lambda: np.zeros(10), need=500)  # needs room: the capture "c" is dropped, not the model
    assert not captures.peek("c")[0] and captures.peek("d")[0] and models_cache.peek("m")[0]
    assert pool.held == 480
    models_cache.get("n", lambda: torch.zeros(10), need=40)
    models_cache.get("o", lambda: torch.zeros(10), need=40)  # its own bound (2) drops "m"
    assert not models_cache.peek("m")[0] and pool.held == 80 + 80
    with pytest.raises(RuntimeError):  # a failed computation holds nothing
        captures.get("e", lambda: (_ for _ in ()).throw(RuntimeError("no")), need=100)
    assert pool.held == 160


def test_work_keeps_the_model_it_runs_on_and_is_refused_when_the_two_never_fit():
    import torch

    pool = budget.MemoryBudget(1000)
    models_cache = budget.HeldCache(pool, max_items=2, priority=1)
    captures = budget.HeldCache(pool, max_items=2, priority=0)
    models_cache.get("other", lambda: torch.zeros(50), need=200)  # 200 kept, least recently used
    models_cache.get("m", lambda: torch.zeros(100), need=400)  # 400 kept
    # 500 more fits only by dropping a model: the other one goes, never the one this capture runs on
    captures.get("c", lambda: np.zeros(10), need=500, keep="m")
    assert models_cache.peek("m")[0] and not models_cache.peek("other")[0] and pool.held == 400 + 80
    # 700 next to the 400 it runs on could never fit in 1000: refused at once (it would otherwise drop the model
    # and wait, or load it again beside the copy in use), with the sum it needs
    with pytest.raises(budget.OverBudget, match="with the model it runs on"):
        captures.get("d", lambda: np.zeros(10), need=700, keep="m", timeout=1)
    assert models_cache.peek("m")[0] and pool.held == 480
    captures.get("e", lambda: np.zeros(10), need=700, timeout=1)  # no model to keep: dropping "m" makes room
    assert not models_cache.peek("m")[0]


def test_a_capture_that_fits_only_without_its_model_is_refused_not_left_waiting(monkeypatch):
    import threading

    from attnviz import ui

    limit = models.load_bytes("toy-gpt2")  # the model's load just fits
    monkeypatch.setattr(budget, "BUDGET", budget.MemoryBudget(limit))
    monkeypatch.setattr(ui.loaded, "_MODELS", None)  # the caches of a server started with that budget
    monkeypatch.setattr(ui.loaded, "_CAPTURES", None)
    kept = budget.held_bytes(ui.cached_model("toy-gpt2", ()))
    assert 0 < kept < limit and budget.BUDGET.held == kept
    need = limit - kept + 1_000  # fits the budget alone, never next to the model
    outcome = []

    def capture():
        try:
            ui.loaded._cached_capture("toy-gpt2", (), "too big with its model", None, False, need=need, timeout=30)
        except budget.OverBudget as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the capture waited for the bytes its own model holds"
    assert len(outcome) == 1 and "with the model it runs on" in outcome[0]


@pytest.fixture
def no_builds_running():
    """Waits until no build of the app's is running or waiting to start: a page run in an earlier test of this
    worker (the kernel page's, say) may have started one, holding a slot these tests count on."""
    import time

    from attnviz.ui.background import running_builds

    deadline = time.monotonic() + 120
    while alive := running_builds():
        assert time.monotonic() < deadline, f"builds still running: {[t.name for t in alive]}"
        alive[0].join(5)


@pytest.mark.usefixtures("no_builds_running")
def test_background_builds_are_capped(monkeypatch):
    import threading

    from attnviz import ui

    gate, started = threading.Event(), []

    def slow(i):
        started.append(i)
        gate.wait(5)

    accepted = [ui.build_in_background(slow, [(i,)], f"test-{i}") for i in range(ui.BACKGROUND_BUILDS + 3)]
    assert accepted == [True] * ui.BACKGROUND_BUILDS + [False] * 3
    gate.set()
    for t in [t for t in threading.enumerate() if t.name.startswith("test-")]:
        t.join(5)
    assert ui.build_in_background(slow, [(0,)], "test-again")  # the slots are free again


def _picker_app():
    import streamlit as st

    from attnviz import ui

    name = ui.model_picker("m", default="toy-gpt2")
    loaded = ui.get_model(name)
    if loaded is not None:
        st.success(f"loaded {loaded.spec.family} from {loaded.spec.source}")


def _open(typed: str) -> AppTest:
    from attnviz import ui

    at = AppTest.from_function(_picker_app, default_timeout=60)
    at.session_state["m"] = ui.CUSTOM_MODEL
    at.session_state["m_custom"] = typed
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_picker_opens_folders_under_the_roots_only(tree, tmp_path, monkeypatch):
    root = tree[0]
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(root))
    assert [s.value for s in _open(str(root / "mine")).success] == ["loaded llama from local"]
    refused = {where: [e.value for e in _open(where).error]
               for where in (str(tmp_path / "outside" / "theirs"), "/etc", str(tmp_path / "no" / "such"),
                             str(root / "link-out"), str(root / "sneaky"))}
    assert all(messages == [NOT_AVAILABLE] for messages in refused.values()), refused


def test_the_picker_opens_no_folder_when_no_root_is_allowed(tree, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    at = _open(str(tree[0] / "mine"))
    assert not at.success and not at.error
    assert "opens the listed models only" in at.info[0].value


def test_the_page_says_a_load_cannot_fit(monkeypatch):
    from attnviz import ui

    monkeypatch.setattr(budget, "BUDGET", budget.MemoryBudget(models.TOY_BYTES - 1))
    monkeypatch.setattr(ui.loaded, "_MODELS", None)
    monkeypatch.setattr(ui.loaded, "_CAPTURES", None)
    at = AppTest.from_function(_picker_app, default_timeout=60)
    at.session_state["m"] = "toy-llama-gqa"
    at.run()
    assert not at.exception and not at.success
    assert "Loading toy-llama-gqa needs about" in at.error[0].value


@pytest.mark.usefixtures("no_builds_running")
def test_a_background_build_starts_no_call_while_a_visitors_work_runs():
    """While a foreground_work block runs, a background build's next call waits; when it ends, the call runs. A
    build's own call inside foreground_work holds back no other build."""
    import threading

    from attnviz import ui

    started, inner = [], threading.Event()

    def record(i):
        with ui.foreground_work():  # inside a build: not a visitor's work
            started.append(i)
            if i == "inner":
                inner.wait(5)

    with ui.foreground_work():
        assert ui.build_in_background(record, [(1,), (2,)], "test-held")
        threading.Event().wait(0.3)
        assert started == []  # held back
    for t in [t for t in threading.enumerate() if t.name == "test-held"]:
        t.join(5)
    assert started == [1, 2]
    assert ui.build_in_background(record, [("inner",)], "test-inner")
    for _ in range(100):  # until that build is inside its foreground_work block
        if "inner" in started:
            break
        threading.Event().wait(0.05)
    assert ui.build_in_background(record, [(3,)], "test-other")
    for t in [t for t in threading.enumerate() if t.name == "test-other"]:
        t.join(5)
    inner.set()
    assert 3 in started  # ran while the first build was inside its own foreground_work


@pytest.mark.usefixtures("no_builds_running")
def test_a_background_builds_model_run_pauses_at_its_next_module_while_a_visitors_work_runs():
    """A build already inside a model's forward when a foreground_work block starts waits at its next module until
    the block ends (the visitor's run gets the cores); the visitor's own modules never wait."""
    import threading
    import time

    import torch

    from attnviz import ui

    started, go, order = threading.Event(), threading.Event(), []

    class Step(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i

        def forward(self, x):
            if self.i == 0 and threading.current_thread().name == "test-pause":
                started.set()
                go.wait(5)
            order.append((threading.current_thread().name, self.i))
            return x

    model = torch.nn.Sequential(*[Step(i) for i in range(3)])
    assert ui.build_in_background(lambda: model(torch.zeros(1)), [()], "test-pause")
    assert started.wait(5)
    with ui.foreground_work():
        go.set()
        time.sleep(0.3)
        model(torch.zeros(1))  # the visitor's run: not held
        assert order == [("test-pause", 0)] + [(threading.current_thread().name, i) for i in range(3)]
    for t in [t for t in threading.enumerate() if t.name == "test-pause"]:
        t.join(5)
    assert order[-2:] == [("test-pause", 1), ("test-pause", 2)]


@pytest.mark.usefixtures("no_builds_running")
def test_a_newer_build_of_the_same_name_stops_the_older_before_its_next_call():
    """Two builds under one name: the older ends its call under way and makes no further one; the newer runs all."""
    import threading

    from attnviz import ui

    ran, gate = [], threading.Event()

    def call(tag):
        if tag == "old 1":
            gate.wait(5)
        ran.append(tag)

    assert ui.build_in_background(call, [("old 1",), ("old 2",)], "test-newest")
    assert ui.build_in_background(call, [("new 1",), ("new 2",)], "test-newest")
    gate.set()
    for t in [t for t in threading.enumerate() if t.name == "test-newest"]:
        t.join(5)
    assert sorted(ran) == ["new 1", "new 2", "old 1"]


@pytest.mark.usefixtures("no_builds_running")
def test_a_build_that_waits_starts_later_unless_a_newer_one_of_its_name_came_meanwhile():
    """wait_s: nothing runs before it has passed; a newer build under the same name meanwhile (even one with no
    calls) means the waiting one never runs, and the newer one does."""
    import threading
    import time

    from attnviz import ui

    ran = []
    started = time.perf_counter()
    assert ui.build_in_background(lambda tag: ran.append((tag, time.perf_counter() - started)), [("late",)],
                                  "test-wait", wait_s=0.3)
    assert ran == []
    deadline = time.perf_counter() + 5
    while not ran and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert [tag for tag, _ in ran] == ["late"] and ran[0][1] >= 0.3
    ran.clear()
    assert ui.build_in_background(lambda tag: ran.append(tag), [("superseded",)], "test-wait", wait_s=0.3)
    assert ui.build_in_background(lambda tag: ran.append(tag), [], "test-wait", wait_s=0.05) is False
    assert ui.build_in_background(lambda tag: ran.append(tag), [("newest",)], "test-wait", wait_s=0.1)
    deadline = time.perf_counter() + 10
    while len([t for t in threading.enumerate() if t.name == "test-wait (waiting)"]) > 1:  # the older cancelled
        assert time.perf_counter() < deadline
        time.sleep(0.01)
    while not ran and time.perf_counter() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # past the superseded one's time: it must not run
    for t in [t for t in threading.enumerate() if t.name.startswith("test-wait")]:
        t.join(5)
    assert ran == ["newest"]


@pytest.mark.usefixtures("no_builds_running")
def test_a_build_runs_torch_on_one_core_unless_a_visitor_waits_for_a_result():
    """A build's torch modules run on one core (the other is left to the browser and the visitor); inside a
    visitor_waits block they take the process's every core; the thread's count is its own, not the process's."""
    import threading

    import torch

    from attnviz import cores, ui

    every = torch.get_num_threads()
    if cores._thread_controls() is None or every < 2:
        pytest.skip("per-thread torch counts cannot be set here, or there is one core")
    seen, gate = [], threading.Event()

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x

    probe = Probe()

    def call(wait_first):
        if wait_first:
            gate.wait(5)
        probe(torch.zeros(1))

    assert ui.build_in_background(call, [(False,), (True,)], "test-cores")
    for _ in range(100):
        if seen:
            break
        threading.Event().wait(0.05)
    with ui.visitor_waits():
        gate.set()
        for t in [t for t in threading.enumerate() if t.name == "test-cores"]:
            t.join(5)
    probe(torch.zeros(1))  # this thread: not a build's
    assert seen == [1, every, every] and torch.get_num_threads() == every

