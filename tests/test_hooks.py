"""attnviz.capture.hooks: hooks shared by concurrent users of one model, installed by the first and removed by the
last."""

import threading

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


@pytest.mark.parametrize("name, attr", [("toy-gpt2", "transformer.h"), ("toy-llama-gqa", "model.layers"),
                                        ("toy-bloom-alibi", "transformer.h")])
def test_decoder_layers_are_the_models_own_layer_list(name, attr):
    model = load_model(name).model
    own = model
    for part in attr.split("."):
        own = getattr(own, part)
    assert decoder_layers(model) == list(own)
