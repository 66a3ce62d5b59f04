"""The experiments' front door (attnviz.knockout, .patching, .logit_attribution, .qk_attribution, .attention_flow,
.rollout, .generate): a tiny model object handed in as a notebook holds it and the same toy named give the numbers
today's functions give on the loaded toy, bit for bit; the model object is left as it was (its logits, every
config's attention implementation, every module's training flag, no hook left behind); the frames' columns, the
decompositions adding up to the model's own output, the notebook views and the refusals."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz import flow as fl
from attnviz import generation as gen
from attnviz import knockout as ko
from attnviz import logit_attribution as la
from attnviz import patching as pt
from attnviz import qk_attribution as qk
from attnviz import rollout as ro
from attnviz.capture import capture_attention
from attnviz.front import ExperimentError
from attnviz.models import load_model
from attnviz.toys import TOY_SEED, toy_config
from attnviz.tokenizer import byte_tokenizer

NAME = "toy-llama-gqa"
TEXT = "The cat sat on the mat. The cat sat"
CLEAN, CORRUPTED = "When Mary and John left, John gave it to", "When Mary and John left, Mary gave it to"


def _notebook_model(name: str = NAME):
    """The toy `name` as a notebook builds it: transformers' default attention implementation, training mode, the
    toy's seeded weights."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TOY_SEED)
        return AutoModelForCausalLM.from_config(toy_config(name))


@pytest.fixture(scope="module")
def toy():
    return load_model(NAME)


@pytest.fixture(scope="module")
def held():
    """(model object, its state before any experiment)."""
    model = _notebook_model()
    return model, _state(model)


def _state(model):
    """Everything an experiment must leave as it was: every config's attention implementation, every module's
    training flag, the hooks, the logits."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    ids = torch.tensor([byte_tokenizer()(TEXT).input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return ([c._attn_implementation for c in configs.values()], [m.training for m in model.modules()],
            sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()), logits)


def _both(held, call):
    """call(model, tokenizer) with the name and with the model object; the object checked unchanged after."""
    model, before = held
    by_name = call(NAME, None)
    by_object = call(model, byte_tokenizer())
    after = _state(model)
    assert after[:3] == before[:3] and torch.equal(after[3], before[3])
    assert before[0][0] == "sdpa" and before[1][0]  # as built: the default implementation, training mode
    return by_name, by_object


def _renders(result) -> None:
    html = result._repr_html_()
    assert "attnviz-view" in html and "Plotly" in html


def test_the_model_object_is_the_named_toy():
    model, toy = _notebook_model(), load_model(NAME)
    for (name, a), (_, b) in zip(model.state_dict().items(), toy.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_experiments_are_exported_beside_capture():
    assert {"knockout", "patching", "logit_attribution", "qk_attribution", "attention_flow", "rollout",
            "generate"} <= set(attnviz.__all__)
    assert attnviz.knockout is ko and callable(ko) and ko.knockout_effects  # the module, callable
    assert attnviz.rollout.rollout is ro.rollout and attnviz.generate is attnviz.front.generate


def test_knockout(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.knockout(m, TEXT, layer=1, answer=" ", position=-2,
                                                                     tokenizer=tok))
    ids = toy.tokenizer(TEXT).input_ids
    rows = [((1, h),) for h in range(4)]
    direct = ko.knockout_effects(toy, ids, rows, target=(len(ids) - 2, ord(" ")))
    for got in (by_name, by_object):
        assert got.raw.rows == direct.rows and got.raw.target == direct.target
        assert np.array_equal(got.raw.loss, direct.loss) and got.raw.base_loss == direct.base_loss
        assert np.array_equal(got.raw.target_logprob, direct.target_logprob)
    frame = by_name.to_frame()
    assert list(frame.columns) == ["heads", "layer", "head", "loss", "delta_loss", "target_logprob", "delta_target"]
    assert frame["heads"].tolist() == ["L1H0", "L1H1", "L1H2", "L1H3"]
    np.testing.assert_array_equal(frame["delta_loss"], direct.loss - direct.base_loss)
    assert np.isnan(by_name.grid()[0]).all() and np.array_equal(by_name.grid()[1], frame["delta_loss"])
    _renders(by_name)
    together = attnviz.knockout(NAME, TEXT, heads=[(0, 1), (1, 2)], together=True, mode="mean")
    direct = ko.knockout_effects(toy, ids, [((0, 1), (1, 2))], mode="mean")
    assert np.array_equal(together.raw.loss, direct.loss)
    assert together.to_frame()["heads"].tolist() == ["L0H1 + L1H2"] and together.to_frame()["layer"].isna().all()
    _renders(together)


@pytest.mark.parametrize("method", ["activation", "attribution"])
def test_patching(toy, held, method):
    by_name, by_object = _both(held, lambda m, tok: attnviz.patching(m, CLEAN, CORRUPTED, answer="M", wrong="J",
                                                                     site="resid", method=method, tokenizer=tok))
    pair = pt.tokenize_pair(toy, pt.PromptPair("p", CLEAN, CORRUPTED, "M", "J"))
    if method == "activation":
        direct = pt.activation_patching(toy, pair, "resid")
        expected, values = direct.normalised, direct.values
    else:
        expected, values = pt.attribution_patching(toy, pair)["resid"], None
    for got in (by_name, by_object):
        assert got.pair == pt.TokenPair("pair", *[getattr(pair, f) for f in
                                                  ("clean_ids", "corrupted_ids", "answer", "wrong", "clean_tokens",
                                                   "corrupted_tokens")])
        assert np.array_equal(got.share, expected)
        assert values is None and got.values is None or np.array_equal(got.values, values)
    frame = by_name.to_frame()
    assert list(frame.columns) == ["method", "site", "layer", "position", "token", "share", "value"]
    assert len(frame) == 2 * pair.n and np.array_equal(frame["share"].to_numpy().reshape(2, -1), expected)
    _renders(by_name)


def test_patching_heads_on_gpt2():
    """The heads' site through GPT-2's Conv1D projection, by name against today's function."""
    got = attnviz.patching("toy-gpt2", CLEAN, CORRUPTED, answer="M", wrong="J")
    loaded = load_model("toy-gpt2")
    direct = pt.activation_patching(loaded, pt.tokenize_pair(loaded, pt.PromptPair("p", CLEAN, CORRUPTED, "M", "J")))
    assert np.array_equal(got.share, direct.normalised) and got.share.shape == (2, 4)
    assert list(got.to_frame().columns) == ["method", "site", "layer", "head", "share", "value"]


