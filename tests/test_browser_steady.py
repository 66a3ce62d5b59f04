"""A view change on the Heads page in a real browser (Debian's Chromium driven by playwright, Streamlit on
127.0.0.1): the One head map keeps the visitor's zoom across a head change and a boost toggle, forgets it after a
double-click's reset, and no element of the page is greyed while the rerun draws it again; a chart mounted anew is
drawn by plotly once, at the width it is shown at, and a call that changes anything still draws; Streamlit's
table code is loaded ahead while no table is shown (attnviz.ui.steady)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.latency.idle import wait_idle, watch  # noqa: E402
from benchmarks.latency.widgets import discover, move  # noqa: E402

pytestmark = pytest.mark.browser

# Every animation frame while it runs: how many element containers are stale (drawn by the last run, not yet by
# this one), and each stale one whose opacity is below 1 or is fading (an opacity transition, running or waiting
# for its delay: Streamlit's greying starts 0.5 s into a rerun, so a fast rerun would hide it from opacity alone).
SAMPLE = """() => {
    const seen = window.__stale = {frames: 0, staleFrames: 0, greyed: []};
    window.__sampling = true;
    const tick = () => {
        if (!window.__sampling) return;
        seen.frames += 1;
        const stale = document.querySelectorAll('[data-testid="stElementContainer"][data-stale="true"]');
        if (stale.length) seen.staleFrames += 1;
        for (const e of stale) {
            const fading = e.getAnimations().some(a => a.transitionProperty === 'opacity');
            const opacity = getComputedStyle(e).opacity;
            if (opacity !== '1' || fading) seen.greyed.push(`${e.innerText.slice(0, 40)}: ${opacity}`);
        }
        requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
}"""
STOP = "() => { window.__sampling = false; return window.__stale; }"
# A slow link, in the tab: while window.__slowSocketMs is set, each message from the server reaches the page that
# many ms after the one before it. A rerun then spans many frames on any machine, so the sampler sees the page
# while the rerun draws it (on a fast machine a cached rerun's messages can all arrive between two frames).
SLOW_SOCKET = """(() => {
    const add = WebSocket.prototype.addEventListener;
    WebSocket.prototype.addEventListener = function (type, listener, options) {
        if (type !== 'message') return add.call(this, type, listener, options);
        let last = 0, pending = 0;
        return add.call(this, type, event => {
            const ms = window.__slowSocketMs || 0, now = performance.now();
            if (!ms && !pending) return listener.call(this, event);
            last = Math.max(now, last) + ms;
            pending += 1;
            setTimeout(() => { pending -= 1; listener.call(this, event); }, last - now);
        }, options);
    };
})();"""
SLOW_MS = 25
MAP = '[data-testid="stPlotlyChart"] .js-plotly-plot'
RANGES = "g => [g._fullLayout.xaxis.range.slice(), g._fullLayout.yaxis.range.slice(), g.layout.title.text]"
# What the first map shows: its title and its colour bar's title (the boost changes only the latter).
DRAWN = f"""() => {{
    const g = document.querySelector('{MAP}');
    return g ? g.layout.title.text + ' | ' + (g.querySelector('.cbtitle')?.textContent || '') : '';
}}"""


@pytest.fixture(scope="module")
def page(browser):
    """The Heads page on toy-gpt2's default text, its One head tab open by the link."""
    from tests.servers import watched_page

    with watched_page(browser, "heads?model=toy-gpt2&layer=0&head=0&boost=0&tab=head", 240, (SLOW_SOCKET,)) as tab:
        yield tab


def _map(page):
    charts = page.query_selector_all(MAP)
    assert charts, "the One head map is not drawn"
    return charts[0]


def _change(page, key: str) -> dict:
    """Moves the widget `key` to another value as a person would, waits until the page is idle and the map drawn
    anew (on a loaded machine the rerun may start after the page first looks idle), and returns what the sampler
    saw during the rerun, its messages slowed by SLOW_SOCKET."""
    before = page.evaluate(DRAWN)
    page.evaluate(f"window.__slowSocketMs = {SLOW_MS}")
    page.evaluate(SAMPLE)
    widget = next(w for w in discover(page) if w.key == key)
    watch(page)
    move(page, widget, set())
    wait_idle(page, time.perf_counter(), 120)
    page.wait_for_function(f"before => ({DRAWN})() !== before", arg=before, timeout=120_000)
    wait_idle(page, time.perf_counter(), 120)
    page.evaluate("window.__slowSocketMs = 0")
    return page.evaluate(STOP)


def _zoom(page) -> None:
    """Drags a box over the map's upper-left part: plotly zooms both axes to it."""
    box = _map(page).query_selector(".nsewdrag").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.15, box["y"] + box["height"] * 0.15)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.5, steps=8)
    page.mouse.up()
    page.wait_for_timeout(300)


