import streamlit as st

from attnviz import ui

st.title("Experiments")
ui.model_picker("exp_model")
st.info("Attention during generation, head knock-outs and attention rollout are being built.")
