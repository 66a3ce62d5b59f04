"""One report of what was found (attnviz.report, `attnviz report`): a single HTML file with the settings, the text,
the chosen heads' maps, the statistics table, experiment results and the code behind each, that needs no network
(plotly inlined once, no script or stylesheet from elsewhere) and draws in Chromium with every request blocked."""

from __future__ import annotations

import html
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from attnviz import report, snippets
from attnviz.__main__ import main
from attnviz.capture.front import capture
from attnviz.errors import AttnvizError
from attnviz.models import load_model

TEXT = "The cat <b>sat</b> on the mat. The cat sat on the mat."  # markup in the text must stay text


@pytest.fixture(scope="module")
def toy():
    loaded = load_model("toy-gpt2")
    cap = capture(loaded, TEXT, store="auto")
    return loaded, cap, cap.stats()


def _self_contained(page: str) -> str:
    """The page without plotly's bundle, after checking it is there exactly once and nothing loads from elsewhere."""
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    assert page.count(bundle) == 1
    assert not re.search(r"<(script|img|iframe)[^>]*\bsrc\s*=", page)
    assert not re.search(r"<link[^>]*\bhref\s*=", page)
    rest = page.replace(bundle, "")
    assert "http://" not in rest and "https://" not in rest
    return rest


def _tables(page: str) -> list[pd.DataFrame]:
    """Every <table> of the page as text cells, its first row the header (read by hand: no HTML parser needed)."""
    out = []
    for table in re.findall(r"<table.*?</table>", page, flags=re.S):
        rows = [[html.unescape(c.strip()) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, flags=re.S)]
                for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S)]
        out.append(pd.DataFrame(rows[1:], columns=rows[0]))
    return out


def _code_blocks(page: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r"<pre><code>(.*?)</code></pre>", page, flags=re.S)]


def test_the_report_holds_settings_text_heads_statistics_experiments_and_their_code(toy, tmp_path):
    loaded, cap, stats = toy
    experiment = pd.DataFrame({"layer": [1], "head": [2], "effect": [0.125]})
    experiment.attrs["snippet"] = "print('the experiment')"
    path = report.write_report(tmp_path / "r.html", cap, TEXT, heads=[(1, 2), (0, 3)], stats=stats,
                               settings={"boost small weights": "on"}, experiments={"A knock-out": experiment},
                               hide_sink=True, gamma=0.5, model="toy-gpt2")
    page = path.read_text(encoding="utf-8")
    rest = _self_contained(page)
    assert rest.count("Plotly.newPlot(") == 4  # each head: its map and what is left off the sink
    assert html.escape(TEXT) in rest and "<b>sat</b>" not in rest
    assert "<td>boost small weights</td>" in rest and "<td>on</td>" in rest and "<td>toy-gpt2</td>" in rest
    tables = _tables(rest)
    shown = next(t for t in tables if "entropy" in t.columns)
    assert list(shown.columns) == list(stats.columns) and len(shown) == cap.n_layers * cap.n_heads
    for column in ("entropy", "sink_mass", "prev_token"):  # written to 4 significant digits
        np.testing.assert_allclose(shown[column].astype(float), stats[column], rtol=1e-3)
    assert any("effect" in t.columns and t["effect"].tolist() == ["0.125"] for t in tables)
    assert _code_blocks(page) == [
        snippets.heads_head("toy-gpt2", TEXT, 1, 2, gamma=0.5, hide_sink=True),
        snippets.heads_head("toy-gpt2", TEXT, 0, 3, gamma=0.5, hide_sink=True),
        snippets.head_stats("toy-gpt2", TEXT), "print('the experiment')"]


def test_the_reports_statistics_code_gives_the_table_it_shows(toy):
    _, cap, stats = toy
    scope: dict = {}
    exec(snippets.head_stats("toy-gpt2", TEXT), scope)
    pd.testing.assert_frame_equal(scope["stats"], stats)


def test_default_heads_are_the_best_head_of_each_role_once(toy):
    _, cap, stats = toy
    heads = report.default_heads(stats, cap)
    assert len(heads) == len(set(heads)) >= 1
    best_sink = stats.loc[stats["sink_mass"].idxmax()]
    assert heads[0] == (int(best_sink["layer"]), int(best_sink["head"]))
    assert report.default_heads(None, cap) == [(cap.layers[0], 0)]


def test_knockout_table_against_transformers_own_loss(toy):
    """The loss without a knock-out is transformers' own mean next-token loss; each row's change is its loss minus
    that; zeroing a head's output changes the loss."""
    loaded, _, _ = toy
    frame = report.knockout_table(loaded, TEXT, [(0, 1), (1, 2)], model="toy-gpt2")
    ids = torch.tensor([loaded.tokenizer(TEXT).input_ids])
    with torch.no_grad():
        own = float(loaded.model(input_ids=ids, labels=ids).loss)
    assert frame.attrs["base_loss"] == pytest.approx(own, rel=1e-5)
    np.testing.assert_allclose(frame["delta_loss_nats"], frame["loss_nats"] - own, rtol=1e-5, atol=1e-6)
    assert (frame["delta_loss_nats"].abs() > 0).all()
    scope: dict = {}
    exec(frame.attrs["snippet"].replace("print(", "(lambda *a: None)("), scope)
    np.testing.assert_allclose(scope["result"].loss, frame["loss_nats"])


