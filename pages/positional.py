import streamlit as st

from attnviz import ui

st.title("Positional")
ui.placeholder("sinusoidal encodings, RoPE rotations and its decay bound, ALiBi slopes and biases, and distance decay measured on models.")
