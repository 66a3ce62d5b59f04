"""In a real browser (Debian's Chromium driven by playwright, Streamlit on 127.0.0.1, the app's light theme): each
figure of tests/test_one_draw.py drawn twice on one page, once as Streamlit draws a plotly figure (its chart theme)
and once by ui.plot (attnviz.figures.one_draw). ui.plot's chart is drawn once where Streamlit's is drawn twice, and
plotly.js lays both out alike: the oracle is plotly.js itself, with Streamlit's own theme applied to the figure."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.latency.charts import chart_sliders, click_stop  # noqa: E402

pytestmark = pytest.mark.browser

APP = f"""import sys
sys.path.insert(0, {str(ROOT)!r})
import streamlit as st
from attnviz import ui
from tests.test_one_draw import FIGURES
for name, build in FIGURES.items():
    st.plotly_chart(build(), key="theme-" + name)
    ui.plot(build(), key="one-" + name)
"""
# Every full draw of each chart (plotly's _doPlot announces itself with plotly_beforeplot), counted by the chart's
# Streamlit key: plotly's event emitter is hooked as plotly sets it up on the chart's element, before its first draw.
COUNT_DRAWS = """(() => {
  window.__draws = {};
  Object.defineProperty(HTMLDivElement.prototype, 'emit', {configurable: true, set(fn) {
    const gd = this;
    Object.defineProperty(gd, 'emit', {configurable: true, writable: true, value: fn});
    gd._ev.on('plotly_beforeplot', () => {
      const holder = gd.closest('[class*="st-key-"]') || {classList: []};
      const key = [...holder.classList].find(c => c.startsWith('st-key-'));
      window.__draws[key] = (window.__draws[key] || 0) + 1;
    });
  }});
})();"""
# What plotly.js made of a chart: its full layout and traces, without plotly's private keys (and the template, a
# layout of its own) and with typed arrays as arrays; an axis's range as drawn (plotly's _rl: a react that finds
# nothing to redraw leaves an autoranged axis's full-layout range at its default, and zooms from _rl).
FULL = """g => {
  const plain = (o, depth) => {
    if (o === null || typeof o !== 'object') return o;
    if (ArrayBuffer.isView(o)) return Array.from(o);
    if (depth > 8) return '...';
    if (Array.isArray(o)) return o.map(v => plain(v, depth + 1));
    const out = {};
    for (const [k, v] of Object.entries(o)) {
      if (k === 'range' && Array.isArray(o._rl)) out[k] = o._rl.slice();
      else if (!k.startsWith('_') && typeof v !== 'function' && k !== 'template') out[k] = plain(v, depth + 1);
    }
    return out;
  };
  return {layout: plain(g._fullLayout, 0), data: g._fullData.map(t => plain(t, 0))};
}"""
# Where the two may differ, by design or by plotly: the traces' random uids; one_draw's datarevision; the title,
# which Streamlit's theme makes bold by wrapping its text in <b> (twice: once per draw) and one_draw by its font's
# weight; an axis's tick0 and dtick, which plotly.js keeps from the draw before under tickmode "auto" (its own diff
# skips them then). And one colour written two ways: Streamlit's "transparent", one_draw's rgba (plotly.py refuses
# the word).
IGNORED = {"uid", "datarevision", "tick0", "dtick"}
SAME = {"transparent", "rgba(0, 0, 0, 0)"}


def _differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted((set(a) | set(b)) - IGNORED):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'one draw' if key in b else 'Streamlit theme'}")
            else:
                out += _differences(a[key], b[key], f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    same = a == b or (isinstance(a, str) and isinstance(b, str) and {a, b} == SAME)
    return [] if same else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    from benchmarks.latency.idle import COUNT_MESSAGES, settle
    from tests.servers import streamlit_server

    script = tmp_path_factory.mktemp("one_draw") / "pairs.py"
    script.write_text(APP)
    with streamlit_server([sys.executable, "-m", "streamlit", "run", str(script)]) as (url, _):
        context = browser.new_context(viewport={"width": 1400, "height": 4000})
        for init in (COUNT_MESSAGES, COUNT_DRAWS):
            context.add_init_script(init)
        tab = context.new_page()
        tab.goto(url)
        tab.wait_for_selector('.st-key-one-frames .js-plotly-plot', timeout=120_000)
        settle(tab, 120)
        time.sleep(1.0)
        try:
            yield tab
        finally:
            context.close()


@pytest.mark.parametrize("name", ["panels", "heat", "shared", "frames", "steps"])
def test_drawn_once_and_laid_out_as_streamlit_lays_it_out(page, name):
    draws = page.evaluate("window.__draws")
    assert draws.get(f"st-key-one-{name}") == 1, draws
    assert draws.get(f"st-key-theme-{name}") == 2, f"Streamlit's own way no longer draws twice: {draws}"
    theme = page.eval_on_selector(f".st-key-theme-{name} .js-plotly-plot", FULL)
    one = page.eval_on_selector(f".st-key-one-{name} .js-plotly-plot", FULL)
    title_theme, title_one = theme["layout"].pop("title"), one["layout"].pop("title")
    assert title_theme.pop("text").replace("<b>", "").replace("</b>", "") == title_one.pop("text")
    assert title_theme["font"].pop("weight") == 400 and title_one["font"].pop("weight") == 700
    assert _differences(title_theme, title_one) == []
    assert _differences(theme, one) == []


def test_an_in_chart_slider_still_switches_frames_in_the_browser(page):
    """The frames chart's stop "3" draws y = 3x, with no message to the server."""
    slider = next(s for s in chart_sliders(page) if s.chart == 7)  # the eighth chart: ui.plot's frames figure
    _, sent = click_stop(page, slider, 2)
    assert sent == 0
    y = page.eval_on_selector(".st-key-one-frames .js-plotly-plot", "g => Array.from(g._fullData[0].y)")
    assert y == [0.0, 3.0, 6.0, 9.0, 12.0]


def test_an_in_chart_slider_updates_both_ways_alike(page):
    """The steps chart's stop "3" (a plotly.update of its values, colour bar title and axis title, leaf by leaf)
    draws the map times 3, and plotly.js lays out the one-draw chart as Streamlit's themed one, with no message to
    the server."""
    for chart in (8, 9):  # Streamlit's way, then ui.plot's
        slider = next(s for s in chart_sliders(page) if s.chart == chart)
        _, sent = click_stop(page, slider, 2)
        assert sent == 0
    theme = page.eval_on_selector(".st-key-theme-steps .js-plotly-plot", FULL)
    one = page.eval_on_selector(".st-key-one-steps .js-plotly-plot", FULL)
    assert one["data"][0]["z"] == [[3.0 * (4 * r + c) for c in range(4)] for r in range(3)]
    assert one["layout"]["xaxis"]["title"]["text"] == "key (x3)"
    for full in (theme, one):
        full["layout"].pop("title")
    assert _differences(theme, one) == []
