import numpy as np
import streamlit as st

from attnviz import snippets, ui
from attnviz.capture.files import export_bytes
from attnviz.figures import heads as figs
from attnviz.figures import text as text_figs
from attnviz.pooling import MIN_REMAINING
from attnviz.report import default_heads
from attnviz.stats import COLUMNS, ROLES, by_layer_kind, top_heads
from attnviz.ui import heads as cache
from attnviz.ui import heads_compare as comparing
from attnviz.ui import heads_next, heads_tabs, induction
from attnviz.ui import links, mixers_panel
from attnviz.ui import snippets as snippet_ui
from attnviz.ui import spans

DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat."
URL_TEXT_LIMIT = 1500  # longer texts are not put in the link
SINK_MASS_NOTE = ("sink_mass is the mean of P[q, 0], the weight query q gives token 0, over the queries "
                  "q = 1 … n−1; the Sinks page's α₀ also counts query 0, so α₀ = (P[0, 0] + (n−1)·sink_mass)/n, "
                  "which is (1 + (n−1)·sink_mass)/n in a causal model, where query 0 sees only itself.")
TABS = {"grid": "All heads", "head": "One head", "token": "Where a token looks", "predict": "Predictions",
        "stats": "Statistics", "induction": "Induction test", "corpus": "Many texts", "compare": "Compare",
        "export": "Export"}

st.title("Heads")
st.write("Run a model on your text, record what every attention head saw (its queries, keys and mask), and find "
         "the interesting ones: sinks (everything looks at the first token), previous-token heads (a stripe just "
         "below the diagonal), induction heads (on repeated text, a stripe one step after the earlier copy).")
links.read(cache.LINK.with_choices("tab", TABS))

left, right = st.columns([1, 2])
with left:
    model = ui.model_picker("heads_model", default="smollm2-135m")
with right:
    text = ui.text_input("heads_text", DEFAULT_TEXT, height=80)
if model is None:
    links.forget_model(cache.LINK)
    st.stop()
if not links.model_confirmed(cache.LINK, model):  # a link's folder or hub id loads once the visitor confirms
    st.stop()
loaded = ui.get_model(model)
if loaded is None:
    links.forget_model(cache.LINK)
    st.stop()

n_model_layers = loaded.shape.layers
layers = None
links.check_asked(cache.LINK, "heads_layer_range", range(n_model_layers))
if n_model_layers > 12:
    if st.session_state.get("heads_layer_range_for", model) != model:  # the last model's range: not asked for
        st.session_state.pop("heads_layer_range", None)
    st.session_state["heads_layer_range_for"] = model
    asked_range = st.session_state.get("heads_layer_range")
    if asked_range and not (0 <= asked_range[0] <= asked_range[1] < n_model_layers):
        st.warning(f"The link asked for layers {asked_range[0]}–{asked_range[1]}; this model has layers 0–"
                   f"{n_model_layers - 1}: showing them all.")
        st.session_state["heads_layer_range"] = (0, n_model_layers - 1)
    st.session_state.setdefault("heads_layer_range", (0, n_model_layers - 1))  # a link may have set it already
    first, last = st.slider("Layers to capture (fewer layers = less memory for long texts)", 0, n_model_layers - 1,
                            key="heads_layer_range", persist_state="session")
    layers = tuple(range(first, last + 1)) if (first, last) != (0, n_model_layers - 1) else None
capture = ui.get_capture(model, text, layers=layers, store="auto")
if capture is None:
    st.stop()
version = ui.model_version(model)
key = (model, version, text, layers)  # what every cached view of this capture is keyed on
if not capture.layers:  # no softmax attention (Mamba2): its mixers' maps are the page
    mixers_panel.show(capture, key)
    st.stop()
long_text = capture.pattern is None  # the qk store: maps are computed from q and k, never the whole N x N
with st.spinner("Computing the statistics of every head…"):
    stats, pooled_grid = cache.stats_of(*key, capture)
