"""The notebook views (attnviz.notebook): what each draws against transformers' own attention weights recomputed in
float64, their HTML self-contained (no script source, no require.js), drawn in Chromium as classic Jupyter and
JupyterLab insert them with every network request blocked, and examples/quickstart.ipynb run by nbclient in a real
ipykernel, its standalone pages drawn offline with the weights SmolLM2 gives."""

from __future__ import annotations

import base64
import copy
import html
import io
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attnviz
from attnviz import notebook
from attnviz.figures import heads as figs
from attnviz.tokenizer import byte_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXT = "The quick brown fox jumps over the lazy dog; the lazy dog sleeps."  # 65 bytes: 66 tokens with <bos>
N = 66
ATOL = 1e-5  # the capture runs the model in float32, the reference in float64
LONG = 20  # FULL_MAP_MAX_TOKENS for the tests that draw TEXT as a long text
TITLE = re.compile(r'title="(\d+): [^"]*? — weight from token (\d+) ([0-9.]+)"')


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama (GQA: 4 query heads, 2 KV heads) as a notebook builds it, and a float64 eager copy."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=257, bos_token_id=256, eos_token_id=256, pad_token_id=256,
                         initializer_range=0.3, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    reference = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    reference.load_state_dict(model.state_dict())
    return model, reference.double().eval()


@pytest.fixture(scope="module")
def caps(tiny):
    """{store: capture of TEXT} and the float64 weights [layer, head, query, key] from output_attentions."""
    model, reference = tiny
    out = {store: attnviz.capture(model, TEXT, tokenizer=byte_tokenizer(), store=store) for store in ("pattern", "qk")}
    with torch.no_grad():
        got = reference(input_ids=torch.tensor([out["pattern"].token_ids]), output_attentions=True)
    return out, np.stack([a[0].numpy() for a in got.attentions])


def _hidden(p: np.ndarray) -> np.ndarray:
    """p [..., query, key] without the first-token sink, by hand: column 0 zeroed, each row rescaled to sum to 1,
    rows that kept under 1% blank (NaN)."""
    out = np.array(p, dtype=np.float64)
    out[..., 0] = 0.0
    kept = out.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(kept >= 0.01, out / kept, np.nan)


def _block_max(p: np.ndarray, m: int) -> np.ndarray:
    """p [n, n] -> [m, m]: the largest weight of each block between the rounded points of linspace(0, n, m + 1)."""
    n = p.shape[-1]
    if n <= m:
        return p
    e = np.linspace(0, n, m + 1).round().astype(int)
    out = np.full((m, m), np.nan)
    for i in range(m):
        for j in range(m):
            block = p[e[i]:e[i + 1], e[j]:e[j + 1]]
            if not np.isnan(block).all():
                out[i, j] = np.nanmax(block)
    return out


def _close(got, expected, atol):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(expected), rtol=0, atol=atol)


@pytest.mark.parametrize("hide_sink", [False, True])
def test_a_short_head_is_drawn_with_the_weights_transformers_gives(caps, hide_sink):
    (by_store, ref) = caps
    cap = by_store["pattern"]
    view = cap.head_view(2, 3, hide_sink=hide_sink)
    expected = _hidden(ref[2, 3]) if hide_sink else ref[2, 3]
    detail = view.figures[0]
    assert detail.data[0].type == "heatmap"
    _close(detail.data[0].customdata, expected, ATOL)  # the hover's exact weight
    assert "(reads KV head 1)" in detail.layout.title.text
    if hide_sink:  # the weight each row keeps off token 0, drawn under the map
        kept = view.figures[1].data[0].y
        np.testing.assert_allclose(kept, np.maximum(1.0 - ref[2, 3, :, 0], 1e-12), rtol=0, atol=ATOL)
    assert len(view.figures) == (2 if hide_sink else 1)


