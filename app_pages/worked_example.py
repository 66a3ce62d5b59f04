import math

import streamlit as st

from attnviz import snippets, ui
from attnviz import worked_example as we
from attnviz.figures.worked import scores_and_pattern_figure
from attnviz.ui import snippets as snippet_ui

KEYS = {"Q": "worked_q", "K": "worked_k", "V": "worked_v"}


def load_example() -> None:
    for name, text in zip(KEYS.values(), we.EXAMPLES[st.session_state["worked_example"]]):
        st.session_state[name] = text


st.title("Worked example")
st.markdown(
    r"$\mathrm{Attention}(Q,K,V)=\mathrm{softmax}\!\left(QK^\top/\sqrt{d_k}\right)V$ on matrices small enough to "
    "check by hand. Pick an example or type your own: one row per line, numbers separated by commas. "
    "Each row of Q is a query, each row of K a key, and the row of V beside a key is the value it hands over."
)

left, right = st.columns([2, 1])
example = left.selectbox("Example", list(we.EXAMPLES), key="worked_example",
                         persist_state="session", on_change=load_example)
digits = right.slider("Decimal places", 1, 6, 3, key="worked_digits", persist_state="session")
for name, text in zip(KEYS.values(), we.EXAMPLES[example]):
    st.session_state.setdefault(name, text)

columns = st.columns(3)
texts = {m: col.text_area(f"{m} ({'n_query' if m == 'Q' else 'n_key'} rows)", key=KEYS[m],
                          persist_state="session", height=130)
         for m, col in zip(KEYS, columns)}
t1, t2 = st.columns(2)
scaled = t1.toggle(r"Divide the scores by $\sqrt{d_k}$", value=True, key="worked_scaled", persist_state="session")
causal = t2.toggle("Causal mask (query i sees keys up to i)", value=False, key="worked_causal", persist_state="session")

try:
    q, k, v = (we.parse_matrix(texts[m], m) for m in KEYS)
    steps = we.worked_steps(q, k, v, scaled=scaled, causal=causal)
except we.MatrixError as exc:
    st.error(f"{exc} Fix the matrix above, or pick an example to start again.")
    st.stop()

n_q, d_k = steps.q.shape
n_k, d_v = steps.v.shape
M = lambda a: we.latex_matrix(a, digits)  # noqa: E731
st.latex(rf"Q={M(steps.q)}\quad K={M(steps.k)}\quad V={M(steps.v)}")
st.caption(f"{n_q} queries and {n_k} keys of length d_k = {d_k}; values of length d_v = {d_v}.")
if causal and n_q > n_k:
    st.warning(f"With the causal mask, queries line up with the last {n_k} keys, so the first "
               f"{n_q - n_k} quer{'y sees' if n_q - n_k == 1 else 'ies see'} no key at all: its weights and output "
               "are 0. Give K and V as many rows as Q to see the usual triangle.")

st.subheader("1. Scores: Q Kᵀ")
st.markdown("Entry (i, j) is the dot product of query i with key j: how well key j matches what query i looks for.")
st.latex(rf"S = QK^\top = {M(steps.scores)}")
with st.expander("Every dot product"):
    for line in we.dot_product_lines(steps, digits):
        st.latex(line)

st.subheader("2. Scaling")
if scaled:
    st.markdown(f"Divide by √d_k = √{d_k} ≈ {math.sqrt(d_k):.4f}, so that scores of random unit-variance vectors "
                "keep variance 1 whatever d_k is, and the softmax does not saturate.")
    st.latex(rf"S/\sqrt{{{d_k}}} = S \times {steps.scale:.4f} = {M(steps.scaled)}")
else:
    st.markdown("Scaling is off: the scores go into the softmax as they are (scale 1). With long vectors they "
                "grow like √d_k and the softmax turns into an argmax.")
if causal:
    st.markdown("The causal mask sets the score of every later key to −∞, so its weight becomes exactly 0.")
    st.latex(rf"\text{{masked}} = {M(steps.masked)}")

st.subheader("3. Softmax, row by row")
st.markdown("Each row becomes weights that are positive and sum to 1: subtract the row's largest score (this "
            "changes nothing but keeps exp from overflowing), exponentiate, divide by the row's sum.")
for line in we.softmax_lines(steps, digits):
    st.latex(line)
ui.plot(scores_and_pattern_figure(steps.masked, steps.pattern, digits=digits,
                                          scale_text=f"× {steps.scale:.4f}" if scaled else "(unscaled)"),
                width="stretch", key="worked_figure")
st.caption("Left, the scores that enter the softmax; right, the weights that come out. The largest score of a row "
           "gets the largest weight, and the gaps between scores, not their level, set how lopsided a row is.")
snippet_ui.show(snippets.worked_example(texts["Q"], texts["K"], texts["V"], scaled=scaled, causal=causal,
                                        digits=digits))

st.subheader("4. Output: weights × V")
st.markdown("Each output row is the average of the value rows, weighted by that query's softmax row.")
for line in we.output_lines(steps, digits):
    st.latex(line)
st.latex(rf"\mathrm{{Attention}}(Q,K,V) = {M(steps.output)}")
st.caption("The weights and the output come from attnviz.attention.scaled_dot_product_attention, in float64.")
