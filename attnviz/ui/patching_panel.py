"""The Experiments page's Patching view (widgets, the shared caches of attnviz.ui.experiments, the figures):
activation patching beside attribution patching, and direct logit attribution, on a ready-made or typed prompt pair.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import ui
from attnviz.figures import experiments as figs
from attnviz.ui import experiments as cache

URL_TEXT_LIMIT = 1500  # typed prompts longer than this stay out of the page's link

PAIR_NAMES = {"ioi": "Names (IOI): who gets the drink", "factual": "Facts: a landmark's city", "yours": "Your own pair"}


SITE_NAMES = {"heads": "each head (layer x head)", "resid": "the residual stream (layer x position)",
              "attn": "each layer's attention output (layer x position)", "mlp": "each MLP's output (layer x position)"}


METRIC_NAMES = {"logit_diff": "logit difference, answer − wrong", "loss": "loss of the clean answer"}


def patching_panel(model, loaded) -> dict:
    """The Experiments page's Patching view: the prompt pair, activation patching beside its attribution estimate,
    and the clean prompt's direct logit attribution. Returns what the page's link keeps."""
    from attnviz.patching import READY_PAIRS

    c1, c2, c3 = st.columns(3)
    which = c1.radio("Prompt pair", list(PAIR_NAMES), format_func=PAIR_NAMES.get, key="exp_pair",
                     persist_state="session")
    kind = c2.radio("Patch", list(SITE_NAMES), format_func=SITE_NAMES.get, key="exp_patch_kind",
                    persist_state="session")
    metric = c3.radio("Metric", list(METRIC_NAMES), format_func=METRIC_NAMES.get, key="exp_patch_metric",
                      persist_state="session")
    shown = {"pair": which, "site": kind, "metric": metric}
    ready = READY_PAIRS.get(which, READY_PAIRS["ioi"])
    if which == "yours":
        a, b = st.columns(2)
        fields = (("clean", a, "Clean prompt", ready.clean),
                  ("corrupted", b, "Corrupted prompt (same number of tokens)", ready.corrupted),
                  ("answer", a, "Answer (one token)", ready.answer),
                  ("wrong", b, "Wrong answer (one token)", ready.wrong))
        typed = {}
        for name, column, label, default in fields:
            st.session_state.setdefault(f"exp_pair_{name}", default)  # a link may have set it already
            typed[name] = column.text_input(label, key=f"exp_pair_{name}", persist_state="session")
        pair = cache.token_pair(model, typed["clean"], typed["corrupted"], typed["answer"], typed["wrong"])
        if all(len(v) <= URL_TEXT_LIMIT for v in typed.values()):
            shown.update(typed)
    else:
        st.caption(f"Clean: “{ready.clean}” → {ready.answer!r}; corrupted: “{ready.corrupted}” → {ready.wrong!r}. "
                   + ready.note)
        pair = cache.token_pair(model, ready.clean, ready.corrupted, ready.answer, ready.wrong, label=which)
    if pair is None:
        return shown
    attributed = cache.attribution_patching(model, pair, metric)
    if attributed is None:
        return shown
    columns = [str(h) for h in range(loaded.shape.heads)] if kind == "heads" else pair.position_labels()
    x_title = "head" if kind == "heads" else "position: clean / corrupted token"
    ui.chart(figs.patching_grid(attributed[kind], columns, x_title=x_title,
                                title=f"Attribution patching: {SITE_NAMES[kind]}, one forward and one backward pass"),
             "A linear estimate (Nanda 2023; Syed et al.): each site's clean-minus-corrupted activation times the "
             "metric's gradient at the corrupted run, as a share of the clean-minus-corrupted metric. 1 means "
             "patching this site alone would restore the clean answer; red sites carry the difference.")
    patched = _real_patching(model, loaded, pair, kind, metric)
    if patched is not None:
        _patching_result(patched, attributed[kind], columns, x_title, kind)
    _logit_attribution(model, pair)
    return shown


def _real_patching(model, loaded, pair, kind, metric):
    """The real patching of every site, on a button when it is more than a moment's work."""
    n_sites = pair.n * loaded.shape.layers if kind != "heads" else loaded.shape.heads * loaded.shape.layers
    work = n_sites * pair.n * loaded.shape.d_model * loaded.shape.layers
    if work > 5e7 and not cache.patching_done(model, pair, kind, metric):
        slot = st.empty()  # the offer goes once the button is pressed
        with slot.container():
            st.info(f"Real patching runs the corrupted prompt once per site ({n_sites:,} runs of {pair.n} tokens, "
                    f"{cache.KNOCKOUT_BATCH} at a time).")
            pressed = st.button("Patch every site", key="exp_patch_run")
        if not pressed:
            return None
        slot.empty()
    return cache.activation_patching(model, pair, kind, metric)


