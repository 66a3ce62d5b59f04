"""The Sinks page at the edges of its one text limit: an empty text, a text past the model's context, and a long
text within it (past the dense store), every button pressed. No exception box, a message where it cannot run, and
no work started on a text past the limit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import capture, massive, sinks, streaming

PAGE = str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py")
BUTTONS = ("sinks_metric_run", "sinks_massive_run", "sinks_run")


@pytest.fixture()
def short_shipped_text(monkeypatch):
    """The eviction experiment and the metric's windows on the first ~100 tokens of the shipped text, so that
    pressing every button stays quick."""
    short = streaming.shipped_text()[:450]
    monkeypatch.setattr(streaming, "shipped_text", lambda: short)


@pytest.fixture()
def texts_captured(monkeypatch):
    """Every text the library is asked to run on, from the page's calls into attnviz."""
    seen = []
    real_capture, real_outputs = capture.capture_attention, massive.layer_outputs
    monkeypatch.setattr(capture, "capture_attention",
                        lambda loaded, text, **kw: seen.append(len(text)) or real_capture(loaded, text, **kw))
    monkeypatch.setattr(massive, "layer_outputs", lambda model, ids: seen.append(len(ids)) or real_outputs(model, ids))
    return seen


def _press_everything(model: str, text: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["sinks_model"] = model
    at.session_state["sinks_text"] = text
    at.run()
    assert not at.exception, at.exception
    for key in BUTTONS:
        if any(b.key == key for b in at.button):
            at.button(key=key).click().run()
            assert not at.exception, (key, at.exception)
    return at


@pytest.mark.parametrize("text, said", [("", "The text is empty"), ("   \n ", "The text is empty"),
                                        ("x" * 20_000, "over the 4,096 toy-llama-gqa reads at once")])
def test_a_text_the_page_cannot_read_is_said_once_and_starts_no_work(text, said, short_shipped_text, texts_captured):
    at = _press_everything("toy-llama-gqa", text)
    shown = [m.value for m in (*at.error, *at.warning)]
    assert sum(said in m for m in shown) == 1, shown
    assert not any(n >= 4_096 for n in texts_captured), "work started on a text past the limit"
    # the sections that do not read the text still run: the metric over the shipped windows, the eviction
    assert any(m.label.startswith("Sink₀") for m in at.metric)
    assert [m.label for m in at.metric if m.label.startswith("(")] == [
        f"({abc}) {name}: perplexity" for abc, name in zip("abc", streaming.SETTINGS)]


@pytest.mark.slow
def test_a_long_text_past_the_dense_store_runs_every_section(short_shipped_text):
    """3,000 tokens of toy-llama-gqa: over the 2,048 the dense store takes, so every section reads q and k; the
    intervention's sink mass then comes from the streamed statistics, equal to the dense definition (tested in
    test_massive), and the metric includes the text."""
    from attnviz.models import load_model

    text = "".join(chr(97 + (i * 7) % 26) for i in range(2_999))
    loaded = load_model("toy-llama-gqa")
    assert len(loaded.tokenizer(text)["input_ids"]) > capture.MAX_TOKENS
    at = _press_everything("toy-llama-gqa", text)
    assert not at.error, [e.value for e in at.error]
    ppl = next(m for m in at.metric if m.label == "Perplexity on your text")
    hidden = massive.layer_outputs(loaded.model, loaded.tokenizer(text)["input_ids"])
    layer = at.selectbox(key="sinks_massive_layer").value
    token = at.selectbox(key="sinks_massive_token").value
    dims = np.argsort(-np.abs(hidden[layer, token]), kind="stable")[:3].tolist()
    want = massive.intervention(loaded, text, massive.edit_for(hidden, layer, token, dims, "zero"), store="qk")
    assert ppl.value == f"{want.edited_perplexity:,.2f}"
    assert "+" not in ppl.delta and "×" in ppl.delta
    n_tokens = at.selectbox(key="sinks_massive_token").options
    assert len(n_tokens) <= 256 + 3 * len(hidden)  # a list a person can choose from, not 3,000 entries
    metric = next(m for m in at.metric if m.label.startswith("Sink₀"))
    windows = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=64, n_windows=8)
    alpha = sinks.alpha_over_texts(loaded, [*windows, text])
    assert metric.value == f"{sinks.sink_rate(alpha, sinks.SINK_THRESHOLD):.1%}"


@pytest.mark.slow
def test_two_models_of_different_shapes_compared(short_shipped_text):
    """toy-llama-gqa against Gemma 3 270M (18 layers, 15 of them local): each model's Sink₀^0.3 over its own windows
    of the shipped text, Gemma's per layer kind over the layers its config calls sliding and full, and the two
    comparison charts."""
    from attnviz.models import load_model

    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["sinks_model"] = "toy-llama-gqa"
    at.session_state["sinks_text"] = "The cat sat on the mat."
    at.session_state["sinks_metric_compare"] = True
    at.session_state["sinks_metric_own"] = False
    at.session_state["sinks_metric_model_b"] = "gemma3-270m"
    at.run()
    at.button(key="sinks_metric_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    shown = {m.label: m.value for m in at.metric}
    for name in ("toy-llama-gqa", "gemma3-270m"):
        loaded = load_model(name)
        windows = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=64, n_windows=8)
        alpha = sinks.alpha_over_texts(loaded, windows)
        assert shown[f"Sink₀^0.3 of {name}"] == f"{sinks.sink_rate(alpha, 0.3):.1%}"
    types = loaded.model.config.layer_types
    for kind, layer_type in (("local", "sliding_attention"), ("global", "full_attention")):
        layers = [i for i, t in enumerate(types) if t == layer_type]
        assert shown[f"on its {kind} layers ({len(layers)})"] == f"{(alpha[:, layers] > 0.3).mean():.1%}"
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert any("α₀ of every (text, layer, head)" in t for t in titles)
    assert any("against relative depth" in t for t in titles)


def test_the_eviction_experiment_says_which_model_it_runs_on_and_counts_its_tokens(smollm2):
    """With another model chosen above, the experiment's note still names its own model and gives the number of
    tokens that model's tokenizer makes of the shipped text, counted here independently."""
    from attnviz import streaming

    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["sinks_model"] = "toy-gpt2"
    at.session_state["sinks_text"] = "The cat sat on the mat."
    at.run()
    assert not at.exception, at.exception
    count = len(smollm2.tokenizer(streaming.shipped_text()).input_ids)
    note = next(i.value for i in at.info if "three forward passes" in i.value)
    assert "three forward passes of smollm2-135m (this section's model" in note and f"{count:,} tokens" in note