def test_logit_attribution_adds_up_to_the_model_s_own_logits(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.logit_attribution(m, TEXT, answer=" ", wrong=ord("m"),
                                                                              position=-3, tokenizer=tok))
    ids = toy.tokenizer(TEXT).input_ids
    direct = la.direct_logit_attribution(toy, ids, ord(" "), ord("m"), len(ids) - 3)
    for got in (by_name, by_object):
        assert np.array_equal(got.raw.heads, direct.heads) and np.array_equal(got.raw.mlp, direct.mlp)
        assert got.raw.embeddings == direct.embeddings and got.raw.final_bias == direct.final_bias
    frame = by_name.to_frame()
    assert list(frame.columns) == ["part", "kind", "layer", "head", "logits"]
    assert frame.loc[frame["kind"] == "head", ["layer", "head"]].astype(int).values.tolist() == \
        [[layer, head] for layer in range(2) for head in range(4)]
    # the parts add up to the logit difference of the model object's own forward pass (transformers' SDPA; the
    # toy's dropout is 0, so training mode computes what eval mode does)
    with torch.no_grad():
        logits = held[0](input_ids=torch.tensor([ids])).logits[0, len(ids) - 3].double()
    own = float(logits[ord(" ")] - logits[ord("m")])
    assert abs(frame["logits"].sum() - own) < 1e-5 * max(1.0, abs(own))
    _renders(by_name)


def test_qk_attribution_adds_up_to_the_score(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.qk_attribution(m, TEXT, layer=-1, head=3, query=-1,
                                                                           key=4, tokenizer=tok))
    ids = toy.tokenizer(TEXT).input_ids
    direct = qk.qk_attribution(toy, ids, 1, 3, len(ids) - 1, 4)
    for got in (by_name, by_object):
        assert np.array_equal(got.raw.terms, direct.terms) and got.raw.score == direct.score
        assert (got.raw.layer, got.raw.head, got.raw.query, got.raw.key) == (1, 3, len(ids) - 1, 4)
    frame = by_name.to_frame()
    assert list(frame.columns) == ["query_part", "key_part", "term"] and len(frame) == direct.terms.size
    assert abs(frame["term"].sum() - direct.score) < 1e-4 * max(1.0, float(np.abs(direct.terms).max()))
    _renders(by_name)


