"""attnviz.capture.hooks: hooks shared by concurrent users of one model, installed by the first and removed by the
last."""

import threading
from contextvars import ContextVar

import pytest
import torch

from attnviz.capture import SharedHooks, decoder_layers
from attnviz.models import load_model


def test_shared_hooks_are_installed_once_and_removed_by_the_last_user():
    model = torch.nn.Linear(2, 2)
    installs = []

    def install(m):
        installs.append(m)
        return [m.register_forward_hook(lambda *a: None)]

    hooks = SharedHooks(install)
    inside, release = threading.Barrier(4), threading.Event()
    counts = []

    def user():
        with hooks.on(model):
            inside.wait(10)
            counts.append(len(model._forward_hooks))
            release.wait(10)

    threads = [threading.Thread(target=user) for _ in range(3)]
    for t in threads:
        t.start()
    inside.wait(10)  # all three are inside at once
    assert hooks.users(model) == 3 and hooks.installed(model) == 1 and len(installs) == 1
    release.set()
    for t in threads:
        t.join(10)
    assert counts == [1, 1, 1]
    assert hooks.users(model) == 0 and len(model._forward_hooks) == 0
    with pytest.raises(RuntimeError):  # an error inside still removes them
        with hooks.on(model):
            raise RuntimeError("boom")
    assert len(model._forward_hooks) == 0 and len(installs) == 2


def test_serving_gives_each_thread_its_own_state_while_the_hooks_are_on():
    """A hook reads the state of the thread that runs the model: two threads serving different values at once each
    see their own, a thread outside sees the default, and the state is reset after an exception."""
    model = torch.nn.Linear(2, 2)
    state: ContextVar[str | None] = ContextVar("test_state", default=None)
    seen: dict[str, list] = {"a": [], "b": [], "outside": []}
    hooks = SharedHooks(lambda m: [m.register_forward_hook(lambda *a: seen[state.get() or "outside"].append(1))])
    both_inside = threading.Barrier(2)

    def user(value):
        with hooks.serving(model, state, value):
            both_inside.wait(10)
            model(torch.ones(1, 2))
            both_inside.wait(10)

    threads = [threading.Thread(target=user, args=(v,)) for v in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"a": [1], "b": [1], "outside": []} and state.get() is None
    with pytest.raises(RuntimeError), hooks.serving(model, state, "a"):
        raise RuntimeError("boom")
    assert state.get() is None and len(model._forward_hooks) == 0
    with hooks.serving(model, state, "b", hooked=False):  # the state only
        assert state.get() == "b" and len(model._forward_hooks) == 0


@pytest.mark.parametrize("name, attr", [("toy-gpt2", "transformer.h"), ("toy-llama-gqa", "model.layers"),
                                        ("toy-bloom-alibi", "transformer.h")])
def test_decoder_layers_are_the_models_own_layer_list(name, attr):
    model = load_model(name).model
    own = model
    for part in attr.split("."):
        own = getattr(own, part)
    assert decoder_layers(model) == list(own)
