"""Reproduce in Python: every page's main figure carries the code that draws it again (attnviz.snippets). Each test
opens the page with settings other than its defaults (a toy model where the page's default is heavy), reads the code
the page shows, runs it, and checks that its `fig` is the chart the page drew, trace for trace and number for
number. A snippet that drifts from its page fails here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import snippets
from tests.test_one_draw import as_sent, plain

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")


def _same(a, b, where: str = "fig") -> None:
    """Equal figure JSON, floats to 1e-6 relative (the page and the snippet compute them on separate runs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, (where, a, b)
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), (where, a, b)
    else:
        assert a == b, (where, a, b)


def _run_snippet(code: str):
    """Runs the shown code as a notebook would, and returns the `fig` it defines."""
    scope: dict = {}
    exec(compile(code, "<snippet>", "exec"), scope)  # the page's own code text, built from our settings
    return scope["fig"]


def _check_page(at: AppTest, expected_code: str) -> None:
    """The page shows expected_code, and running it draws one of the page's charts exactly."""
    assert not at.exception, at.exception
    shown = [c.value for c in at.code if c.value.startswith("import attnviz")]
    assert shown == [expected_code]
    fig = _run_snippet(shown[0])
    mine = plain(as_sent(fig))
    title = mine["layout"].get("title", {}).get("text")
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    same_title = [c for c in charts if c["layout"].get("title", {}).get("text") == title]
    assert len(same_title) == 1, (title, [c["layout"].get("title") for c in charts])
    _same(same_title[0]["data"], mine["data"], "data")
    # uirevision only tells the browser to keep a zoom across the page's reruns (attnviz.ui.steady); a snippet
    # draws once
    drawn = {k: v for k, v in same_title[0]["layout"].items() if k != "uirevision"}
    _same(drawn, mine["layout"], "layout")


def test_the_heads_pages_one_head_snippet_draws_its_map():
    text = "The cat sat on the mat. The cat sat."
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    for key, value in dict(model="toy-gpt2", text=text, layer="1", head="2", sink="1", boost="1",
                           tab="head").items():
        at.query_params[key] = value
    at.switch_page("app_pages/heads.py").run()
    _check_page(at, snippets.heads_head("toy-gpt2", text, 1, 2, gamma=0.5, hide_sink=True))


def test_the_sinks_pages_snippet_draws_its_sink_score_grid():
    at = AppTest.from_file(str(ROOT / "app_pages" / "sinks.py"), default_timeout=300)
    text = "Four score and seven years ago our fathers brought forth a new nation."
    at.session_state["sinks_model"] = "toy-llama-gqa"
    at.session_state["sinks_text"] = text
    at.run()
    _check_page(at, snippets.sinks_grid("toy-llama-gqa", text))


def test_the_positional_pages_snippet_draws_its_sinusoidal_encoding():
    at = AppTest.from_file(str(ROOT / "app_pages" / "positional.py"), default_timeout=300)
    at.session_state["pos_sin_n"] = 40
    at.session_state["pos_sin_d"] = 16
    at.session_state["pos_sin_base"] = 1000.0
    at.run()
    _check_page(at, snippets.positional_encoding(40, 16, 1000.0))


def test_the_variants_pages_snippet_draws_who_reads_which_kv_head():
    at = AppTest.from_file(str(ROOT / "app_pages" / "variants.py"), default_timeout=300)
    at.session_state["variants_heads"] = 12
    at.session_state["variants_kv"] = 3
    at.run()
    _check_page(at, snippets.variants_sharing(12, 3))


@pytest.mark.parametrize("scaled, causal", [(True, False), (False, True)])
def test_the_worked_examples_snippet_draws_its_scores_and_weights(scaled, causal):
    at = AppTest.from_file(str(ROOT / "app_pages" / "worked_example.py"), default_timeout=300)
    q, k, v = "1, 0\n0, 2\n1, 1", "1, 1\n0, 1\n2, 0", "1, 2\n3, 4\n5, 6"
    for key, value in dict(worked_q=q, worked_k=k, worked_v=v, worked_scaled=scaled, worked_causal=causal,
                           worked_digits=2).items():
        at.session_state[key] = value
    at.run()
    _check_page(at, snippets.worked_example(q, k, v, scaled=scaled, causal=causal, digits=2))


def test_a_snippet_writes_any_text_back_exactly():
    """Quotes, backslashes and new lines in a text come back as typed (repr), and nothing in it runs."""
    text = 'He said "it\'s \\n fine"\nand left.'
    code = snippets.heads_head("toy-gpt2", text, 0, 0)
    literal = code.split("attnviz.capture(", 1)[1].split(", store=")[0]
    assert eval(literal.split(", ", 1)[1]) == text  # the second argument is exactly the text


def _span_chart(at: AppTest) -> dict | None:
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    found = [c for c in charts if "the attention of" in (c["layout"].get("title", {}).get("text") or "")]
    assert len(found) <= 1
    return found[0] if found else None