@pytest.mark.parametrize("store", ["pattern", "qk"])
@pytest.mark.parametrize("hide_sink", [False, True])
def test_a_long_head_is_a_max_pooled_overview_and_an_exact_zoom_window(caps, monkeypatch, store, hide_sink):
    monkeypatch.setattr(notebook, "FULL_MAP_MAX_TOKENS", LONG)
    monkeypatch.setattr(notebook, "OVERVIEW", 16)
    (by_store, ref) = caps
    cap, n = by_store[store], by_store[store].n_tokens
    assert notebook.is_long(cap) and n == N
    shown = _hidden(ref[1, 2]) if hide_sink else ref[1, 2]
    pooled, kept = notebook.overview(cap, 1, 2, hide_sink=hide_sink)
    _close(pooled, _block_max(shown, 16), ATOL)
    if hide_sink:
        np.testing.assert_allclose(kept, 1.0 - ref[1, 2, :, 0], rtol=0, atol=ATOL)
    view = cap.head_view(1, 2, hide_sink=hide_sink, window=(40, 25), size=10)
    over, window = view.figures[:2]
    assert over.data[0].type == "image" and "max-pooled to 16 px" in over.layout.title.text
    assert window.data[0].type == "heatmap" and "queries 40–49, keys 25–34" in window.layout.title.text
    _close(window.data[0].customdata, shown[40:50, 25:35], ATOL)
    # by default the window holds the last queries and the keys on their diagonal; it never leaves the text
    assert notebook.zoom_start(n, 10, None) == (56, 56) and notebook.zoom_start(n, 10, (500, -3)) == (56, 0)
    last = cap.head_view(1, 2, hide_sink=hide_sink, size=10).figures[1]
    _close(last.data[0].customdata, shown[56:66, 56:66], ATOL)


@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_where_a_token_looks_and_the_shaded_text_hold_its_weights(caps, store):
    (by_store, ref) = caps
    cap = by_store[store]
    q = 30
    view = cap.token_view(q, layers=[0, 2], gamma=1.0)
    fig = view.figures[0]
    expected = np.concatenate([ref[0, :, q, :q + 1], ref[2, :, q, :q + 1]])  # causal: keys up to the query
    _close(fig.data[0].z, expected, ATOL)
    assert list(fig.data[0].y) == [f"L{x} H{h}" for x in (0, 2) for h in range(4)]
    hidden = notebook.query_rows(cap, [1], q, hide_sink=True)
    _close(hidden, _hidden(ref[1, :, q]), ATOL)
    # the text view: every visible token's tooltip holds its weight to 4 decimals; later tokens are not shaded
    body = cap.text_view(1, 3, q).html()
    found = TITLE.findall(html.unescape(body))
    assert [int(i) for i, _, _ in found] == list(range(q + 1)) and {int(f) for _, f, _ in found} == {q}
    np.testing.assert_allclose([float(w) for _, _, w in found], ref[1, 3, q, :q + 1], rtol=0, atol=5e-5 + ATOL)
    later = f'title="tokens {q + 1}–{cap.n_tokens - 1}: not visible to the query">'
    assert body.count("not visible to the query") == 1 and later in body  # one faint span for the later keys
    assert "<script" not in body  # the text view is plain HTML


def _png_indices(fig) -> np.ndarray:
    uri = fig.data[0].source
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))


@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_the_grid_holds_every_heads_max_pooled_weights(caps, store):
    (by_store, ref) = caps
    cap = by_store[store]
    fig = cap.show().figures[0]
    index = _png_indices(fig)
    m, gap = figs.GRID_TILE, 2
    assert index.shape == (3 * (m + gap) - gap, 4 * (m + gap) - gap)
    above = np.triu(np.ones((m, m), dtype=bool), 1)  # causal: the blocks wholly after the diagonal are grey
    for layer in range(3):
        for h in range(4):
            tile = index[layer * (m + gap):layer * (m + gap) + m, h * (m + gap):h * (m + gap) + m].astype(int)
            assert (tile[above] == 254).all()
            expected = np.rint(np.clip(_block_max(ref[layer, h], m), 0, 1) ** 0.5 * 253)  # weight^0.5, 253 steps
            assert np.abs(tile[~above] - expected[~above]).max() <= 1


def _views(cap):
    return {"grid": cap.show(), "head": cap.head_view(1, 0), "token": cap.token_view(), "text": cap.text_view(1, 0),
            "page": notebook.page_view(cap, 1, 0)}


