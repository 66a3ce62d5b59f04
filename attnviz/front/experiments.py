"""The seven experiments of the front door. Each takes the model as attnviz.capture does, its text as text or token
ids and its answers as strings of one token or token ids, checks what it is given (ExperimentError), runs today's
function of its module, and returns a result with to_frame(), a notebook view and save()."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attnviz import flow as fl
from attnviz import generation as gen
from attnviz import knockout as ko
from attnviz import logit_attribution as la
from attnviz import patching as pt
from attnviz import qk_attribution as qk
from attnviz import rollout as ro
from attnviz.capture import capture_attention, choose_store
from attnviz.doors import open_door
from attnviz.front import inputs as ins
from attnviz.front.inputs import ExperimentError, Model, Text, Token, Tokenizer
from attnviz.front.results import (FlowResults, GenerationResults, KnockoutResults, LogitAttributionResults,
                                   PatchingResults, QKAttributionResults, RolloutResults)

Layers = int | Sequence[int] | None  # one layer, several, or None (every one); negative counts from the end
METHODS = ("activation", "attribution")


def knockout(model: Model, text: Text, *, layer: Layers = None, head: int | Sequence[int] | None = None,
             heads: Iterable[tuple[int, int]] | None = None, together: bool = False, mode: str = "zero",
             answer: Token | None = None, position: int = -1, tokenizer: Tokenizer | None = None,
             batch: int = 16) -> KnockoutResults:
    """Knocks out attention heads one at a time (or all together) and measures what the model loses on `text`.

    Which heads: every head of `layer` (None: every layer) whose number is in `head` (None: every head), or the
    (layer, head) pairs in `heads`. together=False: one knock-out per head; True: one knock-out of them all.
    mode "zero" sets the heads' outputs to 0 before the output projection; "mean" replaces them with their mean
    over the text's positions in a clean run (mean ablation).
    Measured: the mean next-token loss over the text (nats), and with an `answer` (a string of one token, or a
    token id) log p(answer | tokens 0..position) (position -1: the answer right after the text).
    model: a name, a folder, a .gguf file, or a transformers model object with its `tokenizer` (lent and put back
    as it was). batch: knock-outs per forward pass. Returns KnockoutResults (raw: attnviz.knockout's
    KnockoutResult)."""
    with ins.model_for(model, tokenizer, "attnviz.knockout") as loaded:
        ins.decoder(loaded, "a knock-out")
        ids = ins.token_ids(loaded, text, least=2)
        chosen = ins.heads_of(loaded, layer, head) if heads is None else \
            [(ins.layer_of(loaded, la_), ins.head_of(loaded, h)) for la_, h in heads]
        if not chosen:
            raise ExperimentError("No heads chosen: name at least one layer and head to knock out.")
        target = None if answer is None else (ins.position(len(ids), position), ins.answer_id(loaded, answer))
        rows = [tuple(chosen)] if together else [(pair,) for pair in chosen]
        raw = ko.knockout_effects(loaded, ids, rows, mode=mode, target=target, batch=batch)
        shown = None if target is None else ins.tokens(loaded, [target[1]])[0]
        return KnockoutResults(loaded.spec.name, ins.tokens(loaded, ids), raw, loaded.shape.layers,
                               loaded.shape.heads, shown)


def patching(model: Model, clean: Text, corrupted: Text, *, answer: Token, wrong: Token, site: str = "heads",
             metric: str = "logit_diff", method: str = "activation", tokenizer: Tokenizer | None = None,
             batch: int = 16) -> PatchingResults:
    """Activation patching: runs the `corrupted` prompt with one site at a time set to its activation in the
    `clean` prompt (both of the same token length) and measures how much of the clean behaviour comes back.

    site: "heads" (a head's output before the output projection, at every position; one site per layer and
    head), "resid" (the residual stream entering a layer), "attn" (the attention output) or "mlp" (the MLP output),
    each one site per layer and position. metric: "logit_diff", logit(answer) - logit(wrong) at the last position,
    or "loss", -log p(answer); shares are normalised so that the corrupted run is 0 and the clean run 1.
    method: "activation" runs every patch (batched); "attribution" estimates every site at once to first order
    from one forward and one backward pass (attribution patching, AtP).
    answer, wrong: strings of one token each, or token ids. Returns PatchingResults."""
    if method not in METHODS:
        raise ExperimentError(f"Unknown method {method!r}: use 'activation' or 'attribution' (AtP).")
    if site not in pt.KINDS or metric not in pt.METRICS:
        raise ExperimentError(f"site must be one of {', '.join(pt.KINDS)} and metric one of "
                              f"{', '.join(pt.METRICS)}; got {site!r} and {metric!r}.")
    with ins.model_for(model, tokenizer, "attnviz.patching") as loaded:
        pair = _pair(loaded, clean, corrupted, answer, wrong)
        tokens = ins.tokens(loaded, pair.clean_ids)
        if method == "activation":
            raw = pt.activation_patching(loaded, pair, site, metric, batch=batch)
            return PatchingResults(loaded.spec.name, tokens, method, site, metric, raw.normalised, raw.values,
                                   raw.clean_value, raw.corrupted_value, pair)
        share = pt.attribution_patching(loaded, pair, metric)[site]
        return PatchingResults(loaded.spec.name, tokens, method, site, metric, share, None, None, None, pair)


def _pair(loaded, clean: Text, corrupted: Text, answer: Token, wrong: Token) -> pt.TokenPair:
    """The prompt pair as attnviz.patching takes it: two texts of one token length, two different answer tokens."""
    ins.decoder(loaded, "patching")
    a = ins.token_ids(loaded, clean, "The clean prompt", least=2)
    b = ins.token_ids(loaded, corrupted, "The corrupted prompt", least=2)
    if len(a) != len(b):
        raise ExperimentError(f"The clean prompt is {len(a)} tokens and the corrupted one {len(b)} in "
                              f"{loaded.spec.name}'s tokenizer; patching needs the same length.")
    good, bad = ins.answer_id(loaded, answer), ins.answer_id(loaded, wrong, "wrong answer")
    if good == bad:
        raise ExperimentError("The answer and the wrong answer are the same token: the logit difference needs two.")
    decode = loaded.tokenizer.decode
    return pt.TokenPair("pair", tuple(a), tuple(b), good, bad, tuple(decode([i]) for i in a),
                        tuple(decode([i]) for i in b))


def logit_attribution(model: Model, text: Text, *, answer: Token, wrong: Token, position: int = -1,
                      tokenizer: Tokenizer | None = None) -> LogitAttributionResults:
    """Direct logit attribution: how much each head, each MLP, the embeddings and the biases write toward
    logit(answer) - logit(wrong) at `position` (-1: the last) of `text`, with every norm's scale frozen at this
    run so that the parts are linear and add up to the model's own logit difference (checked on every call).
    answer, wrong: strings of one token each, or token ids. Returns LogitAttributionResults (raw:
    attnviz.logit_attribution.LogitAttribution)."""
    with ins.model_for(model, tokenizer, "attnviz.logit_attribution") as loaded:
        ins.decoder(loaded, "direct logit attribution")
        ids = ins.token_ids(loaded, text, least=2)
        p = ins.position(len(ids), position)
        good, bad = ins.answer_id(loaded, answer), ins.answer_id(loaded, wrong, "wrong answer")
        if good == bad:
            raise ExperimentError("The answer and the wrong answer are the same token: their difference is 0.")
        raw = la.direct_logit_attribution(loaded, ids, good, bad, p)
        shown = ins.tokens(loaded, [good, bad])
        return LogitAttributionResults(loaded.spec.name, ins.tokens(loaded, ids), raw, *shown)


def qk_attribution(model: Model, text: Text, *, layer: int, head: int, query: int = -1, key: int = 0,
                   tokenizer: Tokenizer | None = None) -> QKAttributionResults:
    """QK attribution (Kamath et al. 2025): head `head` of layer `layer` (negative: from the last), its
    pre-softmax score of position `key` at position `query` (negative: from the end), split into (query-side
    part, key-side part) terms of the residual stream (embeddings, each earlier head, MLP and bias), and by RoPE
    plane, with the norms' scales frozen; the terms add up to the model's own score (checked on every call).
    Families with q_proj and k_proj and Llama's rotary convention. Returns QKAttributionResults."""
    with ins.model_for(model, tokenizer, "attnviz.qk_attribution") as loaded:
        ins.decoder(loaded, "QK attribution")
        ids = ins.token_ids(loaded, text, least=2)
        layer, head = ins.layer_of(loaded, layer), ins.head_of(loaded, head)
        q, k = ins.position(len(ids), query, "Query position"), ins.position(len(ids), key, "Key position")
        raw = qk.qk_attribution(loaded, ids, layer, head, q, k)
        return QKAttributionResults(loaded.spec.name, ins.tokens(loaded, ids), raw)


