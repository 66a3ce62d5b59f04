"""The "Reproduce in Python" box under a page's figure: the code (attnviz.snippets) that draws it again."""

from __future__ import annotations

import streamlit as st


def show(code: str) -> None:
    """A collapsed box with the library calls that redraw the figure above in a notebook, with this page's settings
    (the code defines `fig`; its last line saves it for a paper)."""
    with st.expander("Reproduce in Python", icon=":material/code:"):
        st.code(code, language="python")
        st.caption("Run it in a notebook or a script: it draws the figure above with the settings now on this page. "
                   "Uncomment the last line to save it as SVG, PDF or PNG.")


def report_button(capture, text: str, model: str, heads: list[tuple[int, int]], *, stats, settings: dict,
                  gamma: float, hide_sink: bool, key: str) -> None:
    """A download button for one offline HTML report (attnviz.report) of `heads` and the statistics table, built
    when pressed."""
    st.download_button("Report (.html)", data=lambda: report_bytes(capture, text, model, heads, stats=stats,
                                                                   settings=settings, gamma=gamma,
                                                                   hide_sink=hide_sink),
                       file_name=f"attention-report-{model.replace('/', '_')}.html", mime="text/html", key=key,
                       on_click="ignore", icon=":material/description:")


def report_bytes(capture, text: str, model: str, heads, **options) -> bytes:
    """attnviz.report.report(...) as the bytes of its standalone page."""
    import tempfile
    from pathlib import Path

    from attnviz import report

    with tempfile.TemporaryDirectory() as folder:
        path = report.write_report(Path(folder) / "report.html", capture, text, heads=heads, model=model, **options)
        return path.read_bytes()
