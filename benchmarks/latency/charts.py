"""The sliders plotly draws inside a chart (attnviz.figures.instant: frames or trace groups switched in the browser),
found in the page's DOM, and one timed click on a stop of each (benchmarks/browser_latency.py prints them apart from
the Streamlit widgets, against their own goal: 0.1 s, and no message to the server)."""

from __future__ import annotations

from dataclasses import dataclass

# Every drawn plotly chart's sliders, in page order: (chart's position among the drawn charts, its title, slider
# index, the slider's current-value prefix, the number of stops, the active stop).
FIND = """() => {
    const out = [];
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')];
    charts.forEach((g, c) => {
        if (!g.getClientRects().length || !g.layout) return;
        const named = (g.layout.title || {}).text || ((g.layout.annotations || [])[0] || {}).text || '';
        const title = named.replace(/<[^>]+>/g, '').slice(0, 60);  // a chart of panels: its first panel's title
        (g.layout.sliders || []).forEach((s, i) => out.push({chart: c, title, slider: i,
            prefix: ((s.currentvalue || {}).prefix || '').replace(/ \\(in this chart.*$/, '').replace(/ = $/, ''),
            stops: s.steps.length, active: s.active || 0}));
    });
    return out;
}"""

# Arms the chart for one timed click: the moment plotly has applied the step (its animate or update event) and the
# browser has painted once after it, by the browser's clock.
ARM = """g => {
    window.__chartDone = null;
    if (!g.__timedSlider) {
        const done = () => requestAnimationFrame(() => {
            if (window.__chartDone === null) window.__chartDone = performance.now();
        });
        for (const ev of ['plotly_animated', 'plotly_update', 'plotly_restyle']) g.on(ev, done);
        g.__timedSlider = true;
    }
}"""


@dataclass(frozen=True)
class ChartSlider:
    chart: int
    title: str
    slider: int
    prefix: str
    stops: int
    active: int

    @property
    def ident(self) -> str:
        return f"chart:{self.title}:{self.slider}:{self.prefix}"

    @property
    def name(self) -> str:
        return f"{self.prefix} (in-chart slider of “{self.title or 'untitled chart'}”, {self.stops} stops)"


def chart_sliders(page) -> list[ChartSlider]:
    return [ChartSlider(**s) for s in page.evaluate(FIND)]


def click_stop(page, slider: ChartSlider, step: int, timeout_s: float = 10.0) -> tuple[float, int]:
    """Clicks stop `step` of the slider as a person would (on its label; a slider of many stops draws them
    transparent) and returns (seconds from the pointerdown to the first paint after plotly applied it, websocket
    messages the page sent meanwhile)."""
    chart = page.query_selector_all('[data-testid="stPlotlyChart"] .js-plotly-plot')[slider.chart]
    chart.evaluate(ARM)
    # plotly draws a chart's sliders in an order of its own: each is found by the value it shows ("<prefix> (in
    # this chart) = ...")
    groups = [g for g in chart.query_selector_all(".slider-group")
              if (g.query_selector(".slider-label").text_content() or "").startswith(f"{slider.prefix} (")]
    if not groups:
        raise LookupError(f"no slider showing {slider.prefix!r} in the chart")
    group = groups[0]
    label = group.query_selector_all(".slider-label-group")[step]
    label.scroll_into_view_if_needed()
    box = label.bounding_box()
    sent = page.evaluate("window.__sent || 0")
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => window.__chartDone !== null", timeout=timeout_s * 1000)
    page.wait_for_timeout(300)  # anything the click made the page send to the server would go out by now
    done, pressed, after = page.evaluate("[window.__chartDone, window.__input, window.__sent || 0]")
    return (done - pressed) / 1000.0, after - sent


def next_stop(slider: ChartSlider, seen: set[int], current: int) -> int:
    """A stop not clicked yet (the one after the current, wrapping), else the next one."""
    for offset in range(1, slider.stops):
        step = (current + offset) % slider.stops
        if step not in seen:
            return step
    return (current + 1) % slider.stops
