import math

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import snippets, ui
from attnviz import softmax as sm
from attnviz import softmax_charts as sm_charts
from attnviz.figures import softmax as figs
from attnviz.ui import snippets as snippet_ui
from attnviz.ui import softmax as ui_softmax

N_QUERIES = ui_softmax.N_QUERIES
ROWS_SHOWN = sm_charts.ROWS_SHOWN
MAX_TOKENS = 256  # every head's three softmaxes are computed for the per-head grids
MAX_CHARS = 1000
DIMS = ui_softmax.DIMS
REAL_TEXT = "The cat sat on the mat because it was warm. The cat"
TEMPERATURES = ui_softmax.TEMPERATURES


@st.fragment
def show_real_model(cap, text: str) -> None:
    """The real-model section, once a capture with its layers' inputs (q, k, scaling, bias, soft-cap) is at hand.
    Every map rescales the head's raw q·k (from the captured q and k): an additive bias (BLOOM's ALiBi) is added
    as the model adds it, unscaled."""
    layers = list(cap.layers)
    scaling, head_dim = float(cap.scaling), int(cap.head_dim)
    tokens = [str(t) for t in cap.tokens]
    h1, h2, h3, h4 = st.columns(4)
    layer_pos = h1.selectbox("layer", range(len(layers)), format_func=lambda i: str(layers[i]), key="softmax_layer",
                             persist_state="session")
    head = h2.selectbox("head", range(cap.n_heads), key="softmax_head", persist_state="session")
    real_t = h3.select_slider("temperature T on the scores", options=TEMPERATURES, value=2.0,
                              key="softmax_real_temperature", persist_state="session")
    query = h4.selectbox("query row", range(len(tokens)), index=len(tokens) - 1,
                         format_func=lambda i: f"{i}: {tokens[i]}", key="softmax_query", persist_state="session")
    # [query, key] float64 q·k, -inf where masked; [key] bias or None; the soft-cap or None
    head_raw, head_bias, softcap = sm.head_logits(cap.inputs[layers[layer_pos]], head)
    biased = head_bias is not None
    st.caption(f"{cap.model_name}: head_dim = {head_dim}, the model's scaling s = {scaling:.4g} "
               f"(1/√{head_dim} = {1 / math.sqrt(head_dim):.4g}); {len(tokens)} tokens." +
               (f" It soft-caps q·k × s at {softcap:g} (c·tanh(x / c)) before any bias." if softcap else "") +
               (" It adds a bias b to every score after the scaling (BLOOM's ALiBi: this head's slope × the key "
                "position); b is kept as the model adds it, unscaled, in every map and sweep below." if biased
                else ""))

    code = snippets.softmax_head(cap.model_name, text, layers[layer_pos], head, real_t)
    patterns, keep = _real_maps(head_raw, scaling, real_t, head_bias, softcap, tokens, code)
    _real_row(head_raw, patterns, keep, query, tokens)
    _real_sweep(cap, text, layers, layer_pos, head, scaling, softcap, head_raw, head_bias, real_t)
    _real_saturation(cap, text, layers, scaling, softcap)


