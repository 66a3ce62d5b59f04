import numpy as np
import pandas as pd
import streamlit as st

from attnviz import cost, cost_tables, snippets, ui
from attnviz import variants as var
from attnviz.figures import cost as figs
from attnviz.ui import snippets as snippet_ui
from attnviz.ui import variants as uv

CONTEXTS = np.unique(np.logspace(7, 17, 41, base=2).round().astype(int))  # 128 ... 131072 tokens
BYTES = {"fp32 (4 bytes)": 4, "fp16 / bf16 (2 bytes)": 2, "fp8 / int8 (1 byte)": 1, "int4 (½ byte)": 0.5}
SEQ_LENS = tuple(np.unique(np.logspace(4, 20, 65, base=2).round().astype(int)).tolist())  # the FLOPs chart's N
CUSTOM = "Custom values"
MAX_HEADS_SHOWN = 8
MAX_HEADS = 128
MAX_TOY_WIDTH = 2048  # query heads x head dim of the toy layer: four 2048 x 2048 float64 weights, 128 MiB


st.title("MHA, GQA, MQA and what attention costs")
st.markdown(
    "Multi-head attention (MHA) gives every query head its own key and value head. Grouped-query attention (GQA) "
    "lets a group of query heads share one key/value head, and multi-query attention (MQA) lets all of them share "
    "one. Queries are the same; what shrinks is the key/value cache that generation keeps for every past token."
)

archs = uv.preset_archs()

st.header("Who reads which key/value head")
c1, c2 = st.columns(2)
n_heads = c1.slider("Query heads", 1, MAX_HEADS, 8, key="variants_heads", persist_state="session",
                    help="Up to 128, as in the largest open models (Llama-3-405B); Llama-2-70B has 64.")
if st.session_state.get("variants_kv") != (kv_used := uv.kv_heads_for(n_heads, st.session_state.get("variants_kv"))):
    st.session_state["variants_kv"] = kv_used  # the asked value does not divide the query heads
n_kv = c2.select_slider("Key/value heads (must divide the query heads)", uv.divisors(n_heads), key="variants_kv",
                        persist_state="session")
ui.plot(uv.sharing_figure(n_heads, n_kv), width="stretch", key="variants_sharing")
snippet_ui.show(snippets.variants_sharing(n_heads, n_kv))
q_step = figs.label_step(n_heads)  # the figure labels query heads 0, q_step, 2 q_step, ...
group = n_heads // n_kv
st.caption((f"Query head h reads key/value head ⌊h / {group}⌋: with {n_kv} key/value heads, groups of {group} "
            f"consecutive query heads (one colour) share one. The cache holds {n_kv} heads instead of {n_heads}: "
            f"{group}× less memory than MHA." if group > 1 else
            f"Query head h reads key/value head h: with {n_kv} key/value heads, one per query head, this is MHA "
            "itself, and its cache takes the same memory as MHA's.")
           + (f" With this many heads only query heads 0, {q_step}, {2 * q_step}, … are labelled; hover over a "
              "square or diamond to name it." if q_step > 1 else ""))

st.header("KV-cache memory")
# on two lines: on one it was cut at "head_dim" in a narrow window
st.latex(r"\begin{gathered}\text{KV bytes} = 2_{(K,V)} \times \text{layers} \times \text{kv\_heads} \times "
         r"\text{head\_dim} \\ {}\times \text{context} \times \text{batch} \times \text{bytes per value}\end{gathered}")
# the model chips get the page's whole width: in a third of it they were cut to "Mi…"
chosen = st.multiselect("Models", list(archs) + [CUSTOM], key="variants_models", persist_state="session",
                        default=["Llama-2-7B", "Llama-2-70B", "Mistral-7B", "SmolLM2-135M"])
