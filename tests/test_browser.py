"""The app in a real browser: Debian's Chromium driven by playwright, Streamlit on 127.0.0.1 on a free port.

Every page is opened by deep link, the first of them on the freshly started server (where Streamlit's legacy
pages/ navigation could take over), waited on until its script has finished and its charts are drawn, and checked
for Streamlit exception blocks and browser console errors. A screenshot of every page is saved for the README tour
(docs/screenshots/, or $ATTNVIZ_SCREENSHOTS).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from attnviz.ui import PAGES
from tests.servers import streamlit_server

ROOT = Path(__file__).resolve().parent.parent
SHOTS = Path(os.environ.get("ATTNVIZ_SCREENSHOTS", ROOT / "docs" / "screenshots"))
PAGE_TIMEOUT_S = 240

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """The Corpus page's runs folder: one small run of toy-gpt2 over the shipped text at two window lengths."""
    from attnviz import streaming
    from attnviz.corpus import corpus_run

    root = tmp_path_factory.mktemp("runs")
    data = root.parent / "declaration.txt"
    data.write_text(streaming.shipped_text()[:6000], encoding="utf-8")
    corpus_run("toy-gpt2", data, window=[32, 128], out=root / "declaration-toy-gpt2", max_windows=24)
    return root


@pytest.fixture(scope="module")
def server(runs_dir):
    """A fresh Streamlit server (tests.servers) with the runs folder set (ATTNVIZ_RUNS_DIR), stopped by its own PID
    when the module's tests are done."""
    log = open(ROOT / ".pytest_cache" / "streamlit-browser-test.log", "w") if (ROOT / ".pytest_cache").is_dir() \
        else subprocess.DEVNULL
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))  # the server process inherits it
            with streamlit_server(log=log) as (url, _):
                yield url
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _wait_until_done(page, timeout_s: float) -> None:
    """Waits until the script run has finished (the app reports notRunning three polls in a row) and every chart
    is drawn."""
    deadline = time.time() + timeout_s
    page.wait_for_selector('[data-testid="stSidebarNav"]', timeout=timeout_s * 1000)
    quiet = 0
    while quiet < 3:
        if time.time() > deadline:
            raise AssertionError(f"page still running after {timeout_s} s")
        done = page.query_selector('[data-testid="stApp"][data-test-script-state="notRunning"]') is not None \
            and page.query_selector('[data-testid="stSkeleton"]') is None
        quiet = quiet + 1 if done else 0
        time.sleep(0.5)
    for chart in page.query_selector_all('[data-testid="stPlotlyChart"]'):
        if not chart.is_visible():  # in a tab that is not open
            continue
        chart.scroll_into_view_if_needed()
        chart.wait_for_selector(".main-svg", timeout=max(1.0, deadline - time.time()) * 1000)