n = capture.n_tokens
n_kv = len(set(capture.kv_head_of))
st.caption(f"{model}: {n:,} tokens, {capture.n_layers} layers x {capture.n_heads} heads captured"
           + (f" (and {len(capture.linear_layers)} linear layers, below)" if capture.linear_layers else "")
           + (f"; its {capture.n_heads} query heads share {n_kv} key/value head{'s' if n_kv > 1 else ''}"
              if n_kv < capture.n_heads else "") + ".")
kinds = loaded.shape.kinds_summary()
if kinds:
    st.caption(f"Its layers are not all alike. {kinds}." + (" A local layer's maps are zero beyond its window."
                                                            if loaded.shape.local_layers else ""))

if "learned_sink" in stats.columns:
    share = stats["learned_sink"]
    st.info(f"{model} has a learned sink logit in every head (as gpt-oss does): one extra logit in each row's "
            "softmax that belongs to no token, so a row's weights sum to 1 minus what the sink took. Here the sinks "
            f"take {share.mean():.1%} of the attention on average (from {share.min():.1%} to {share.max():.1%} by "
            "head): see the learned_sink column in Statistics.")
links.check_asked(cache.LINK, "heads_layer", capture.layers)  # said across the page, not in a narrow column
links.check_asked(cache.LINK, "heads_head", range(capture.n_heads))
c1, c2, c3, c4 = st.columns(4)
with c1:
    layer = cache.choice_box("Layer", list(capture.layers), "heads_layer")
with c2:
    head = cache.choice_box("Head", list(range(capture.n_heads)), "heads_head")
with c3:
    # Long texts spread each row over ~n keys, so weights are ~1/n and a linear colour scale is near black: a new
    # text of BOOST_FROM_TOKENS tokens or more turns the boost on (the user can turn it off again).
    if "heads_link_boost" in st.session_state:  # a link's boost setting wins over the long-text default
        st.session_state["heads_gamma"] = st.session_state.pop("heads_link_boost")
        st.session_state["heads_gamma_set_for"] = key
    if st.session_state.get("heads_gamma_set_for") != key:
        st.session_state["heads_gamma_set_for"] = key
        if n >= figs.BOOST_FROM_TOKENS:
            st.session_state["heads_gamma"] = True
    boost = st.toggle("Boost small weights", key="heads_gamma", persist_state="session",
                      help="Colour = weight^0.5, so small weights show. It applies to the One head, Where a token "
                           "looks and Compare views; the All heads grid is always drawn as weight^0.5.")
    st.caption(f"Single-head views only: the grid is always weight^0.5. On from {figs.BOOST_FROM_TOKENS} tokens.")
    gamma = 0.5 if boost else 1.0
with c4:
    hide_sink = st.toggle("Hide the sink", key="heads_hide_sink", persist_state="session",
                          help="Zero the attention on token 0 and renormalise each row (attnviz.views.sink_hidden), "
                               "so the rest of the map is not swamped by the sink.")
li = capture.layers.index(layer)
if kinds:
    facts = loaded.shape.layer_facts[layer]
    st.caption(f"Layer {layer} is **{facts.kind}**: {facts.describe()}.")

# The query token of Where a token looks follows a new model or text (its last token), or the one a link names.
links.check_asked(cache.LINK, "heads_link_query", range(n))
if "heads_link_query" in st.session_state:
    st.session_state["heads_query"] = min(st.session_state.pop("heads_link_query"), n - 1)
    st.session_state["heads_query_for"] = key
if st.session_state.get("heads_query_for") != key or st.session_state.get("heads_query", 0) >= n:
    st.session_state["heads_query_for"] = key
    st.session_state["heads_query"] = n - 1

view = dict(model=model, layer=str(layer), head=str(head), boost="1" if boost else "0",
            sink="1" if hide_sink else "0")
if layers is not None:
    view["layers"] = f"{layers[0]}-{layers[-1]}"
text_in_link = len(text) <= URL_TEXT_LIMIT
if text_in_link:
    view["text"] = text
else:
    st.caption(f"The text is {len(text):,} characters, over the {URL_TEXT_LIMIT:,} a link holds: the page's link "
               "keeps the rest of the view (model, layers, head and settings), but not the text.")

