"""attnviz as a library: the installed package and its command, what `import attnviz` does, and the front door
(attnviz.capture, from_attentions, AttentionCapture.stats / save / to_attentions) against transformers' own
output_attentions, hand computations and bertviz."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz.capture.files import load_capture
from attnviz.stats import COLUMNS
from attnviz.tokenizer import byte_tokenizer
from tests.servers import streamlit_server

ROOT = Path(__file__).resolve().parent.parent
TEXT = "abc abd abc abd"
SCRIPT = Path(sys.executable).parent / "attnviz"  # the console script pip puts beside the environment's python


def _env_without_triton_choice() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}


# -- the package --

def test_import_attnviz_imports_nothing_and_changes_no_environment_variable(tmp_path):
    code = ("import json, os, sys\n"
            "before = dict(os.environ)\n"
            "import attnviz\n"
            "light = {name: name in sys.modules for name in ('streamlit', 'triton', 'torch', 'plotly')}\n"
            "unchanged = dict(os.environ) == before\n"
            "attnviz.capture, attnviz.from_attentions, attnviz.AttentionCapture, attnviz.load_capture\n"
            "front = {name: name in sys.modules for name in ('streamlit', 'triton', 'plotly')}\n"
            "print(json.dumps([light, unchanged, front, dict(os.environ) == before, attnviz.__file__]))\n")
    result = subprocess.run([sys.executable, "-c", code], env=_env_without_triton_choice(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    light, unchanged, front, still_unchanged, where = json.loads(result.stdout.splitlines()[-1])
    assert light == {"streamlit": False, "triton": False, "torch": False, "plotly": False}
    assert unchanged and still_unchanged
    assert front == {"streamlit": False, "triton": False, "plotly": False}  # the front door's own imports
    assert Path(where) == ROOT / "attnviz" / "__init__.py"  # importable from anywhere: the checkout, installed


@pytest.mark.slow
def test_console_script_after_setup(tmp_path):
    assert SCRIPT.is_file(), "no attnviz command beside this python: run bash scripts/setup.sh"
    result = subprocess.run([str(SCRIPT), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: attnviz")
    for command in ("capture", "stats", "models", "app"):
        assert command in result.stdout
    models = subprocess.run([str(SCRIPT), "models"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert models.returncode == 0 and "toy-gpt2" in models.stdout and "smollm2-135m" in models.stdout


@pytest.mark.slow
def test_attnviz_app_starts_the_streamlit_app(tmp_path):
    """`attnviz app` from another folder serves the checkout's app until it is stopped (by its own PID: the command
    becomes streamlit)."""
    with streamlit_server([str(SCRIPT), "app"], cwd=tmp_path) as (_, proc):  # RuntimeError unless it answers
        assert "app.py" in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().replace("\0", " ")


def test_attnviz_app_without_a_checkout_says_what_to_do(monkeypatch, capsys):
    import attnviz.__main__ as cli

    monkeypatch.setattr(cli, "app_script", lambda: None)
    assert cli.main(["app"]) == 2
    assert "Clone the repository" in capsys.readouterr().err
    assert cli.app_script() is None
    monkeypatch.undo()
    assert cli.app_script() == ROOT / "app.py"


def test_pyproject_pins_are_requirements_txt():
    """The package's dependencies plus its app extra are exactly requirements.txt's lines, and the app extra holds
    what only the app and attnviz.figures import."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    required = sorted(line for line in lines if line and not line.startswith("#"))
    assert sorted(project["dependencies"] + project["optional-dependencies"]["app"]) == required
    assert sorted(project["optional-dependencies"]["app"]) == ["choreographer==1.4.0", "kaleido==1.5.0",
                                                               "logistro==2.0.1", "orjson==3.13.0", "pillow==13.0.0",
                                                               "plotly==7.1.0", "streamlit==1.67.0",
                                                               "threadpoolctl==3.8.0"]
    assert project["scripts"] == {"attnviz": "attnviz.__main__:main"}


# -- capture by name --

