"""The Experiments page: every view runs and draws on a toy model, bad input gets a message, an encoder is told
what it cannot do, the link keeps the view (a layer the model does not have is clamped with a warning), and a number
on screen equals an independent computation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.knockout import output_projection
from attnviz.models import load_model

PAGE = str(Path(__file__).resolve().parent.parent / "app_pages" / "experiments.py")


def _page(**query) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def _charts(at) -> int:
    return len(at.get("plotly_chart"))


def _values(data):
    """A plotly array from a chart's JSON: a list, or a typed array (base64 of the values and their shape)."""
    import base64

    import numpy as np

    if isinstance(data, dict):
        values = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"])
        return values.reshape([int(x) for x in data["shape"].split(",")]) if "shape" in data else values
    return np.array(data, dtype=float)


@pytest.mark.parametrize("view", ["Generation", "Knock-outs", "Rollout", "Norm-based attention"])
def test_every_view_draws_on_a_toy_model(view):
    at = _page(view=view, model="toy-llama-gqa")
    assert at.radio(key="exp_view").value == view
    assert _charts(at) >= 2 and not at.error, [e.value for e in at.error]
    assert at.get("download_button"), "every view exports its numbers"
    assert at.query_params["view"] == [view] or at.query_params["view"] == view


def test_generation_rows_slider_and_bad_counts():
    at = _page(model="toy-gpt2", new="6")
    options = at.select_slider(key="exp_step").options
    assert len(options) == 6 and all(o.startswith(f"{i}: ") for i, o in enumerate(options))
    at.select_slider(key="exp_step").set_value(3).run()
    assert not at.exception and at.query_params["step"] in ("3", ["3"])
    for bad in (0, 10_000):
        at.number_input(key="exp_new").set_value(bad).run()
        assert not at.exception
        assert any("between 1 and 64" in e.value for e in at.error)
    at.number_input(key="exp_new").set_value(4).run()
    at.text_area(key="exp_prompt").set_value("   ").run()
    assert any("empty" in e.value for e in at.error)


def test_an_encoder_is_told_it_cannot_generate_or_knock_out_but_gets_rollout():
    at = _page(model="minilm-l6", view="Generation")
    assert any("encoder" in w.value for w in at.warning)
    at.radio(key="exp_view").set_value("Knock-outs").run()
    assert any("encoder" in w.value for w in at.warning)
    at.radio(key="exp_view").set_value("Rollout").run()
    assert not at.exception and _charts(at) == 3  # rollout beside the raw layer, every query's rollout, and flow
    assert at.selectbox(key="exp_layer").value == 5  # through the last of MiniLM's 6 layers by default


def test_a_link_to_a_layer_or_head_the_model_does_not_have_is_clamped_with_a_warning():
    at = _page(model="toy-gpt2", view="Norm-based attention", layer="99", head="7")
    warnings = " ".join(w.value for w in at.warning)
    assert "layer 99" in warnings and "head 7" in warnings
    assert at.selectbox(key="exp_layer").value in (0, 1) and at.selectbox(key="exp_head").value in range(4)
    assert _charts(at) == 2


def test_knockout_set_and_bad_target():
    at = _page(model="toy-gpt2", view="Knock-outs")
    n = len(load_model("toy-gpt2").tokenizer(at.text_area(key="exp_text").value).input_ids)
    assert at.selectbox(key="exp_query").value == n - 2  # the last position that has a next token
    at.radio(key="exp_ko_which").set_value("A chosen set of heads together").run()
    at.multiselect(key="exp_ko_set").set_value([]).run()
    assert any("at least one head" in w.value for w in at.warning)
    at.multiselect(key="exp_ko_set").set_value(["L1H2"]).run()
    assert len(at.metric) == 2
    at.text_input(key="exp_ko_target").set_value("a long target of many tokens").run()
    assert any("must be one token" in e.value for e in at.error)
    at.text_area(key="exp_text").set_value("").run()
    assert any("empty" in w.value for w in at.warning)


