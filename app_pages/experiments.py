import numpy as np
import streamlit as st

from attnviz import snippets, ui
from attnviz.figures import experiments as figs
from attnviz.generation import MAX_NEW_TOKENS
from attnviz.tokenizer import readable_tokens
from attnviz.ui import experiments as cache
from attnviz.ui import links
from attnviz.ui import snippets as snippet_ui
from attnviz.ui.patching_panel import patching_panel

VIEWS = ("Generation", "Knock-outs", "Patching", "Rollout", "QK attribution", "Norm-based attention")
DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat."
DEFAULT_PROMPT = "Once upon a time"
URL_TEXT_LIMIT = 1500
LINK = links.Link("exp_", {
    "view": links.Param("exp_view", "choice", choices={v: v for v in VIEWS}),
    "model": links.Param("exp_model", "model"),
    "text": links.Param("exp_text", "text", "text"),
    "prompt": links.Param("exp_prompt", "text", "prompt"),
    "new": links.Param("exp_new", "int", lo=1, hi=MAX_NEW_TOKENS),
    "temperature": links.Param("exp_temperature", "float", "temperature", lo=0.0, hi=2.0, step=0.1),
    "seed": links.Param("exp_seed", "int", lo=0, hi=1_000_000),
    "mode": links.Param("exp_ko_mode", "choice", choices={"zero": "zero", "mean": "mean"}),
    "layer": links.Param("exp_layer", "int", "layer"),
    "head": links.Param("exp_head", "int", "head"),
    "query": links.Param("exp_query", "int", "token", within="text"),
    "key": links.Param("exp_key", "int", "token", within="text"),
    "step": links.Param("exp_step", "int", "generated token", within="generation"),
    "pair": links.Param("exp_pair", "choice", choices={"ioi": "ioi", "factual": "factual", "yours": "yours"}),
    "site": links.Param("exp_patch_kind", "choice", choices={k: k for k in ("heads", "resid", "attn", "mlp")}),
    "metric": links.Param("exp_patch_metric", "choice", choices={"logit_diff": "logit_diff", "loss": "loss"}),
    "clean": links.Param("exp_pair_clean", "text", "clean prompt"),
    "corrupted": links.Param("exp_pair_corrupted", "text", "corrupted prompt"),
    "answer": links.Param("exp_pair_answer", "text", "answer"),
    "wrong": links.Param("exp_pair_wrong", "text", "wrong answer"),
})


def choice_box(label, options, key, default=None):
    if key not in st.session_state and default is not None:  # the selectbox would otherwise start at options[0]
        st.session_state[key] = default
    return links.choice_box(LINK, label, options, key, default)


