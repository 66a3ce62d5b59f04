import streamlit as st

from attnviz import ui

st.title("Worked example")
ui.placeholder("small Q, K and V that you edit, with every step of attention computed.")