def _patching_result(patched, estimate, columns, x_title, kind):
    from attnviz.patching import compare

    ui.chart(figs.patching_grid(patched.normalised, columns, x_title=x_title,
                                title=f"Activation patching: {SITE_NAMES[kind]}, clean into corrupted"),
             f"Each cell is a run of the corrupted prompt with one site taken from the clean run: 0 is the corrupted "
             f"run's {patched.metric} ({patched.corrupted_value:+.3f}), 1 the clean run's "
             f"({patched.clean_value:+.3f}). Checked against a hand-patched copy of the model in the tests.")
    result = compare(patched, estimate)
    rows = range(patched.values.shape[0])
    labels = [f"L{r} {c}" for r in rows for c in columns]
    ui.chart(figs.patching_against_attribution(patched.normalised, estimate, labels, pearson=result.pearson),
             "Points on the dotted line are sites the linear estimate gets right; far from it, the model is not "
             "linear between the two runs there (saturated attention, a norm).")
    st.dataframe([{"site": f"L{r} {columns[c]}", "patched": round(real, 4), "estimate": round(est, 4)}
                  for r, c, real, est in result.disagreements], hide_index=True)
    st.caption("The sites where the estimate and real patching disagree most.")
    st.download_button("Patching grids (.npz)", data=cache.npz_bytes(
        patched=patched.normalised, attribution=estimate, clean_ids=np.array(patched.pair.clean_ids),
        corrupted_ids=np.array(patched.pair.corrupted_ids)), file_name=f"patching-{kind}.npz", key="exp_dl_patch")


def _logit_attribution(model, pair):
    st.subheader("What each head writes toward the answer (direct logit attribution, clean prompt)")
    parts = cache.logit_attribution(model, pair)
    if parts is None:
        return
    ui.chart(figs.effect_grid(parts.heads, what="Direct logit attribution", unit="logits").update_layout(
        title_text="Each head's output through the frozen final norm and the unembedding, onto answer − wrong"),
        "Red heads push the answer over the wrong token at the last position, blue ones against it. The final "
        "norm's scale is frozen at the clean run" + (f" (and {', '.join(parts.frozen)})" if parts.frozen else "")
        + ", so every part is linear and the parts add up.")
    layers = range(parts.heads.shape[0])
    labels = ["embeddings"] + [x for i in layers for x in (f"L{i} heads", f"L{i} MLP")] + ["biases"]
    values = [parts.embeddings] + [x for i in layers for x in (parts.heads[i].sum() + parts.attn_bias[i],
                                                                parts.mlp[i])] + [parts.final_bias]
    ui.chart(figs.logit_parts(labels, values, total=parts.logit_diff),
             f"The sum of every part is {parts.total:+.4f}; the model's own logit difference is "
             f"{parts.logit_diff:+.4f} (checked on every run).")
    st.download_button("Logit attribution (.csv)", data="part,logits\n" + "\n".join(
        f"{label},{value:.6g}" for label, value in parts.terms()), file_name="logit-attribution.csv",
        mime="text/csv", key="exp_dl_dla")
