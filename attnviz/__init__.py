"""attnviz: see how attention works, in real and toy transformers.

The library does every computation; the Streamlit pages only read widgets, call it and draw.
Only attnviz.ui imports streamlit; attnviz.figures imports neither torch nor streamlit.
"""

__version__ = "0.1.0"
