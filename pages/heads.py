import streamlit as st

from attnviz import ui

st.title("Heads")
ui.placeholder("the attention of every head of a real or toy model on your text: a grid of all heads, one head in detail, where a token looks, per-head statistics and comparisons.")
