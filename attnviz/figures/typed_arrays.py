"""Arrays as plotly's JSON carries them: numeric numpy arrays written as typed-array specs ({"dtype", "bdata",
"shape"}: the bytes in base64, which plotly.js decodes into typed arrays), and read back bit for bit (`array`).
attnviz.figures.instant writes its sliders' steps and frames with `written` and `value`, once, when a figure is
built, and one_draw copies a figure's frames with them; `json_bytes` is a figure's size as the page sends it."""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio


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
    return len(pio.to_json(obj if isinstance(obj, go.Figure) else written(obj), validate=False))


# plotly.js's typed arrays, by numpy's dtype name (plotly's plotlyjsShortTypes)
_SHORT = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
          "float32": "f4", "float64": "f8"}
_UNCONVERTED = {"geojson", "layer", "layers", "range"}  # keys plotly's convert_to_base64 leaves as they are


def written(obj, convert: bool = True):
    """obj with its dicts, lists and tuples copied (other values shared) and its numpy arrays written as plotly's
    JSON writes them (convert_to_base64, then its encoder): an array that is a dict's value (`value`) as a
    typed-array spec, an array inside a list as a list. convert=False: every array as a list (under a key plotly
    leaves unconverted)."""
    if isinstance(obj, Mapping):
        return {k: value(v, k, convert) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [v.tolist() if isinstance(v, np.ndarray) else written(v, convert) for v in obj]
    return obj


def value(v, key: str, convert: bool = True):
    """v as plotly's JSON writes the value of the attribute `key` (a dotted path's last part counts): a numpy array as
    a typed-array spec, written here as plotly's to_typed_array_spec writes it (which costs 70-150 us an array,
    through narwhals, and a RoPE chart's or the kernel's step view's frames hold thousands), or as a list where plotly
    has no typed array for it (strings, bools, an empty array) or leaves the key unconverted (an axis range);
    anything else through `written`."""
    convert = convert and key.rsplit(".", 1)[-1] not in _UNCONVERTED
    if not isinstance(v, np.ndarray):
        return written(v, convert)
    if not convert or not v.size:
        return v.tolist()
    v = _narrowed(v) if v.dtype.kind in "iu" else v
    if v.dtype.name not in _SHORT:  # no typed array for it in plotly.js (bools, an int64 past int32)
        return v.tolist()
    spec = {"dtype": _SHORT[v.dtype.name], "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}
    return {**spec, "shape": str(v.shape)[1:-1]} if v.ndim > 1 else spec


def _narrowed(v: np.ndarray) -> np.ndarray:
    """A 64-bit int array as plotly's to_typed_array_spec narrows it (plotly.js has no 64-bit ints): to the first of
    int8, int16, int32 (uint8, uint16, uint32) that holds its values, or as it is where none does."""
    if v.dtype.itemsize < 8:
        return v
    low, high = int(v.min()), int(v.max())
    for narrow in (("uint8", "uint16", "uint32") if v.dtype.kind == "u" else ("int8", "int16", "int32")):
        if np.iinfo(narrow).min <= low and high <= np.iinfo(narrow).max:
            return v.astype(narrow)
    return v