def test_each_view_is_self_contained_html_with_plotly_inlined_once(caps, tmp_path):
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    # plotly's bundle sets window.Plotly itself and never calls define or require (require.js in classic Jupyter
    # would take over an AMD module); its one "require(" is inside a shader's comment
    assert "define.amd" not in bundle and "window.Plotly = Plotly" in bundle and "</script" not in bundle
    assert [bundle[m.start() - 40:m.start()].split("//")[-1].strip() for m in re.finditer(r"require\(", bundle)] \
        == ["#pragma glslify: beckmann ="]
    for name, view in _views(caps[0]["qk"]).items():
        fragment = view.html()
        assert view._repr_html_().count(bundle) == fragment.count(bundle) == (0 if name == "text" else 1), name
        rest = fragment.replace(bundle, "")
        assert not re.search(r"<script[^>]*\bsrc\s*=", fragment), name
        assert "http://" not in rest and "https://" not in rest, name
        assert "require(" not in rest and "requirejs" not in rest and "define(" not in rest, name
        assert rest.count("Plotly.newPlot(") == len(view.figures), name
        ids = re.findall(r'<div id="(attnviz-[0-9a-f]+)"', rest)
        assert len(ids) == len(view.figures) and set(ids).isdisjoint(re.findall(r'id="(attnviz-[0-9a-f]+)"',
                                                                                view.html()))
    page = caps[0]["pattern"].to_html(tmp_path / "page.html", 1, 0)
    written = page.read_text(encoding="utf-8")
    assert written.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in written
    assert written.count(bundle) == 1 and written.count("Plotly.newPlot(") == 3  # grid, head, token; text is HTML
    assert 'title="45: ' in written  # the shaded text, to the last token


def test_a_token_that_is_markup_stays_text():
    """Tokens are the user's text: one that reads like markup or a closing script tag ends no script and opens no
    element."""
    tokens = ["<bos>", "</script><script>alert(1)</script>", "<!--<script>", "<b>x</b>"]
    w = np.tril(np.ones((4, 4)))
    w /= w.sum(-1, keepdims=True)
    cap = attnviz.from_attentions([np.stack([w, w])[None]], tokens)
    for view in (cap.show(), cap.head_view(0, 1), cap.token_view(), cap.text_view(0, 1), notebook.page_view(cap)):
        fragment = view.html()
        assert fragment.count("</script>") == len(view.figures) + bool(view.figures)
        outside = re.sub(r"<script[^>]*>.*?</script>", "", fragment, flags=re.S)
        assert "<script>alert(1)" not in outside and "<b>x" not in outside and "<!--" not in outside


def test_the_notebook_views_import_neither_streamlit_nor_the_app():
    import subprocess

    code = ("import sys, attnviz.notebook; "
            "print(sorted(m for m in sys.modules if m.startswith(('streamlit', 'attnviz.ui'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_views_refuse_what_was_not_captured(caps):
    cap = caps[0]["pattern"].select([1])
    with pytest.raises(attnviz.CaptureError, match="Layer 0 was not captured"):
        cap.head_view(0, 0)
    with pytest.raises(attnviz.CaptureError, match="Head 4 does not exist"):
        cap.text_view(1, 4)
    with pytest.raises(attnviz.CaptureError, match=f"Query {N} does not exist"):
        cap.token_view(N)


# -- in a browser, offline --
def _offline_page(browser):
    """A page whose every request other than file: and data: is aborted and listed, and its console errors."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
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
    return page, blocked, errors


DRAWN = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => [
    d.querySelectorAll('.main-svg').length, d.querySelectorAll('image').length])"""


def _charts_drawn(page, count: int) -> list:
    """[svg layers, svg images] of each chart, once `count` charts are on the page and each has drawn its svg
    (plotly draws a heatmap and an image trace as an svg image)."""
    page.wait_for_function("n => { const d = document.querySelectorAll('.plotly-graph-div'); return d.length >= n && "
                           "Array.from(d).every(x => x.querySelector('.main-svg')); }", arg=count, timeout=60_000)
    return page.evaluate(DRAWN)


@pytest.mark.browser
def test_views_draw_offline_as_classic_jupyter_and_jupyterlab_insert_them(caps, monkeypatch, tmp_path, browser):
    monkeypatch.setattr(notebook, "FULL_MAP_MAX_TOKENS", LONG)
    cap = caps[0]["qk"]
    shown = [cap.show(), cap.head_view(1, 0, size=16), cap.token_view(), cap.text_view(1, 0)]
    shown.append(shown[0])  # the same view shown twice: each output draws its own charts
    count = sum(len(v.figures) for v in shown)
    # Classic Jupyter: require.js defines an AMD `define`; every output's scripts run in order.
    amd = ("<script>window.defined = []; window.define = function () { window.defined.push(arguments); };"
           "window.define.amd = {}; window.require = window.define;</script>")
    (tmp_path / "classic.html").write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + amd
                                           + "".join(f"<div class='output'>{v._repr_html_()}</div>" for v in shown)
                                           + "</body></html>", encoding="utf-8")
    # JupyterLab and VS Code: the output's HTML set as innerHTML, its scripts re-created so that they run
    lab = """(outputs) => { for (const source of outputs) {
        const host = document.createElement('div'); host.innerHTML = source;
        for (const old of Array.from(host.getElementsByTagName('script'))) {
            const s = document.createElement('script');
            for (const a of Array.from(old.attributes)) s.setAttribute(a.name, a.value);
            s.textContent = old.textContent; old.parentNode.replaceChild(s, old); }
        document.body.appendChild(host); } }"""
    (tmp_path / "lab.html").write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body></body></html>")
    for name in ("classic", "lab"):
        page, blocked, errors = _offline_page(browser)
        try:
            page.goto((tmp_path / f"{name}.html").as_uri())
            if name == "lab":
                page.evaluate(lab, [v._repr_html_() for v in shown])
            drawn = _charts_drawn(page, count)
            assert len(drawn) == count and all(svg >= 1 for svg, _ in drawn), (name, drawn)
            assert drawn[0][1] >= 1  # the grid is a PNG drawn as an svg image
            assert page.evaluate("window.defined ? window.defined.length : 0") == 0  # plotly never used AMD
            spans = page.locator("span[title^='0: ']").count()
            assert spans == 1, name  # the shaded text, once
            assert not blocked, blocked
            assert not errors, (name, errors)
        finally:
            page.close()


