"""attnviz.lab.variants: each config builds its transformers architecture, with the weights it says."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz import lab


@pytest.mark.parametrize("positional, model_type", [("learned", "gpt2"), ("sinusoidal", "gpt2"), ("rope", "llama"),
                                                    ("alibi", "bloom")])
def test_model_architecture_per_positional_scheme(positional, model_type):
    cfg = lab.LabConfig(positional=positional, n_layers=2, n_heads=4, d_model=32)
    model = lab.build_model(cfg)
    assert model.config.model_type == model_type and model.config.vocab_size == 257
    assert model.config._attn_implementation == "eager"
    ids = lab.make_probe(5, batch_size=2)
    out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 11, 11)
    same = lab.build_model(cfg)
    other = lab.build_model(lab.LabConfig(positional=positional, d_model=32, seed=1))
    for (name, p), q, r in zip(model.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, r) for p, r in zip(model.parameters(), other.parameters()))


def test_sinusoidal_positions_are_vaswani_table_and_frozen():
    model = lab.build_model(lab.LabConfig(positional="sinusoidal", d_model=16))
    wpe = model.transformer.wpe.weight
    assert not wpe.requires_grad
    for pos in (0, 1, 7, 200):
        for i in range(8):
            assert wpe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
            assert wpe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    run = lab.LabRun(lab.LabConfig(positional="sinusoidal", d_model=16, n_heads=2, steps=3))
    before = run.model.transformer.wpe.weight.clone()
    run.run()
    assert torch.equal(run.model.transformer.wpe.weight, before)


def test_config_problems_are_reported_and_refused():
    assert lab.LabConfig().problems() == []
    bad = lab.LabConfig(task="sorting", positional="xpos", steps=lab.MAX_STEPS + 1, d_model=30, n_heads=4,
                        segment_len=40)
    assert len(bad.problems()) == 5
    with pytest.raises(ValueError):
        lab.LabRun(bad)
