"""A figure as the page sends it so that the browser draws it once, not twice.

Streamlit mounts every chart whose figure changed afresh, draws it, then hands plotly a JSON copy of it (its chart
theme's effect, run on mount); plotly's `react` compares the copy with what it drew and draws it all again when it
finds a change. It always finds two: the layout's `template` (an attribute of type "any": a new object is a change)
and the traces' arrays (numpy arrays travel as typed arrays, never equal to a new copy; without a
`layout.datarevision`, plotly compares every array by identity). docs/measured.md, "Two draws for every new chart".

`spec` writes the figure so that the copy compares equal: no template (plotly_white's layout and trace defaults,
with Streamlit's chart theme for this app's light theme on top, written into the figure's own layout and traces,
as plotly.js would apply them), every array of the traces and layout as a plain list, and a fixed `datarevision`.
The page sends it with `theme=None` (ui.plot). A list costs more to write than a typed array (JSON numbers against
base64), so a figure with more numbers than LIST_LIMIT is sent as it is, and drawn twice.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from attnviz.figures import typed_arrays
from attnviz.figures.common import TEMPLATE

# Numbers in a figure's arrays, at most, for it to go as lists. Measured on a 2-core machine for a heatmap: written as
# lists, 10,000 numbers cost 5 ms more Python than as typed arrays and saved 22 ms of drawing; 29,000 cost 18 ms and
# saved 16; 60,000 cost 33 ms and saved none (a heatmap's second draw is cheap; a chart of many panels, shapes and
# labels, the kind that draws slowly, has few numbers).
LIST_LIMIT = 20_000
DATAREVISION = "attnviz"  # any fixed value: the arrays are compared by it, and a changed figure is a new chart
_FONT = '"Source Sans", sans-serif'
_TEXT, _GRID = "#808495", "#e6eaf1"
_CLEAR = "rgba(0, 0, 0, 0)"  # Streamlit's "transparent", which plotly.py does not take

# What Streamlit's chart theme writes over the template's layout for the light theme of .streamlit/config.toml,
# read from a chart it drew (its values not used by these figures' kinds, ternary and range selectors, left out).
STREAMLIT_LIGHT = {
    "font": {"color": _TEXT, "family": _FONT, "size": 12, "weight": 400},
    "hoverlabel": {"bgcolor": "#ffffff", "bordercolor": "rgba(31, 35, 48, 0.2)",
                   "font": {"color": _TEXT, "family": _FONT, "size": 12}},
    "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
    "coloraxis": {"colorbar": {"outlinewidth": 8, "thickness": 16, "xpad": 24, "ticklabelposition": "outside",
                               "outlinecolor": _CLEAR, "len": 0.75, "y": 0.5745,
                               "title": {"font": {"color": _TEXT, "size": 14}},
                               "tickfont": {"color": _TEXT, "size": 12}}},
    "xaxis": {"gridcolor": _GRID, "title": {"standoff": 20, "font": {"color": _TEXT, "size": 14}},
              "zerolinecolor": _GRID, "showgrid": False, "tickfont": {"color": _TEXT, "size": 12},
              "tickcolor": _GRID, "minor": {"gridcolor": _GRID}, "zeroline": False},
    "yaxis": {"gridcolor": _GRID, "title": {"standoff": 24, "font": {"color": _TEXT, "size": 14}},
              "zerolinecolor": _GRID, "ticklabelposition": "outside", "tickcolor": _GRID,
              "tickfont": {"color": _TEXT, "size": 12}, "minor": {"gridcolor": _GRID}},
    "title": {"x": 0, "font": {"family": _FONT, "size": 16, "color": "#1f2330", "weight": 700}, "pad": {"l": 4},
              "xanchor": "left"},  # Streamlit's theme makes a title bold by wrapping its text in <b>
    "legend": {"title": {"font": {"size": 12, "color": _TEXT}, "side": "top"}, "valign": "top",
               "bordercolor": _CLEAR, "borderwidth": 0, "font": {"size": 12, "color": "#262730"}},
    "margin": {"pad": 8, "r": 0, "l": 0},
}
_ARRAYS_OF = {"annotations": "annotationdefaults", "shapes": "shapedefaults", "images": "imagedefaults",
              "sliders": "sliderdefaults", "updatemenus": "updatemenudefaults", "selections": "selectiondefaults"}
_SUBPLOTS = ("xaxis", "yaxis", "coloraxis")
_NOT_CARTESIAN = ("polar", "ternary", "scene", "geo", "mapbox", "map", "smith")  # subplots no figure here has
# plotly.js turns an axis feature on when its colour or width is set in the figure itself but not when the template
# sets them (Lib.coerce2): each flag below, with the attributes that turn it on, its value when none is set in the
# figure (a cartesian axis) and when one is. Written with the template's colours, the flag is written too.
_SHOWN_BY = (("showline", ("linecolor", "linewidth"), False, True),
             ("showgrid", ("gridcolor", "gridwidth", "griddash"), True, True),
             ("zeroline", ("zerolinecolor", "zerolinewidth", "zerolinelayer"), True, True),
             ("ticks", ("ticklen", "tickwidth", "tickcolor"), "", "outside"))


def numbers(fig: go.Figure) -> int:
    """How many numbers the figure's traces and layout hold in arrays (what sending them as lists costs)."""
    return _count(fig._data) + _count(fig._layout)