def test_the_heads_pages_span_attention_sums_or_averages_the_chosen_rows(attention_of):
    """Against transformers' own weights: the default span (the last four queries) summed, then two tokens picked
    one by one and averaged; the rules are on screen, an empty selection draws nothing and says why, and the shown
    code draws the chart."""
    from attnviz.models import load_model

    text = "The cat sat on the mat. The cat sat."
    loaded = load_model("toy-gpt2")
    ids = loaded.tokenizer(text).input_ids
    own = attention_of(loaded.model, ids)[1, 2]  # layer 1, head 2: [query, key] float64
    n = len(ids)
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    for key, value in dict(model="toy-gpt2", text=text, layer="1", head="2", tab="token").items():
        at.query_params[key] = value
    at.switch_page("app_pages/heads.py").run()
    assert not at.exception, at.exception
    assert any("**sum** of their columns" in c.value and "**mean** of their rows" in c.value for c in at.caption)
    chart = _span_chart(at)
    np.testing.assert_allclose(chart["data"][0]["y"], own[n - 4:].sum(0), atol=1e-5)
    code = [c.value for c in at.code if "span_attention" in c.value]
    assert len(code) == 1
    _same(plain(as_sent(_run_snippet(code[0]))), chart)

    at.radio(key="heads_span_mode").set_value("Tokens one by one").run()
    assert not at.exception and _span_chart(at) is None
    assert any("No query token is selected" in i.value for i in at.info)
    at.multiselect(key="heads_span_tokens").set_value([5, 1]).run()
    at.radio(key="heads_span_how").set_value("Mean over the queries").run()
    chart = _span_chart(at)
    np.testing.assert_allclose(chart["data"][0]["y"], own[[1, 5]].mean(0), atol=1e-5)
    assert sum(chart["data"][0]["y"]) == pytest.approx(1.0, abs=1e-5)
    code = [c.value for c in at.code if "span_attention" in c.value]
    _same(plain(as_sent(_run_snippet(code[0]))), chart)


def test_the_experiments_pages_knockout_snippet_draws_its_grid():
    text = "The cat sat on the mat. The cat sat."
    at = AppTest.from_file(str(ROOT / "app_pages" / "experiments.py"), default_timeout=300)
    for key, value in dict(model="toy-llama-gqa", view="Knock-outs", text=text, mode="mean", query="3").items():
        at.query_params[key] = value
    at.run()
    from attnviz.models import load_model

    ids = load_model("toy-llama-gqa").tokenizer(text).input_ids
    _check_page(at, snippets.knockout_grid("toy-llama-gqa", text, mode="mean", target=(3, ids[4])))


def test_the_experiments_pages_generation_snippet_draws_the_rows_of_its_step():
    at = AppTest.from_file(str(ROOT / "app_pages" / "experiments.py"), default_timeout=300)
    settings = dict(model="toy-llama-gqa", view="Generation", prompt="A cat sat", new="5", temperature="0.7",
                    seed="3", step="2")
    for key, value in settings.items():
        at.query_params[key] = value
    at.run()
    _check_page(at, snippets.generation_step("toy-llama-gqa", "A cat sat", 5, 0.7, 3, 2))


def test_the_corpus_pages_snippet_draws_its_grid_from_the_run(tmp_path, monkeypatch):
    """The code names the run, not where this server keeps it: RUNS is set to the runs folder before it runs."""
    from attnviz.corpus import corpus_run

    data = tmp_path / "texts.txt"
    data.write_text("The cat sat on the mat; the cat sat on the mat again. " * 6, encoding="utf-8")
    runs = tmp_path / "runs"
    corpus_run("toy-gpt2", data, window=[16, 32], out=runs / "a-gpt2", max_windows=4)
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs))
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    for key, value in dict(run="a-gpt2", stat="sink_mass", window="32").items():
        at.query_params[key] = value
    at.switch_page("app_pages/corpus.py").run()
    expected = snippets.corpus_grid("a-gpt2", "sink_mass", 32)
    assert str(tmp_path) not in expected
    at_code = [c.value for c in at.code if "CorpusRun" in c.value]
    assert at_code == [expected]
    rooted = expected.replace('RUNS = Path("runs")', f"RUNS = Path({str(runs)!r})")
    assert rooted != expected
    fig = _run_snippet(rooted)
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    mine = plain(as_sent(fig))
    same = [c for c in charts if c["layout"]["title"]["text"] == mine["layout"]["title"]["text"]]
    assert len(same) == 1 and "sink_mass: each head's mean over" in mine["layout"]["title"]["text"]
    _same(same[0], mine)


def _chart_titled(at: AppTest, title: str) -> dict:
    """The one chart on the page whose layout title is `title`."""
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    found = [c for c in charts if (c["layout"].get("title") or {}).get("text") == title]
    assert len(found) == 1, (title, [c["layout"].get("title") for c in charts])
    return found[0]


