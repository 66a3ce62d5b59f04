"""The Experiments page's caches and exports: generation, knock-outs, patching and logit attribution, rollout and
attention flow, norm-based attention and QK attribution, each computed once for every session that asks for the same
(model, model_version, text, settings), with progress shown to the session that computes it. ComputeOnce rather
than st.cache_data: a computation reports its progress to its page, and a stopped generation must not be cached."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import ui
from attnviz.errors import AttnvizError
from attnviz.once import ComputeOnce

_GENERATIONS = ComputeOnce(max_items=16)
_KNOCKOUTS = ComputeOnce(max_items=16)
_NORMS = ComputeOnce(max_items=16)
_ROLLOUTS = ComputeOnce(max_items=16)
_PATCHING = ComputeOnce(max_items=16)
_FLOWS = ComputeOnce(max_items=16)
_QK = ComputeOnce(max_items=32)

KNOCKOUT_BATCH = 16  # head sets per forward pass (attnviz.knockout.knockout_effects' default)
ROLLOUT_MAX_TOKENS = 512  # rollout keeps [layer, n, n] float64: 30 layers of 512 tokens are 63 MB


def generation(name: str, prompt: str, n_new: int, temperature: float, seed: int):
    """The Generation for these settings, or None after a message. Runs with a progress bar and a Stop button;
    a stopped run is not cached, and its partial result is shown until the settings change or it is run again."""
    from attnviz.generation import GenerationError, generate

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    key = (name, ui.model_version(name), prompt, int(n_new), float(temperature), int(seed))
    found, made = _GENERATIONS.peek(key)
    if found:
        return made
    partial = st.session_state.get("exp_gen_partial")
    if st.session_state.get("exp_gen_stopped") == key and partial is not None and partial[0] == key:
        st.info(f"Stopped after {partial[1].n_generated} of {n_new} tokens.")
        if st.button("Generate again", key="exp_gen_again"):
            st.session_state.pop("exp_gen_stopped", None)
            st.rerun()
        return partial[1]
    stop = st.empty()
    stop.button("Stop", key="exp_gen_stop", on_click=lambda: st.session_state.__setitem__("exp_gen_stopped", key),
                help="Keeps the tokens generated so far.")
    bar = st.progress(0.0, text=f"Generating with {name}…")

    def on_step(so_far):
        st.session_state["exp_gen_partial"] = (key, so_far)
        bar.progress(so_far.n_generated / n_new, text=f"Generated {so_far.n_generated} of {n_new} tokens: "
                                                      f"{so_far.text[-60:]!r}")

    try:
        return _GENERATIONS.get(key, lambda: generate(loaded, prompt, int(n_new), temperature=float(temperature),
                                                      seed=int(seed), on_step=on_step))
    except GenerationError as exc:
        st.error(str(exc))
        return None
    finally:
        stop.empty()
        bar.empty()


def knockouts(name: str, token_ids: tuple[int, ...], rows: tuple, mode: str, target):
    """The KnockoutResult of these rows on the text, or None after a message; progress shown batch by batch."""
    from attnviz import budget
    from attnviz.knockout import KnockoutError, knockout_effects

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    key = (name, ui.model_version(name), token_ids, rows, mode, target)
    # every batch of KNOCKOUT_BATCH rows is one forward pass of that many copies of the text
    need = budget.forward_bytes(loaded.model.config, len(token_ids), batch=min(KNOCKOUT_BATCH, len(rows)))

    def compute(progress):
        with budget.BUDGET.admit(need, what=f"Knocking out {len(rows)} head sets"):
            return knockout_effects(loaded, list(token_ids), list(rows), mode=mode, target=target,
                                    batch=KNOCKOUT_BATCH, progress=progress)

    return ui.computed_once(_KNOCKOUTS, key, f"Knocking out {len(rows)} head set(s)", compute,
                            errors=(KnockoutError, budget.OverBudget))


def knockouts_done(name: str, token_ids: tuple[int, ...], rows: tuple, mode: str, target) -> bool:
    return (name, ui.model_version(name), token_ids, rows, mode, target) in _KNOCKOUTS


def norms(name: str, text: str, layer: int):
    """The NormAttention of the layer on the text, or None after a message."""
    from attnviz.norms import NormError, norm_attention

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    try:
        with st.spinner("Reading the layer's value vectors…"):
            return _NORMS.get((name, ui.model_version(name), text, int(layer)),
                              lambda: norm_attention(loaded, text, int(layer)))
    except NormError as exc:
        st.error(str(exc))
        return None


def rollout(name: str, text: str):
    """(capture, rollout [layer, n, n]) of the text, or (None, None) after a message."""
    from attnviz.rollout import capture_rollout

    capture = ui.get_capture(name, text)
    if capture is None:
        return None, None
    if capture.n_tokens > ROLLOUT_MAX_TOKENS:
        st.error(f"The text is {capture.n_tokens:,} tokens; rollout here takes up to {ROLLOUT_MAX_TOKENS} "
                 "(it keeps one n x n matrix per layer). Shorten the text.")
        return None, None
    key = (name, ui.model_version(name), text)
    return capture, _ROLLOUTS.get(key, lambda: capture_rollout(capture))


def token_pair(name: str, clean: str, corrupted: str, answer: str, wrong: str, label: str = "yours"):
    """The prompt pair in the model's tokens (attnviz.patching.TokenPair), or None after a message saying what to
    change (lengths that differ, one answer token for both, an encoder)."""
    from attnviz.patching import PromptPair, tokenize_pair

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    try:
        return tokenize_pair(loaded, PromptPair(label, clean, corrupted, answer, wrong, ""))
    except AttnvizError as exc:  # PatchingError, KnockoutError, ...: messages written for the page
        st.error(str(exc))
        return None


def _patching_work(name: str, key: tuple, label: str, batch: int, pair, compute):
    """compute(loaded, progress) once for every session (ComputeOnce), admitted by the memory budget as `batch`
    copies of the pair in one forward pass; None after a message."""
    from attnviz import budget
    from attnviz.knockout import KnockoutError
    from attnviz.logit_attribution import LogitAttributionError
    from attnviz.patching import PatchingError

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    need = budget.forward_bytes(loaded.model.config, pair.n, batch=batch)

    def run(progress):
        with budget.BUDGET.admit(need, what=label):
            return compute(loaded, progress)

    return ui.computed_once(_PATCHING, (name, ui.model_version(name)) + key, label, run,
                            errors=(PatchingError, KnockoutError, LogitAttributionError, budget.OverBudget))


def activation_patching(name: str, pair, kind: str, metric: str):
    """attnviz.patching.activation_patching of every site of `kind`, with progress, or None after a message."""
    from attnviz.patching import activation_patching as patch

    return _patching_work(name, ("patch", pair, kind, metric), f"Patching every {kind} site", KNOCKOUT_BATCH, pair,
                          lambda loaded, progress: patch(loaded, pair, kind, metric, batch=KNOCKOUT_BATCH,
                                                         progress=progress))


def patching_done(name: str, pair, kind: str, metric: str) -> bool:
    return (name, ui.model_version(name), "patch", pair, kind, metric) in _PATCHING


def attribution_patching(name: str, pair, metric: str):
    """attnviz.patching.attribution_patching (every kind's AtP grid from one backward pass), or None."""
    from attnviz.patching import attribution_patching as atp

    # a backward pass holds the forward pass's activations and their gradients: counted as 3 copies
    return _patching_work(name, ("atp", pair, metric), "Attribution patching (one forward and one backward pass)",
                          3, pair, lambda loaded, progress: atp(loaded, pair, metric))


def logit_attribution(name: str, pair):
    """attnviz.logit_attribution.pair_attribution of the clean prompt, or None after a message."""
    from attnviz.logit_attribution import pair_attribution

    return _patching_work(name, ("dla", pair), "Direct logit attribution", 1, pair,
                          lambda loaded, progress: pair_attribution(loaded, pair))


def flow(name: str, text: str, capture, query: int, layer: int):
    """attnviz.flow.attention_flow of the query through `layer` ([n] float64), or None after a message."""
    from attnviz.flow import FlowError

    try:
        with st.spinner("Solving one max-flow per token…"):
            return flow_of(name, ui.model_version(name), text, int(query), int(layer), capture)
    except FlowError as exc:
        st.error(str(exc))
        return None


def flow_of(name: str, version: tuple, text: str, query: int, layer: int, capture):
    """The flow of one query through one layer, computed once for every session: the page's and the builds
    ahead's cache."""
    from attnviz.flow import attention_flow

    return _FLOWS.get((name, version, text, query, layer),
                      lambda: attention_flow(capture, query, layers=[layer])[layer])


def prefetch_flows(name: str, text: str, capture, query: int, layer: int) -> None:
    """Builds in the background (ui.build_in_background) the flows a visitor is likely to ask for next, the query
    one either way, then the layer one either way, each only while it is cheap: a quarter of flow.FLOW_WORK, the
    most the page solves (0.6 s through SmolLM2's last layer at 80 tokens). A flow is one compiled max-flow per token
    that nothing pauses once it starts, so a long one would hold a background slot and a core for seconds."""
    from attnviz.flow import FLOW_WORK

    def cheap(x: int) -> bool:
        return (x + 1) * capture.n_tokens ** 3 <= FLOW_WORK / 4  # the work token_limit counts, through layer x

    layers = list(capture.layers)
    here = layers.index(layer)
    near = [(q, layer) for q in (query + 1, query - 1) if 0 <= q < capture.n_tokens]
    near += [(query, x) for x in layers[max(0, here - 1):here + 2] if x != layer]
    version = ui.model_version(name)
    ui.build_in_background(flow_of, [(name, version, text, q, x, capture) for q, x in near if cheap(x)],
                           "attnviz-flow-next")


def qk_attribution(name: str, text: str, layer: int, head: int, query: int, key: int):
    """attnviz.qk_attribution.qk_attribution of one head's score, or None after a message."""
    from attnviz.qk_attribution import qk_attribution as attribute

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    cache_key = (name, ui.model_version(name), text, int(layer), int(head), int(query), int(key))
    try:
        with st.spinner("Splitting the score (two forward passes)…"):
            return _QK.get(cache_key, lambda: attribute(loaded, text, int(layer), int(head), int(query), int(key)))
    except AttnvizError as exc:  # QKAttributionError, KnockoutError, ...: messages written for the page
        st.error(str(exc))
        return None


def npz_bytes(**arrays) -> bytes:
    """Arrays as one compressed .npz file."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    return buffer.getvalue()


def generation_npz(gen) -> bytes:
    """Every step's rows (step_i: [layer, head, position + 1]) with the tokens, ids and top-k."""
    return npz_bytes(token_ids=np.array(gen.token_ids), tokens=np.array(gen.tokens), n_prompt=gen.n_prompt,
                     positions=np.array([s.position for s in gen.steps]),
                     top_ids=np.stack([s.top_ids for s in gen.steps]),
                     top_probs=np.stack([s.top_probs for s in gen.steps]),
                     cache_bytes=np.array([s.cache_bytes for s in gen.steps]),
                     **{f"step_{i}": s.rows for i, s in enumerate(gen.steps)})


def knockout_table(result, stats: pd.DataFrame | None) -> pd.DataFrame:
    """One row per knock-out: the heads, the loss and target effects, and (single heads) the head's statistics."""
    frame = pd.DataFrame({
        "heads": [" + ".join(f"L{layer}H{head}" for layer, head in r) or "none" for r in result.rows],
        "layer": [r[0][0] if len(r) == 1 else np.nan for r in result.rows],
        "head": [r[0][1] if len(r) == 1 else np.nan for r in result.rows],
        "delta_loss_nats": result.delta_loss, "loss_nats": result.loss})
    if result.delta_target is not None:
        frame["delta_target_logprob"] = result.delta_target
    if stats is not None and (frame["layer"].notna()).any():
        frame = frame.merge(stats.drop(columns=["kv_head"], errors="ignore"), on=["layer", "head"], how="left")
    return frame


# -- the Knock-outs view's inputs, checked --------------------------------------------------------------------------

def knockout_rows(heads):
    """(the knock-out rows: each head alone, or the chosen set together; None when none is chosen, the mode)."""
    c1, c2 = st.columns(2)
    which = c1.radio("Knock out", ["Each head in turn", "A chosen set of heads together"], key="exp_ko_which",
                     persist_state="session")
    mode = c2.radio("Replace the head's output with", ["zero", "mean"], key="exp_ko_mode", persist_state="session",
                    format_func=lambda m: {"zero": "zeros", "mean": "its mean over the text's positions"}[m])
    labels = [f"L{layer}H{head}" for layer, head in heads]
    if which == "Each head in turn":
        return tuple(((layer, head),) for layer, head in heads), mode
    chosen = st.multiselect("Heads to knock out together", labels, default=labels[:1], key="exp_ko_set",
                            persist_state="session")
    if not chosen:
        st.warning("Pick at least one head to knock out.")
        return None, mode
    return (tuple(heads[labels.index(c)] for c in chosen),), mode


def target_token(loaded, actual: int) -> int | None:
    """The target token's id: the one typed (one token, else an error and None), or the one that actually follows."""
    typed = st.text_input("Target token (empty: the token that actually follows)", key="exp_ko_target",
                          persist_state="session").strip("\n")
    if not typed:
        return actual
    pieces = loaded.tokenizer(typed, add_special_tokens=False).input_ids
    if len(pieces) != 1:
        st.error(f"{typed!r} is {len(pieces)} tokens for this model; the target must be one token.")
        return None
    return pieces[0]
