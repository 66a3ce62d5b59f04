import streamlit as st

from attnviz import ui

st.title("Toy lab")
ui.placeholder("a small transformer trained in the browser on a synthetic task, with its heads' statistics over training.")