def attention_flow(model: Model, text: Text, *, query: int = -1, layer: Layers = -1, residual: float = 0.5,
                   limit: bool = True, tokenizer: Tokenizer | None = None) -> FlowResults:
    """Attention flow (Abnar & Zuidema 2020): how much of each input token can reach position `query` after
    `layer` (one or several, negative from the last; default the last; None: every layer), reading each layer's
    head-averaged attention, mixed with the residual (weight `residual`), as pipe capacities. One max-flow per
    token and layer: with limit=True a text longer than attnviz.flow.token_limit(layers) is refused (through the
    last layer of a 30-layer model: 128 tokens). Returns FlowResults, with the same query's
    rollout beside."""
    with ins.model_for(model, tokenizer, "attnviz.attention_flow") as loaded:
        ids = ins.token_ids(loaded, text)
        layers = sorted({ins.layer_of(loaded, x) for x in ins.some(layer, loaded.shape.layers)})
        if limit and len(ids) > fl.token_limit(layers):
            raise ExperimentError(f"The text is {len(ids)} tokens; attention flow through layers {layers} takes up "
                                  f"to {fl.token_limit(layers)} (limit=False lifts the limit, for scripts that can "
                                  "wait). Shorten the text or pick earlier layers.")
        q = ins.position(len(ids), query, "Query position")
        capture = capture_attention(loaded, "", token_ids=ids, layers=range(layers[-1] + 1), store="pattern")
    flow = fl.attention_flow(capture, q, residual=residual, layers=layers, limit=limit)
    joint = ro.capture_rollout(capture, residual)[:, q]
    return FlowResults(loaded.spec.name, capture.tokens, flow, joint, q, layers)


