"""Positional encodings: sinusoidal, RoPE and ALiBi, their distance decay in theory and measured in real heads."""

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import positional as P
from attnviz import snippets, ui
from attnviz.ui import positional as ui_pos
from attnviz.ui import snippets as snippet_ui
from attnviz.figures import positional as F

BASES = [100.0, 1000.0, 10000.0, 100000.0, 1000000.0]
HEAD_DIMS = [8, 16, 32, 64, 128, 256]
D_MODELS = [8, 16, 32, 64, 128, 256, 512]
POSITIONS = list(range(201))  # the query and key position sliders' range, every one a stop of the RoPE charts
SIN_POSITIONS = range(8, 513, 4)  # the sinusoid's Positions slider, and the stops its prefetch walks
CMP_LENGTHS = range(8, 1025, 8)  # the Compare section's Sequence length slider, likewise
SLOPES = [2.0 ** -e for e in range(1, 9)]
MEASURE_TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening. He lit the lamp, wound the clockwork, and "
    "watched the ships pass far out at sea. One stormy night a small boat drifted toward the rocks, and the keeper "
    "rang the bell again and again until the sailors turned away from the danger. In the morning the sea was calm, "
    "and the keeper climbed down the stairs, made his tea, and wrote a single line in his logbook."
)
SCHEME_NAMES = {
    "rope": "RoPE, rotating q and k in every layer",
    "alibi": "ALiBi, a linear bias on the scores in every layer",
    "sinusoidal": "sinusoidal vectors (Vaswani et al. 2017) added to the token embeddings once, at the input "
                  "(a toy-lab model trained with the GPT-2 position table frozen to them)",
    "learned": "learned absolute position vectors added to the token embeddings once, at the input (GPT-2 style)",
    "other": "not RoPE or ALiBi (learned or fixed vectors added at the input, or none)",
}
MAX_MEASURE_CHARS = ui.MAX_TEXT_CHARS  # long texts are measured from q and k a block of rows at a time


st.title("Positional encodings")
st.markdown(
    "Attention by itself is blind to order: permute the tokens and every score moves with them. Position has to "
    "enter somewhere: **added to the input** (sinusoidal, Vaswani et al. 2017), **rotating q and k** (RoPE, "
    "Su et al. 2021) or **biasing the scores** (ALiBi, Press et al. 2022). Each section below computes one of them "
    "from its formula; the last one measures how real heads spread attention over distance."
)

# one section at a time: only the chosen one is computed and drawn
SECTIONS = ["Sinusoidal", "RoPE", "ALiBi", "Compare", "Measured on models"]
section = st.radio("Section", SECTIONS, horizontal=True, key="pos_section",
                   persist_state="session", label_visibility="collapsed")