# Each drawn chart whose margins plotly's automargin had to widen, with the margins asked for and drawn (l/r/t/b):
# such a chart is drawn twice, and attnviz.figures sizes margins so that none is (a view change stays fast). A few
# pixels are let pass, so that a font drawn a hair wider on another machine does not fail the test.
WIDENED_MARGINS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(g => {
    const asked = g.layout.margin || {}, drawn = g._fullLayout._size;
    const a = ['l', 'r', 't', 'b'].map(k => asked[k]), d = ['l', 'r', 't', 'b'].map(k => Math.round(drawn[k]));
    return a.some((v, i) => d[i] > v + 4) ? [`${(g.layout.title || {}).text}: ${a.join('/')} -> ${d.join('/')}`] : [];
})"""

# The first page opened is a deep link on the fresh server: the case where legacy navigation can take over.
ORDER = sorted(PAGES, key=lambda p: p.default)


@pytest.mark.parametrize("info", ORDER, ids=[p.url_path for p in ORDER])
def test_page_opens_by_deep_link(server, browser, info):
    context = browser.new_context(viewport={"width": 1400, "height": 1300})
    page = context.new_page()
    errors: list[str] = []
    # Streamlit's frontend first probes /<page>/_stcore/* on a deep link, gets 404 and falls back to the root:
    # its own behaviour, not an error of the app.
    path = "" if info.default else info.url_path  # the default page lives at the root
    probe = f"{server}/{path}/_stcore/"

    def on_console(m):
        if m.type == "error" and not (m.location or {}).get("url", "").startswith(probe):
            errors.append(f"{m.text} ({(m.location or {}).get('url', '')})")

    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{server}/{path}", wait_until="domcontentloaded")
        _wait_until_done(page, PAGE_TIMEOUT_S)

        SHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("document.querySelectorAll('*').forEach(e => { if (e.scrollTop) e.scrollTop = 0; })")
        time.sleep(0.5)
        page.screenshot(path=str(SHOTS / f"{info.url_path}.png"), full_page=True)
        nav = [e.inner_text().split("\n")[-1].strip()
               for e in page.query_selector_all('[data-testid="stSidebarNavLink"]')]
        assert nav == [p.title for p in PAGES], f"not the app's own navigation: {nav}"
        exceptions = [e.inner_text() for e in page.query_selector_all('[data-testid="stException"]')]
        assert not exceptions, exceptions
        assert page.query_selector("h1") is not None, "page shows no title"
        if not info.default:
            assert page.query_selector_all('[data-testid="stPlotlyChart"]'), f"{info.title} shows no chart"
        widened = page.evaluate(WIDENED_MARGINS)
        assert not widened, f"charts whose margins plotly had to widen (each drew twice): {widened}"
        assert not errors, f"browser console errors: {errors}"
    finally:
        context.close()


def test_a_setting_survives_leaving_the_page_and_coming_back(server, browser):
    # In the browser a page switch starts a new page run, and Streamlit drops the values of widgets it does not
    # draw unless they persist (persist_state="session"); the app test cannot see the difference, the browser can.
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    label = "Causal mask (query i sees keys up to i)"

    def causal_on() -> bool:
        toggle = page.locator('[data-testid="stCheckbox"]', has_text=label)
        assert toggle.count() == 1, "the causal toggle is not on the page"
        return toggle.get_attribute("data-selected") == "true"

    try:
        page.goto(f"{server}/worked-example", wait_until="domcontentloaded")
        _wait_until_done(page, PAGE_TIMEOUT_S)
        assert not causal_on()
        page.get_by_text(label).click()
        _wait_until_done(page, PAGE_TIMEOUT_S)
        assert causal_on()
        page.locator('[data-testid="stSidebarNavLink"]', has_text="MHA, GQA, MQA").click()
        _wait_until_done(page, PAGE_TIMEOUT_S)
        assert page.locator('[data-testid="stCheckbox"]', has_text=label).count() == 0, "still on the worked example"
        page.locator('[data-testid="stSidebarNavLink"]', has_text="Worked example").click()
        _wait_until_done(page, PAGE_TIMEOUT_S)
        assert causal_on(), "the setting was lost on the way back"
    finally:
        context.close()


@pytest.mark.parametrize("path, box, limit, press", [
    ("heads?model=toy-gpt2", '[data-testid="stTextArea"] textarea', "ui", "Control+Enter"),
    ("softmax", '[data-testid="stTextInput"] input', "softmax", "Enter"),
    ("positional", '[data-testid="stTextArea"] textarea', "positional", "Control+Enter"),
], ids=["heads", "softmax", "positional"])
def test_a_text_over_the_limit_is_refused_with_a_message_not_dropped(server, browser, path, box, limit, press):
    """Pasting more than a text box takes: a browser keeps the old text without a word when the box has
    max_chars; the page must keep the new text and say what the limit is."""
    import importlib.util

    from attnviz.ui import MAX_TEXT_CHARS

    def page_constant(name, constant):
        spec = importlib.util.spec_from_file_location("p", ROOT / "app_pages" / f"{name}.py")
        source = spec.loader.get_source("p")
        line = next(x for x in source.splitlines() if x.startswith(f"{constant} ="))
        return int(line.split("=")[1].split("#")[0].strip().replace("_", ""))

    # the measured section of Positional takes as much text as the Heads page (it reads long texts from q and k)
    chars = {"ui": MAX_TEXT_CHARS, "softmax": None, "positional": MAX_TEXT_CHARS}[limit]
    if chars is None:
        chars = page_constant(limit, "MAX_CHARS")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{server}/{path}", wait_until="domcontentloaded")
        _wait_until_done(page, PAGE_TIMEOUT_S)
        if limit == "positional":  # the measured section is one choice of the page's section radio
            page.get_by_text("Measured on models", exact=True).click()
            _wait_until_done(page, PAGE_TIMEOUT_S)
        field = page.locator(box).first
        field.fill("a" * (chars + 1))
        field.press(press)
        _wait_until_done(page, PAGE_TIMEOUT_S)
        if limit == "positional":  # the measured section runs on its button
            page.get_by_role("button", name="Measure", exact=True).click()
            _wait_until_done(page, PAGE_TIMEOUT_S)
        alerts = " ".join(e.inner_text() for e in page.query_selector_all('[data-testid="stAlert"]'))
        assert f"{chars + 1:,} characters" in alerts and f"{chars:,}" in alerts, alerts
        assert len(field.input_value()) == chars + 1  # the pasted text is kept, not silently replaced
        assert not page.query_selector_all('[data-testid="stException"]')
    finally:
        context.close()


def test_an_instant_slider_redraws_its_chart_without_a_word_to_the_server(server, browser):
    """The Softmax page's logits chart carries every d_k in its own slider's frames: a click on a stop redraws it in
    the browser, in place, with that d_k's numbers (the library's attention rows, in the hover and in the pictures'
    colours; the pictures drawn are the ones a full redraw draws), and sends nothing to the server: no frame on
    Streamlit's websocket (/_stcore/stream), no request."""
    import numpy as np

    from attnviz import softmax as sm
    from attnviz.figures.common import ATTENTION_SCALE
    from attnviz.ui import softmax as ui_softmax
    from tests.test_figures_raster import QUANTUM, cell_colours, expected_colours

    context = browser.new_context(viewport={"width": 1400, "height": 1300})
    page = context.new_page()
    sent: list = []
    requests: list[str] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(payload))
            if "/_stcore/stream" in ws.url else None)
    page.on("request", lambda r: requests.append(r.url))
    rows = """g => g._fullData.filter(t => t.mode === 'lines' && t.line.width === 0 && t.customdata)
                             .map(t => Array.from(t.customdata))"""
    pictures = "g => Array.from(g.querySelectorAll('.layer-above image'), i => i.getAttribute('href'))"
    try:
        page.goto(f"{server}/softmax", wait_until="domcontentloaded")
        _wait_until_done(page, PAGE_TIMEOUT_S)
        chart = page.query_selector_all('[data-testid="stPlotlyChart"] .js-plotly-plot')[0]
        assert chart.evaluate("g => g.layout.sliders[0].currentvalue.prefix") == "d_k (in this chart) = "
        labels = [e.text_content() for e in chart.query_selector_all(".slider-label-group .slider-label")]
        assert labels == [str(d) for d in ui_softmax.DIMS]
        before = chart.evaluate(rows)
        time.sleep(1.0)  # the page is quiet: anything sent from here on is the slider's doing
        assert sent, "the listener saw none of the page's own messages to the server: it would see none at all"
        n_sent, n_requests = len(sent), len(requests)
        stop = chart.query_selector_all(".slider-label-group .slider-label")[labels.index("1024")]
        stop.scroll_into_view_if_needed()
        box = stop.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("g => g.layout.sliders[0].active === %d" % labels.index("1024"), arg=chart,
                               timeout=10_000)
        time.sleep(1.0)
        assert sent[n_sent:] == [], f"the in-chart slider sent {len(sent) - n_sent} websocket frames"
        assert requests[n_requests:] == [], requests[n_requests:]
        after = chart.evaluate(rows)
        assert after != before, "the chart's drawn data did not change"
        assert chart.evaluate("g => g.layout.sliders[0].steps.every(s => s.method === 'animate')")  # in place
        drawn = chart.evaluate(pictures)
        assert len(drawn) == 2, drawn
        # the page's defaults: 32 keys per query, seed 0, T = 1; the chart shows the first 12 rows of each variant
        q, k = sm.random_qk(ui_softmax.N_QUERIES, 32, 1024, 0)
        for scaled, hovered, picture in zip((True, False), after, drawn):
            pattern = sm.scores_and_pattern(q, k, scaled=scaled, temperature=1.0)[1]
            np.testing.assert_allclose(np.array(hovered, dtype=float), pattern[:12].ravel(), rtol=1e-12, atol=0)
            np.testing.assert_allclose(cell_colours({"source": picture}, (12, 32)),
                                       expected_colours(pattern[:12], ATTENTION_SCALE, 0.0, 1.0), atol=QUANTUM)
        assert "d_k (in this chart) = 1024" in chart.text_content()
        chart.evaluate("g => Plotly.redraw(g)")
        time.sleep(0.3)
        assert chart.evaluate(pictures) == drawn, "the pictures drawn in place differ from a full redraw's"
        assert not page.query_selector_all('[data-testid="stException"]')
    finally:
        context.close()


