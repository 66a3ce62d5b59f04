import streamlit as st

from attnviz import ui

st.title("Kernel")
ui.placeholder("a tiled Triton attention kernel run step by step with its online-softmax state, checked and timed against naive attention.")