def test_knockout_number_on_screen_equals_the_edited_copy():
    at = _page(model="toy-gpt2", view="Knock-outs")
    table = at.dataframe[0].value
    row = table[table["heads"] == "L1H2"].iloc[0]
    loaded = load_model("toy-gpt2")
    ids = torch.tensor([loaded.tokenizer(at.text_area(key="exp_text").value).input_ids])
    model = copy.deepcopy(loaded.model)
    proj = output_projection(model, 1)
    with torch.no_grad():
        proj.weight[2 * 16:3 * 16, :] = 0  # GPT-2's Conv1D: the head's input rows
        base = loaded.model(input_ids=ids).logits[0].double()
        knocked = model(input_ids=ids).logits[0].double()
    ce = torch.nn.functional.cross_entropy
    expected = float(ce(knocked[:-1], ids[0, 1:]) - ce(base[:-1], ids[0, 1:]))
    assert row["delta_loss_nats"] == pytest.approx(expected, abs=1e-5)


def test_a_stopped_generation_shows_what_it_made_until_run_again():
    from attnviz.generation import generate

    prompt = "Stop me here"
    partial = generate(load_model("toy-gpt2"), prompt, 3, stop_at_eos=False)
    key = ("toy-gpt2", (), prompt, 8, 0.0, 0)  # what the Stop button leaves behind (toy models' version is ())
    at = _page(model="toy-gpt2", new="8")
    at.session_state["exp_gen_stopped"] = key
    at.session_state["exp_gen_partial"] = (key, partial)
    at.text_area(key="exp_prompt").set_value(prompt).run()
    assert not at.exception
    assert any("Stopped after 3 of 8 tokens" in i.value for i in at.info)
    assert _charts(at) >= 2 and at.button(key="exp_gen_again")
    at.button(key="exp_gen_again").click().run()
    assert not at.exception and not any("Stopped" in i.value for i in at.info)
    assert len(at.select_slider(key="exp_step").options) == 8  # generated in full this time


@pytest.mark.slow
def test_patching_view_on_smollm2_shows_the_librarys_grids_and_a_sum_that_adds_up():
    """The factual pair on SmolLM2 by link: the attribution grid is attnviz.patching's, real patching runs on the
    button and its grid is activation_patching's (which the library tests hold to a hand-patched copy), and the
    logit attribution's parts add up to the model's own difference, as the page says."""
    import json

    import numpy as np

    from attnviz import patching
    from attnviz.logit_attribution import pair_attribution

    at = _page(view="Patching", model="smollm2-135m", pair="factual", site="heads", metric="logit_diff")
    assert not at.error, [e.value for e in at.error]
    if any(b.key == "exp_patch_run" for b in at.button):  # a bigger pair waits for the button
        at.button(key="exp_patch_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    loaded = load_model("smollm2-135m")
    pair = patching.ready_pair(loaded, "factual")
    charts = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec) for c in
              at.get("plotly_chart")}

    def grid(prefix):
        return _values(next(spec for title, spec in charts.items() if title.startswith(prefix))["data"][0]["z"])

    np.testing.assert_allclose(grid("Attribution patching"), patching.attribution_patching(loaded, pair)["heads"],
                               atol=1e-9)
    np.testing.assert_allclose(grid("Activation patching"), patching.activation_patching(loaded, pair).normalised,
                               atol=1e-9)
    parts = pair_attribution(loaded, pair)
    assert any(f"The sum of every part is {parts.total:+.4f}; the model's own logit difference is "
               f"{parts.logit_diff:+.4f}" in c.value for c in at.caption)
    data = [b.proto.label for b in at.get("download_button") if not b.proto.label.startswith(("SVG", "PDF", "PNG"))]
    assert at.query_params["pair"] in ("factual", ["factual"]) and data == ["Patching grids (.npz)",
                                                                           "Logit attribution (.csv)"], data


def test_patching_view_says_what_to_change_for_a_pair_it_cannot_use():
    at = _page(view="Patching", model="toy-gpt2")  # a byte tokenizer: " Mary" and " John" start with one byte
    assert any("do not start with different tokens" in e.value for e in at.error)
    at = _page(view="Patching", model="minilm-l6")
    assert any("encoder" in w.value for w in at.warning)


@pytest.mark.slow
def test_qk_attribution_view_shows_the_score_and_its_parts_sum():
    """SmolLM2, layer 15 head 2, the last query and key 0: the score on screen is attnviz.qk_attribution's, which
    the library tests hold to the captured score and to float64; the sum of the terms shown equals it."""
    from attnviz.qk_attribution import qk_attribution

    text = "The cat sat on the mat. The cat sat on the mat."
    at = _page(view="QK attribution", model="smollm2-135m", text=text, layer="15", head="2", key="0")
    assert not at.error, [e.value for e in at.error]
    parts = qk_attribution(load_model("smollm2-135m"), text, 15, 2, -1, 0)
    shown = [m.value for m in at.metric]
    assert shown == [f"{parts.score:+.4f}", f"{parts.total:+.4f}"] and shown[0] == shown[1]
    assert _charts(at) == 3 and at.query_params["key"] in ("0", ["0"])


