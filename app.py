"""attnviz: the entry point imports the library once for every visitor (ui.warm_up), keeps every page steady across
its reruns (ui.steady_reruns) and declares the pages."""

import streamlit as st

from attnviz.ui import PAGES, steady_reruns, warm_up

st.set_page_config(page_title="attnviz", page_icon="🔭", layout="wide")
warm_up()
steady_reruns()  # on every page: a view change greys nothing, and a chart keeps its zoom over the same axes
st.navigation([st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path, default=p.default)
               for p in PAGES]).run()