def test_attention_flow(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.attention_flow(m, TEXT, query=-2, layer=[0, 1],
                                                                           tokenizer=tok))
    ids = toy.tokenizer(TEXT).input_ids
    capture = capture_attention(toy, "", token_ids=ids)
    direct = fl.attention_flow(capture, len(ids) - 2)
    rollout = ro.capture_rollout(capture)[:, len(ids) - 2]
    for got in (by_name, by_object):
        assert np.array_equal(got.flow, direct) and np.array_equal(got.rollout, rollout)
    assert (rollout <= direct + 1e-8).all()  # rollout's path products are a feasible flow
    frame = by_name.to_frame()
    assert list(frame.columns) == ["layer", "position", "token", "flow", "share", "rollout"]
    assert len(frame) == 2 * len(ids)
    _renders(by_name)


def test_rollout_against_transformers_attentions(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.rollout(m, TEXT, tokenizer=tok))
    ids = toy.tokenizer(TEXT).input_ids
    direct = ro.capture_rollout(capture_attention(toy, "", token_ids=ids))
    for got in (by_name, by_object):
        assert np.array_equal(got.rollout, direct)
    # against the paper's formula on transformers' own output_attentions, in float64
    with torch.no_grad():
        out = toy.model(input_ids=torch.tensor([ids]), output_attentions=True)
    joint = None
    for a in out.attentions:
        m = 0.5 * a[0].double().mean(0).numpy() + 0.5 * np.eye(len(ids))
        m /= m.sum(-1, keepdims=True)
        joint = m if joint is None else m @ joint
    np.testing.assert_allclose(by_name.rollout[-1], joint, rtol=0, atol=1e-6)
    frame = by_name.to_frame()
    assert list(frame.columns) == ["layer", "query", "key", "share"] and len(frame) == 2 * len(ids) ** 2
    assert np.allclose(frame.groupby(["layer", "query"])["share"].sum(), 1.0)
    assert attnviz.rollout(NAME, TEXT, layer=0).rollout.shape == (1, len(ids), len(ids))
    _renders(by_name)


def test_generate(toy, held):
    by_name, by_object = _both(held, lambda m, tok: attnviz.generate(m, TEXT, max_new_tokens=4, temperature=0.7,
                                                                     seed=3, tokenizer=tok))
    direct = gen.generate(toy, TEXT, 4, temperature=0.7, seed=3)
    for got in (by_name, by_object):
        assert got.raw.token_ids == direct.token_ids and len(got.raw.steps) == len(direct.steps) == 4
        for a, b in zip(got.raw.steps, direct.steps):
            assert np.array_equal(a.rows, b.rows) and np.array_equal(a.top_probs, b.top_probs)
    ids = toy.tokenizer(TEXT).input_ids
    assert attnviz.generate(NAME, ids, max_new_tokens=4, temperature=0.7, seed=3).raw.token_ids == direct.token_ids
    frame = by_name.to_frame()
    assert list(frame.columns) == ["step", "position", "token_id", "token", "prob", "cache_tokens", "cache_bytes"]
    assert frame["token_id"].tolist() == direct.token_ids[len(ids):]
    _renders(by_name)


def test_token_ids_give_what_the_text_gives(toy):
    ids = toy.tokenizer(TEXT).input_ids
    a = attnviz.knockout(NAME, TEXT, layer=0, head=[1, 2])
    b = attnviz.knockout(NAME, ids, layer=0, head=[1, 2])
    assert a.raw.rows == b.raw.rows == [((0, 1),), ((0, 2),)]
    assert np.array_equal(a.raw.loss, b.raw.loss)


