"""A view change that keeps the page as it was: no greying while a rerun draws the page again, and a chart that
keeps the visitor's zoom when it is drawn again over the same axes.

Streamlit greys every element of the last run that the running one has not drawn again yet (data-stale="true" on
its container; the opacity fades to a third from 0.5 s into a rerun). STEADY_CSS turns that off.

Streamlit draws a chart whose figure changed as a new chart: its element id hashes the figure's JSON, key or not
(st.plotly_chart: compute_and_register_element_id(..., key_as_main_identity=False, plotly_spec=...)), and the
browser mounts an element whose id changed afresh (React's key is the id), so plotly's own layout.uirevision never
comes into play. KEEP_ZOOM, in the browser, keeps each chart's zoomed axis ranges by its layout.uirevision (set by
same_axes to what defines the axes) and applies them to the next chart drawn with the same uirevision.
"""

from __future__ import annotations

import hashlib

import streamlit as st

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


def steady_reruns() -> None:
    """Once per page run: no greying while a rerun draws the page again (STEADY_CSS: a style alone takes no room on
    the page), and zoom kept across reruns for charts marked by same_axes (KEEP_ZOOM, in the sidebar, where its
    empty element takes no room from the page)."""
    st.html(STEADY_CSS)
    st.sidebar.html(KEEP_ZOOM, unsafe_allow_javascript=True)


def same_axes(fig, *what):
    """The figure, its layout.uirevision set from `what` (what defines its axes: the kind of chart, the model, the
    text, ...), so that a zoom the visitor made is kept when a rerun draws a chart over the same axes (KEEP_ZOOM).
    For a figure about to be cached: it changes the figure."""
    fig.layout.uirevision = hashlib.blake2b(repr(what).encode(), digest_size=8).hexdigest()
    return fig