def generation_view(model, loaded):
    left, right = st.columns([2, 1])
    with left:
        prompt = ui.text_input("exp_prompt", DEFAULT_PROMPT, label="Prompt", height=80)
    with right:
        n_new = st.number_input("Tokens to generate (1 to 64)", 0, 100_000, 16, key="exp_new", persist_state="session")
    c1, c2 = st.columns(2)
    temperature = c1.slider("Temperature (0 = greedy)", 0.0, 2.0, 0.0, 0.1, key="exp_temperature",
                            persist_state="session")
    seed = c2.number_input("Seed (sampling)", 0, 1_000_000, 0, key="exp_seed", persist_state="session",
                           disabled=temperature == 0)
    gen = cache.generation(model, prompt, int(n_new), float(temperature), int(seed))
    if gen is None or not gen.steps:
        return {"prompt": prompt, "new": n_new, "temperature": temperature, "seed": seed}
    st.markdown(f"**{''.join(gen.tokens[:gen.n_prompt])}** {gen.text}".replace("␣", " ").replace("↵", "  \n"))
    st.caption(f"Prompt in bold ({gen.n_prompt} tokens), then {gen.n_generated} generated"
               + {"eos": ", ending with the model's end token.", "stopped": " before you stopped it.",
                  "length": "."}[gen.ended])
    steps = [f"{i}: {gen.tokens[gen.n_prompt + i]}" for i in range(gen.n_generated)]
    links.check_asked(LINK, "exp_step", range(gen.n_generated))
    if not 0 <= st.session_state.get("exp_step", 0) < gen.n_generated:
        st.session_state["exp_step"] = gen.n_generated - 1
    step = 0 if gen.n_generated == 1 else st.select_slider(
        "Generated token", list(range(gen.n_generated)), key="exp_step", persist_state="session",
        format_func=lambda i: steps[i])
    s = gen.steps[step]
    ui.chart(figs.generation_step(gen, step),
             f"To choose token {gen.n_prompt + step} ({gen.tokens[gen.n_prompt + step]}), the newest token, at "
             f"position {s.position}, was the only query: each row is one head's weights over the {s.position + 1} "
             "tokens in the cache. Bright columns on token 0 are sinks; a diagonal-like spot on an earlier copy is "
             "an induction head at work.")
    snippet_ui.show(snippets.generation_step(model, prompt, int(n_new), float(temperature), int(seed), step))
    a, b = st.columns(2)
    with a:
        labels = readable_tokens(loaded.tokenizer, [int(t) for t in s.top_ids])
        chosen = list(s.top_ids).index(s.chosen) if s.chosen in s.top_ids else None
        ui.chart(figs.top_k_bars(labels, s.top_probs, chosen),
                 f"The generated token had probability {s.chosen_prob:.1%}"
                 + ("" if chosen is not None else ", outside the top five (sampled)") + ".")
    with b:
        ui.chart(figs.cache_growth([x.cache_tokens for x in gen.steps], [x.cache_bytes for x in gen.steps], step),
                 f"{s.cache_tokens} tokens cached: {s.cache_bytes / 1024:,.1f} KiB, growing by the same amount "
                 "every token (layers x KV heads x head size x 2 x 4 bytes).")
    st.download_button("Every step's rows, tokens and top-k (.npz)", data=lambda: cache.generation_npz(gen),
                       file_name=f"{model.replace('/', '_')}-generation.npz", mime="application/octet-stream",
                       key="exp_dl_gen")
    return {"prompt": prompt, "new": n_new, "temperature": temperature, "seed": seed, "step": step}


def knockout_view(model, loaded, text):
    """Head knock-outs: which heads to remove and how, the target token, then their effects."""
    from attnviz.knockout import KnockoutError, check_text

    ids = tuple(loaded.tokenizer(text).input_ids) if text.strip() else ()
    try:
        check_text(loaded, ids)
    except KnockoutError as exc:
        st.warning(str(exc) if ids else "The text is empty: type some text to run the model on.")
        return {}
    heads = [(layer, head) for layer in range(loaded.shape.layers) for head in range(loaded.shape.heads)]
    rows, mode = cache.knockout_rows(heads)
    if rows is None:
        return {"mode": mode}
    position = choice_box("Target position (its next token is the target)", list(range(len(ids) - 1)),
                          "exp_query", len(ids) - 2)
    target_id = cache.target_token(loaded, ids[position + 1])
    if target_id is None:
        return {"mode": mode, "query": position}
    target = (position, int(target_id))
    work = len(rows) * len(ids)
    if work * loaded.shape.d_model * loaded.shape.layers > 5e6 and not cache.knockouts_done(model, ids, rows, mode,
                                                                                           target):
        st.info(f"{len(rows)} knock-out(s) on {len(ids)} tokens: {work:,} token rows through {model}, in batches "
                "of 16 rows.")
        if not st.button("Run the knock-outs", key="exp_ko_run"):
            return {"mode": mode, "query": position}
    result = cache.knockouts(model, ids, rows, mode, target)
    if result is not None:
        _knockout_results(model, loaded, text, ids, rows, result, target, mode)
    return {"mode": mode, "query": position}


