"""attnviz.lab.storage: save, reload with the same outputs, replace, refuse bad names, auto-save."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from attnviz import lab
from attnviz.tokenizer import byte_tokenizer


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """Every saved model goes to a temporary cache."""
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    return tmp_path

@pytest.mark.parametrize("positional", lab.POSITIONAL)
def test_saved_model_reloads_with_the_same_outputs(cache, positional):
    run = lab.LabRun(lab.LabConfig(positional=positional, steps=5, d_model=32))
    snap = run.run()
    path = run.save("unit-test")
    assert path == cache / "trained" / "unit-test" and any(path.glob("*.safetensors"))
    assert lab.saved_runs() == ["unit-test"]
    tok = byte_tokenizer()
    ids = torch.tensor([tok("abcdefabcdef")["input_ids"]])
    with torch.no_grad():
        want = run.model(input_ids=ids, output_attentions=True)
        reloaded = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        got = reloaded(input_ids=ids, output_attentions=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.attentions[1], want.attentions[1], rtol=0, atol=1e-6)
    assert AutoTokenizer.from_pretrained(path)("abcdefabcdef")["input_ids"] == ids[0].tolist()
    history = (path / "lab.json").read_text()
    assert f'"steps_trained": {snap.step}' in history


def test_saved_model_opens_through_the_model_registry(cache):
    from attnviz import models

    run = lab.LabRun(lab.LabConfig(positional="alibi", steps=5, d_model=32))
    run.run()
    run.save("registry-test")
    assert "lab/registry-test" in {s.name for s in models.available_models()}
    loaded = models.load_model("lab/registry-test")
    assert loaded.spec.source == "lab"
    ids = loaded.tokenizer("abcabc", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, run.model(input_ids=ids).logits,
                                   rtol=0, atol=1e-6)


def test_save_replaces_a_folder_and_refuses_bad_names(cache):
    run = lab.LabRun(lab.LabConfig(steps=2, d_model=32))
    run.run()
    run.save("same")
    run.save("same")
    assert lab.saved_runs() == ["same"] and run.snapshot().saved_as == "same"
    for bad in ("", "../escape", "a/b", ".hidden", "UPPER", "x" * (lab.MAX_NAME + 1)):
        with pytest.raises(ValueError):
            run.save(bad)
    assert sorted(p.name for p in (cache / "trained").iterdir()) == ["same"]


def test_auto_save_after_a_background_run(cache):
    cfg = lab.LabConfig(steps=4, d_model=32)
    snap = lab.LabRun(cfg, auto_save=cfg.default_name()).start().join(timeout=60)
    assert snap.status == "done" and snap.saved_as == cfg.default_name()
    assert (cache / "trained" / cfg.default_name() / "config.json").exists()


@pytest.mark.parametrize("attention", lab.VARIANTS)
def test_saved_variants_load_everywhere_with_the_same_outputs(cache, attention):
    """Each attention variant saved by the lab opens through attnviz.models (as every page loads it) with the
    trained model's logits; the gated one only because attnviz installs its gate (transformers alone drops the
    gate weights); the capture reports the sink logit's share where there is one."""
    import json

    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    run = lab.LabRun(lab.LabConfig(attention=attention, task="text", d_model=32, steps=3, text_len=16))
    run.run()
    path = run.save(f"variant-{attention}")
    history = json.loads((path / lab.LAB_FILE).read_text())
    assert history["config"]["attention"] == attention and "GptOss" in history["architecture"]
    loaded = load_model(f"lab/variant-{attention}", device="cpu")
    ids = torch.tensor([[lab.BOS_ID] + [ord(c) for c in "we hold these truths"]])
    with torch.no_grad():
        want, got = run.model(input_ids=ids).logits, loaded.model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    if attention == "gated":
        assert (plain - want).abs().max() > 1e-4  # without attnviz's gate the model is another one
    capture = capture_attention(loaded, "we hold these truths")
    rows = capture.pattern.sum(-1)  # [layer, head, query]: the weight on tokens
    if attention in ("softmax", "gated"):
        np.testing.assert_allclose(rows, 1.0, atol=1e-5)
        assert capture.learned_sink is None or np.allclose(capture.learned_sink, 0.0, atol=1e-7)
    else:
        np.testing.assert_allclose(capture.learned_sink, 1.0 - rows, atol=1e-5)
        assert capture.learned_sink.min() > 0.0