@pytest.mark.slow
def test_capture_by_name_equals_output_attentions(smollm2, attention_of):
    cap = attnviz.capture("smollm2-135m", "The cat sat on the mat.")
    assert cap.store == "pattern" and cap.model_name == "smollm2-135m"
    reference = attention_of(smollm2.model, cap.token_ids)  # transformers' output_attentions, float64
    assert cap.pattern.shape == reference.shape == (30, 9, len(cap.tokens), len(cap.tokens))
    assert np.array_equal(cap.pattern.astype(np.float64), reference)
    attentions = cap.to_attentions()
    assert len(attentions) == 30 and all(a.shape == (1, 9, cap.n_tokens, cap.n_tokens) for a in attentions)
    assert np.array_equal(torch.cat(attentions).double().numpy(), reference)
    attentions[0].zero_()  # the tensors are the caller's: the capture (maybe shared by a cache) is untouched
    assert np.array_equal(cap.pattern.astype(np.float64), reference)
    with pytest.raises(attnviz.CaptureError, match="tokenizer= goes with a model object"):
        attnviz.capture("smollm2-135m", "The cat", tokenizer=smollm2.tokenizer)


# -- a model object handed in --

def _tiny(family: str):
    """A tiny random transformers model as a notebook would build it (default attention implementation, training
    mode), and an eager copy with the same weights for output_attentions."""
    from transformers import AutoModelForCausalLM, BloomConfig, LlamaConfig

    common = dict(vocab_size=257, bos_token_id=256, eos_token_id=256, pad_token_id=256, initializer_range=0.3)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, **common) if family == "llama" else \
        BloomConfig(hidden_size=32, n_layer=3, n_head=4, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    reference = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    reference.load_state_dict(model.state_dict())
    return model, reference


def _state(model, ids):
    """Everything a capture must leave as it was: every config's attention implementation, every module's
    training flag and hooks, and the logits."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return ([c._attn_implementation for c in configs.values()], [m.training for m in model.modules()],
            sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()), logits)


def _output_attentions(reference, cap) -> np.ndarray:
    with torch.no_grad():
        out = reference(input_ids=torch.tensor([cap.token_ids]), output_attentions=True)
    return np.stack([a[0].numpy() for a in out.attentions])


@pytest.mark.parametrize("family", ["llama", "bloom"])
def test_model_object_capture_equals_output_attentions_and_leaves_the_model_as_it_was(family):
    model, reference = _tiny(family)
    tokenizer = byte_tokenizer()
    ids = torch.tensor([tokenizer(TEXT).input_ids])
    before = _state(model, ids)
    assert before[0][0] == ("sdpa" if family == "llama" else "eager") and before[1][0]  # as built: training mode
    cap = attnviz.capture(model, TEXT, tokenizer=tokenizer)
    after = _state(model, ids)
    assert after[:3] == before[:3]
    assert torch.equal(after[3], before[3])
    assert cap.store == "pattern" and cap.tokens[:2] == ["<bos>", "a"]
    expected = _output_attentions(reference, cap)
    assert np.array_equal(cap.pattern, expected)
    assert cap.kv_head_of == ([0, 0, 1, 1] if family == "llama" else [0, 1, 2, 3])
    qk = attnviz.capture(model, TEXT, tokenizer=tokenizer, store="qk", layers=[-1])
    assert qk.store == "qk" and qk.layers == [2]
    # the qk store computes the weights from q and k itself: float32 products summed in another order
    np.testing.assert_allclose(qk.to_attentions()[0][0].numpy(), expected[2], rtol=0, atol=1e-5)
    after_qk = _state(model, ids)
    assert after_qk[:3] == before[:3] and torch.equal(after_qk[3], before[3])


def test_model_object_is_put_back_when_the_capture_fails_and_refused_without_its_tokenizer():
    model, _ = _tiny("llama")
    ids = torch.tensor([byte_tokenizer()(TEXT).input_ids])
    before = _state(model, ids)
    with pytest.raises(attnviz.CaptureError, match="Layer 7 does not exist"):
        attnviz.capture(model, TEXT, tokenizer=byte_tokenizer(), layers=[7])
    after = _state(model, ids)
    assert after[:3] == before[:3] and torch.equal(after[3], before[3])
    with pytest.raises(attnviz.CaptureError, match="needs its tokenizer"):
        attnviz.capture(model, TEXT)
    with pytest.raises(attnviz.CaptureError, match="model must be"):
        attnviz.capture(object(), TEXT, tokenizer=byte_tokenizer())


def test_store_auto_takes_the_qk_store_when_the_pattern_does_not_fit(monkeypatch):
    model, reference = _tiny("llama")
    n = len(byte_tokenizer()(TEXT).input_ids)
    monkeypatch.setattr("attnviz.capture.run.MAX_CAPTURE_BYTES", 3 * 4 * n * n * 4 - 1)  # one float32 weight short
    cap = attnviz.capture(model, TEXT, tokenizer=byte_tokenizer())
    assert cap.store == "qk" and cap.pattern is None
    expected = _output_attentions(reference, cap)
    got = np.stack([a[0].numpy() for a in cap.to_attentions()])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)  # computed from q and k, as above
    monkeypatch.setattr("attnviz.capture.run.MAX_CAPTURE_BYTES", 3 * 4 * n * n * 4)  # exactly fits
    assert attnviz.capture(model, TEXT, tokenizer=byte_tokenizer()).store == "pattern"


# -- from_attentions, stats, save --

def test_from_attentions_round_trips_patterns_and_statistics(tmp_path):
    model, reference = _tiny("llama")
    cap = attnviz.capture(model, TEXT, tokenizer=byte_tokenizer())
    with torch.no_grad():
        out = reference(input_ids=torch.tensor([cap.token_ids]), output_attentions=True)
    for made in (attnviz.from_attentions(out.attentions, cap.tokens),
                 attnviz.from_attentions(out.attentions, cap.tokens, token_ids=cap.token_ids),
                 attnviz.from_attentions(cap.to_attentions(), cap.tokens)):
        assert made.store == "pattern" and made.causal and made.layers == [0, 1, 2]
        assert np.array_equal(made.pattern, cap.pattern)
        columns = ["layer", "head", *COLUMNS]
        pd.testing.assert_frame_equal(made.stats()[columns], cap.stats()[columns])
    stats = cap.stats()
    assert len(stats) == 3 * 4 and not stats["induction"].isna().any()
    # two columns by hand, in float64, from transformers' own weights
    p = np.stack([a[0].double().numpy() for a in out.attentions])  # [layer, head, query, key]
    n = p.shape[-1]
    np.testing.assert_allclose(stats["prev_token"], p[..., np.arange(1, n), np.arange(n - 1)].mean(-1).ravel(),
                               rtol=1e-12)
    np.testing.assert_allclose(stats["sink_mass"], p[..., 1:, 0].mean(-1).ravel(), rtol=1e-12)
    cap.save(tmp_path / "capture.npz")
    back = load_capture(tmp_path / "capture.npz")
    assert np.array_equal(back.pattern, cap.pattern) and back.tokens == cap.tokens
    pd.testing.assert_frame_equal(back.stats(), stats)


def test_from_attentions_refuses_what_is_not_output_attentions():
    weights = torch.full((1, 2, 3, 3), 1 / 3)
    with pytest.raises(attnviz.CaptureError, match=r"\(2 tokens\); got \[1, 2, 3, 3\]"):
        attnviz.from_attentions([weights], ["a", "b"])
    with pytest.raises(attnviz.CaptureError, match=r"\(3 tokens\); got \[2, 2, 3, 3\]"):
        attnviz.from_attentions([torch.full((2, 2, 3, 3), 1 / 3)], ["a", "b", "c"])  # a batch of two
    with pytest.raises(attnviz.CaptureError, match="same heads"):
        attnviz.from_attentions([weights, torch.full((1, 3, 3, 3), 1 / 3)], ["a", "b", "c"])
    with pytest.raises(attnviz.CaptureError, match="No layers"):
        attnviz.from_attentions([], ["a"])
    assert not attnviz.from_attentions([weights], ["a", "b", "c"]).causal  # weight above the diagonal


# -- bertviz --

def _params(html: str) -> dict:
    """The parameters bertviz wrote into its page (json.dumps of them replaces its PYTHON_PARAMS marker)."""
    start = html.index('{"attention": ')
    return json.JSONDecoder().raw_decode(html, start)[0]


def test_bertviz_views_accept_to_attentions():
    from bertviz import head_view, model_view

    model, reference = _tiny("llama")
    cap = attnviz.capture(model, TEXT, tokenizer=byte_tokenizer())
    expected = _output_attentions(reference, cap)
    for view in (head_view, model_view):
        html = view(cap.to_attentions(), cap.tokens, html_action="return").data
        shown = _params(html)["attention"][0]
        assert shown["left_text"] == shown["right_text"] == cap.tokens
        np.testing.assert_allclose(np.asarray(shown["attn"]), expected, rtol=0, atol=1e-7)