def rollout(model: Model, text: Text, *, layer: int = -1, residual: float = 0.5,
            tokenizer: Tokenizer | None = None) -> RolloutResults:
    """Attention rollout (Abnar & Zuidema 2020): each layer's attention averaged over its heads, mixed with the
    residual connection (weight `residual`) and multiplied from the first layer up to `layer` (negative: from the
    last); rollout[l][q, k] is the share of token k's information in position q after layer l. It assumes every
    head counts equally and ignores the MLPs. Returns RolloutResults ([layer, query, key] float64)."""
    with ins.model_for(model, tokenizer, "attnviz.rollout") as loaded:
        ids = ins.token_ids(loaded, text)
        top = ins.layer_of(loaded, layer)
        store = choose_store(loaded, len(ids), range(top + 1))[0]
        capture = capture_attention(loaded, "", token_ids=ids, layers=range(top + 1), store=store)
    return RolloutResults(loaded.spec.name, capture.tokens, ro.capture_rollout(capture, residual))


def generate(model: Model, text: Text, *, max_new_tokens: int = 16, temperature: float = 0.0, seed: int = 0,
             top_k: int = gen.TOP_K, stop_at_eos: bool = True, tokenizer: Tokenizer | None = None) -> GenerationResults:
    """Continues `text` by up to max_new_tokens tokens (at most attnviz.generation.MAX_NEW_TOKENS) with the KV
    cache, greedily at temperature 0, else sampled from softmax(logits / temperature) seeded by `seed`, and keeps
    each step's attention row in every head and its top_k most likely next tokens. stop_at_eos: end at the
    model's end token. Returns GenerationResults (raw: attnviz.generation.Generation)."""
    with ins.model_for(model, tokenizer, "attnviz.generate") as loaded:
        ins.decoder(loaded, "generation")
        ids = ins.token_ids(loaded, text, "The prompt")
        raw = gen.generate(loaded, ids, max_new_tokens, temperature=temperature, seed=seed, k=top_k,
                           stop_at_eos=stop_at_eos)
        top = [ins.tokens(loaded, [int(t) for t in s.top_ids]) for s in raw.steps]
        return GenerationResults(loaded.spec.name, list(raw.tokens), raw, top)


# attnviz.knockout(...) is knockout(...) above, and so on: the modules are opened from here (attnviz.doors)
for _module, _function in ((ko, knockout), (pt, patching), (la, logit_attribution), (qk, qk_attribution),
                           (ro, rollout)):
    open_door(_module.__name__, _function)