def test_a_view_change_keeps_the_zoom_and_greys_nothing(page):
    whole_x, whole_y, title = _map(page).evaluate(RANGES)
    assert "Layer 0, head 0" in title
    _zoom(page)
    zoom_x, zoom_y, _ = _map(page).evaluate(RANGES)
    assert zoom_x[1] - zoom_x[0] < 0.6 * (whole_x[1] - whole_x[0]), "the drag did not zoom the map"
    for key, drawn in (("heads_head", "Layer 0, head 1"), ("heads_gamma", "Layer 0, head 1")):
        seen = _change(page, key)
        x, y, title = _map(page).evaluate(RANGES)
        assert drawn in title, f"after {key}: {title}"  # a new map was drawn (the head's, or with the boost)
        assert x == pytest.approx(zoom_x) and y == pytest.approx(zoom_y), f"{key} lost the zoom: {x}, {y}"
        assert seen["staleFrames"] > 0, f"no frame saw a stale element during the rerun: {seen}"
        assert seen["greyed"] == [], f"{key}: elements greyed during the rerun: {seen['greyed'][:5]}"


def test_a_reset_zoom_is_not_brought_back(page):
    _zoom(page)
    box = _map(page).query_selector(".nsewdrag").bounding_box()
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # plotly's autorange
    page.wait_for_timeout(500)
    whole_x, whole_y, _ = _map(page).evaluate(RANGES)
    _change(page, "heads_head")
    x, y, title = _map(page).evaluate(RANGES)
    assert "head 0" in title or "head 2" in title
    assert x == pytest.approx(whole_x) and y == pytest.approx(whole_y)


DRAWS = "() => ({...window.__attnvizDraws})"
# The map's width as plotly laid it out, as its layout asks for it, and as its element is shown.
WIDTHS = "g => [g._fullLayout.width, g.layout.width, Math.round(g.getBoundingClientRect().width)]"


def test_a_mounted_chart_is_drawn_once_at_the_width_it_is_shown_at(page):
    before = page.evaluate(DRAWS)
    _change(page, "heads_head")
    after = page.evaluate(DRAWS)
    drawn, skipped = after["drawn"] - before["drawn"], after["skipped"] - before["skipped"]
    assert drawn >= 1, f"no chart was drawn anew: {before} -> {after}"
    assert skipped >= drawn, f"Streamlit's calls that change nothing were drawn: {before} -> {after}"
    laid_out, asked, shown = _map(page).evaluate(WIDTHS)
    assert laid_out == asked and abs(laid_out - shown) <= 1 and shown > 500, (laid_out, asked, shown)

    page.set_viewport_size({"width": 1100, "height": 1300})  # a new width: Streamlit asks plotly for it
    try:
        page.wait_for_function(f"() => {{ const [a, b, c] = ({WIDTHS})(document.querySelector('{MAP}')); "
                               "return a === b && Math.abs(b - c) <= 1 && c < " + str(shown - 100) + "; }",
                               timeout=30_000)
        assert page.evaluate(DRAWS)["drawn"] > after["drawn"]
    finally:
        page.set_viewport_size({"width": 1400, "height": 1300})
        page.wait_for_function(f"() => ({WIDTHS})(document.querySelector('{MAP}'))[0] === {laid_out}",
                               timeout=30_000)


# On the map as drawn: the same figure again is skipped; after a zoom (a relayout), or with another title, it is
# drawn, and the title is the new one. It leaves the map zoomed and retitled: the file's last test.
CALLS = """async () => {
    const g = document.querySelector('%s'), counts = window.__attnvizDraws;
    const again = async layout => {
        const before = {...counts};
        await window.Plotly.react(g, {data: g.data, layout, config: (g.__attnvizLast || {}).config, frames: undefined});
        return [counts.drawn - before.drawn, counts.skipped - before.skipped];
    };
    const copy = () => JSON.parse(JSON.stringify(g.layout));
    const same = await again(copy());
    await window.Plotly.relayout(g, {'xaxis.range': [0, 2]});
    const afterZoom = await again(copy());
    const retitled = await again({...copy(), title: {text: 'another title'}});
    return {same, afterZoom, retitled, title: g._fullLayout.title.text};
}""" % MAP


def test_only_a_call_that_changes_nothing_is_skipped(page):
    seen = page.evaluate(CALLS)
    assert seen["same"] == [0, 1], seen
    assert seen["afterZoom"] == [1, 0], seen
    assert seen["retitled"] == [1, 0] and seen["title"] == "another title", seen


def test_streamlits_table_code_is_loaded_ahead_when_the_tab_is_idle(page):
    """PRELOAD: the tab has imported Streamlit's data-grid chunk, from where Streamlit's own code imports it, with no
    table on the page (a first table then does not wait for its code)."""
    from attnviz.ui.steady import preloaded_chunks

    chunks = preloaded_chunks()
    assert len(chunks) == 1 and chunks[0].startswith("DataFrame."), chunks  # a Streamlit that renamed it fails here
    page.wait_for_function("(window.__attnvizPreload || []).length > 0", timeout=60_000)
    assert page.evaluate("Promise.all(window.__attnvizPreload)") == list(chunks)
    fetched = page.evaluate("performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)")
    assert f"/static/js/{chunks[0]}" in fetched, [f for f in fetched if f.endswith(".js")][-20:]
    assert page.locator('[data-testid="stDataFrame"]').count() == 0  # loaded ahead, not for a table shown
