import streamlit as st

from attnviz import ui

st.title("Variants")
ui.placeholder("MHA, GQA and MQA head sharing, KV-cache memory and FLOPs for real model presets.")