def listed(fig: go.Figure) -> bool:
    """Whether the page sends the figure as its spec (lists, drawn once) rather than as it is: at most LIST_LIMIT
    numbers."""
    return numbers(fig) <= LIST_LIMIT


def _count(value) -> int:
    if isinstance(value, np.ndarray):
        return value.size
    if isinstance(value, Mapping):
        return sum(_count(v) for k, v in value.items() if k != "template")
    if isinstance(value, (list, tuple)):
        return len(value) if value and not isinstance(value[0], (Mapping, list, tuple, np.ndarray)) \
            else sum(_count(v) for v in value)
    return 0


def spec(fig: go.Figure) -> dict:
    """The figure as one draw needs it ({"data", "layout"[, "frames"]}, plain JSON values): the house template and
    Streamlit's light chart theme written into its layout and traces, no template, arrays as lists, a fixed
    datarevision; frames as plotly writes them (animate does not compare them)."""
    theme_layout, trace_defaults = _theme(TEMPLATE)
    layout = _listed({k: v for k, v in fig._layout.items() if k != "template"})
    data = [_listed(trace) for trace in fig._data]
    out = {"data": [_merged(trace_defaults.get(trace.get("type", "scatter"), {}), trace) for trace in data],
           "layout": _themed_layout(layout, theme_layout, data)}
    if fig._frame_objs:  # written by instant._set_frames already: copied, any array left written as plotly writes it
        out["frames"] = typed_arrays.written([frame._props for frame in fig._frame_objs])
    return out


def _themed_layout(layout: dict, theme: dict, data: list[dict]) -> dict:
    """layout over the theme's layout, as plotly.js applies a template: the theme's xaxis / yaxis / coloraxis to
    every axis of the kind the figure has (its traces' too), its *defaults to every item of the array they name."""
    out = {k: v for k, v in theme.items() if k not in _SUBPLOTS and not k.endswith("defaults")}
    for key, value in layout.items():
        base = key.rstrip("0123456789")
        if base in ("xaxis", "yaxis"):
            out[key] = _axis(theme.get(base, {}), value)
        elif base in _SUBPLOTS:
            out[key] = _merged(theme.get(base, {}), value)
        elif key in _ARRAYS_OF and isinstance(value, list):
            out[key] = [_merged(theme.get(_ARRAYS_OF[key], {}), item) for item in value]
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    for trace in data:
        for kind, ref in (("xaxis", trace.get("xaxis", "x")), ("yaxis", trace.get("yaxis", "y"))):
            name = kind + str(ref)[1:]
            if name not in out:
                out[name] = _axis(theme.get(kind, {}), {})
        shared = trace.get("coloraxis") or (trace.get("marker") or {}).get("coloraxis")
        if shared and shared not in out:
            out[shared] = copy.deepcopy(theme.get("coloraxis", {}))
    out["datarevision"] = DATAREVISION
    return out


def _axis(theme: Mapping, own: Mapping) -> dict:
    """An axis of the figure (own) over the theme's axis, its features shown or not as the template would have left
    them (_SHOWN_BY); the theme's minor-tick colours left out (set here, they would turn minor ticks on)."""
    out = _merged({k: v for k, v in theme.items() if k != "minor"}, own)
    for flag, colours, unset, set_ in _SHOWN_BY:
        if flag not in own and flag not in theme:
            out[flag] = set_ if any(k in own for k in colours) else unset
    return out


@functools.lru_cache(maxsize=2)
def _theme(name: str) -> tuple[dict, dict]:
    """The named plotly template's layout with STREAMLIT_LIGHT on top, and its defaults per trace type (the first
    of each type's: plotly cycles through them, and its templates give one)."""
    template = pio.templates[name].to_plotly_json()
    traces = {kind: _listed({k: v for k, v in entries[0].items() if k != "type"})
              for kind, entries in template.get("data", {}).items() if entries}
    layout = {k: v for k, v in template.get("layout", {}).items() if k not in _NOT_CARTESIAN}
    return _merged(_listed(layout), STREAMLIT_LIGHT), traces


def _merged(base: Mapping, over: Mapping) -> dict:
    """over on top of base: nested dicts key by key, anything else taken from over (new dicts, shared leaves)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _listed(value):
    """value with every numpy array (and numpy number) as plain Python values; dicts and lists new, leaves shared."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (int, float, str)) and not isinstance(value[0], np.generic):
            return list(value)
        return [_listed(v) for v in value]
    return value
