"""attnviz: the entry point declares the pages and nothing else."""

import streamlit as st

from attnviz.ui import PAGES

st.set_page_config(page_title="attnviz", page_icon="🔭", layout="wide")
st.navigation([st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path, default=p.default)
               for p in PAGES]).run()