def test_attention_flow_beside_rollout_on_a_short_text():
    """toy-llama-gqa on 12 tokens: the flow bars are attnviz.flow's (held to hand-solved graphs in its tests), each
    row's share, next to the rollout row."""
    import json

    import numpy as np

    from attnviz.capture import capture_attention
    from attnviz.flow import attention_flow, normalised

    text = "one two three"
    at = _page(view="Rollout", model="toy-llama-gqa", text=text)
    assert not at.error, [e.value for e in at.error]
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "attention flow" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    cap = capture_attention(load_model("toy-llama-gqa"), text)
    want = normalised(attention_flow(cap, cap.n_tokens - 1))[cap.layers[-1]]
    np.testing.assert_allclose(_values(spec["data"][1]["y"]), want, atol=1e-9)


def test_the_flows_next_to_the_one_shown_are_built_ahead_and_then_shown_without_a_second_solve(monkeypatch):
    """After a flow is drawn, the background builds ask for the query one either way and the other layer; built,
    a move to one of them solves no max-flow."""
    from attnviz import flow, ui

    asked = []
    monkeypatch.setattr(ui, "build_in_background", lambda fn, calls, name: asked.append((fn, calls)) or True)
    at = _page(view="Rollout", model="toy-llama-gqa", text="one two three four")
    assert not at.error, [e.value for e in at.error]
    fn, calls = asked[-1]
    n, layers = len(at.selectbox(key="exp_query").options), at.selectbox(key="exp_layer").options
    last = int(layers[-1])
    assert [c[3:5] for c in calls] == [(n - 2, last), (n - 1, int(layers[-2]))]  # no query after the last
    for call in calls:
        fn(*call)  # as the background thread would
    solved = []
    real = flow.attention_flow
    monkeypatch.setattr(flow, "attention_flow", lambda *a, **k: solved.append(a[1]) or real(*a, **k))
    at.selectbox(key="exp_query").set_value(n - 2).run()
    at.selectbox(key="exp_query").set_value(n - 1).run()
    at.selectbox(key="exp_layer").set_value(int(layers[-2])).run()
    assert not at.exception and not at.error and solved == []


def test_only_flows_cheaper_than_a_quarter_of_the_pages_limit_are_built_ahead(monkeypatch):
    from types import SimpleNamespace

    from attnviz import ui
    from attnviz.flow import FLOW_WORK
    from attnviz.ui import experiments as cache

    asked = []
    monkeypatch.setattr(ui, "build_in_background", lambda fn, calls, name: asked.append(calls) or True)
    monkeypatch.setattr(ui, "model_version", lambda name: ("v",))
    n = 190  # through layer 1 (2 x 190^3) under FLOW_WORK / 4, through layer 2 (3 x 190^3) over it
    assert 2 * n**3 <= FLOW_WORK / 4 < 3 * n**3
    cache.prefetch_flows("m", "t", SimpleNamespace(n_tokens=n, layers=[0, 1, 2]), 5, 1)
    assert [c[3:5] for c in asked[-1]] == [(6, 1), (4, 1), (5, 0)]
    cache.prefetch_flows("m", "t", SimpleNamespace(n_tokens=n, layers=[0, 1, 2]), 5, 2)
    assert [c[3:5] for c in asked[-1]] == [(5, 1)]  # layer 2 itself is over: only its cheaper neighbour


def test_your_own_pair_is_read_from_the_link_and_refused_with_a_reason():
    """A link carries your own pair; prompts of different token lengths get tokenize_pair's message, no traceback."""
    at = _page(view="Patching", model="smollm2-135m", pair="yours", clean="The cat sat on the mat and",
               corrupted="A dog", answer=" slept", wrong=" ran")
    assert at.text_input(key="exp_pair_corrupted").value == "A dog"
    assert any("token" in e.value and "length" in e.value.lower() for e in at.error), [e.value for e in at.error]
    assert at.query_params["corrupted"] in ("A dog", ["A dog"])