def _knockout_results(model, loaded, text, ids, rows, result, target, mode):
    """The knock-outs' effects: the grids and the scatter against a head statistic (every head), or two numbers
    (one set), then the table."""
    from attnviz.stats import COLUMNS, head_stats

    position, target_id = target
    shown = readable_tokens(loaded.tokenizer, [target_id])[0]
    st.write(f"Without a knock-out: mean next-token loss {result.base_loss:.3f} nats over {len(ids) - 1} "
             f"predictions; log p({shown} after position {position}) = {result.base_target_logprob:.3f}.")
    stats = None
    if len(rows) > 1:
        capture = ui.get_capture(model, text)
        stats = head_stats(capture) if capture is not None else None
        grid = result.grid(result.delta_loss, loaded.shape.layers, loaded.shape.heads)
        ui.chart(figs.effect_grid(grid, what="Change in mean next-token loss", unit="nats"),
                 "Red heads carry the loss: removing them makes the model worse at predicting this text; blue ones "
                 "were hurting it. Most heads barely matter on their own.")
        snippet_ui.show(snippets.knockout_grid(model, text, mode=mode, target=target))
        ui.chart(figs.effect_grid(result.grid(result.delta_target, loaded.shape.layers, loaded.shape.heads),
                                  what=f"Change in log p({shown}) at position {position}", unit="nats"),
                 "Blue heads support the target token at this position: knocking them out lowers its log-probability.")
        if stats is not None:
            stat = st.selectbox("Against the statistic", list(COLUMNS), index=list(COLUMNS).index("induction"),
                                key="exp_ko_stat", persist_state="session")
            table = cache.knockout_table(result, stats)
            ui.chart(figs.effect_scatter(table[stat], table["delta_loss_nats"], table["heads"], stat_name=stat,
                                         effect_name="change in loss (nats)"),
                     "Each point is a head: do the heads the statistic singles out (right) carry the loss (up)? "
                     "On repeated text, the induction heads should.")
    else:
        st.metric("Change in mean next-token loss", f"{result.delta_loss[0]:+.4f} nats")
        st.metric(f"Change in log p({shown}) at position {position}", f"{result.delta_target[0]:+.4f} nats")
    table = cache.knockout_table(result, stats)
    st.dataframe(table.sort_values("delta_loss_nats", ascending=False), hide_index=True, width="stretch")
    st.caption("Click a column's title to sort the heads by it: their knock-out effects beside their statistics.")
    st.download_button("Knock-out table (.csv)", data=table.to_csv(index=False),
                       file_name=f"{model.replace('/', '_')}-knockouts.csv", mime="text/csv", key="exp_dl_ko")


def rollout_view(model, text):
    capture, joint = cache.rollout(model, text)
    if capture is None:
        return {}
    n = capture.n_tokens
    c1, c2 = st.columns(2)
    with c1:
        query = choice_box("Query token", list(range(n)), "exp_query", n - 1)
    with c2:
        last = capture.layers[-1]
        layer = choice_box("Through layer", list(capture.layers), "exp_layer", last)
    raw = capture.layer_rows(layer).astype(np.float64).mean(0)
    raw = raw / raw.sum(-1, keepdims=True)
    ui.chart(figs.rollout_beside_raw(joint[layer, query], raw[query], capture.tokens, query=query, layer=layer),
             f"Rollout follows attention from the input through layer {layer} (the residual as half of each step); "
             f"layer {layer}'s own attention often puts its weight elsewhere. Rollout assumes information mixes "
             "linearly, every head counting equally and the residual carrying exactly half: it misleads where heads "
             "differ in how much their output matters (a sink's large weights carry small values) and ignores the "
             "MLPs.")
    ui.chart(figs.rollout_map(joint[layer], capture.tokens, layer=layer),
             "Every query's rollout: in a causal model the mass piles up, layer after layer, on the first tokens, "
             "which every later token can reach; pick an earlier layer to see it before it collapses.")
    st.download_button("Rollout after every layer (.npz)", data=lambda: cache.npz_bytes(
        rollout=joint, tokens=np.array(capture.tokens)), file_name=f"{model.replace('/', '_')}-rollout.npz",
        mime="application/octet-stream", key="exp_dl_ro")
    flow_panel(model, text, capture, joint, query, layer)
    return {"query": query, "layer": layer}