HIDDEN_SINK_NOTE = (f"With the sink hidden, token 0's weight is removed and each row is rescaled to sum to 1, except "
                    f"the rows that had under {MIN_REMAINING:.0%} of their weight off token 0: they are grey, "
                    "since a few millionths rescaled to full brightness would look like a real pattern"
                    + (" (row 0 always: in a causal model query 0 sees only token 0)." if capture.causal else "."))


@st.fragment
def token_panel():
    """Where one query looks: its selector reruns this panel only, and keeps the link's query token."""
    query = st.selectbox("Query token", list(range(n)), key="heads_query", persist_state="session",
                         format_func=lambda i: f"{i}: {capture.tokens[i]}")
    scope = st.radio("Heads", ["This layer", "All captured layers"], horizontal=True, key="heads_token_scope",
                     persist_state="session")
    layer_ids = (li,) if scope == "This layer" else tuple(range(capture.n_layers))
    ui.plot(cache.token_figure(*key, layer_ids, query, gamma, hide_sink, capture), width="stretch")
    st.write("One row per head: how the chosen query token splits its attention over the keys it can see."
             + (f" With the sink hidden, heads that had under {MIN_REMAINING:.0%} of this query's weight off "
                "token 0 are blank." if hide_sink else ""))
    st.markdown(f"**The text as token {query} of layer {layer}, head {head} reads it**")
    st.html(cache.text_view(*key, layer, head, query, hide_sink, capture))
    st.caption("Each token is shaded by the weight this query gives it, relative to the row's largest weight, so a "
               "spread-out row still shows; hover a token for its position and exact weight, pick another query "
               "above." + (" Later tokens are faint: a causal query cannot see them." if capture.causal else ""))
    spans.span_panel(capture, layer, head, model=model, text=text, layers=layers)
    if str(query) != st.query_params.get("query"):  # a rerun of this panel alone keeps the link up to date
        links.write(cache.LINK, {**st.query_params.to_dict(), "query": str(query)})


def predictions_panel():
    if not cache.predicts_next_token(loaded):
        st.info(f"{model} is an encoder: it has no language-model head, so it predicts no next token (no loss, no "
                "top-k). Pick a decoder such as smollm2-135m or toy-gpt2.")
        return
    got = cache.predictions_of(model, version, text, 5, loaded, capture)
    if got is None:
        return
    losses, table = got
    ui.plot(text_figs.loss_chart(losses, capture.tokens, title=f"{model}: the loss of each token given the "
                                         f"ones before it (mean {losses.mean():.2f} nats)"), width="stretch")
    st.write("Low loss = the model saw this token coming. On repeated text the second copy's loss drops: the model "
             "copies from the first, the job induction heads do.")
    st.html(text_figs.shaded_text(capture.tokens, np.concatenate([[np.nan], losses]), label="loss (nats)",
                                  fmt=".2f"))
    st.caption("The text shaded by each token's loss (darker = more surprising); hover a token for its loss.")
    st.dataframe(table, hide_index=True, width="stretch")
    st.caption("Each row: a position, the token that follows it, its loss and rank among the model's predictions "
               "(0 = the first choice), and the model's five most likely next tokens with their probabilities.")


