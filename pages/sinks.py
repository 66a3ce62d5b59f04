import streamlit as st

from attnviz import ui

st.title("Sinks")
ui.placeholder("sink scores per head, the tokens that act as sinks, and a StreamingLLM-style eviction experiment on SmolLM2.")