def test_save_writes_the_frame_and_the_page(tmp_path):
    result = attnviz.knockout(NAME, TEXT, layer=1)
    [csv] = result.save(tmp_path / "knockouts.csv")
    pd.testing.assert_frame_equal(pd.read_csv(csv), result.to_frame(), check_dtype=False)
    [page] = result.save(tmp_path / "knockouts.html")
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_refusals_say_what_to_change(held):
    model, before = held
    with pytest.raises(ExperimentError, match=r"'ab' is 2 tokens .*give one token"):
        attnviz.knockout(NAME, TEXT, answer="ab")
    with pytest.raises(ExperimentError, match="Layer 2 does not exist: toy-llama-gqa has layers 0 to 1"):
        attnviz.qk_attribution(NAME, TEXT, layer=2, head=0)
    with pytest.raises(ExperimentError, match="Head 4 does not exist"):
        attnviz.knockout(NAME, TEXT, head=4)
    with pytest.raises(ExperimentError, match="Key position 99 is outside the text"):
        attnviz.qk_attribution(NAME, TEXT, layer=0, head=0, key=99)
    with pytest.raises(ExperimentError, match="Token id 300 is outside the vocabulary"):
        attnviz.logit_attribution(NAME, TEXT, answer=300, wrong=1)
    with pytest.raises(ExperimentError, match="the corrupted one"):
        attnviz.patching(NAME, CLEAN, CORRUPTED + "!", answer="M", wrong="J")
    with pytest.raises(ExperimentError, match="Unknown method"):
        attnviz.patching(NAME, CLEAN, CORRUPTED, answer="M", wrong="J", method="causal")
    with pytest.raises(ExperimentError, match=r"needs its tokenizer: attnviz.rollout\(model"):
        attnviz.rollout(model, TEXT)
    with pytest.raises(ExperimentError, match="tokenizer= goes with a model object"):
        attnviz.rollout(NAME, TEXT, tokenizer=byte_tokenizer())
    with pytest.raises(ExperimentError, match="attention flow through layers"):
        attnviz.attention_flow(NAME, "x" * 300, layer=None)  # 301 tokens, past 275 through both layers
    with pytest.raises(attnviz.AttnvizError):  # a refusal inside a model object's experiment puts it back too
        attnviz.qk_attribution(model, TEXT, layer=0, head=9, tokenizer=byte_tokenizer())
    after = _state(model)
    assert after[:3] == before[:3] and torch.equal(after[3], before[3])


def test_an_encoder_is_refused_with_the_experiment_named_and_put_back():
    from transformers import AutoModel, BertConfig

    torch.manual_seed(0)
    model = AutoModel.from_config(BertConfig(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=64))
    implementation = model.config._attn_implementation
    with pytest.raises(ExperimentError, match="is an encoder: it predicts no next token, so direct logit attribution"):
        attnviz.logit_attribution(model, TEXT, answer="a", wrong="b", tokenizer=byte_tokenizer())
    assert model.config._attn_implementation == implementation and model.training
    # rollout needs no next token: an encoder's rollout, against the formula on its own output_attentions
    got = attnviz.rollout(model, TEXT, tokenizer=byte_tokenizer())
    ids = byte_tokenizer()(TEXT).input_ids
    eager = AutoModel.from_config(copy.deepcopy(model.config), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        a = eager(input_ids=torch.tensor([ids]), output_attentions=True).attentions[0][0].double().mean(0).numpy()
    m = 0.5 * a + 0.5 * np.eye(len(ids))
    np.testing.assert_allclose(got.rollout[0], m / m.sum(-1, keepdims=True), rtol=0, atol=1e-6)
    assert model.config._attn_implementation == implementation and model.training


def test_reaching_the_front_door_imports_neither_plotly_nor_streamlit():
    """The experiments compute without the app's drawing libraries; the views import plotly when drawn."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, attnviz\n"
            "[getattr(attnviz, n) for n in ('knockout', 'patching', 'logit_attribution', 'qk_attribution', "
            "'attention_flow', 'rollout', 'generate')]\n"
            "print(sorted(m for m in ('plotly', 'streamlit') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "[]"


def test_the_doors_are_opened_from_above():
    """A module never imports its front door (attnviz.doors): importing attnviz.knockout or a capture module alone
    loads neither attnviz.front nor the models; attnviz hands each out open, however it was imported first; and
    AttentionCapture has the methods its package sets (attnviz.capture.methods) whichever capture module came first."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import importlib, sys\n"
            "store = importlib.import_module('attnviz.capture.store')\n"
            "ko = importlib.import_module('attnviz.knockout')\n"
            "doors = ('attnviz.front', 'attnviz.capture.front', 'attnviz.models')\n"
            "alone = sorted(m for m in doors if m in sys.modules)\n"
            "methods = all(hasattr(store.AttentionCapture, m) for m in ('stats', 'save', 'by_words', 'head_view'))\n"
            "import attnviz\n"
            "print(alone, methods, callable(attnviz.knockout), attnviz.knockout is ko, callable(attnviz.capture),\n"
            "      callable(sys.modules['attnviz.rollout']))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[] True True True True True"
