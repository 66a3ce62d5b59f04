import streamlit as st

from attnviz import ui

st.title("Softmax")
ui.placeholder("random queries and keys with and without 1/sqrt(d_k): logits, saturation, entropy and the gradient that gets through, and the same on a real head.")