@st.fragment
def stats_panel():
    role_cols = st.columns(3)
    for i, (role, (column, _, meaning)) in enumerate(ROLES.items()):
        with role_cols[i % 3]:
            st.markdown(f"**{role}**: {meaning} (`{column}`)")
            top = top_heads(stats, role, k=5)
            if top.empty:
                st.caption("No score: the text has no repeated token." if column == "induction" else "No score.")
            else:
                st.dataframe(top, hide_index=True, width="stretch")
    st.caption(SINK_MASS_NOTE)
    extra = ["learned_sink"] if "learned_sink" in stats.columns else []
    column = st.selectbox("Statistic to map", [*COLUMNS, *extra], key="heads_stat", persist_state="session")
    units = {"entropy": "nats", "mean_distance": "tokens"}.get(column, "share of attention")
    ui.plot(figs.stat_grid(stats, column, title=f"{column} of every head", colorbar_title=f"{column} "
                                   f"({units})"), width="stretch")
    st.write("The same statistic for every head: a role shows up as a bright cell (definitions below).")
    if kinds:
        st.markdown("**By layer kind**: each statistic's mean over the heads of the local and of the global layers.")
        st.dataframe(by_layer_kind(stats, loaded.shape), hide_index=True, width="stretch")
    st.dataframe(stats, hide_index=True, width="stretch")
    st.caption("Click a column header to sort. entropy: nats, averaged over query rows; sink_mass: attention on "
               "token 0 over queries 1 … n−1 (above); mean_distance: expected |query − key| in tokens; "
               "prev_token / self: attention on the key just before / at the query; induction: attention on the "
               "token that followed an earlier copy of the query's token (empty when nothing repeats)"
               + ("; learned_sink: the share each head gives its learned sink logit, 1 − the row's sum." if extra
                  else "."))


@st.fragment
def compare_panel():
    mode = st.radio("Compare", ["Two heads", "Two layers (mean over heads)", "Two texts"], horizontal=True,
                    key="heads_compare_mode", persist_state="session")
    ahead, following = [], dict(zip(capture.layers, capture.layers[1:]))  # built ahead: the next Layer B, Head B
    if mode == "Two heads":
        d1, d2 = st.columns(2)
        with d1:
            layer_b = cache.choice_box("Layer B", list(capture.layers), "heads_layer_b")
        with d2:
            head_b = cache.choice_box("Head B", list(range(capture.n_heads)), "heads_head_b")
        a, b = comparing.two_heads(capture, layer, head, layer_b, head_b)
        layer_b2 = st.session_state.get("heads_layer_b2")  # and the other mode
        ahead = [comparing.two_layers(capture, layer, layer_b2 if layer_b2 in capture.layers else capture.layers[0])]
        ahead += [comparing.two_heads(capture, layer, head, following[layer_b], head_b)] if layer_b in following else []
        if head_b + 1 < capture.n_heads:
            ahead.append(comparing.two_heads(capture, layer, head, layer_b, head_b + 1))
    elif mode.startswith("Two layers"):
        layer_b = cache.choice_box("Layer B", list(capture.layers), "heads_layer_b2")
        a, b = comparing.two_layers(capture, layer, layer_b)
        ahead = [comparing.two_layers(capture, layer, following[layer_b])] if layer_b in following else []
    else:
        other = st.text_area("Text B", value=text.replace("cat", "dog"), key="heads_text_b",
                             persist_state="session", height=68)  # its length is checked by get_capture
        other_capture = ui.get_capture(model, other, layers=layers, store="auto")
        if other_capture is None:
            return
        a = comparing.two_heads(capture, layer, head, layer, head)[0]
        b = comparing.CompareMap(other_capture, layer, head, ("text", other, layer, head),
                                 f"B: text B, layer {layer}, head {head}")
    shown = comparing.compare_view(*key, a, b, gamma, hide_sink)
    if shown is None:
        return
    comparing.prefetch(key, ahead, hide_sink)
    fig_a, fig_b, diff, summary = shown
    # side by side while the maps are small enough to read in half the width; longer texts get the full width
    # each, one under the other (two 1,800-token images in half columns shrink to ~200 px with piled-up ticks)
    e1, e2 = st.columns(2) if max(a.n, b.n) <= figs.DETAIL_MAX_TOKENS else (st.container(), st.container())
    ui.plot(where=e1, fig=fig_a, width="stretch")
    ui.plot(where=e2, fig=fig_b, width="stretch")
    if diff is None:
        st.info(f"Text B has {b.n:,} tokens and text A {a.n:,}: the difference needs the same number of "
                "tokens (keep the texts the same length in tokens).")
        return
    ui.plot(diff, width="stretch")
    if summary is None:
        st.write("Every row is blank in A or B (almost all their weight is on the hidden sink).")
    else:
        st.write(f"Largest difference: {summary['max']:.3f}; total variation per query row: "
                 f"{summary['total_variation']:.3f} (0 = same, 1 = disjoint)"
                 + (f", over the {summary['rows']:,} rows blank in neither map." if not summary["all_rows"] else ".")
                 + (" Computed from the full maps a block of rows at a time; the maps are drawn max-pooled."
                    if max(a.n, b.n) > comparing.FULL_MAP_MAX_TOKENS else ""))