# -- the quickstart notebook --
@pytest.mark.slow
@pytest.mark.browser
def test_quickstart_notebook_runs_in_a_real_kernel_and_its_pages_draw_offline(tmp_path, monkeypatch, browser,
                                                                            smollm2, attention_of):
    import nbformat
    from ipykernel.kernelspec import write_kernel_spec
    from nbclient import NotebookClient

    # a kernel spec of this Python (the environment's), found only here; the kernel imports this checkout
    jupyter = tmp_path / "jupyter"
    spec = write_kernel_spec(jupyter / "kernels" / "attnviz-test", overrides={"display_name": "attnviz test"})
    assert json.loads((Path(spec) / "kernel.json").read_text())["argv"][0] == sys.executable
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    work = tmp_path / "run"
    work.mkdir()
    nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    assert not any("pip install" in c.source or "!pip" in c.source for c in nb.cells)  # it installs nothing
    NotebookClient(nb, kernel_name="attnviz-test", timeout=600, resources={"metadata": {"path": str(work)}}).execute()

    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o.data["text/html"] for o in outputs if "attnviz-view" in o.get("data", {}).get("text/html", "")]
    assert len(views) == 8  # show, head x 2, token, text, the model object's head, the long head, the long grid
    for view in views:
        assert view.count(bundle) == (0 if "Plotly.newPlot" not in view else 1)
        assert not re.search(r"<script[^>]*\bsrc\s*=", view) and "require(" not in view.replace(bundle, "")
    assert "Plotly.newPlot" in views[-2] and "max-pooled to 512 px" in views[-2]  # the long text's overview

    for name, charts in (("attention.html", 3), ("attention-long.html", 4)):
        path = work / name
        written = path.read_text(encoding="utf-8")
        assert written.count(bundle) == 1 and written.count("Plotly.newPlot(") == charts
        page, blocked, errors = _offline_page(browser)
        try:
            page.goto(path.as_uri())
            drawn = _charts_drawn(page, charts)
            assert len(drawn) == charts and all(svg >= 1 for svg, _ in drawn), (name, drawn)
            assert drawn[0][1] >= 1, (name, drawn)  # the grid's image
            assert not blocked and not errors, (name, blocked, errors)
            if name == "attention.html":  # the shaded text holds the weights SmolLM2 itself gives
                titles = page.eval_on_selector_all("span[title]", "s => s.map(e => e.title)")
                found = [TITLE.search(f'title="{t}"') for t in titles]
                ids = smollm2.tokenizer("When Mary and John went to the store, John gave a drink to").input_ids
                ref = attention_of(smollm2.model, ids)[4, 0, len(ids) - 1]
                assert [int(f.group(1)) for f in found] == list(range(len(ids)))
                np.testing.assert_allclose([float(f.group(3)) for f in found], ref, rtol=0, atol=5e-5 + ATOL)
        finally:
            page.close()