# ---------------------------------------------------------------- sinusoidal
if section == "Sinusoidal":
    st.latex(r"PE_{p,2i} = \sin(p\,\omega_i),\quad PE_{p,2i+1} = \cos(p\,\omega_i),\quad "
             r"\omega_i = \mathrm{base}^{-2i/d}")
    c1, c2, c3 = st.columns(3)
    n_pos = c1.slider("Positions", SIN_POSITIONS[0], SIN_POSITIONS[-1], 100, step=SIN_POSITIONS.step, key="pos_sin_n",
                      persist_state="session")
    d_model = c2.select_slider("d_model", options=D_MODELS, value=64, key="pos_sin_d", persist_state="session")
    base_sin = c3.select_slider("Base", options=BASES, value=10000.0, key="pos_sin_base", persist_state="session")
    heatmap, by_offset = ui_pos.sinusoid_charts(n_pos, d_model, base_sin, tuple(D_MODELS))
    setting = {"n_pos": n_pos, "d_model": d_model, "base": base_sin}
    ui_pos.prefetch_sinusoid(setting, ui.last_setting("pos_sin_last", setting),
                             {"n_pos": list(SIN_POSITIONS), "d_model": D_MODELS, "base": BASES}, tuple(D_MODELS))
    left, right = st.columns(2)
    with left:
        ui.chart(heatmap, "Early dimensions turn fast (stripes), late ones barely move: each position "
                                      "gets its own pattern of phases.")
        snippet_ui.show(snippets.positional_encoding(n_pos, d_model, base_sin))
    with right:
        ui.chart(by_offset,
                 "PE_p · PE_(p+k) = Σ cos(k ω_i) depends on the offset k only, not on p, and mostly falls as k grows. "
                 "**Instant:** its own d_model slider (drawn by the browser, no server); the controls above "
                 "recompute.")

    st.subheader("PE at p + k is a fixed rotation of PE at p")
    c1, c2, c3 = st.columns(3)
    k_shift = c1.slider("Offset k", -50, 50, 5, key="pos_sin_k", persist_state="session")
    p1 = c2.slider("Position p", 0, 200, 10, key="pos_sin_p1", persist_state="session")
    p2 = c3.slider("Another position p′", 0, 200, 120, key="pos_sin_p2", persist_state="session")
    left, right = st.columns([1, 1])
    with left:
        ui.chart(ui_pos.shift_matrix_chart(k_shift, d_model, base_sin),
              "Block diagonal: one 2×2 rotation by k·ω_i per (sin, cos) pair, and nothing that depends on p.")
    with right:
        table, errors = {}, {}
        for p in (p1, p2):
            mapped, direct, errors[p] = P.shift_identity(p, k_shift, d_model, base_sin)
            table[f"M_k·PE({p})"] = mapped[:6]
            table[f"PE({p + k_shift})"] = direct[:6]
        st.dataframe(pd.DataFrame(table, index=[f"dim {i}" for i in range(6)]).style.format("{:.6f}"))
        st.markdown("\n".join(f"- p = {p}: max over all {d_model} dimensions of |M_k PE_p − PE_(p+k)| = "
                              f"**{err:.1e}**" for p, err in errors.items()))
        st.caption("The same matrix works at both positions: to float64 rounding the difference is zero. "
                   "Negative positions are fine, the formula extends to them.")

# ---------------------------------------------------------------- RoPE
def rope_rotation(q, k, d_rope: int, base_rope: float, pair: int, seed: int, m_pos: int, n_pos_k: int) -> None:
    """R_m q against R_n k, and the relative-position identity with these numbers."""
    left, right = st.columns(2)
    with left:
        ui.chart(ui_pos.rope_rotation_chart(d_rope, base_rope, pair, seed, m_pos, n_pos_k, tuple(POSITIONS),
                                            tuple(BASES)),
                 "The angle between R_m q and R_n k changes only when n − m does. **Instant:** the chart's base "
                 f"slider, and its query position slider from m − {ui_pos.ROPE_REACH} to m + {ui_pos.ROPE_REACH} "
                 "(drawn by the browser, no server); the controls above recompute (Query position m moves that "
                 "window), and the table beside it follows them.")
    setting = {"d_head": d_rope, "base": base_rope, "pair": pair, "seed": seed, "m": m_pos, "n": n_pos_k}
    ui_pos.prefetch_rotation(setting, ui.last_setting("pos_rope_last", setting), HEAD_DIMS, tuple(BASES),
                             tuple(POSITIONS))
    with right:
        ident = P.rope_identity(q, k, m_pos, n_pos_k, base_rope)
        st.markdown("**The relative-position identity, with these numbers** (all d_head dimensions):")
        quantities = ["⟨R_m q, R_n k⟩", "⟨q, R_(n−m) k⟩", "⟨R_(m+1000) q, R_(n+1000) k⟩", "⟨q, k⟩ (no RoPE)"]
        st.dataframe(pd.DataFrame({"quantity": quantities, "value": [ident[key] for key in
                                                                     ("rotated", "relative", "shifted", "plain")]})
                     .style.format({"value": "{:.12f}"}), hide_index=True)
        st.caption(f"|⟨R_m q, R_n k⟩ − ⟨q, R_(n−m) k⟩| = {abs(ident['rotated'] - ident['relative']):.1e}: the "
                   f"score depends on n − m = {n_pos_k - m_pos} only. Norms are kept: |q| = {ident['norm_q']:.6f}, "
                   f"|R_m q| = {ident['norm_rotated_q']:.6f}.")