def test_a_slider_restyled_in_place_draws_what_a_full_redraw_draws(server, browser):
    """The Softmax T chart's frames change only its lines, so its in-chart slider restyles them without a full
    redraw (attnviz.figures.instant: redraw false). At three of its stops every line's drawn SVG path is the one
    Plotly.redraw then draws from the same data, and differs from the stop before."""
    paths = """g => Array.from(g.querySelectorAll('.scatterlayer .trace path')).map(p => p.getAttribute('d'))"""
    context = browser.new_context(viewport={"width": 1400, "height": 1300})
    page = context.new_page()
    try:
        page.goto(f"{server}/softmax", wait_until="domcontentloaded")
        _wait_until_done(page, PAGE_TIMEOUT_S)
        page.locator('[data-testid="stTabs"] [role="tab"]:visible').filter(has_text="Against d_k").first.click()
        _wait_until_done(page, PAGE_TIMEOUT_S)
        chart = next(c for c in page.query_selector_all('[data-testid="stPlotlyChart"] .js-plotly-plot') if c.evaluate(
            "g => (g.layout.sliders || []).some(s => s.currentvalue.prefix.startsWith('T (in this chart'))"))
        assert chart.evaluate("g => g.layout.sliders[0].steps.every(s => s.args[1].frame.redraw === false)")
        labels = chart.query_selector_all(".slider-label-group .slider-label")
        drawn = [chart.evaluate(paths)]
        for index in (0, len(labels) // 2, len(labels) - 1):
            stop = chart.query_selector_all(".slider-label-group .slider-label")[index]
            stop.scroll_into_view_if_needed()
            box = stop.bounding_box()
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.wait_for_function("g => g.layout.sliders[0].active === %d" % index, arg=chart, timeout=10_000)
            time.sleep(0.3)
            restyled = chart.evaluate(paths)
            chart.evaluate("g => Plotly.redraw(g)")
            time.sleep(0.3)
            assert restyled == chart.evaluate(paths), f"stop {index}: the lines drawn differ from a full redraw's"
            assert restyled != drawn[-1], f"stop {index}: the lines did not change"
            drawn.append(restyled)
        assert not page.query_selector_all('[data-testid="stException"]')
    finally:
        context.close()