def _real_maps(head_raw, scaling: float, real_t: float, head_bias, softcap, tokens, code: str):
    """The head's pattern at its own scale, unscaled and at temperature T (and the code that draws them), with
    their statistics; returns (patterns, the rows that may attend to at least two keys)."""
    biased = head_bias is not None
    patterns = sm.head_variants(head_raw, scaling, real_t, bias=head_bias, softcap=softcap)
    own_formula = figs.logit_formula(f" × {scaling:.3g}", biased, softcap)
    raw_formula = figs.logit_formula("", biased, softcap)
    titles = figs.real_map_titles(scaling, real_t, bias=biased, softcap=softcap)
    st.caption(f"Each map is the softmax of its row's logits: left, {own_formula} (the head's real pattern); "
               f"middle, {raw_formula} (the same q and k without the scaling"
               + (", the bias unchanged" if biased else "") + f"); right, ({own_formula}) / {real_t:g}. q·k is "
               "computed from the captured q and k (after RoPE, for RoPE models), in float64.")
    keep = sm.valid_keys(head_raw) >= 2
    ui.plot(figs.head_patterns({titles[name]: pattern for name, pattern in patterns.items()}, tokens),
                    width="stretch", key="softmax_real_maps")
    snippet_ui.show(code)
    rows = []
    for name, pattern in patterns.items():
        stats = sm.row_stats(pattern[keep])
        rows.append({"softmax": titles[name], "mean max weight": stats.max_weight.mean(),
                     "mean entropy (nats)": stats.entropy.mean(), "saturated rows": stats.saturated_share,
                     "median ‖J‖_F": float(np.median(stats.jacobian_norm))})
    st.dataframe(pd.DataFrame(rows).style.format(
        {"mean max weight": "{:.3f}", "mean entropy (nats)": "{:.3f}", "saturated rows": "{:.1%}",
         "median ‖J‖_F": "{:.3g}"}), hide_index=True, width="stretch")
    st.caption(f"Statistics over the {int(keep.sum())} rows that may attend to at least two keys (in a causal "
               "model the first token sees only itself, whatever the scale).")
    return patterns, keep


def _real_row(head_raw, patterns, keep, query: int, tokens) -> None:
    """One query's row under each softmax, and each row's Jacobian norm."""
    d1, d2 = st.columns(2)
    n_valid = int(sm.valid_keys(head_raw)[query])
    ui.plot(where=d1, fig=figs.head_row({name: p[query, :n_valid] for name, p in patterns.items()}, tokens[:n_valid],
                                  title=f"Row of query {query}: {tokens[query]!r}"),
                    width="stretch", key="softmax_real_row")
    norms = {name: sm.row_stats(p[keep]).jacobian_norm for name, p in patterns.items()}
    ui.plot(where=d2, fig=figs.row_distribution(norms, colors=figs.REAL_COLORS, log_y=True,
                                                title="Jacobian norm per row",
                                                y_title="‖diag(p) − pp^T‖_F (log scale)"),
                    width="stretch", key="softmax_real_jac")
    st.caption("The bars show where one query puts its weight under each softmax; the dots, how much gradient "
               "each row of this head would let through.")


def _real_sweep(cap, text, layers, layer_pos, head, scaling, softcap, head_raw, head_bias, real_t) -> None:
    """The head's statistics as the factor on raw q·k varies."""
    biased = head_bias is not None
    sweep_table = ui_softmax.real_scale_sweep(cap.model_name, ui.model_version(cap.model_name), text, tuple(layers),
                                              layer_pos, head, scaling, softcap, head_raw, head_bias)
    # dividing the logits by T equals a factor s / T on q·k only when nothing is added to (or caps) q·k × s
    t_on_curve = not biased and not softcap
    ui.plot(figs.scale_sweep_chart(sweep_table, own_factor=scaling,
                                           temperature_factor=scaling / real_t if t_on_curve else None,
                                           title=f"Layer {layers[layer_pos]}, head {head}, as the factor on raw q·k "
                                                 "varies"),
                    width="stretch", key="softmax_real_sweep")
    st.caption(f"Each point is the softmax of {figs.logit_formula(' × factor', biased, softcap)}"
               + (", the bias b the same at every factor" if biased else "") +
               ". Left of 'own scale' the head flattens, right of it it sharpens; 'unscaled' is factor 1." +
               ("" if t_on_curve else " The temperature map divides the whole score, "
                + ("the bias" if biased else "the soft-cap") + " included, which no factor on q·k does: it is no "
                "point on this curve and is not marked."))


def _real_saturation(cap, text, layers, scaling, softcap) -> None:
    """Every head's share of saturated rows, at its own scale and unscaled."""
    shares = ui_softmax.real_head_saturation(cap.model_name, ui.model_version(cap.model_name), text, tuple(layers),
                                             scaling, softcap, cap.inputs)
    g1, g2 = st.columns(2)
    ui.plot(where=g1, fig=figs.head_share_grid(shares["own scale"], layers, title="Saturated rows per head, own scale"),
                    width="stretch", key="softmax_grid_own")
    ui.plot(where=g2, fig=figs.head_share_grid(shares["unscaled"], layers, title="Saturated rows per head, unscaled"),
                    width="stretch", key="softmax_grid_unscaled")
    st.caption(f"Every head of {cap.model_name} on this text, each layer with its own q, k"
               + (" and bias" if any(x.key_bias is not None for x in cap.inputs.values()) else "") +
               f". Own scale: {shares['own scale'].mean():.1%} of rows "
               f"saturated on average; unscaled: {shares['unscaled'].mean():.1%}, and "
               f"{np.mean(shares['unscaled'] > 0.5):.0%} of heads have most of their rows saturated.")


