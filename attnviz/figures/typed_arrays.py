"""Arrays as plotly's JSON carries them: numeric numpy arrays written as typed-array specs ({"dtype", "bdata",
"shape"}: the bytes in base64, which plotly.js decodes into typed arrays), and read back bit for bit (`array`).
attnviz.figures.instant writes its sliders' steps and frames with `copied` and `typed`, once, when a figure is
built; `json_bytes` is a figure's size as the page sends it."""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from _plotly_utils.utils import convert_to_base64, to_typed_array_spec


def array(value) -> np.ndarray:
    """An array attribute of a figure dict as numpy: plotly writes numpy arrays as typed-array specs ({"dtype",
    "bdata", "shape"}: the bytes in base64), which this decodes bit for bit; lists and arrays are passed through, a
    list's None (NaN as JSON writes it, one_draw's lists) read as NaN."""
    if isinstance(value, Mapping) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return flat.reshape([int(n) for n in str(shape).split(",")]) if shape else flat
    out = np.asarray(value)
    return np.asarray(value, dtype=float) if out.dtype == object else out


def json_bytes(obj) -> int:
    """Size of a figure, or of a figure dict, as the JSON st.plotly_chart sends (plotly.io.to_json; a figure's
    arrays as base64 typed arrays, as its to_dict writes them)."""
    if not isinstance(obj, go.Figure):
        obj = copied(obj)
        convert_to_base64(obj)
    return len(pio.to_json(obj, validate=False))


_FLOATS = {np.dtype(np.float64): "f8", np.dtype(np.float32): "f4"}


def copied(obj):
    """obj's dicts, lists and tuples copied (other values shared), for convert_to_base64 to rewrite. A non-empty
    float array under a dict key is written here as plotly writes it ({"dtype", "bdata", "shape"}): plotly's own
    path costs ~70 us an array, and a RoPE chart's frames hold thousands of small ones."""
    if isinstance(obj, Mapping):
        return {k: _float_spec(v) if isinstance(v, np.ndarray) and v.dtype in _FLOATS and v.size and k not in
                _UNCONVERTED else copied(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [copied(v) for v in obj]
    return obj


_UNCONVERTED = {"geojson", "layer", "layers", "range"}  # keys plotly's convert_to_base64 leaves as they are


def _float_spec(v: np.ndarray) -> dict:
    spec = {"dtype": _FLOATS[v.dtype], "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}
    if v.ndim > 1:
        spec["shape"] = str(v.shape)[1:-1]
    return spec


def typed(args: dict) -> dict:
    """{path: value} with its numpy arrays (in lists and dicts too) as typed-array specs, as plotly's JSON writes a
    trace's (to_typed_array_spec), and as lists where plotly has no typed array for them (strings) or leaves them
    unconverted (an axis range)."""
    def write(value, convert: bool):
        if isinstance(value, np.ndarray):
            if convert and value.dtype in _FLOATS and value.size:
                return _float_spec(value)  # plotly's own path below costs ~150 us an array
            spec = to_typed_array_spec(value) if convert else value  # a spec, or the array where none fits
            return spec.tolist() if isinstance(spec, np.ndarray) else spec
        if isinstance(value, (list, tuple)):
            return [write(v, convert) for v in value]
        if isinstance(value, Mapping):
            return {k: write(v, convert and k not in _UNCONVERTED) for k, v in value.items()}
        return value
    return {path: write(value, path.rsplit(".", 1)[-1] not in _UNCONVERTED) for path, value in args.items()}