k2, k3 = st.columns(2)
batch = k2.slider("Batch (sequences cached at once)", 1, 64, 1, key="variants_batch", persist_state="session")
precision = k3.selectbox("Cache precision", list(BYTES), index=1, key="variants_bytes", persist_state="session")
bytes_per_value = BYTES[precision]
with st.expander("Custom values, and a model from the registry", expanded=CUSTOM in chosen):
    e1, e2, e3, e4 = st.columns(4)
    custom = cost.Architecture(
        name=CUSTOM, family="custom", layers=e1.number_input("Layers", 1, 512, 32, key="variants_c_layers",
                                                             persist_state="session"),
        d_model=0, heads=0, kv_heads=e2.number_input("KV heads", 1, 256, 8, key="variants_c_kv",
                                                     persist_state="session"),
        head_dim=e3.number_input("Head dim", 1, 1024, 128, key="variants_c_hd",
                                 persist_state="session"), d_ff=0, vocab=0)
    budget = e4.number_input("Memory budget to draw (GiB)", 0.0, 10_000.0, 80.0, key="variants_budget",
                             persist_state="session")
    if st.toggle("Add a model from the registry", value=False, key="variants_add_loaded", persist_state="session"):
        name = ui.model_picker("variants_model", default="toy-llama-gqa")
        found = uv.loaded_arch(name) if name else None
        if found:
            archs = {**archs, f"{name} (loaded)": found[0]}
            chosen = [*chosen, f"{name} (loaded)"]
            counted = cost.param_counts(found[0])["total"]
            (st.success if counted == found[1] else st.warning)(
                f"{name}: {counted:,} parameters from its config; {found[1]:,} counted on the loaded weights.")
lookup = {**archs, CUSTOM: custom}
if not chosen:
    st.warning("Pick at least one model above to draw its KV cache.")
else:
    ui.plot(uv.kv_chart(tuple((name, lookup[name]) for name in chosen), tuple(CONTEXTS.tolist()), batch,
                        bytes_per_value, budget or None), width="stretch", key="variants_kv_chart")
    st.caption("The cache grows linearly with context and batch (straight lines on log axes, all with the same "
               "slope); fewer KV heads shift a line down by the same factor at every length.")
    context = st.number_input("Context length for the table (tokens)", 1, 10_000_000, 4096, key="variants_ctx",
                              persist_state="session")
    rows = cost_tables.kv_cache_table({name: lookup[name] for name in chosen}, context=context, batch=batch,
                                      bytes_per_value=bytes_per_value)
    # a static table: its cells wrap instead of being clipped at the width of a narrow window
    st.table(pd.DataFrame(rows).set_index("model"))

st.header("FLOPs against sequence length")
f1, f2, f3 = st.columns(3)
flop_model = f1.selectbox("d_model of", list(archs), index=list(archs).index("Llama-2-7B"), key="variants_flop_model",
                          persist_state="session")
causal = f2.toggle("Causal (decoder prefill)", value=False, key="variants_causal", persist_state="session")
gqa_proj = f3.toggle("Narrower K, V projections with GQA", value=False, key="variants_gqa_proj",
                     persist_state="session",
                     help="With fewer KV heads, K and V project to kv_heads × head_dim instead of d_model.")
fa = archs[flop_model]
d = fa.d_model
kv_dim = fa.kv_heads * fa.head_dim if gqa_proj and fa.kv_heads < fa.heads else None
if gqa_proj and kv_dim is None:
    st.info(f"{flop_model} has as many key/value heads as query heads: its K and V projections are full width.")
n_star = cost.crossover_seq_len(d_model=d, causal=causal, kv_dim=kv_dim)
ui.plot(uv.flops_chart(SEQ_LENS, d, causal, kv_dim), width="stretch", key="variants_flops")
at_star = cost.attention_flops(seq_len=int(n_star), d_model=d, causal=causal, kv_dim=kv_dim)
st.latex(cost_tables.crossover_latex(d_model=d, causal=causal, kv_dim=kv_dim))
st.markdown(f"Check at N* = {n_star:,.0f}: projections {at_star['projections']:.4e} FLOPs, attention matmuls "
            f"{at_star['attention']:.4e} FLOPs.")
st.caption(f"Projections grow like N, the attention matmuls like N²: below N* = {n_star:,.0f} tokens the four "
           "d × d projections cost more, above it Q Kᵀ and pattern × V do. A multiply-add counts as 2 FLOPs; "
           "softmax and masking are left out.")