st.title("Softmax saturation")
st.markdown(
    r"If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then "
    r"$q\cdot k=\sum_{i=1}^{d_k} q_i k_i$ has variance $d_k$. Without the $1/\sqrt{d_k}$ of "
    r"$\mathrm{softmax}(QK^\top/\sqrt{d_k})$ the logits spread out as $d_k$ grows, one key takes nearly all the "
    r"weight, and the softmax Jacobian $J=\mathrm{diag}(p)-pp^\top$ (the only way a gradient reaches $q$ and $k$) "
    r"goes to zero. "
    rf"Below, {N_QUERIES} random queries each attend over the same random keys, with and without the scaling; "
    r"the temperature $T$ divides every logit in both. Under the numbers, four tabs: the logits and first rows, "
    r"every row's statistics, the same statistics against $d_k$, and the gradient that reaches $q$; a control "
    r"moved redraws the open tab only."
)

SECTION_TABS = dict(zip(ui_softmax.TABS, ["Logits and rows", "Every row, not only the mean", "Against d_k",
                                          "The gradient that reaches q"]))


@st.fragment
def random_logits_section() -> None:
    """Everything the four controls above it change: moving one reruns this section only, not the real model's, and
    draws the open tab's charts only (the others are drawn when opened)."""
    n_keys, d_k, temperature, seed = _random_controls()

    with st.spinner("Sampling queries and keys…"):
        variants, grads = ui_softmax.sample(d_k, n_keys, seed, temperature)

    _variant_metrics(variants, d_k, n_keys, temperature)
    tabs = dict(zip(SECTION_TABS, ui.lazy_tabs(list(SECTION_TABS.values()), "softmax_tab")))
    (open_tab,) = [name for name, tab in tabs.items() if tab.open] or ["logits"]

    def figure(tab: str):
        return ui_softmax.tab_figure(tab, d_k, n_keys, seed, temperature, ROWS_SHOWN)

    if tabs["logits"].open:
        with tabs["logits"]:
            _logits_tab(*figure("logits"), d_k, n_keys, seed, temperature)
    if tabs["rows"].open:
        with tabs["rows"]:
            _rows_tab(figure("rows"))
    if tabs["sweeps"].open:
        with tabs["sweeps"]:
            _sweeps_tab(figure("sweeps"), n_keys)
    if tabs["gradients"].open:
        with tabs["gradients"]:
            _gradient_to_q(grads, figure("gradients"))
    setting = {"d_k": d_k, "n_keys": n_keys, "seed": seed, "temperature": temperature}
    ui_softmax.prefetch_next(setting, ui.last_setting("softmax_last_setting", setting), TEMPERATURES, ROWS_SHOWN,
                             open_tab)


def _logits_tab(figure, dims, d_k: int, n_keys: int, seed: int, temperature: float) -> None:
    """The logits of both variants and their first rows, with the chart's own d_k slider over dims."""
    ui.plot(figure, width="stretch", key="softmax_variants")
    st.caption(
        "**Instant:** the d_k slider in this chart redraws it in the browser, no server ("
        + (f"all {len(DIMS)} values of d_k" if len(dims) == len(DIMS) else f"d_k = {', '.join(map(str, dims))}")
        + "); the controls above recompute on the server, and the numbers above and the other tabs follow them, "
        "not this slider. "
        "The dashed curves are the normal density with the predicted variance (1 scaled, d_k unscaled, both divided "
        "by T²); at small d_k the sampled logits are products of normals, heavier-tailed than that curve, with the "
        "same variance. Unscaled, the rows turn into single bright cells as d_k grows: one key takes all the weight."
    )
    snippet_ui.show(snippets.softmax_variants(d_k, n_keys, seed, temperature, ROWS_SHOWN))