def test_the_command_writes_the_report_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", "--model", "toy-gpt2", "--text", TEXT, "--out", str(out), "--heads", "1.2,0.0",
                 "--knockout"]) == 0
    page = out.read_text(encoding="utf-8")
    rest = _self_contained(page)
    assert "Each head knocked out alone" in rest and "delta_loss_nats" in rest
    assert "statistics</h3>" in rest
    assert _code_blocks(page)[:2] == [snippets.heads_head("toy-gpt2", TEXT, 1, 2, gamma=1.0),
                                      snippets.heads_head("toy-gpt2", TEXT, 0, 0, gamma=1.0)]
    base = ["report", "--model", "toy-gpt2", "--text", TEXT]
    for args, said in ((base + ["--out", str(out), "--heads", "1-2"], "layer.head pairs"),
                       (base + ["--out", str(out), "--heads", "7.0"], "layer 7"),
                       (base + ["--out", str(tmp_path / "r.txt")], "must end in .html")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert said in err.lower() and "Traceback" not in err, (args, err)


@pytest.mark.browser
def test_the_report_draws_offline_in_chromium_with_no_console_error(toy, tmp_path, request):
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (bash scripts/setup.sh --dev installs it)")
    browser = request.getfixturevalue("browser")
    loaded, cap, stats = toy
    path = report.write_report(tmp_path / "r.html", cap, TEXT, heads=[(1, 2), (0, 0)], stats=stats,
                               experiments={"Knock-outs": report.knockout_table(loaded, TEXT, [(1, 2)])})
    page = browser.new_page()
    blocked, errors = [], []

    def route(r):
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => { const d = document.querySelectorAll('.plotly-graph-div'); return d.length "
                               "== 2 && Array.from(d).every(x => x.querySelector('.main-svg')); }", timeout=60_000)
        assert page.locator("table").count() == 3  # the settings, the statistics, the knock-outs
        assert page.locator("details").count() == 4  # two heads, the statistics, the knock-outs
        assert not blocked, blocked
        assert not errors, errors
    finally:
        page.close()


def test_the_heads_pages_report_button_writes_the_chosen_head_first_with_the_pages_settings(monkeypatch):
    from attnviz.ui import snippets as snippet_ui
    from tests.test_heads_page import heads_page, open_tab

    asked = []
    monkeypatch.setattr(snippet_ui, "report_button", lambda *a, **kw: asked.append((a, kw)))
    at = heads_page({"model": "toy-gpt2", "layer": "1", "head": "2", "text": TEXT, "boost": "1", "sink": "1"})
    open_tab(at, "Export")
    assert not at.exception and len(asked) == 1
    (cap, text, model, heads), options = asked[0]
    assert (text, model, heads[0]) == (TEXT, "toy-gpt2", (1, 2)) and len(set(heads)) == len(heads)
    assert options["settings"]["boost small weights"] == "on" and options["hide_sink"] is True
    assert options["gamma"] == 0.5
    page = snippet_ui.report_bytes(cap, text, model, heads, **{k: v for k, v in options.items() if k != "key"})
    page = page.decode("utf-8")
    rest = _self_contained(page)
    assert rest.index("Layer 1, head 2</h3>") < rest.index("statistics</h3>")
    assert _code_blocks(page)[0] == snippets.heads_head("toy-gpt2", TEXT, 1, 2, gamma=0.5, hide_sink=True)
    assert any("report --model toy-gpt2" in c.value for c in at.caption)


def test_a_long_text_store_report_draws_each_head_as_an_overview_and_a_zoom(toy, tmp_path):
    loaded, _, _ = toy
    cap = capture(loaded, TEXT, store="qk")  # q and k only: the maps are computed a block of rows at a time
    path = report.write_report(tmp_path / "qk.html", cap, TEXT, heads=[(1, 2)], stats=cap.stats(),
                               model="toy-gpt2")
    rest = _self_contained(path.read_text(encoding="utf-8"))
    assert rest.count("Plotly.newPlot(") == 2 and "max-pooled" in rest and "<td>qk</td>" in rest
    with pytest.raises(AttnvizError, match="must end in .html"):
        report.write_report(tmp_path / "qk.pdf", cap, TEXT, heads=[(1, 2)])
    with pytest.raises(AttnvizError, match="No head chosen"):
        report.report(cap, TEXT, heads=[])
