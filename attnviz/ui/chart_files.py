"""Each chart's figure files (SVG, PDF, PNG at 300 dpi), drawn by attnviz.export only when asked and kept for every
session, and the visitor's print-style choice.
"""

from __future__ import annotations

import functools
import hashlib
import logging

import streamlit as st

from attnviz.once import ComputeOnce

log = logging.getLogger("attnviz")


PRINT_STYLE = "chart_print_style"  # this visitor's choice for every chart's files (the print style: True)


_FIGURE_FILES = ComputeOnce(max_items=32)  # (figure's digest, format, print style) -> the file's bytes, every session


def figure_files(fig, caption: str) -> None:
    """The figure as SVG, PDF and PNG (attnviz.export, plotly's own exporter), one download button each, and a Print
    style toggle, behind a small popover. A rerun sends the popover's button only: what is inside is drawn when the
    visitor opens it (a rerun of the page or fragment, on_change="rerun"), and a file when its button is pressed
    (Streamlit calls the button's function), kept by figure. Without a browser, one caption says why."""
    key = _chart_key(fig, caption)
    shelf = st.popover("Figure files", icon=":material/download:", type="tertiary", key=f"{key}_files",
                       on_change="rerun")
    if shelf.open:
        with shelf:
            _file_buttons(fig, caption, key)


def _file_buttons(fig, caption: str, key: str) -> None:
    """What the Figure files popover holds: the Print style toggle and a button for each format."""
    from attnviz import export

    why = export.unavailable()
    if why:
        st.caption(why)
        return
    st.session_state[key] = st.session_state.get(PRINT_STYLE, True)  # the same choice on every chart
    styled = st.toggle("Print style", key=key, persist_state="session", on_change=_remember_print_style,
                       args=(key,), help="A white background, type legible at one column's width (3.3 in), "
                                         "colour-blind-safe colours; the PNG at 300 dpi.")
    name = export.file_stem(fig, caption)
    with st.container(horizontal=True):
        for fmt, mime in export.FORMATS.items():
            st.download_button(fmt.upper(), data=functools.partial(_figure_file, fig, fmt, styled),
                               file_name=f"{name}.{fmt}", mime=mime, key=f"{key}_{fmt}", on_click="ignore")


def _chart_key(fig, caption: str) -> str:
    """A widget key for a chart's file buttons, stable across reruns: from its title and caption, numbered when the
    same pair is drawn again in one run."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    title = fig.layout.title.text or ""
    base = "chart_" + hashlib.blake2b(f"{title}\n{caption}".encode(), digest_size=6).hexdigest()
    shared = getattr(get_script_run_ctx(), "shared", None)
    used = getattr(shared, "widget_user_keys_this_run", ())
    key, n = base, 1
    while f"{key}_files" in used:  # the popover's key, registered whether it is open or not
        n += 1
        key = f"{base}_{n}"
    return key


def _remember_print_style(key: str) -> None:
    st.session_state[PRINT_STYLE] = bool(st.session_state[key])


def _figure_file(fig, fmt: str, styled: bool) -> bytes:
    """One file of the figure, drawn once for every session that asks (by the figure's JSON, format and style)."""
    from attnviz import export

    try:
        return _FIGURE_FILES.get((export.figure_digest(fig), fmt, styled),
                                 lambda: export.figure_bytes(fig, fmt, styled=styled))
    except export.ExportError as exc:
        log.warning("%s (%s)", exc, exc.detail)
        raise