def flow_panel(model, text, capture, joint, query, layer):
    """Attention flow (the same paper's max-flow) beside rollout, where it stays interactive."""
    from attnviz.flow import normalised, token_limit

    st.subheader("Attention flow (max-flow through the same graph)")
    limit = token_limit([layer])
    if capture.n_tokens > limit:
        st.caption(f"Attention flow solves one max-flow per token over (layers x tokens²) edges, about tokens³ x "
                   f"depth: through layer {layer} it stays under about 3 s up to {limit} tokens. This text has "
                   f"{capture.n_tokens}: shorten it, or pick an earlier layer.")
        return
    flows = cache.flow(model, text, capture, query, layer)
    if flows is None:
        return
    cache.prefetch_flows(model, text, capture, query, layer)
    ui.chart(figs.bars_by_token({f"rollout through layer {layer}": joint[layer, query],
                                 "attention flow (each row's share)": normalised(flows[None])[0]},
                                capture.tokens, title=f"Query {query}: rollout beside attention flow",
                                y_title="share of the query's input (unitless)"),
             "Rollout multiplies the (residual-mixed) attention matrices, so mass piles onto the first tokens; flow "
             "asks how much can get from each input token to the query if every weight is a pipe's capacity, so "
             "tokens reachable by many paths keep their share (Abnar & Zuidema 2020). Flow uses scipy's maximum "
             "flow, checked against graphs solved by hand and networkx's max-flow in the tests.")
    st.download_button("Flow (.csv)", data="position,token,flow,rollout\n" + "\n".join(
        f"{j},{capture.tokens[j]!r},{f:.6g},{r:.6g}" for j, (f, r) in enumerate(zip(flows, joint[layer, query]))),
        file_name="attention-flow.csv", mime="text/csv", key="exp_dl_flow")


