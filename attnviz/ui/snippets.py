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