def rope_decay() -> None:
    """RoFormer's long-term decay bound, with its own controls."""
    st.markdown(
        r"**RoFormer §3.4.3, their Figure 2.** Grouping the score into pairs, $\sum_i h_i e^{\mathrm{i} r\theta_i}$ "
        r"with $h_i$ the pair products, Abel summation bounds it by $\max_i |h_{i+1}-h_i| \sum_j |S_j|$ with "
        r"$S_j = \sum_{k<j} e^{\mathrm{i} r\theta_k}$. The curve is $\frac{1}{d/2}\sum_{j=1}^{d/2} |S_j|$; at "
        r"$r = 0$ every $S_j = j$, so it starts at $(d/2+1)/2$.")
    c1, c2, c3, c4, c5 = st.columns(5)
    d_bound = c1.select_slider("Bound d_head", options=HEAD_DIMS, value=128, key="pos_bound_d", persist_state="session")
    base_bound = c2.select_slider("Bound base", options=BASES, value=10000.0, key="pos_bound_base",
                                  persist_state="session")
    max_dist = c3.select_slider("Longest distance", options=[64, 256, 1024, 4096, 16384, 65536], value=256,
                                key="pos_bound_max", persist_state="session")
    scaling = c4.selectbox("Context scaling", ["none", "linear", "ntk"], key="pos_bound_scaling",
                           persist_state="session",
                           help="linear: position interpolation (θ/s); ntk: NTK-aware, base·s^(d/(d−2))")
    factor = c5.select_slider("Scale factor s", options=[1.0, 2.0, 4.0, 8.0, 16.0, 32.0], value=4.0,
                              key="pos_bound_factor", persist_state="session", disabled=scaling == "none")
    log_x = st.toggle("Log distance axis", value=False, key="pos_bound_logx", persist_state="session")
    ui.chart(ui_pos.decay_bound_chart(max_dist, d_bound, base_bound, scaling, factor, log_x, tuple(BASES)),
             f"Starts at (d/2+1)/2 = {(d_bound / 2 + 1) / 2:g} and falls with distance, with ripples; a larger base "
             "or context scaling stretches the decay over more tokens." +
             (" Above 4000 tokens the curve is sampled at 4001 evenly spaced distances." if max_dist > 4000 else "") +
             " **Instant:** the chart's base slider (no server); the controls above recompute.")


def rope_layouts(base_rope: float, m_pos: int, seed: int) -> None:
    """The paper's interleaved pairs against transformers' rotate_half, and the permutation between them."""
    d_small = 8
    perm = P.interleaved_to_half_permutation(d_small)
    x = np.random.default_rng(seed).standard_normal((1, d_small))
    ui.chart(ui_pos.rope_layouts_chart(d_small, base_rope, m_pos, tuple(POSITIONS)),
             "The paper pairs (x_2i, x_2i+1): 2×2 blocks on the diagonal; transformers' rotate_half pairs (x_i, "
             "x_i+d/2): the same rotations, spread over four diagonals. P reorders the features by "
             f"{perm.tolist()}: what transformers does to each head's W_q, W_k rows when it loads a llama.cpp GGUF "
             f"file. **Instant:** the chart's query position slider, m − {ui_pos.ROPE_REACH} to m + "
             f"{ui_pos.ROPE_REACH} (no server); the base (here {base_rope:g}) and the controls above recompute.")
    st.markdown(f"With that reordering the two layouts give the same vector: "
                f"max |rotate_half(Px) − P·interleaved(x)| = **{P.layouts_agree(x, m_pos, base_rope):.1e}** "
                f"(d = {d_small}).")


