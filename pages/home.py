import streamlit as st

from attnviz.ui import PAGES

st.title("attnviz")
st.markdown(
    "See how attention works inside real and toy transformers: every number computed, every picture checked "
    "against an independent computation, offline on a laptop CPU."
)
for page in PAGES:
    if page.default:
        continue
    st.page_link(page.script, label=f"**{page.title}**: {page.summary}", icon=page.icon)