def _rows_tab(figure) -> None:
    """Every row's max weight, entropy and Jacobian norm."""
    ui.plot(figure, width="stretch", key="softmax_rows")
    st.caption(
        "Each dot is one query row. The Jacobian norm is the Frobenius norm: it is the root-mean-square size of the "
        "gradient that reaches the logits when the gradient arriving at the weights has independent unit-variance "
        "entries, and it has a closed form in O(keys) per row (the spectral norm, the worst case, is at most it and "
        f"at least it divided by √(keys − 1)). Rows below {figs.NORM_FLOOR:.0e} are drawn at {figs.NORM_FLOOR:.0e}: "
        "to float64 they pass no gradient at all."
    )


def _sweeps_tab(figure, n_keys: int) -> None:
    """The statistics against d_k, with the chart's own T slider."""
    ui.plot(figure, width="stretch", key="softmax_sweeps")
    st.caption(
        f"**Instant:** the T slider in this chart redraws it in the browser, no server (all {len(TEMPERATURES)} "
        "temperatures); the controls above recompute on the server. "
        f"Same seed, {N_QUERIES} queries and {n_keys} keys at every d_k. The scaled curves stay flat; the unscaled "
        "ones leave them as soon as d_k grows past a few: the logit variance follows the d_k line, rows saturate and "
        "the Jacobian collapses by orders of magnitude."
    )

def _random_controls() -> tuple[int, int, float, int]:
    """(keys per query, d_k, temperature, seed) as the four controls set them."""
    c1, c2, c3, c4 = st.columns(4)
    low, high = ui_softmax.N_KEYS_RANGE
    n_keys = c1.slider("keys per query", min_value=low, max_value=high, value=32, key="softmax_n_keys",
                       persist_state="session",
                       help="The number of keys each query spreads its weight over (the row length).")
    d_k = c2.select_slider("d_k (dimension of q and k)", options=DIMS, value=64, key="softmax_d_k",
                           persist_state="session", help="Log-spaced from 1 to 1024: two steps per doubling.")
    temperature = c3.select_slider("temperature T", options=TEMPERATURES, value=1.0, key="softmax_temperature",
                                   persist_state="session",
                                   help="softmax(logits / T): T > 1 flattens, T < 1 sharpens.")
    low, high = ui_softmax.SEED_RANGE
    seed = int(c4.number_input("seed", min_value=low, max_value=high, value=0, step=1, key="softmax_seed",
                               persist_state="session"))
    return n_keys, d_k, temperature, seed


def _variant_metrics(variants, d_k: int, n_keys: int, temperature: float) -> None:
    """Scaled and unscaled side by side: logit spread, max weight, entropy, saturated rows."""
    scale_text = sm_charts.scale_text(d_k)
    predicted_var = sm_charts.predicted_variance(d_k, temperature)
    log_n = math.log(n_keys)

    for column, variant in zip(st.columns(2), (sm.SCALED, sm.UNSCALED)):
        scores, pattern, stats = variants[variant]
        with column:
            st.subheader(scale_text[variant])
            m1, m2 = st.columns(2)
            m3, m4 = st.columns(2)
            m1.metric("logit std", f"{scores.std():.3g}",
                      help=f"Predicted: {math.sqrt(predicted_var[variant]):.3g}")
            m2.metric("mean max weight", f"{stats.max_weight.mean():.3f}", help=f"Uniform would be 1/{n_keys}.")
            m3.metric("mean entropy (nats)", f"{stats.entropy.mean():.2f}",
                      help=f"Between 0 and log {n_keys} = {log_n:.2f}.")
            m4.metric("saturated rows", f"{stats.saturated_share:.1%}",
                      help="Rows whose largest weight exceeds 0.99.")


