"""The Sinks page's link: ?model=, ?text=, and the one-head view's layer, head and Hide the sinks in the URL, read
as every other page reads its link (attnviz.ui.links: odd values clamped or ignored with one warning) and written
back as the view changes."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TEXT = "Four score and seven years ago our fathers brought forth a new nation."


def sinks_page(query: dict, model: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    if model:
        at.session_state["sinks_model"] = model
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page("app_pages/sinks.py").run()
    assert not at.exception, at.exception
    return at


def _param(at: AppTest, key: str):
    value = at.query_params.get(key)
    return value[-1] if isinstance(value, list) else value


def test_a_link_reproduces_the_model_text_and_one_head_view_and_the_url_follows_the_view():
    at = sinks_page({"model": "toy-llama-gqa", "text": TEXT, "layer": "1", "head": "3", "sink": "1"})
    assert at.selectbox(key="sinks_model").value == "toy-llama-gqa"
    assert at.text_area(key="sinks_text").value == TEXT
    assert at.selectbox(key="sinks_layer").value == 1 and at.selectbox(key="sinks_head").value == 3
    assert at.toggle(key="sinks_hide").value is True
    assert not at.warning
    at.selectbox(key="sinks_head").set_value(2).run()
    assert not at.exception
    assert (_param(at, "model"), _param(at, "text"), _param(at, "layer"), _param(at, "head"), _param(at, "sink")) \
        == ("toy-llama-gqa", TEXT, "1", "2", "1")


def test_a_head_past_the_model_is_clamped_and_an_odd_value_ignored_each_with_a_warning():
    at = sinks_page({"model": "toy-gpt2", "text": TEXT, "layer": "9", "head": "-1", "sink": "maybe"})
    warnings = " ".join(w.value for w in at.warning)
    assert "`layer=9`" in warnings and "`head=-1`" in warnings and "`sink=maybe`" in warnings
    assert at.selectbox(key="sinks_layer").value == 1  # toy-gpt2 has layers 0-1
    assert at.selectbox(key="sinks_head").value == 0
    assert at.toggle(key="sinks_hide").value is False


def test_a_link_without_a_model_keeps_the_visitors_and_a_text_over_a_links_limit_stays_out_of_it():
    long_text = "word " * 400  # 2,000 characters: over the 1,500 a link holds
    at = sinks_page({"text": long_text}, model="toy-gpt2")
    assert at.selectbox(key="sinks_model").value == "toy-gpt2"
    assert at.text_area(key="sinks_text").value == long_text
    assert _param(at, "model") == "toy-gpt2" and _param(at, "text") is None
