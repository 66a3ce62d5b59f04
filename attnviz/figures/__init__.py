"""Plotly figure builders: numpy in, go.Figure out. Imports neither torch nor streamlit.

One module per topic (heads, sinks, positional, softmax, kernel, cost, lab); `common` holds the shared pieces
(layout, heatmaps, line charts) every topic builds on.
"""