@st.fragment
def export_panel():
    from attnviz.ui.heads import export_file

    stem = f"attention-{model.replace('/', '_')}-{n}tok"
    link = ("The page's link (model, text, layers, head and settings) reproduces this view" if text_in_link else
            f"The page's link keeps the view but not the text ({len(text):,} characters, over the "
            f"{URL_TEXT_LIMIT:,} a link holds): send the text along with it")
    e1, e2 = st.columns([2, 1])
    scope = e1.radio("Weights to export", ["This head", "This layer", "Every captured layer"], horizontal=True,
                     key="heads_export_scope", persist_state="session")
    half = e2.toggle("float16 (half the size)", key="heads_export_half", persist_state="session")
    export = {"This head": dict(layers=[layer], heads=[head]), "This layer": dict(layers=[layer], heads=None),
              "Every captured layer": dict(layers=None, heads=None)}[scope]
    dtype = np.float16 if half else np.float32
    size = export_bytes(capture, **export, dtype=dtype)
    what = {"This head": f"layer {layer}, head {head}", "This layer": f"layer {layer}, every head",
            "Every captured layer": f"{capture.n_layers} layers x {capture.n_heads} heads"}[scope]
    if ui.export_fits(size, f"{what} x {n:,}² weights"):
        tag = {"This head": f"-L{layer}H{head}", "This layer": f"-L{layer}", "Every captured layer": ""}[scope]
        tag += "-f16" if half else ""
        for fmt in ("npz", "safetensors"):
            st.download_button(f"Pattern + tokens, {what} (.{fmt})",
                               data=lambda fmt=fmt: export_file(capture, fmt, export, dtype),
                               file_name=f"{stem}{tag}.{fmt}", mime="application/octet-stream",
                               key=f"heads_dl_{fmt}")
        st.caption(f"pattern [layer, head, query, key] = [{len(export['layers'] or capture.layers)}, "
                   f"{1 if export['heads'] else capture.n_heads}, {n:,}, {n:,}] {np.dtype(dtype).name}, "
                   f"{size / 2**20:,.1f} MiB before compression, written to the file a block of rows at a time"
                   + (", computed from the layer's q and k when you press the button." if long_text else "."))
    st.download_button("Statistics table (.csv)", data=stats.to_csv(index=False), file_name=f"{stem}-stats.csv",
                       mime="text/csv", key="heads_dl_csv")
    report_heads = list(dict.fromkeys([(layer, head), *default_heads(stats, capture)]))
    snippet_ui.report_button(capture, text, model, report_heads, stats=stats, gamma=gamma, hide_sink=hide_sink,
                             settings={"layers": "all" if layers is None else f"{layers[0]}–{layers[-1]}",
                                       "boost small weights": "on" if boost else "off",
                                       "hide the sink": "on" if hide_sink else "off"}, key="heads_dl_report")
    st.caption(f"The report: one HTML file that opens offline, with the model, the text, these settings, layer "
               f"{layer} head {head} and the best head of each role ({len(report_heads)} maps), the statistics table "
               "and the code behind each. The command line writes one too, with knock-outs: `python -m attnviz "
               f"report --model {model} --text-file text.txt --heads {layer}.{head} --knockout --out report.html`.")
    st.write(f"{link}; the command line writes every layer's file (`python -m attnviz capture --model {model} "
             f"--text-file text.txt --out {stem}.npz`) and, at any length, the statistics (`python -m attnviz "
             f"stats --model {model} --text-file text.txt --out {stem}-stats.csv`).")


# Only the open tab runs: a rerun after a layer, head or toggle change draws one tab, from cached figures.
tabs = dict(zip(TABS, ui.lazy_tabs(list(TABS.values()), "heads_tab")))
view["tab"] = next((slug for slug, tab in tabs.items() if tab.open), "grid")