with st.expander("A cost table that circulates, recomputed (d_model = 4096, 32 layers, 32 KV heads, fp16)"):
    st.dataframe(pd.DataFrame(cost_tables.cost_table(archs["Llama-2-7B"], (512, 2048, 8192, 32768, 131072),
                                                     d_model=4096)),
                 hide_index=True, width="stretch", key="variants_seed_table")
    st.caption("Computed from the formulas above: each token caches 2 × 32 × 32 × 128 values of 2 bytes.")

st.header("Parameters")
st.dataframe(pd.DataFrame(cost_tables.param_table(archs)), hide_index=True, width="stretch", key="variants_params")
ui.plot(uv.param_share_chart(tuple(archs.items())), width="stretch", key="variants_param_share")
st.caption("Counted from each model's config values (the tests check them against the models transformers builds "
           "from the same configs). Small models spend a large share on embeddings; large ones on the MLP. "
           "GQA makes the K and V projections smaller, so attention's share drops too.")

st.header("The same input through MHA, GQA and MQA")
st.markdown(
    f"A toy layer with {n_heads} query heads (set above) sees the same random tokens three times. GQA and MQA are "
    "made from the MHA layer as Ainslie et al. (2023) convert checkpoints: each group's key and value projections "
    "are the mean of its heads'. Queries are unchanged, so every difference below comes from sharing keys and values."
)


@st.fragment
def toy_layer(n_heads: int, n_kv: int) -> None:
    """The toy layer's maps: its own controls rerun this section only."""
    t1, t2, t3, t4 = st.columns(4)
    n_tokens = t1.slider("Tokens", 2, 32, 12, key="variants_tokens", persist_state="session")
    max_d_head = uv.max_toy_head_dim(n_heads, MAX_TOY_WIDTH)
    d_asked = st.session_state.get("variants_dhead", 16)
    if d_asked != (d_used := uv.toy_head_dim(d_asked, n_heads, MAX_TOY_WIDTH)):  # more query heads were chosen above
        st.session_state["variants_dhead"] = d_used
    d_head = t2.slider("Head dim", 2, max_d_head, min(16, max_d_head), key="variants_dhead",
                       persist_state="session",
                       help=f"At most {MAX_TOY_WIDTH} // query heads, so the toy layer stays {MAX_TOY_WIDTH} wide or "
                            "less.")
    seed = t3.number_input("Seed", 0, 10_000, 0, key="variants_seed", persist_state="session")
    toy_causal = t4.toggle("Causal mask", value=True, key="variants_toy_causal", persist_state="session")
    results, _ = uv.toy_run(n_tokens, d_head, n_heads, n_kv, toy_causal, int(seed))
    heads_shown = st.multiselect("Heads to show", list(range(n_heads)), default=list(range(min(n_heads, 4))),
                                 key="variants_heads_shown", persist_state="session", max_selections=MAX_HEADS_SHOWN)
    if not heads_shown:
        st.warning("Pick at least one head to show.")
    else:
        ui.plot(uv.variant_maps_chart(n_tokens, d_head, n_heads, n_kv, toy_causal, int(seed),
                                      tuple(sorted(heads_shown))), width="stretch", key="variants_maps")
        diffs = var.differences_from(results, "MHA")
        cols = st.columns(len(diffs))
        for col, (name, (tv, rel)) in zip(cols, diffs.items()):
            col.metric(f"{name}: rows moved vs MHA", f"{tv:.3f}", help="Mean total-variation distance between a "
                       f"head's attention row and MHA's (0 = same, 1 = disjoint). Output differs by {rel:.1%}.")
        st.caption("Heads in one GQA group read the same keys, so their maps differ only through their queries; under "
                   "MQA every head does. Untrained, pooled keys are averages of unrelated heads, so rows move a lot: "
                   "this is why converted checkpoints need some further training (uptraining).")
    uv.prefetch_heads(n_heads, ui.last_setting("variants_heads_last", n_heads), n_kv,
                      dict(n_tokens=n_tokens, d_head=d_head, causal=toy_causal, seed=int(seed), heads=heads_shown),
                      MAX_HEADS, MAX_TOY_WIDTH)


toy_layer(n_heads, n_kv)
