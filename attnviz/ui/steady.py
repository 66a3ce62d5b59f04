"""A view change that keeps the page as it was: no greying while a rerun draws the page again, a chart that keeps
the visitor's zoom when it is drawn again over the same axes, a chart drawn once rather than twice (sendable), and a
first table that does not wait for Streamlit's code (PRELOAD).

Streamlit greys every element of the last run that the running one has not drawn again yet (data-stale="true" on
its container; the opacity fades to a third from 0.5 s into a rerun). STEADY_CSS turns that off.

Streamlit draws a chart whose figure changed as a new chart: its element id hashes the figure's JSON, key or not
(st.plotly_chart: compute_and_register_element_id(..., key_as_main_identity=False, plotly_spec=...)), and the
browser mounts an element whose id changed afresh (React's key is the id), so plotly's own layout.uirevision never
comes into play. KEEP_ZOOM, in the browser, keeps each chart's zoomed axis ranges by its layout.uirevision (set by
same_axes to what defines the axes) and applies them to the next chart drawn with the same uirevision.

A mounted chart then gets plotly's `react` again on the same element with the JSON copy of the figure that
Streamlit's theme effect makes (with the width it measured, which plotly had already laid out). It changes nothing
drawn, but plotly computes every trace's and axis's defaults again and re-adds the frames: 0.02 s for the kernel's
step view on an idle machine, more on a loaded one. DRAW_ONCE, in the browser, wraps plotly's `react` and skips a
call that hands plotly the objects it last drew, or a figure equal, as JSON, to the one it was last handed or left
after drawing (width and height apart, when they are the ones plotly laid out). Once the copy is skipped, the
chart's update callback hands Streamlit plotly's own objects, and a third call brings them back: skipped too. A
restyle, relayout, update or animation of the chart forgets the draw, so a call after one always draws.
window.__attnvizDraws counts the calls drawn and skipped.

A browser tab fetches and compiles Streamlit's code for tables (its data grid, 0.5 MB) the first time it shows one:
the Experiments page's first switch to Knock-outs took 0.76-0.91 s for it, 0.51-0.69 s with that code loaded
before. PRELOAD loads it once per tab, 1.5 s after the tab's first page runs its scripts, when the tab is
idle. (Streamlit's own import also fetches the chunk's small stylesheet, which is not loaded ahead.)
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from attnviz.figures import one_draw

STEADY_CSS = ('<style>[data-testid="stElementContainer"][data-stale="true"] '
              '{opacity: 1 !important; transition: none !important;}</style>')

# Installed once per browser tab (window.__attnvizZoom). Per uirevision, the ranges of the axes the visitor zoomed
# (none kept after a double-click's autorange); a chart drawn with a kept uirevision gets them at once.
KEEP_ZOOM = """<script>(() => {
  if (window.__attnvizZoom) return;
  const kept = window.__attnvizZoom = new Map();
  const ranges = g => {
    const out = {};
    for (const [name, axis] of Object.entries(g._fullLayout || {})) {
      if (/^[xy]axis\\d*$/.test(name) && axis && !axis.autorange && Array.isArray(axis.range)) {
        out[`${name}.range`] = axis.range.slice();
      }
    }
    return out;
  };
  const hook = g => {
    g.__attnvizZoom = true;
    const revision = () => (g.layout || {}).uirevision;
    g.on('plotly_relayout', () => {
      if (revision() === undefined) return;
      const now = ranges(g);
      if (Object.keys(now).length) kept.set(revision(), now); else kept.delete(revision());
    });
    const zoom = revision() === undefined ? undefined : kept.get(revision());
    if (zoom && window.Plotly) window.Plotly.relayout(g, zoom);
  };
  const look = () => document.querySelectorAll('.js-plotly-plot').forEach(g => {
    if (!g.__attnvizZoom && g._fullLayout && typeof g.on === 'function') hook(g);
  });
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
  look();
})();</script>"""


# Installed once per browser tab, on plotly.js as Streamlit's chart code sets window.Plotly (or at once, if it is
# there already). A chart's fingerprint: its traces, its layout but width and height, its frames' count, as JSON (a
# typed array gives none). A call is skipped when nothing forgot the chart's last draw, its config and size are the
# same, and it hands plotly the very objects it drew, or a figure whose fingerprint is the one plotly was handed then
# or the one it left after drawing.
DRAW_ONCE = """<script>(() => {
  if (window.__attnvizDraws) return;
  const counts = window.__attnvizDraws = {drawn: 0, skipped: 0};
  const SIZE = ['width', 'height'];
  const CHANGES = ['plotly_restyle', 'plotly_relayout', 'plotly_update', 'plotly_animated', 'plotly_redraw'];
  const plain = (k, v) => { if (ArrayBuffer.isView(v)) throw new TypeError('typed array'); return v; };
  const print = (data, layout, frames) => {
    try {
      return JSON.stringify([data, {...layout, width: undefined, height: undefined}, (frames || []).length], plain);
    } catch (e) { return undefined; }
  };
  const forget = g => { g.__attnvizLast = undefined; };
  const listen = g => {
    if (g.__attnvizForgets || typeof g.on !== 'function') return;
    g.__attnvizForgets = true;
    for (const change of CHANGES) g.on(change, () => forget(g));
  };
  const sameSize = (g, layout) => SIZE.every(
    k => layout[k] === undefined || layout[k] === g.layout[k] || layout[k] === (g._fullLayout || {})[k]);
  const unchanged = (g, fig) => {
    const last = g.__attnvizLast;
    if (!last || last.config !== fig.config || !sameSize(g, fig.layout)) return false;
    if (fig.data === last.data && fig.layout === last.layout && (fig.frames || []).length === last.frames) return true;
    const now = print(fig.data, fig.layout, fig.frames);
    return now !== undefined && (now === last.asked || now === last.drawn);
  };
  const wrap = P => {
    if (!P || P.__attnvizDrawOnce || typeof P.react !== 'function') return;
    P.__attnvizDrawOnce = true;
    const react = P.react;
    P.react = function (g, fig, ...rest) {
      const asFigure = g instanceof HTMLElement && fig && Array.isArray(fig.data) && fig.layout && !rest.length;
      if (asFigure && unchanged(g, fig)) {
        counts.skipped += 1;
        for (const k of SIZE) if (fig.layout[k] !== undefined) g.layout[k] = fig.layout[k];
        return Promise.resolve(g);
      }
      counts.drawn += 1;
      if (g instanceof HTMLElement) forget(g);
      const asked = asFigure ? print(fig.data, fig.layout, fig.frames) : undefined;
      const out = react.call(this, g, fig, ...rest);
      if (!asFigure) return out;
      return Promise.resolve(out).then(drawn => {
        listen(g);
        const frames = (g._transitionData && g._transitionData._frames) || [];
        g.__attnvizLast = {asked, drawn: print(g.data, g.layout, frames), data: g.data, layout: g.layout,
                           frames: frames.length, config: fig.config};
        return drawn;
      });
    };
  };
  if (window.Plotly) { wrap(window.Plotly); return; }
  let plotly;
  Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true,
    get: () => plotly, set: value => { plotly = value; wrap(value); }});
})();</script>"""


# Streamlit's chunks of browser code that PRELOAD loads ahead (each a file <name>.<hash>.js next to its index.js)
PRELOADED = ("DataFrame",)

# Installed once per browser tab: 1.5 s after it, when the tab is idle, each chunk is imported from beside Streamlit's
# own index.js (the URL Streamlit itself imports it from, so the module is fetched and compiled once);
# window.__attnvizPreload holds each import's promise (the chunk's name once loaded, undefined if it failed).
PRELOAD = """<script>(() => {
  if (window.__attnvizPreload) return;
  const loads = window.__attnvizPreload = [];
  const index = [...document.querySelectorAll('script[type="module"][src]')]
    .find(s => /[/]index[.][^/]*[.]js$/.test(s.src));
  if (!index) return;
  const load = () => {
    for (const chunk of CHUNKS) {
      loads.push(import(new URL(chunk, index.src).href).then(() => chunk, () => undefined));
    }
  };
  const idle = window.requestIdleCallback || (f => setTimeout(f, 0));
  setTimeout(() => idle(load, {timeout: 5000}), 1500);
})();</script>"""


@cache
def preloaded_chunks() -> tuple[str, ...]:
    """The file names of PRELOADED's chunks in the installed Streamlit's static folder (none where it has none)."""
    folder = Path(st.__file__).parent / "static" / "static" / "js"
    return tuple(sorted(path.name for name in PRELOADED for path in folder.glob(f"{name}.*.js")))


def steady_reruns() -> None:
    """Once per page run: no greying while a rerun draws the page again (STEADY_CSS: a style alone takes no room on
    the page); zoom kept across reruns for charts marked by same_axes (KEEP_ZOOM), a mounted chart drawn by plotly
    once (DRAW_ONCE) and Streamlit's table code loaded ahead (PRELOAD), scripts in the sidebar, where their empty
    element takes no room from the page."""
    st.html(STEADY_CSS)
    preload = PRELOAD.replace("CHUNKS", json.dumps(list(preloaded_chunks())))
    st.sidebar.html(KEEP_ZOOM + DRAW_ONCE + preload, unsafe_allow_javascript=True)


def same_axes(fig, *what):
    """The figure, its layout.uirevision set from `what` (what defines its axes: the kind of chart, the model, the
    text, ...), so that a zoom the visitor made is kept when a rerun draws a chart over the same axes (KEEP_ZOOM).
    For a figure about to be cached: it changes the figure."""
    fig.layout.uirevision = hashlib.blake2b(repr(what).encode(), digest_size=8).hexdigest()
    return fig


class _Sent(go.Figure):
    """A figure whose to_dict is a spec written beforehand (one_draw.spec): st.plotly_chart sends a figure's
    to_dict as it is (to_json with validate=False), where a dict it is given is built into a Figure again (and takes
    plotly's default template back)."""

    def __init__(self, spec: dict):  # plotly's own __init__ is not run: it builds an empty figure with its template
        self._spec = spec  # (a millisecond a chart, on every rerun), and st.plotly_chart reads to_dict() alone

    def to_dict(self):
        return self._spec


def sendable(fig) -> tuple:
    """(what to hand st.plotly_chart, its theme) so that the browser draws the chart once (one_draw): a figure of
    at most one_draw.LIST_LIMIT numbers, with the light theme, goes as one_draw.spec with theme None; any other as it
    is, with Streamlit's theme (drawn twice)."""
    if _dark() or not isinstance(fig, go.Figure) or not one_draw.listed(fig):
        return fig, "streamlit"
    return _Sent(one_draw.spec(fig)), None


def _dark() -> bool:
    """Whether the visitor's browser shows the dark theme (a choice in Streamlit's settings menu; the app's own is
    light): one_draw writes the light theme's colours, so a dark page gets Streamlit's theme instead."""
    return getattr(st.context.theme, "type", None) == "dark"