if section == "RoPE":
    st.latex(r"f(x, m) = R_m x,\quad R_m = \mathrm{diag}_i\!\begin{pmatrix}\cos m\theta_i & -\sin m\theta_i"
             r"\\ \sin m\theta_i & \cos m\theta_i\end{pmatrix},\quad \theta_i = \mathrm{base}^{-2i/d}")
    st.latex(r"\langle R_m q,\ R_n k\rangle = q^\top R_m^\top R_n\, k = \langle q,\ R_{n-m}\, k\rangle")
    c1, c2, c3, c4 = st.columns(4)
    d_rope = c1.select_slider("d_head", options=HEAD_DIMS, value=64, key="pos_rope_d", persist_state="session")
    base_rope = c2.select_slider("Base", options=BASES, value=10000.0, key="pos_rope_base", persist_state="session")
    st.session_state["pos_rope_pair"] = min(st.session_state.get("pos_rope_pair", 0), d_rope // 2 - 1)
    pair = c3.slider("Feature pair i", 0, d_rope // 2 - 1, key="pos_rope_pair", persist_state="session")
    seed = int(c4.number_input("Random seed for q, k", 0, ui_pos.ROPE_SEED_MAX, 0, key="pos_rope_seed",
                              persist_state="session"))
    c1, c2 = st.columns(2)
    m_pos = c1.slider("Query position m", POSITIONS[0], POSITIONS[-1], 3, key="pos_rope_m", persist_state="session")
    n_pos_k = c2.slider("Key position n", POSITIONS[0], POSITIONS[-1], 10, key="pos_rope_n", persist_state="session")
    q, k = ui_pos.rope_qk(d_rope, seed)
    # only the open tab runs: a control moved redraws the open tab's chart alone
    rope_tabs = ui.lazy_tabs(["Rotation and the identity", "Long-term decay", "Two layouts of the same rotation"],
                             "pos_rope_tab")
    if rope_tabs[0].open:
        with rope_tabs[0]:
            rope_rotation(q, k, d_rope, base_rope, pair, seed, m_pos, n_pos_k)
    if rope_tabs[1].open:
        with rope_tabs[1]:
            rope_decay()
    if rope_tabs[2].open:
        with rope_tabs[2]:
            rope_layouts(base_rope, m_pos, seed)

# ---------------------------------------------------------------- ALiBi
if section == "ALiBi":
    st.latex(r"\mathrm{score}_{ij} = \frac{q_i\cdot k_j}{\sqrt{d}} - m_h\,(i-j),\qquad "
             r"m_h = 2^{-8h/n}\ (h = 1..n,\ n \text{ a power of two})")
    c1, c2, c3 = st.columns(3)
    n_heads = c1.slider("Heads", 1, 64, 12, key="pos_alibi_heads", persist_state="session")
    slopes = P.alibi_slopes(n_heads)
    # keep the chosen head inside the new range when the head count shrinks
    st.session_state["pos_alibi_head"] = min(st.session_state.get("pos_alibi_head", 0), n_heads - 1)
    head = c2.slider("Head", 0, max(n_heads - 1, 1), key="pos_alibi_head",
                     persist_state="session", disabled=n_heads == 1)
    seq = c3.slider("Sequence length", 4, 64, 16, key="pos_alibi_n", persist_state="session")
    left, right = st.columns(2)
    with left:
        closest = 2 ** int(np.floor(np.log2(n_heads)))
        ui.chart(F.slopes_bar(slopes, closest),
              "For a power of two the slopes are geometric (a straight line here). Otherwise the reference code "
              "takes the 2^⌊log2 n⌋ slopes, then every other slope of the next power of two: a second, "
              "interleaved line.")
    with right:
        st.dataframe(pd.DataFrame({"head": np.arange(n_heads), "slope": slopes,
                                   "formula": [f"2^(−8·{h + 1}/{closest})" if h < closest else
                                               f"2^(−8·{2 * (h - closest) + 1}/{2 * closest})"
                                               for h in range(n_heads)]})
                     .style.format({"slope": "{:.6g}"}), hide_index=True, height=330)
    with_content = st.toggle("Add random content scores q·k/√d (standard normal)", value=False,
                             key="pos_alibi_content", persist_state="session")
    scores = np.random.default_rng(0).standard_normal((n_heads, seq, seq)) if with_content else None
    bias = P.alibi_bias(n_heads, seq)
    pattern = P.alibi_pattern(n_heads, seq, scores)
    left, right = st.columns(2)
    with left:
        ui.chart(F.bias_heatmap(bias[head], title=f"ALiBi bias, head {head} (slope {slopes[head]:.4g})"),
              "−m·(i−j) below the diagonal, masked (blank) above it: each token further back costs m.")
    with right:
        ui.chart(F.pattern_heatmap(pattern[head], title=f"Attention softmax(scores + bias), head {head}"),
              "Steep heads attend to the last few tokens only; the gentlest heads still see far back.")

# ---------------------------------------------------------------- compare
if section == "Compare":
    st.markdown("One query at the last position against the same key vector placed at every earlier position: "
                "q and k are random, the projections are the identity, so only the positional scheme differs.")
    c1, c2, c3, c4, c5 = st.columns(5)
    d_cmp = c1.select_slider("d", options=HEAD_DIMS, value=64, key="pos_cmp_d", persist_state="session")
    n_cmp = c2.slider("Sequence length", CMP_LENGTHS[0], CMP_LENGTHS[-1], 128, step=CMP_LENGTHS.step, key="pos_cmp_n",
                      persist_state="session")
    base_cmp = c3.select_slider("Base (sinusoidal, RoPE)", options=BASES, value=10000.0, key="pos_cmp_base",
                                persist_state="session")
    slope_cmp = c4.select_slider("ALiBi slope m", options=SLOPES, value=2.0 ** -4,
                                 format_func=lambda s: f"1/{int(round(1 / s))}", key="pos_cmp_slope",
                                 persist_state="session")
    seed_cmp = c5.number_input("Seed", 0, 10_000, 0, key="pos_cmp_seed", persist_state="session")
    same = st.toggle("Key = query (the same token repeated)", value=True, key="pos_cmp_same", persist_state="session")
    ui.chart(ui_pos.compare_chart(d_cmp, n_cmp, base_cmp, slope_cmp, int(seed_cmp), same, tuple(SLOPES)),
             "RoPE's score decays and oscillates, ALiBi's falls in a straight line, sinusoidal wobbles around the "
             "content score plus PE·PE; after the softmax, without position the weight is flat at 1/n and the schemes "
             "tilt it toward nearby tokens by different amounts. **Instant:** the chart's ALiBi slope slider (no "
             "server); the controls above recompute.")
    setting = {"d": d_cmp, "n": n_cmp, "base": base_cmp, "slope": slope_cmp, "seed": int(seed_cmp), "same": same}
    ui_pos.prefetch_compare(setting, ui.last_setting("pos_cmp_last", setting),
                            {"d": HEAD_DIMS, "n": list(CMP_LENGTHS), "base": BASES, "slope": SLOPES,
                             "seed": (0, 10_000)}, tuple(SLOPES))

# ---------------------------------------------------------------- measured
if section == "Measured on models":
    from attnviz.lab import N_POSITIONS as LAB_POSITIONS  # here: attnviz.lab imports transformers' models (~3 s)

    st.markdown(
        "Run a model on a text, capture every head's attention pattern, and average the weight each query gives "
        "to the key r tokens back, over queries and heads, one line per layer. **smollm2-135m** uses RoPE "
        "(its bound is drawn against the right axis); **toy-bloom-alibi** uses ALiBi (its position-only "
        "prediction is in attention-weight units). The dotted line is uniform attention over the keys each query "
        "may see, what the mask alone gives: in a causal decoder it falls with distance, in a bidirectional encoder "
        "(**minilm-l6**, BERT) it is a flat 1/n. An encoder's queries also see the keys after them, so it is "
        "measured in both directions, against the signed distance (negative: the key comes after the query). "
        "**gemma3-270m** has two kinds of layer: 15 see only the last 512 keys with RoPE base 10,000, 3 see every "
        "key with base 1,000,000; each kind gets its own colours, baseline and bound. A toy-lab model (lab/…) is "
        "measured with the scheme it was trained with, "
        f"which the lab recorded beside its weights; unless it uses ALiBi it reads at most {LAB_POSITIONS} tokens, "
        "so give it a short text.")
    model_name = ui.model_picker("pos_meas_model", default="smollm2-135m", label="Model to measure")
    # no max_chars: a browser silently refuses a paste over it and "Measure" would plot the old text
    text = st.text_area("Text", MEASURE_TEXT, height=120, key="pos_meas_text", persist_state="session",
                        help=f"Up to {MAX_MEASURE_CHARS:,} characters.")
    c1, c2 = st.columns([1, 3])
    go_measure = c1.button("Measure", key="pos_meas_go", type="primary")
    c2.caption("The first load of a bundled GGUF model converts its file to float32 once, with its progress shown; "
               "later loads read the converted copy in seconds.")
    if go_measure:
        st.session_state["pos_meas_done"] = (model_name, text)
    done = st.session_state.get("pos_meas_done")
    if done is None:
        st.info("Press **Measure** to run the model; the other sections need no model.")
    elif not ui.text_ready(done[1], MAX_MEASURE_CHARS, empty="Type some text to measure: the text box is empty.",
                           too_long="The text is {n:,} characters; this section measures up to {limit:,}. "
                                    "Shorten it."):
        pass
    elif done[0] is None:
        st.warning("Pick a model first.")
    else:
        loaded = ui.get_model(done[0])
        capture = ui.get_capture(done[0], done[1], store="auto") if loaded is not None else None
        if capture is not None:
            if (model_name, text) != done:
                st.caption(f"Showing {done[0]} on the text as it was when Measure was pressed; press it again to "
                           "update.")
            n_tok = capture.n_tokens
            if n_tok < 2:
                st.warning("The text gave a single token; type a longer text.")
            else:
                skip = int(st.toggle("Leave out the first token (an attention sink)", value=False,
                                     key="pos_meas_skip", persist_state="session"))
                prof = ui_pos.profile(done[0], done[1], skip, capture)
                st.caption(f"How {done[0]} encodes position: {SCHEME_NAMES[loaded.shape.position]}.")
                causal = bool(capture.causal)
                ui.chart(F.distance_profile(prof.per_layer, layers=list(capture.layers), distances=prof.distances,
                                            title=f"{capture.model_name}: attention against distance, {n_tok} tokens",
                                            theory=prof.theory, theory_name="ALiBi alone (theory)",
                                            baselines=prof.baselines, relative=prof.relative, groups=prof.groups,
                                            curve_groups=prof.curve_groups),
                         ("Lines above the dotted one mean the layer prefers those distances more than "
                          if len(prof.baselines) == 1 else "A layer's line above the dotted line of its own colour "
                          "(its mask alone: causal, or its sliding window) means it prefers those distances more "
                          "than ") +
                         ("its mask alone would" if causal else
                          "uniform attention over all the keys would; this model is bidirectional, so keys after the "
                          "query are measured too, at negative distances") +
                         f"; {prof.theory_note}. Far distances average few queries, so they are noisier" +
                         ("." if skip else "; if the far right rises, that is usually the first token, which many "
                          "heads use as an attention sink (only it is that far back from the last queries): leave "
                          "it out with the toggle.") +
                         ("" if causal else " At the far left, the first query looks at the last token ([SEP] in a "
                          "BERT encoder), which heads use the same way."))
                near, where = prof.near, prof.where
                st.markdown(f"Share of attention {where} (excluding the token itself), "
                            f"mean over heads: layer {capture.layers[int(near.mean(1).argmax())]} is the most "
                            f"local ({near.mean(1).max():.2f}), layer "
                            f"{capture.layers[int(near.mean(1).argmin())]} the least ({near.mean(1).min():.2f}).")