def qk_view(model, loaded, text):
    """One head's score of one key split into the residual-stream parts that made the query and the key."""
    ids = loaded.tokenizer(text).input_ids if text.strip() else []
    if len(ids) < 2:
        st.warning("The text needs at least two tokens: a query and a key.")
        return {}
    tokens = readable_tokens(loaded.tokenizer, ids)
    c1, c2, c3, c4 = st.columns(4)
    with c1:
        layer = choice_box("Layer", list(range(loaded.shape.layers)), "exp_layer", loaded.shape.layers // 2)
    with c2:
        head = choice_box("Head", list(range(loaded.shape.heads)), "exp_head", 0)
    with c3:
        query = choice_box("Query token", list(range(len(ids))), "exp_query", len(ids) - 1)
    with c4:
        key = choice_box("Key token", list(range(query + 1)), "exp_key", 0)
    parts = cache.qk_attribution(model, text, layer, head, query, key)
    if parts is None:
        return {"layer": layer, "head": head, "query": query, "key": key}
    m1, m2 = st.columns(2)
    m1.metric(f"Score of key {key} ({tokens[key]}) at query {query} ({tokens[query]})", f"{parts.score:+.4f}")
    m2.metric("Sum of every term", f"{parts.total:+.4f}", help="Checked equal to the score on every run.")
    ui.chart(figs.score_parts(parts.q_labels, parts.q_side(), title="Query side: what made the query",
                              x_title="share of the score (score units)"),
             "Each bar is one part of the residual stream at the query (the embedding, an earlier head, an MLP, a "
             "bias) dotted with the whole key: the parts' sum is the score. The norms' scales (and a QK-norm's) are "
             "frozen at this run, so q is linear in the parts.")
    ui.chart(figs.score_parts(parts.k_labels, parts.k_side(), title="Key side: what made the key",
                              x_title="share of the score (score units)"),
             "The same split on the key's side: the whole query dotted with each part that made the key.")
    st.dataframe([{"query part": a, "key part": b, "term": round(v, 5)} for a, b, v in parts.top(10)],
                 hide_index=True)
    st.caption(f"The ten largest (query part, key part) terms of the {parts.terms.size:,} that sum to the score "
               "(Kamath et al. 2025).")
    if parts.by_frequency is not None:
        planes = [str(i) for i in range(len(parts.by_frequency))]
        ui.chart(figs.score_parts(planes, parts.by_frequency, title="The score by RoPE plane (the 16 largest)",
                                  x_title="share of the score (score units)", top=16,
                                  y_title="RoPE plane i (frequency base^(-2i/d))"),
                 "RoPE rotates q and k in d/2 planes, plane i at frequency base^(-2i/d): low planes turn fast and "
                 "carry position, high ones barely turn and carry content. The planes' shares sum to the score.")
    st.download_button("Terms (.npz)", data=cache.npz_bytes(terms=parts.terms, q_labels=np.array(parts.q_labels),
                                                            k_labels=np.array(parts.k_labels)),
                       file_name="qk-attribution.npz", key="exp_dl_qk")
    return {"layer": layer, "head": head, "query": query, "key": key}


def norms_view(model, loaded, text):
    layer = choice_box("Layer", list(range(loaded.shape.layers)), "exp_layer", (2 * loaded.shape.layers) // 3)
    head = choice_box("Head", list(range(loaded.shape.heads)), "exp_head", 0)
    got = cache.norms(model, text, layer)
    if got is None:
        return {"layer": layer, "head": head}
    summary = got.sink_summary(head)
    sink = summary["weight"] > 0.3 and summary["norm_share"] < summary["weight"]
    ui.chart(figs.weights_beside_norms(got.pattern[head], got.shares()[head], got.tokens),
             "Left: the weights. Right: each key's share of the summed lengths ‖α·v·W_O‖ of what it adds to the "
             f"query's output. Token 0 gets {summary['weight']:.0%} of this head's weight and "
             f"{summary['norm_share']:.0%} of the norms. "
             + ("When a sink takes the mass, raw weights mislead: the sink token's value vectors are small, so it "
                "adds little to the output." if sink else "Where a sink takes the mass, raw weights mislead: the "
                "sink token's value vectors are small, so it adds little; try a head whose weight sits on token 0."))
    ui.chart(figs.value_norm_bars(got.value_norms[head], got.tokens),
             f"Token 0's vector is {summary['value_norm_ratio']:.2f}x the mean length of the others': a large weight "
             "times a short vector is a small contribution.")
    st.download_button("Weights and norms of this layer (.npz)", data=lambda: cache.npz_bytes(
        pattern=got.pattern, norms=got.norms, value_norms=got.value_norms, tokens=np.array(got.tokens)),
        file_name=f"{model.replace('/', '_')}-norms-L{layer}.npz", mime="application/octet-stream", key="exp_dl_norms")
    return {"layer": layer, "head": head}


st.title("Experiments")
st.write("From picture to experiment: watch attention while the model writes, remove heads and measure what they "
         "carried, patch a clean run into a corrupted one to find which heads carry the difference and what each "
         "writes toward the answer, follow attention through every layer (rollout and attention flow), split a "
         "head's score into the parts of the residual stream that made it (QK attribution), and weigh attention by "
         "what it moves (norm-based attention).")
links.read(LINK)
left, right = st.columns([1, 2])
with left:
    model = ui.model_picker("exp_model", default="toy-gpt2", allow_custom=True)
    view = st.radio("Experiment", VIEWS, key="exp_view", persist_state="session")
with right:
    text = ui.text_input("exp_text", DEFAULT_TEXT, height=80) if view not in ("Generation", "Patching") else None
if model is None:
    links.forget_model(LINK)
    st.stop()
if not links.model_confirmed(LINK, model):  # a link's folder or hub id loads once confirmed
    st.stop()
loaded = ui.get_model(model)
if loaded is None:
    links.forget_model(LINK)
    st.stop()
decoder = loaded.shape.causal
if not decoder and view in ("Generation", "Knock-outs", "Patching", "QK attribution"):
    st.warning(f"{model} is an encoder: it cannot generate and has no next-token loss to knock heads out of or "
               "patch, and QK attribution here splits decoders' scores. "
               "Rollout and norm-based attention work for it; pick a decoder (toy-gpt2, smollm2-135m) for the rest.")
    shown = {}
elif view == "Generation":
    shown = generation_view(model, loaded)
elif view == "Knock-outs":
    shown = knockout_view(model, loaded, text)
elif view == "Patching":
    shown = patching_panel(model, loaded)
elif view == "Rollout":
    shown = rollout_view(model, text)
elif view == "QK attribution":
    shown = qk_view(model, loaded, text)
else:
    shown = norms_view(model, loaded, text)

link = {"view": view, "model": model, **({"text": text} if text and len(text) <= URL_TEXT_LIMIT else {}),
        **{k: str(v) for k, v in shown.items() if k != "prompt"}}
if shown.get("prompt") and len(shown["prompt"]) <= URL_TEXT_LIMIT:
    link["prompt"] = shown["prompt"]
links.write(LINK, link)
