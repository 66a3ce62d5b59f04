"""The Toy lab's hybrid section: the Qwen3-Next hybrid and its gated and ungated softmax models trained side by side
(attnviz.lab.hybrid), their losses and first-token attention over training, and once trained every layer's map on
one text. The comparison and its maps live in the visitor's session state, as the attention variants' do."""

from __future__ import annotations

from dataclasses import asdict, replace

import streamlit as st

from attnviz import lab, snippets, ui
from attnviz.errors import AttnvizError
from attnviz.figures import lab as lab_figs
from attnviz.figures import lab_hybrid as figs
from attnviz.lab import hybrid, qwen3_next
from attnviz.ui import snippets as snippet_ui
from attnviz.ui.lab import comparison_progress, visitor

INTRO = (
    "Qwen3-Next mixes tokens two ways: three layers in four are **Gated DeltaNet**, a linear attention whose state "
    "is updated by the delta rule, and the fourth is softmax attention with a **sigmoid gate** on each head's "
    "output. No real hybrid checkpoint is on the package index, so these toy models, transformers' own "
    "Qwen3NextForCausalLM at toy size, are where you can watch such layers learn. Three models train on the task "
    "and sizes set above, from the same seed on the same batches: the **hybrid** (Gated DeltaNet layers, then one "
    "gated softmax layer), the **gated** softmax model (every layer Qwen3-Next's gated attention) and the "
    "**ungated** one (the same model with its gate held open at exactly 1: plain softmax attention). A Gated "
    "DeltaNet layer's output is still a weighted sum of per-token values, o_t = Σ_s w_ts v_s; attnviz reads that "
    "implicit map w exactly from the layer's inputs.")
MAPS_NOTE = (
    "The Gated DeltaNet panels (red and blue) are implicit maps, not probabilities: w can be negative and a row "
    "need not sum to 1. The previous-token and induction scores in each title are read on |w| divided by its row "
    "sum, where they mean what they mean for a softmax head. With Qwen3-Next's short convolution (width 4) each "
    "position's q, k and v are mixed from it and the three tokens before it, so the previous-token step can live "
    "in the convolution, not in w, and an induction stripe in w can sit one or two keys off the target the score "
    "reads: set the width to 1 to make w do all the mixing.")

DECAY_HELP = (
    "Each Gated DeltaNet head keeps exp(-A·softplus(·)) of its state per token, A drawn between 0.01 and this "
    "value. transformers draws Qwen3-Next's up to 16, and most heads of a model this small then forget within a "
    "token; measured once on the induction task (4 layers × 4 heads, width 32, 600 steps): up to 16, the Gated "
    "DeltaNet maps stayed on the diagonal and the softmax layer learnt induction; up to 1, an induction stripe "
    "formed in a Gated DeltaNet layer's own map.")


def start(config: lab.LabConfig, conv_kernel: int, a_max: float) -> hybrid.HybridComparison | None:
    """The three Qwen3-Next models of `config` training side by side in the background (not saved), or None after a
    message saying why not."""
    try:
        return hybrid.HybridComparison(config, conv_kernel=conv_kernel, a_max=a_max, owner=visitor()).start()
    except lab.LabBusyError as exc:
        st.warning(f"{exc}. A comparison takes at most {lab.MAX_SECONDS:.0f} s.")
    except AttnvizError as exc:
        st.error(f"Cannot train with these settings: {exc}")
    return None


def maps_of(comparison: hybrid.HybridComparison) -> dict | None:
    """comparison.maps on its map_text, computed once per comparison and kept in the session, or None after a
    message saying why not."""
    kept = st.session_state.get("lab_hybrid_maps")
    if kept is not None and kept[0] is comparison:
        return kept[1]
    try:
        maps = comparison.maps(comparison.map_text())
    except AttnvizError as exc:  # messages written for the page
        st.error(f"No maps: {exc}")
        return None
    st.session_state["lab_hybrid_maps"] = (comparison, maps)
    return maps