if tabs["grid"].open:
    with tabs["grid"], st.spinner("Drawing every head…"):
        marks = tuple(loaded.shape.layer_mark(x) for x in capture.layers) if kinds else None
        ui.plot(cache.grid_of(*key, hide_sink, 0.5, figs.GRID_TILE, capture, pooled_grid, marks),
                        width="stretch")
        st.write("Each small map is one head (query down, key across, max-pooled to 48 px). A bright left column is "
                 "a sink; a bright diagonal is a self head; a stripe just below it is a previous-token head."
                 + (" The layer axis marks local layers L (maps kept to a band as wide as its window), global ones G,"
                    " or a layer's mixer: gated, top-k, +SSM." if marks else "")
                 + (" Grey blocks lie wholly above the diagonal: a causal query cannot see later keys."
                    if capture.causal else ""))
        if hide_sink:
            st.caption(HIDDEN_SINK_NOTE + " A pure sink head is then a grey tile.")

if tabs["head"].open:
    with tabs["head"]:
        if long_text or n > cache.FULL_MAP_MAX_TOKENS:
            with st.spinner("Pooling the head…"):
                overview, kept, m = cache.overview_figure(*key, layer, head, gamma, hide_sink, capture)
            ui.plot(overview, width="stretch")
            st.write(f"Each pixel is the largest weight in a block of about {n / m:.0f} x {n / m:.0f} query x key "
                     "tokens, so a one-token stripe (the diagonal, a sink column) survives. Zoom in below to read "
                     "the weights token by token.")
            heads_tabs.zoom_panel(capture, key, layer, head, hide_sink, gamma)
            if hide_sink:
                st.caption(HIDDEN_SINK_NOTE)
                ui.plot(cache.remaining_figure(*key, layer, head, kept), width="stretch")
        else:
            detail, kept = cache.head_figure(*key, layer, head, gamma, hide_sink, capture)
            ui.plot(detail, width="stretch")
            st.write("Row = the query token, column = the key it attends to; each row sums to 1."
                     + (" Grey cells above the diagonal are masked: a causal query cannot see later keys."
                        if capture.causal else "")
                     + (f" Above {figs.DETAIL_MAX_TOKENS} tokens the map is sent as an image: hover gives positions "
                        "only." if n > figs.DETAIL_MAX_TOKENS else " Hover for the tokens and the weight."))
            if not boost and n >= figs.BOOST_FROM_TOKENS:
                st.caption(f"{n:,} tokens: most weights are near 1/{n:,}, almost black on this scale. Turn on Boost "
                           "small weights to see them.")
            if hide_sink:
                st.caption(HIDDEN_SINK_NOTE)
                ui.plot(cache.remaining_figure(*key, layer, head, kept), width="stretch")
                blank = int((kept < MIN_REMAINING).sum())
                st.write(f"The weight each query row puts on keys other than token 0, before rescaling: {blank:,} of "
                         f"{n:,} rows have under {MIN_REMAINING:.0%} and are blank in the map above.")
        snippet_ui.show(snippets.heads_head(model, text, layer, head, gamma=gamma, hide_sink=hide_sink,
                                            layers=layers))
        heads_next.prefetch_maps(key, layer, head, gamma, hide_sink, capture)  # the heads beside it, made ahead


for name, panel in (("token", token_panel), ("predict", predictions_panel),
                    ("induction", lambda: induction.induction_panel(model, version, layer, head, gamma)),
                    ("corpus", lambda: heads_tabs.many_texts_panel(model, version, text, loaded)),
                    ("stats", stats_panel), ("compare", compare_panel), ("export", export_panel)):
    if tabs[name].open:  # only the open tab runs
        with tabs[name]:
            panel()

mixers_panel.show(capture, key)  # a hybrid's other layers: their kinds, implicit maps and gates
# The view goes into the link last, compared whole: a text too long for the link must also take an older text= out
# of it, or the next rerun would read that older text back as a new link (links.read) over the user's own.
view["query"] = str(st.session_state["heads_query"])
links.write(cache.LINK, view)