def test_the_kernel_pages_snippet_draws_its_step_view_with_every_frame():
    """A sliding window, 32 x 16 tiles, another seed, step 4: the shown code draws the page's step view, its slider's
    steps included, from library calls alone."""
    at = AppTest.from_file(str(ROOT / "app_pages" / "kernel.py"), default_timeout=300)
    for key, value in dict(kernel_n=80, kernel_d=16, kernel_block_m=32, kernel_block_n=16, kernel_window=32,
                           kernel_seed=5, kernel_step=4).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    expected = snippets.kernel_step(80, 16, block_m=32, block_n=16, causal=True, dtype="float32", seed=5, window=32,
                                    step=4)
    assert [c.value for c in at.code if c.value.startswith("import attnviz")] == [expected]
    assert "streamlit" not in expected and "attnviz.ui" not in expected
    mine = plain(as_sent(_run_snippet(expected)))
    assert [t["text"][0] for t in mine["data"] if t.get("mode") == "text"][-1].startswith("Step 4 of ")
    assert len(mine["layout"]["sliders"][0]["steps"]) > 1
    _same(_chart_titled(at, mine["layout"]["title"]["text"]), mine)


def test_the_softmax_pages_snippet_draws_a_real_heads_three_maps():
    """BLOOM's ALiBi (a bias b in every title), layer 1, head 2, T = 0.5 on a text of our own: the shown code
    draws the page's three maps of the head, from the captured q and k."""
    text = "A bird in the hand is worth two in the bush."
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("app_pages/softmax.py").run()
    at.selectbox(key="softmax_model").set_value("toy-bloom-alibi").run()
    at.text_input(key="softmax_text").input(text).run()
    at.button(key="softmax_capture").click().run()
    at.selectbox(key="softmax_layer").set_value(1).run()
    at.selectbox(key="softmax_head").set_value(2).run()
    at.select_slider(key="softmax_real_temperature").set_value(0.5).run()
    assert not at.exception, at.exception
    expected = snippets.softmax_head("toy-bloom-alibi", text, 1, 2, 0.5)
    assert [c.value for c in at.code if "head_logits" in c.value] == [expected]
    mine = plain(as_sent(_run_snippet(expected)))
    names = [t["name"] for t in mine["data"]]
    assert names == ["Own scale: q·k × 0.25 + b", "Unscaled: q·k + b", "Own scale ÷ T, T = 0.5"]
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    same = [c for c in charts if [t.get("name") for t in c["data"]] == names]
    assert len(same) == 1
    _same(same[0], mine)


def test_the_toy_labs_snippet_redraws_the_loss_curve_from_the_saved_run(tmp_path, monkeypatch):
    """A 20-step run on the text task (chance among bytes), saved automatically: the shown code names the saved
    model, not where it lies, reads its history and draws the page's loss curve without training."""
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=300)  # the app: the page links to the Heads page once saved
    for key, value in dict(lab_task="text", lab_steps=20, lab_width=32, lab_text_len=16, lab_seed=7).items():
        at.session_state[key] = value
    at.run()
    at.switch_page("app_pages/toy_lab.py").run()
    at.button(key="lab_train").click().run()
    assert not at.exception, at.exception
    snap = at.session_state["lab_run"].join(timeout=240)
    assert snap.status == "done" and snap.saved_as, (snap.status, snap.error)
    at.run()
    assert not at.exception, at.exception
    expected = snippets.lab_loss_curve(snap.saved_as)
    assert str(tmp_path) not in expected
    assert [c.value for c in at.code if c.value.startswith("import attnviz")] == [expected]

    from attnviz import lab

    monkeypatch.setattr(lab.LabRun, "__init__", lambda *a, **k: pytest.fail("the snippet trained a model"))
    fig = _run_snippet(expected)
    mine = plain(as_sent(fig))
    assert mine["data"][0]["y"] == pytest.approx(snap.losses, rel=0, abs=0)
    assert "bytes" in json.dumps(mine["data"])
    _same(_chart_titled(at, "Loss on the answer tokens"), mine)


def test_the_toy_labs_saved_history_refuses_a_bad_or_unknown_name(tmp_path, monkeypatch):
    from attnviz import lab

    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    with pytest.raises(lab.StorageRefused, match="no toy-lab model is saved as lab/nothing-here"):
        lab.saved_history("nothing-here")
    with pytest.raises(lab.StorageRefused, match="lowercase letters"):
        lab.saved_history("../escape")


def test_the_softmax_pages_snippet_draws_its_random_logits_chart_with_every_d_k():
    """d_k = 16, 24 keys per query, T = 2, seed 9: the shown code draws the page's first chart, its d_k slider's
    steps included."""
    at = AppTest.from_file(str(ROOT / "app_pages" / "softmax.py"), default_timeout=300)
    for key, value in dict(softmax_d_k=16, softmax_n_keys=24, softmax_temperature=2.0, softmax_seed=9).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    expected = snippets.softmax_variants(16, 24, 9, 2.0, 12)
    assert [c.value for c in at.code if c.value.startswith("import attnviz")] == [expected]
    mine = plain(as_sent(_run_snippet(expected)))
    labels = [s["label"] for s in mine["layout"]["sliders"][0]["steps"]]
    assert labels[:3] == ["1", "2", "3"] and mine["layout"]["sliders"][0]["active"] == labels.index("16")
    charts = [plain(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]
    same = [c for c in charts if c["layout"].get("sliders") == mine["layout"]["sliders"]]
    assert len(same) == 1
    _same(same[0], mine)
