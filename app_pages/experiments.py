import streamlit as st

st.title("Experiments")
st.info("Attention during generation, head knock-outs and attention rollout are being built.")