def section(config: lab.LabConfig, problems: list[str]) -> None:
    """The section's settings, its Train and Stop buttons, and the comparison's view."""
    st.markdown(INTRO)
    c1, c2, c3 = st.columns(3)
    layers = c1.select_slider("Layers of these models", [2, 3, 4], value=4, key="lab_hybrid_layers",
                              persist_state="session",
                              help="The hybrid's last layer is its softmax layer, the rest Gated DeltaNet: with 4 "
                                   "it is Qwen3-Next's own block of three linear layers and one softmax layer.")
    conv = c2.select_slider("Short convolution width", qwen3_next.CONV_KERNELS, value=qwen3_next.CONV_KERNEL,
                            key="lab_hybrid_conv", persist_state="session",
                            help="Qwen3-Next convolves q, k and v over 4 tokens before the Gated DeltaNet mixes "
                                 "them; 1 turns that off, so the layer's own map has to look back.")
    a_max = c3.select_slider("Largest decay rate A at the start", qwen3_next.A_MAXES, value=1.0,
                             key="lab_hybrid_a_max", persist_state="session", format_func=lambda a: f"{a:g}",
                             help=DECAY_HELP)
    config = replace(config, n_layers=int(layers))
    comparison: hybrid.HybridComparison | None = st.session_state.get("lab_hybrid")
    busy = comparison is not None and not comparison.finished
    c1, c2, _ = st.columns([1, 1, 3])
    if c1.button("Train the hybrid and the softmax pair", key="lab_hybrid_train", disabled=busy or bool(problems)):
        started = start(config, int(conv), float(a_max))
        if started is not None:
            st.session_state["lab_hybrid"] = comparison = started
            busy = True
    if c2.button("Stop them", key="lab_hybrid_stop", disabled=not busy):
        comparison.stop()
    if comparison is None:
        st.info(f"Trains the three models one step each in turn, {config.steps} steps each (at most "
                f"{lab.MAX_SECONDS:.0f} s in all), kept for this session only.")
        return
    st.fragment(run_every=2.0 if busy else None)(_view)(comparison, busy)


def _view(comparison: hybrid.HybridComparison, was_running: bool) -> None:
    """Progress, losses and first-token attention over training; every layer's map once finished."""
    snaps = comparison_progress(comparison, "model")
    first = next(iter(snaps.values()))
    left, right = st.columns(2)
    with left:
        ui.chart(lab_figs.variant_loss_curves({n: s.losses for n, s in snaps.items()},
                                              total_steps=first.config.steps),
                 "Loss on the task's answer tokens of the three models, from the same seed on the same batches: "
                 "the curve that falls first learnt to find the repeat first.")
    with right:
        steps = {n: [c.step for c in s.checkpoints] for n, s in snaps.items()}
        ui.chart(figs.first_token_curves(steps, {n: [c.first_token_mass for c in s.checkpoints] for n, s in
                                                 snaps.items()},
                                         {n: [c.sink_rate for c in s.checkpoints] for n, s in snaps.items()},
                                         total_steps=first.config.steps),
                 "Attention the softmax layers give <bos> over training: the mean α₀ (solid) and the share of heads "
                 "with α₀ > 0.3 (dashed). Compare gated with ungated: a head whose gate can shut has no need to park "
                 "its attention on the first token.")
    columns = st.columns(2)
    for column, (statistic, field) in zip(columns, (("prev_token", "previous_token"), ("induction", "induction"))):
        with column:
            best = {n: hybrid.best_by_kind(s.checkpoints, field) for n, s in snaps.items()}
            ui.chart(figs.best_score_curves(steps, best, statistic=statistic, total_steps=first.config.steps),
                     "The best head of each kind of layer, on the probe's repeated strings: a solid line that rises "
                     "is a Gated DeltaNet map learning the pattern, a dotted one a softmax layer.")
    if was_running and comparison.finished:
        st.rerun()
    if comparison.finished:
        _maps(comparison, first.config)


def _maps(comparison: hybrid.HybridComparison, config: lab.LabConfig) -> None:
    maps = maps_of(comparison)
    if maps is None:
        return
    head = st.selectbox("Head", list(range(config.n_heads)), key="lab_hybrid_head", persist_state="session",
                        format_func=lambda h: f"head {h}")
    head = min(int(head), config.n_heads - 1)
    ui.chart(figs.layer_maps_grid(maps, head=head),
             f"One head of every layer on `{comparison.map_text()}`: look for a stripe just below the diagonal "
             "(previous token) and, in the second copy, a stripe on the token after the first copy (induction), in "
             "the hybrid's Gated DeltaNet maps as in the softmax models' patterns.")
    st.caption(MAPS_NOTE)
    notes = {m.note for m in maps.values() if m.note}
    for note in notes:
        st.warning(note)
    ui.chart(figs.layer_scores_grid(maps),
             "Every head's previous-token and induction score on the same text, on |w| / row sum: the bright cells "
             "are the heads that do each job, in whichever kind of layer learnt it.")
    fields = {k: v for k, v in asdict(config).items() if k not in ("attention", "positional")}
    snippet_ui.show(snippets.lab_hybrid_maps(fields, comparison.conv_kernel, comparison.a_max, head))