def _gradient_to_q(grads, figure) -> None:
    """What autograd gives for the gradient reaching q, scaled and unscaled."""
    st.markdown(
        r"One attention layer, $o_i=\sum_j p_{ij} v_j$ with $p_i=\mathrm{softmax}(s\,K q_i / T)$, and a loss "
        r"$L=\sum_i g_i\cdot o_i$ with a random upstream gradient $g_i$ (what the next layer would send back). "
        r"`torch.autograd` gives $\partial L/\partial q_i$ through `attnviz.attention.scaled_dot_product_attention`; "
        r"by the chain rule it is $\tfrac{s}{T}\,K^\top J_i V g_i$, $J_i$ being the Jacobian of row $i$'s softmax. "
        r"Unscaled, $s=1$ makes the logits $\sqrt{d_k}$ times larger, which at first *raises* the gradient, until "
        r"saturation drives $J_i$ to zero and the gradient with it."
    )
    st.code(
        "q = q.requires_grad_()\n"
        "out, _ = scaled_dot_product_attention(q, k, v, scale=s / T)   # s = 1/sqrt(d_k) or 1\n"
        "(grad_q,) = torch.autograd.grad((out * g).sum(), q)           # one row per query",
        language="python",
    )
    g1, g2 = st.columns([1, 2])
    g1.metric("median ‖∂L/∂q‖, scaled", f"{np.median(grads[sm.SCALED]):.3g}")
    g1.metric("median ‖∂L/∂q‖, unscaled", f"{np.median(grads[sm.UNSCALED]):.3g}")
    g1.metric("unscaled rows with < 1 % of it",
              f"{np.mean(grads[sm.UNSCALED] < 0.01 * np.median(grads[sm.SCALED])):.1%}",
              help="The share of unscaled rows whose ‖∂L/∂q‖ is below 1 % of the scaled median.")
    ui.plot(where=g2, fig=figure, width="stretch", key="softmax_box_grad")


random_logits_section()

st.divider()
st.header("In a real model")
st.markdown(
    "A trained head's pre-softmax scores are $q\\cdot k \\times s + b$, as the model computes them: $s$ its "
    "scaling ($1/\\sqrt{d_k}$ in most models), $b$ an additive bias some models put on every score after the "
    "scaling (BLOOM's ALiBi: a slope per head times the key position; 0 in most models), $-\\infty$ where the "
    "mask hides a key. Its softmax at its own scale is the head's real pattern. *Unscaled* feeds the softmax "
    "$q\\cdot k + b$: the raw $q\\cdot k$ of the captured $q$ and $k$, what the same weights would give without "
    "the scaling, with the bias left as it is; a temperature $T$ divides the whole score."
)

r1, r2 = st.columns([1, 2])
with r1:
    model_name = ui.model_picker(key="softmax_model", default="smollm2-135m")
# no max_chars: a browser silently refuses a paste over it; the length is checked below, with the limit
text = r2.text_input("text", value=REAL_TEXT, key="softmax_text", persist_state="session",
                     help=f"Up to {MAX_CHARS:,} characters.")
request = (model_name, text)
if st.button("Capture the scores", key="softmax_capture", type="primary", disabled=model_name is None):
    st.session_state["softmax_request"] = request
if not ui.text_ready(text, MAX_CHARS, empty="Type some text to run the model on.",
                     too_long="The text is {n:,} characters; this section computes every head's scores (from the "
                              "captured q and k) for up to {limit:,}. Shorten it."):
    pass
elif st.session_state.get("softmax_request") != request:
    st.caption("Press the button to run the model on the text. The first load of smollm2-135m converts its "
               "GGUF file once, with its progress shown; later runs are cached.")
else:
    cap = ui.get_capture(model_name, text, layers=None)  # shows its own error on failure
    if cap is not None and not cap.inputs:
        st.warning(f"attnviz does not record the q and k of {model_name}'s attention, which every map here is "
                   "computed from; pick another model.")
    elif cap is not None and cap.scaling is None:
        st.warning(f"The layers of {model_name} scale q·k by different factors; this section needs one.")
    elif cap is not None and len(cap.tokens) > MAX_TOKENS:
        st.warning(f"The text has {len(cap.tokens)} tokens; shorten it to at most {MAX_TOKENS}.")
    elif cap is not None:
        show_real_model(cap, text)
