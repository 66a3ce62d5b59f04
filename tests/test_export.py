"""Figures as files (attnviz.export): SVG, PDF and PNG drawn by plotly's exporter in Debian's chromium, the print
style, View.save by suffix, the app's Figure files buttons, and what happens on a machine without a browser. One
Chromium serves the whole module (export keeps it between figures)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
from xml.etree import ElementTree

import numpy as np
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import export
from attnviz.figures import common
from attnviz.figures import heads as head_figs


@pytest.fixture(scope="module", autouse=True)
def chromium():
    if export.browser_path() is None:
        pytest.fail("chromium is not installed: run `bash scripts/setup.sh --dev` (installs it with apt-get)")
    yield
    export.close()


@pytest.fixture
def no_browser(monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)


def _chart() -> go.Figure:
    return common.line_chart(np.arange(8), {"decay": 0.5 ** np.arange(8)}, title="Weight against distance",
                             x_title="distance (tokens)", y_title="mean weight")


def _capture():
    """A two-head, one-layer capture of four tokens made from weights (no model)."""
    w = np.tril(np.ones((4, 4)))
    w /= w.sum(-1, keepdims=True)
    return attnviz.from_attentions([np.stack([w, np.eye(4)])[None]], ["<bos>", "The", "␣cat", "␣sat"])


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_svg_is_vector_and_keeps_the_titles():
    svg = export.figure_bytes(_chart(), "svg").decode()
    assert svg.startswith("<svg") and "distance (tokens)" in svg and "mean weight" in svg
    assert re.search(r'viewBox="0 0 316\.8 ', svg)  # laid out at one column, 3.3 in of 96 px


def test_pdf_is_a_page_one_column_wide():
    pdf = export.figure_bytes(_chart(), "pdf")
    assert pdf.startswith(b"%PDF")
    box = re.search(rb"MediaBox \[0 0 ([0-9.]+) ([0-9.]+)\]", pdf)
    assert box and float(box.group(1)) == pytest.approx(export.COLUMN_INCHES * 72, abs=0.5)  # points


def test_png_is_300_dpi_at_the_print_width():
    fig = _chart()
    width, height = export.print_size(fig)
    assert width == pytest.approx(export.COLUMN_INCHES * 96)
    assert _png_size(export.figure_bytes(fig, "png")) == (round(export.COLUMN_INCHES * 300), round(height * 300 / 96))
    panels = go.Figure([go.Scatter(y=[1, 2]), go.Scatter(y=[2, 1], xaxis="x2", yaxis="y2")],
                       common.grid_layout(1, 2, ["a", "b"]))
    assert _png_size(export.figure_bytes(panels, "png"))[0] == round(export.PAGE_INCHES * 300)  # both columns


def test_print_style_is_white_legible_and_colour_blind_safe():
    fig = common.heatmap(np.random.default_rng(0).random((3, 3)), colorscale="Blues", x_title="key", y_title="query",
                         title="A sequential map")
    fig.update_layout(paper_bgcolor="#0e1117", font=dict(size=16))
    styled = export.print_style(fig)
    assert styled.layout.paper_bgcolor == "white" and styled.layout.plot_bgcolor == "white"
    assert styled.layout.font.size == export.FONT_PX and styled.layout.font.color == "black"
    assert styled.layout.xaxis.title.text == "key" and styled.layout.yaxis.title.text == "query"
    assert export.scale_trend(styled.data[0].colorscale) == -1  # Blues gets darker: Viridis reversed keeps that
    assert styled.data[0].colorscale == go.Heatmap(colorscale="Viridis_r").colorscale
    assert fig.layout.paper_bgcolor == "#0e1117"  # the page's figure is not touched
    signed = export.print_style(common.heatmap(np.eye(3) - 0.5, colorscale=common.DIVERGING_SCALE, zmin=-1, zmax=1))
    assert signed.data[0].colorscale == go.Heatmap(colorscale=common.DIVERGING_SCALE).colorscale
    lines = export.print_style(_chart())
    assert lines.data[0].line.color == export.OKABE_ITO[0]
    image = head_figs.image_figure(np.eye(4), title="map", x_title="key", y_title="query", colorscale="Blues")
    assert export.print_style(image).data[1].marker.colorscale == image.data[1].marker.colorscale  # its pixels


def test_print_style_gives_a_colour_bar_only_where_one_is_drawn():
    """A lines+markers chart gets no colour bar (styling a plain marker's colorbar would draw an empty one); a
    heatmap's and an image's bar are styled."""
    markers = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 0, 1], mode="lines+markers"))
    assert export.print_style(markers).data[0].marker.colorbar.to_plotly_json() == {}
    heat = export.print_style(common.heatmap(np.eye(3), colorbar_title="w"))
    assert heat.data[0].colorbar.thickness == 10
    image = export.print_style(head_figs.image_figure(np.eye(4), title="map", x_title="key", y_title="query"))
    assert image.data[1].marker.colorbar.thickness == 10


def test_which_scales_are_sequential():
    assert export.scale_trend("Viridis") == 1 and export.scale_trend("Blues") == -1
    assert export.scale_trend("RdBu_r") == 0 and export.scale_trend("Picnic") == 0
    stepped = [[0, "#000000"], [0.5, "#000000"], [0.5, "#ffffff"], [1, "#ffffff"]]  # categories
    assert export.scale_trend(stepped) == 0


def test_a_views_save_writes_each_suffix(tmp_path):
    cap = _capture()
    view = cap.head_view(0, 1)
    assert view.save(tmp_path / "head.html")[0].read_text().startswith("<!DOCTYPE html>")
    svg, = view.save(tmp_path / "head.svg")
    assert svg.read_text().startswith("<svg") and "key token" in svg.read_text()
    assert (tmp_path / "head.pdf").exists() is False
    assert view.save(tmp_path / "head.pdf")[0].read_bytes().startswith(b"%PDF")
    assert _png_size(view.save(tmp_path / "head.png")[0].read_bytes())[0] == round(export.COLUMN_INCHES * 300)
    two = cap.head_view(0, 1, hide_sink=True)  # the map and what each row keeps off the sink
    assert [p.name for p in two.save(tmp_path / "sink.svg")] == ["sink.svg", "sink-2.svg"]
    with pytest.raises(export.ExportError, match=r"\.jpg: use \.html, \.svg, \.pdf or \.png"):
        view.save(tmp_path / "head.jpg")
    with pytest.raises(attnviz.AttnvizError, match="no chart"):
        cap.text_view(0, 1).save(tmp_path / "text.svg")


def test_without_a_browser_files_say_why_and_nothing_breaks(no_browser, tmp_path):
    assert export.browser_path() is None and export.unavailable() == export.NO_BROWSER
    with pytest.raises(export.ExportError, match="need Chromium"):
        export.figure_bytes(_chart(), "svg")
    view = _capture().show()
    with pytest.raises(attnviz.AttnvizError, match="need Chromium"):
        view.save(tmp_path / "grid.pdf")
    assert view.save(tmp_path / "grid.html")[0].exists()  # HTML needs no browser

    at = _open_figure_files(AppTest.from_function(_page_with_two_charts).run())
    assert not at.exception
    assert any(export.NO_BROWSER in c.value for c in at.caption)
    assert not at.toggle


def _open_figure_files(at: AppTest) -> AppTest:
    """Opens every chart's Figure files popover, as a click would, and reruns."""
    shelves = [k for k in at.session_state.keys() if str(k).startswith("chart_") and str(k).endswith("_files")]
    assert len(shelves) == 2  # one popover per chart, the second numbered
    for key in shelves:
        at.session_state[key] = True
    return at.run()


def _page_with_two_charts():
    import numpy as np

    from attnviz import ui
    from attnviz.figures import common

    for i in range(2):  # two charts with one title and caption: their buttons still get keys of their own
        ui.chart(common.line_chart(np.arange(3), {"y": np.arange(3) * (i + 1)}, title="Twice"), "The same words.")


def test_the_app_offers_each_chart_as_files_drawn_on_demand(monkeypatch):
    from attnviz.ui import chart_files
    from attnviz.once import ComputeOnce

    at = AppTest.from_function(_page_with_two_charts).run()
    assert not at.exception
    assert not at.toggle and not at.get("download_button")  # closed: a rerun sends each chart's popover only
    assert not _open_figure_files(at).exception
    assert len(at.toggle) == 2 and all(t.value for t in at.toggle)  # the print style by default
    buttons = at.get("download_button")
    assert len(buttons) == 6 and {b.proto.label for b in buttons} == {"SVG", "PDF", "PNG"}
    at.toggle[0].set_value(False).run()  # one choice for every chart of the visitor
    assert not at.exception and not any(t.value for t in at.toggle)

    monkeypatch.setattr(chart_files, "_FIGURE_FILES", ComputeOnce(max_items=4))
    drawn = []
    monkeypatch.setattr(export, "figure_bytes", lambda fig, fmt, styled: drawn.append(fmt) or b"%PDF")
    fig = _chart()
    drawn_twice = chart_files._figure_file(go.Figure(fig), "pdf", True)
    assert chart_files._figure_file(fig, "pdf", True) == drawn_twice == b"%PDF"
    assert drawn == ["pdf"]  # kept by figure: the same figure again is not drawn again


def _first_chart_of_each_page() -> dict[str, go.Figure]:
    """Each page's first chart at its defaults (run through app.py's navigation, as a visitor opens it)."""
    from pathlib import Path

    from attnviz.ui import PAGES

    figures = {}
    for page in PAGES:
        at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180)
        at.run()
        at.switch_page(page.script).run()
        charts = at.get("plotly_chart")
        if charts:
            figures[page.script] = go.Figure(json.loads(charts[0].proto.spec))
    return figures


@pytest.mark.slow  # every page at its defaults, some on a bundled real model
def test_one_figure_of_each_page_is_a_valid_svg_and_pdf():
    """The Figure files of every page that draws a chart at its defaults: the SVG parses as XML with an <svg> root and
    keeps the chart's title, the PDF is a PDF."""
    figures = _first_chart_of_each_page()
    assert len(figures) >= 8, sorted(figures)
    for script, fig in figures.items():
        svg = export.figure_bytes(fig, "svg")
        root = ElementTree.fromstring(svg)
        assert root.tag.endswith("svg"), script
        title = (fig.layout.title.text or "").split("<br>")[0]
        if title:
            assert html.escape(title[:20], quote=False) in svg.decode("utf-8") or title[:20] in svg.decode(), script
        assert export.figure_bytes(fig, "pdf").startswith(b"%PDF"), script
