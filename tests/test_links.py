"""attnviz.ui.links: one link mechanism for every page. Each kind of value is parsed, clamped or replaced with one
warning, on a small page of its own (expected values worked out by hand); then the Heads and Experiments pages
treat the same odd link the same way: an unregistered model waits for the visitor, a negative head is clamped with
a warning, a long text is cut with a warning, and nothing long is echoed back."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui.links import shown

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"heads": str(ROOT / "app_pages" / "heads.py"), "experiments": str(ROOT / "app_pages" / "experiments.py")}
MODEL_KEY = {"heads": "heads_model", "experiments": "exp_model"}
TIMEOUT_S = 120


def _table_page():
    """A page with one link key of every kind; it writes its view back and lists what the session holds."""
    import streamlit as st

    from attnviz.ui import links

    link = links.Link("t_", {
        "n": links.Param("t_n", "int", lo=1, hi=64),
        "i": links.Param("t_i", "int", "head"),
        "f": links.Param("t_f", "float", "temperature", lo=0.0, hi=2.0, step=0.1),
        "c": links.Param("t_c", "choice", choices={"a": "A", "b": "B"}, also=("t_c_too",)),
        "r": links.Param("t_r", "range", "layer"),
        "x": links.Param("t_x", "text", "text"),
    })
    links.read(link)
    links.check_asked(link, "t_i", range(4))  # "the model" has heads 0-3 and layers 0-9
    links.check_asked(link, "t_r", range(10))
    keys = ("t_n", "t_i", "t_f", "t_c", "t_c_too", "t_r", "t_x")
    st.session_state["t_seen"] = {k: st.session_state[k] for k in keys if k in st.session_state}
    view = {"n": st.session_state.get("t_n", 1)}
    links.write(link, view)


def _run_table(query: dict) -> AppTest:
    at = AppTest.from_function(_table_page, default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize("query, expected, warned", [
    ({"n": "7"}, {"t_n": 7}, None),
    ({"n": "100"}, {"t_n": 64}, "at most 64"),
    ({"n": "0"}, {"t_n": 1}, "at least 1"),
    ({"n": "-5"}, {"t_n": 1}, "at least 1"),
    ({"n": "1" + "0" * 30}, {"t_n": 64}, "at most 64"),
    ({"n": "9" * 5000}, {"t_n": 64}, "(5,000 characters)"),  # int() of 4,300+ digits raises: never called
    ({"n": ""}, {}, "is empty"),
    ({"n": "7.0"}, {}, "not a whole number"),
    ({"n": "٣"}, {}, "not a whole number"),  # an Arabic-Indic 3: int() takes it, a link does not
    ({"i": "2"}, {"t_i": 2}, None),
    ({"i": "-1"}, {"t_i": 0}, "heads are numbered from 0, showing head 0"),
    ({"i": "9"}, {"t_i": 3}, "no head 9 (heads 0–3), showing 3"),
    ({"i": "1" + "0" * 30}, {"t_i": 3}, "no such head (heads 0–3), showing 3"),
    ({"f": "1.5"}, {"t_f": 1.5}, None),
    ({"f": "0.27"}, {"t_f": 0.3}, "steps of 0.1, showing 0.3"),
    ({"f": "5"}, {"t_f": 2.0}, "at most 2"),
    ({"f": "-1"}, {"t_f": 0.0}, "at least 0"),
    ({"f": "nan"}, {}, "not a number"),
    ({"f": "1e400"}, {}, "not a number"),
    ({"c": "b"}, {"t_c": "B", "t_c_too": "B"}, None),
    ({"c": "z"}, {}, "not one of a, b"),
    ({"r": "3-5"}, {"t_r": (3, 5)}, None),
    ({"r": "2-99"}, {"t_r": (2, 9)}, "layers 0–9, showing 2–9"),
    ({"r": "5-3"}, {}, "not a range of layers"),
    ({"r": "-1-3"}, {}, "not a range of layers"),
    ({"x": "abc"}, {"t_x": "abc"}, None),
    ({"x": "y" * 180_000}, {"t_x": "y" * 170_000}, "180,000 characters, over the 170,000"),
    ({"n": ["3", "5"]}, {"t_n": 5}, "gives `n` 2 times"),
    ({"zz": "1", "Model": "x"}, {}, None),  # keys the page does not read: quietly ignored
])
def test_each_kind_of_link_value_is_taken_clamped_or_replaced_with_one_warning(query, expected, warned):
    at = _run_table(query)
    assert at.session_state["t_seen"] == expected
    warnings = [w.value for w in at.warning]
    if warned is None:
        assert not warnings
    else:
        assert len(warnings) == 1 and warned in warnings[0], warnings
        assert len(warnings[0]) < 300


def test_the_view_is_written_back_only_when_it_changed_and_a_rerun_keeps_the_visitors_choice():
    at = _run_table({"n": "5", "utm": "x"})
    assert at.query_params == {"n": "5", "utm": "x"}, "the view equals the link: the URL is left alone"
    at = _run_table({"n": "100", "utm": "x"})
    assert at.query_params == {"n": "64"}, "the view changed: the URL is the view"
    at.session_state["t_n"] = 9  # the visitor's own choice, then a rerun with the page's own link
    at.run()
    assert at.session_state["t_n"] == 9 and not at.warning and at.query_params == {"n": "9"}
    at.query_params.clear()
    at.query_params["n"] = "3"  # a new link in the same session is applied
    at.run()
    assert at.session_state["t_n"] == 3


def test_a_links_value_is_shown_short_quoted_and_without_control_characters():
    assert shown("head", "-1") == "`head=-1`"
    assert shown("text") == "`text`"
    long = shown("model", "a" * 100_000)
    assert len(long) < 80 and long.endswith("(100,000 characters)")
    odd = shown("model", "/x\x00y\n`**b**`")
    assert "\x00" not in odd and "\n" not in odd and odd.count("`") == 2 and "'**b**'" in odd


def _page(name: str, query: dict, *, view: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGES[name], default_timeout=TIMEOUT_S)
    at.session_state[MODEL_KEY[name]] = "toy-gpt2"  # a link without a registered model leaves the toy chosen
    if view:
        at.session_state["exp_view"] = view
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize("model", ["../../etc", "/etc", "no-such-model", " lab/../x "])
def test_an_unregistered_model_from_a_link_waits_for_the_visitor_alike_on_both_pages(model, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))  # a server that opens folders under one root
    said = {}
    for name in PAGES:
        at = _page(name, {"model": model})
        assert at.text_input(key=f"{MODEL_KEY[name]}_custom").value == model.strip()
        assert not at.error and not at.get("plotly_chart"), f"{name} loaded {model!r} before the visitor confirmed"
        said[name] = [w.value for w in at.warning]
        assert len(said[name]) == 1 and "Load it" in said[name][0]
        at.button(key=f"{MODEL_KEY[name][:-5]}link_model_confirm").click().run()
        assert not at.exception and at.error, f"{name}: the confirmed name is tried, and the page says why it fails"
    assert said["heads"] == said["experiments"]


@pytest.mark.parametrize("model", ["../../etc", "/etc", "no-such-model"])
def test_a_server_that_opens_no_folders_ignores_a_links_unregistered_model_with_a_warning(model, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    for name in PAGES:
        at = _page(name, {"model": model}, view="Rollout")
        warnings = [w.value for w in at.warning]
        assert len(warnings) == 1 and "opens no folders of models: ignored" in warnings[0], warnings
        assert at.selectbox(key=MODEL_KEY[name]).value == "toy-gpt2" and at.get("plotly_chart")


def test_a_100_kb_model_name_is_never_echoed_back_and_the_page_keeps_its_model():
    for name in PAGES:
        at = _page(name, {"model": "../" * 34_000}, view="Rollout")
        warnings = [w.value for w in at.warning]
        assert len(warnings) == 1 and "102,000 characters, too long" in warnings[0] and len(warnings[0]) < 200
        assert at.selectbox(key=MODEL_KEY[name]).value == "toy-gpt2"
        assert f"{MODEL_KEY[name]}_custom" not in at.session_state
        assert at.get("plotly_chart"), f"{name} drew nothing on its own model"


def test_a_negative_head_is_clamped_with_a_warning_alike_on_both_pages():
    for name in PAGES:
        at = _page(name, {"head": "-1", "layer": "999"}, view="Norm-based attention")
        warnings = " ".join(w.value for w in at.warning)
        assert "`head=-1`: heads are numbered from 0, showing head 0" in warnings, warnings
        assert "`layer=999`: this model has no layer 999 (layers 0–1), showing 1" in warnings, warnings
        key = {"heads": "heads_", "experiments": "exp_"}[name]
        assert at.selectbox(key=f"{key}head").value == 0 and at.selectbox(key=f"{key}layer").value == 1
        assert len(at.warning) == 2


def test_a_text_over_the_limit_is_cut_with_a_warning_alike_on_both_pages():
    from attnviz import ui

    text = "The cat sat on the mat. " * 7_500  # 180,000 characters
    for name in PAGES:  # a model that waits for the visitor: the page reads the link and runs nothing on the text
        at = _page(name, {"text": text, "model": "no-such-model"}, view="Rollout")
        key = {"heads": "heads_text", "experiments": "exp_text"}[name]
        assert at.text_area(key=key).value == text[:ui.MAX_TEXT_CHARS]
        assert any("`text` is 180,000 characters, over the 170,000" in w.value for w in at.warning)


def test_a_query_token_past_the_text_is_clamped_with_a_warning():
    at = _page("heads", {"text": "abcdef", "query": "40", "tab": "token"})
    n = len(at.selectbox(key="heads_query").options)
    assert at.selectbox(key="heads_query").value == n - 1
    assert any(f"`query=40`: this text has no token 40 (tokens 0–{n - 1}), showing {n - 1}" in w.value
               for w in at.warning)


def test_a_repeated_unregistered_model_is_one_warning_and_the_button_goes_once_pressed(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    at = _page("experiments", {"model": ["toy-gpt2", "../../etc"]})
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "gives `model` 2 times" in warnings[0] and "Load it" in warnings[0], warnings
    at.button(key="exp_link_model_confirm").click().run()
    assert not at.exception and not at.warning and at.error
    assert not any(b.key == "exp_link_model_confirm" for b in at.button)


@pytest.mark.parametrize("tab", ["token", "Where a token looks", "where a TOKEN looks"])
def test_a_tab_is_named_by_its_code_or_by_what_the_page_shows(tab):
    at = _page("heads", {"text": "abcdef", "tab": tab})
    assert at.session_state["heads_tab"] == "Where a token looks" and not at.warning


@pytest.mark.slow
def test_switching_models_resets_the_layer_range_without_a_link_warning():
    # SmolLM2's slider left layers 0-29; Gemma 3 has 18: no link asked for anything, so nothing is said
    at = AppTest.from_file(PAGES["heads"], default_timeout=TIMEOUT_S)
    at.session_state["heads_model"] = "gemma3-270m"
    at.session_state["heads_text"] = "The cat sat on the mat."
    at.session_state["heads_layer_range"] = (0, 29)
    at.session_state["heads_layer_range_for"] = "smollm2-135m"
    at.run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.slider(key="heads_layer_range").value == (0, 17)


@pytest.mark.parametrize("name", ["heads", "experiments"])
def test_a_refused_other_path_takes_the_last_model_out_of_the_url(name, tmp_path, monkeypatch):
    from attnviz.ui import CUSTOM_MODEL

    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    key = {"heads": "heads_model", "experiments": "exp_model"}[name]
    at = _page(name, {"model": "toy-gpt2", "text": "abc"})
    assert at.query_params["model"] == ["toy-gpt2"] or at.query_params["model"] == "toy-gpt2"
    at.session_state[key] = CUSTOM_MODEL
    at.session_state[f"{key}_custom"] = "/etc"  # outside the server's model folders: refused
    at.run()
    assert not at.exception and at.error
    assert "model" not in at.query_params
