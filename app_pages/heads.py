import numpy as np
import streamlit as st

from attnviz import ui, views
from attnviz.capture_io import MAX_EXPORT_BYTES, capture_to_bytes, export_bytes
from attnviz.figures import heads as figs
from attnviz.models import available_models
from attnviz.sinks import without_sinks
from attnviz.stats import COLUMNS, ROLES, head_stats, top_heads

DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat."
URL_TEXT_LIMIT = 1500  # longer texts are not put in the link
SINK_MASS_NOTE = ("sink_mass is the mean of P[q, 0], the weight query q gives token 0, over the queries "
                  "q = 1 … n−1; the Sinks page's α₀ also counts query 0, so α₀ = (P[0, 0] + (n−1)·sink_mass)/n, "
                  "which is (1 + (n−1)·sink_mass)/n in a causal model, where query 0 sees only itself.")


# The capture is determined by (model, version, text, layers): ui.model_version changes when a toy-lab model is
# saved again under its name. The capture itself (underscored) is not hashed. cache_data hands every session its
# own copy of the result, so nothing cached here is shared.
@st.cache_data(show_spinner=False, max_entries=16)
def stats_of(model: str, version: tuple, text: str, layers: tuple[int, ...] | None, _capture):
    """head_stats of the capture, and for a long capture (qk store) every head pooled to the grid's tile in the
    same pass (else None)."""
    if _capture.pattern is not None:
        return head_stats(_capture), None
    pooled, pooled_nosink = [], []
    bar = st.progress(0.0, text="Computing every head's statistics and the grid, a block of rows at a time…")
    stats = head_stats(_capture, pool=figs.GRID_TILE, pooled_out=pooled, pooled_nosink_out=pooled_nosink,
                       progress=lambda done, total: bar.progress(done / total, text=f"Statistics: layer {done} of "
                                                                 f"{total}"))
    bar.empty()
    return stats, {False: np.stack(pooled), True: np.stack(pooled_nosink)}


@st.cache_data(show_spinner=False, max_entries=16)  # a figure is one PNG of at most 30 x 9 maps of 48 px: < 1 MB
def grid_of(model: str, version: tuple, text: str, layers: tuple[int, ...] | None, hide_sink: bool, gamma: float,
            tile: int, _capture, _pooled=None):
    """The grid of all heads, with the sink hidden layer by layer when asked: a rerun that moves only the detail
    view neither renormalises the whole capture nor pools it again. _pooled: the long capture's heads already
    pooled by stats_of, {hide_sink: [layer, head, m, m]}."""
    if _capture.pattern is None:  # long-text store: each layer pooled a block of rows at a time from q and k
        pooled = _pooled[hide_sink] if (_pooled is not None and tile == figs.GRID_TILE) else np.stack(
            [views.pooled_heads(_capture.inputs[layer], tile, hide_sink=hide_sink) for layer in _capture.layers])
        return figs.head_grid(pooled, _capture.layers, gamma=gamma, tile=tile, causal=_capture.causal,
                              n_tokens=_capture.n_tokens)
    layer_map = sink_hidden if hide_sink else None
    return figs.head_grid(_capture.pattern, _capture.layers, gamma=gamma, tile=tile, layer_map=layer_map,
                          causal=_capture.causal)


OVERVIEW = 512  # pixels per side of a long head's overview


@st.cache_data(show_spinner=False, max_entries=32)
def overview_of(model: str, version: tuple, text: str, layers, layer: int, head: int, hide_sink: bool, _capture):
    """One head of a long capture max-pooled to OVERVIEW pixels, and its weight off the sink per row."""
    x = _capture.inputs[layer]
    return (views.pooled_heads(x, OVERVIEW, hide_sink=hide_sink, heads=[head])[0],
            views.mass_off_sink(x, head) if hide_sink else None)


def sink_hidden(p: np.ndarray) -> np.ndarray:
    """p [..., query, key] without the first-token sink (attnviz.sinks.without_sinks: column 0 zeroed, rows
    rescaled to 1), and with the rows that had under figs.MIN_REMAINING of their weight off token 0 blank (NaN):
    rescaling a few millionths to full brightness would draw a pattern that is not there."""
    return figs.blank_rows(without_sinks(p, sink_keys=(0,)), figs.mass_off_sink(p) >= figs.MIN_REMAINING)


def from_link() -> None:
    """Model, text, layer and head from the URL query, so a shared link reproduces the view. Applied whenever the
    query is not the one this page last wrote (a new link, or a link from another page), never over the user's
    own choices on a rerun."""
    q = st.query_params
    if _link_key(q.to_dict()) == st.session_state.get("heads_link_seen"):
        return
    st.session_state["heads_link_seen"] = _link_key(q.to_dict())
    if "model" in q:
        if q["model"] in {spec.name for spec in available_models()}:
            st.session_state["heads_model"] = q["model"]
        else:  # a local folder or hub id: it goes into the picker's text box, loaded only once the user confirms
            st.session_state["heads_model"] = ui.CUSTOM_MODEL
            st.session_state["heads_model_custom"] = q["model"]
            st.session_state["heads_link_model_pending"] = q["model"]
    if "text" in q:
        st.session_state["heads_text"] = q["text"][:ui.MAX_TEXT_CHARS]
    asked = {}
    for name in ("layer", "head"):
        if q.get(name, "").isdigit():
            st.session_state[f"heads_{name}"] = asked[f"heads_{name}"] = int(q[name])
    st.session_state["heads_link_asked"] = asked  # choice_box says so when the model has no such layer or head
    first, _, last = q.get("layers", "").partition("-")
    if first.isdigit() and last.isdigit() and int(first) <= int(last):
        st.session_state["heads_layer_range"] = (int(first), int(last))
    if q.get("boost") in ("0", "1"):
        st.session_state["heads_link_boost"] = q["boost"] == "1"  # applied over the long-text default
    if q.get("sink") in ("0", "1"):
        st.session_state["heads_hide_sink"] = q["sink"] == "1"
    if q.get("query", "").isdigit():
        st.session_state["heads_link_query"] = int(q["query"])  # applied once the text's tokens are known


LINK_KEYS = ("model", "text", "layer", "head", "layers", "boost", "sink", "query")


def _link_key(query: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in query.items() if k in LINK_KEYS))


def choice_box(label: str, options: list[int], key: str) -> int:
    return ui.choice_box(label, options, key, link_asked_key="heads_link_asked")


st.title("Heads")
st.write("Run a model on your text, record what every attention head saw (its queries, keys and mask), and find "
         "the interesting ones: sinks (everything looks at the first token), previous-token heads (a stripe just "
         "below the diagonal), induction heads (on repeated text, a stripe one step after the earlier copy).")
from_link()

left, right = st.columns([1, 2])
with left:
    model = ui.model_picker("heads_model", default="smollm2-135m")
with right:
    text = ui.text_input("heads_text", DEFAULT_TEXT, height=80)
if model is None:
    st.stop()
if model == st.session_state.get("heads_link_model_pending"):
    # A link must not make the server load any folder it names: the visitor confirms first.
    st.info(f"This link asks to load the model `{model}` from this server's disk or Hugging Face cache.")
    if not st.button("Load it", key="heads_link_model_confirm"):
        st.stop()
    del st.session_state["heads_link_model_pending"]
loaded = ui.get_model(model)
if loaded is None:
    st.stop()

n_model_layers = loaded.shape.layers
layers = None
if n_model_layers > 12:
    asked_range = st.session_state.get("heads_layer_range")
    if asked_range and not (0 <= asked_range[0] <= asked_range[1] < n_model_layers):
        st.warning(f"The link asked for layers {asked_range[0]}–{asked_range[1]}; this model has layers 0–"
                   f"{n_model_layers - 1}: showing them all.")
        st.session_state["heads_layer_range"] = (0, n_model_layers - 1)
    first, last = st.slider("Layers to capture (fewer layers = less memory for long texts)", 0, n_model_layers - 1,
                            (0, n_model_layers - 1), key="heads_layer_range", persist_state="session")
    layers = tuple(range(first, last + 1)) if (first, last) != (0, n_model_layers - 1) else None
capture = ui.get_capture(model, text, layers=layers, store="auto")
if capture is None:
    st.stop()
long_text = capture.pattern is None  # the qk store: maps are computed from q and k, never the whole N x N
version = ui.model_version(model)
with st.spinner("Computing the statistics of every head…"):
    stats, pooled_grid = stats_of(model, version, text, layers, capture)
n = capture.n_tokens
st.caption(f"{model}: {n:,} tokens, {capture.n_layers} layers x {capture.n_heads} heads captured"
           + (f"; query heads share {len(set(capture.kv_head_of))} key/value heads" if
              len(set(capture.kv_head_of)) < capture.n_heads else "") + ".")

if "learned_sink" in stats.columns:
    share = stats["learned_sink"]
    st.info(f"{model} has a learned sink logit in every head (as gpt-oss does): one extra logit in each row's "
            "softmax that belongs to no token, so a row's weights sum to 1 minus what the sink took. Here the sinks "
            f"take {share.mean():.1%} of the attention on average (from {share.min():.1%} to {share.max():.1%} by "
            "head): see the learned_sink column in Statistics.")
c1, c2, c3, c4 = st.columns(4)
with c1:
    layer = choice_box("Layer", list(capture.layers), "heads_layer")
with c2:
    head = choice_box("Head", list(range(capture.n_heads)), "heads_head")
with c3:
    # Long texts spread each row over ~n keys, so weights are ~1/n and a linear colour scale is near black: a new
    # text of BOOST_FROM_TOKENS tokens or more turns the boost on (the user can turn it off again).
    capture_id = (model, version, text, layers)
    if "heads_link_boost" in st.session_state:  # a link's boost setting wins over the long-text default
        st.session_state["heads_gamma"] = st.session_state.pop("heads_link_boost")
        st.session_state["heads_gamma_set_for"] = capture_id
    if st.session_state.get("heads_gamma_set_for") != capture_id:
        st.session_state["heads_gamma_set_for"] = capture_id
        if n >= figs.BOOST_FROM_TOKENS:
            st.session_state["heads_gamma"] = True
    boost = st.toggle("Boost small weights", key="heads_gamma", persist_state="session",
                      help="Colour = weight^0.5, so small weights show. It applies to the One head, Where a token "
                           "looks and Compare views; the All heads grid is always drawn as weight^0.5.")
    st.caption(f"Single-head views only: the grid is always weight^0.5. On from {figs.BOOST_FROM_TOKENS} tokens.")
    gamma = 0.5 if boost else 1.0
with c4:
    hide_sink = st.toggle("Hide the sink", key="heads_hide_sink", persist_state="session",
                          help="Zero the attention on token 0 and renormalise each row (attnviz.sinks.without_sinks), "
                               "so the rest of the map is not swamped by the sink.")
li = capture.layers.index(layer)

view = dict(model=model, layer=str(layer), head=str(head), boost="1" if boost else "0",
            sink="1" if hide_sink else "0")
if layers is not None:
    view["layers"] = f"{layers[0]}-{layers[-1]}"
text_in_link = len(text) <= URL_TEXT_LIMIT
if text_in_link:
    view["text"] = text
if not text_in_link:
    st.caption(f"The text is {len(text):,} characters, over the {URL_TEXT_LIMIT:,} a link holds: the page's link "
               "keeps the rest of the view (model, layers, head and settings), but not the text.")


def shown(p):
    """A slice of the pattern as displayed: with the first-token sink hidden when asked (sink_hidden returns a copy:
    the capture is shared)."""
    return sink_hidden(p) if hide_sink else p


HIDDEN_SINK_NOTE = (f"With the sink hidden, token 0's weight is removed and each row is rescaled to sum to 1, except "
                    f"the rows that had under {figs.MIN_REMAINING:.0%} of their weight off token 0: they are grey, "
                    "since a few millionths rescaled to full brightness would look like a real pattern"
                    + (" (row 0 always: in a causal model query 0 sees only token 0)." if capture.causal else "."))


tab_grid, tab_head, tab_token, tab_stats, tab_compare, tab_export = st.tabs(
    ["All heads", "One head", "Where a token looks", "Statistics", "Compare", "Export"])

with tab_grid:
    with st.spinner("Drawing every head…"):
        grid = grid_of(model, version, text, layers, hide_sink, 0.5, figs.GRID_TILE, capture, pooled_grid)
    st.plotly_chart(grid, width="stretch")
    st.write("Each small map is one head (query down, key across, max-pooled to 48 px). A bright left column is a "
             "sink; a bright diagonal is a self head; a stripe just below it is a previous-token head."
             + (" Grey blocks lie wholly above the diagonal: a causal query cannot see later keys." if capture.causal
                else ""))
    if hide_sink:
        st.caption(HIDDEN_SINK_NOTE + " A pure sink head is then a grey tile.")

with tab_head:
    if long_text:
        causal_offset = 0 if capture.causal else None
        with st.spinner("Pooling the head…"):
            pooled, kept = overview_of(model, version, text, layers, layer, head, hide_sink, capture)
        st.plotly_chart(figs.pooled_overview(pooled, n, gamma=gamma, causal=capture.causal,
                                             title=f"Layer {layer}, head {head}: every {n:,} x {n:,} weight, "
                                                   f"max-pooled to {pooled.shape[-1]} px"), width="stretch")
        st.write(f"Each pixel is the largest weight in a block of about {n / pooled.shape[-1]:.0f} x "
                 f"{n / pooled.shape[-1]:.0f} query x key tokens, so a one-token stripe (the diagonal, a sink column) "
                 "survives. Zoom in below to read the weights token by token.")
        z1, z2, z3 = st.columns(3)
        size = z3.select_slider("Window (tokens)", [32, 64, 96, 128, 160], 64, key="heads_zoom_size",
                                persist_state="session")
        span = max(0, n - size)  # the last window start; the window is the whole text when it is that short
        q0 = z1.slider("Queries from", 0, span, span, key="heads_zoom_q", persist_state="session") if span else 0
        k0 = z2.slider("Keys from", 0, span, min(span, q0), key="heads_zoom_k", persist_state="session") \
            if span else 0
        window = views.head_window(capture.inputs[layer], head, (q0, min(n, q0 + size)), (k0, min(n, k0 + size)),
                                   hide_sink=hide_sink)
        st.plotly_chart(figs.window_detail(window, capture.tokens, q0, k0, gamma=gamma, causal_offset=causal_offset,
                                           title=f"Layer {layer}, head {head}: queries {q0:,}–{q0 + len(window) - 1:,}"
                                                 f", keys {k0:,}–{k0 + window.shape[1] - 1:,}"), width="stretch")
        st.write("The window's weights at full resolution, computed from the layer's q and k for these rows only."
                 + (" Grey cells are masked: a causal query cannot see later keys." if capture.causal else ""))
        if hide_sink:
            st.caption(HIDDEN_SINK_NOTE)
            st.plotly_chart(figs.remaining_mass(kept, title=f"Layer {layer}, head {head}: what is left off the sink, "
                                                "row by row"), width="stretch")
    else:
        st.plotly_chart(figs.head_detail(shown(capture.pattern[li, head]), capture.tokens, gamma=gamma,
                                         causal=capture.causal,
                                         title=f"Layer {layer}, head {head}: attention weights "
                                               f"(reads KV head {capture.kv_head_of[head]})"), width="stretch")
        st.write("Row = the query token, column = the key it attends to; each row sums to 1."
                 + (" Grey cells above the diagonal are masked: a causal query cannot see later keys." if capture.causal
                    else "")
                 + (f" Above {figs.DETAIL_MAX_TOKENS} tokens the map is sent as an image: hover gives positions only." if
                    n > figs.DETAIL_MAX_TOKENS else " Hover for the tokens and the weight."))
        if not boost and n >= figs.BOOST_FROM_TOKENS:
            st.caption(f"{n:,} tokens: most weights are near 1/{n:,}, almost black on this scale. Turn on Boost small "
                       "weights to see them.")
        if hide_sink:
            st.caption(HIDDEN_SINK_NOTE)
            kept = figs.mass_off_sink(capture.pattern[li, head])
            st.plotly_chart(figs.remaining_mass(kept, title=f"Layer {layer}, head {head}: what is left off the sink, "
                                                "row by row"), width="stretch")
            blank = int((kept < figs.MIN_REMAINING).sum())
            st.write(f"The weight each query row puts on keys other than token 0, before rescaling: {blank:,} of {n:,} "
                     f"rows have under {figs.MIN_REMAINING:.0%} and are blank in the map above.")

with tab_token:
    if "heads_link_query" in st.session_state:  # the query token a link names (the last one if it is too far)
        st.session_state["heads_query"] = min(st.session_state.pop("heads_link_query"), n - 1)
        st.session_state["heads_query_for"] = capture_id
    if st.session_state.get("heads_query_for") != capture_id or st.session_state.get("heads_query", 0) >= n:
        # a new model or text: the query follows it (its last token), never a stale position from the old one
        st.session_state["heads_query_for"] = capture_id
        st.session_state["heads_query"] = n - 1
    query = st.selectbox("Query token", list(range(n)), key="heads_query", persist_state="session",
                         format_func=lambda i: f"{i}: {capture.tokens[i]}")
    scope = st.radio("Heads", ["This layer", "All captured layers"], horizontal=True, key="heads_token_scope",
                     persist_state="session")
    layer_ids = [li] if scope == "This layer" else list(range(capture.n_layers))
    if long_text:
        rows = shown(np.concatenate([capture.layer_rows(capture.layers[i], query, query + 1) for i in layer_ids]))
        rows = rows.reshape(-1, n)
    else:
        rows = shown(capture.pattern[layer_ids, :, query, :]).reshape(-1, n)
    keys = query + 1 if capture.causal else n
    labels = [f"L{capture.layers[i]} H{h}" for i in layer_ids for h in range(capture.n_heads)]
    st.plotly_chart(figs.token_looks(rows[:, :keys], capture.tokens, labels, query, gamma=gamma), width="stretch")
    st.write("One row per head: how the chosen query token splits its attention over the keys it can see."
             + (f" With the sink hidden, heads that had under {figs.MIN_REMAINING:.0%} of this query's weight off "
                "token 0 are blank." if hide_sink else ""))

with tab_stats:
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
    st.plotly_chart(figs.stat_grid(stats, column, title=f"{column} of every head", colorbar_title=f"{column} "
                                   f"({units})"), width="stretch")
    st.write("The same statistic for every head: a role shows up as a bright cell (definitions below).")
    st.dataframe(stats, hide_index=True, width="stretch")
    st.caption("Click a column header to sort. entropy: nats, averaged over query rows; sink_mass: attention on "
               "token 0 over queries 1 … n−1 (above); mean_distance: expected |query − key| in tokens; "
               "prev_token / self: attention on the key just before / at the query; induction: attention on the "
               "token that followed an earlier copy of the query's token (empty when nothing repeats)"
               + ("; learned_sink: the share each head gives its learned sink logit, 1 − the row's sum." if extra
                  else "."))

with tab_compare:
  if long_text:
    st.info(f"Compare needs the dense pattern: this text's {n:,} tokens are kept as q and k only. Compare two "
            "heads on a shorter text, or zoom into each head in One head.")
  else:
    mode = st.radio("Compare", ["Two heads", "Two layers (mean over heads)", "Two texts"], horizontal=True,
                    key="heads_compare_mode", persist_state="session")
    a_title = f"A: layer {layer}, head {head}"
    a = shown(capture.pattern[li, head])
    b, b_title, b_tokens = None, "", capture.tokens
    if mode == "Two heads":
        d1, d2 = st.columns(2)
        with d1:
            layer_b = choice_box("Layer B", list(capture.layers), "heads_layer_b")
        with d2:
            head_b = choice_box("Head B", list(range(capture.n_heads)), "heads_head_b")
        lj = capture.layers.index(layer_b)
        b, b_title = shown(capture.pattern[lj, head_b]), f"B: layer {layer_b}, head {head_b}"
    elif mode.startswith("Two layers"):
        layer_b = choice_box("Layer B", list(capture.layers), "heads_layer_b2")
        lj = capture.layers.index(layer_b)
        a, a_title = shown(capture.pattern[li].mean(0)), f"A: layer {layer}, mean of its heads"
        b, b_title = shown(capture.pattern[lj].mean(0)), f"B: layer {layer_b}, mean of its heads"
    else:
        other = st.text_area("Text B", value=text.replace("cat", "dog"), key="heads_text_b",
                             persist_state="session", height=68)  # its length is checked by get_capture
        other_capture = ui.get_capture(model, other, layers=layers)
        if other_capture is not None:
            b, b_title, b_tokens = shown(other_capture.pattern[li, head]), f"B: text B, layer {layer}, head {head}", \
                other_capture.tokens
    if b is not None:
        # side by side while the maps are small enough to read in half the width; longer texts get the full width
        # each, one under the other (two 1,800-token images in half columns shrink to ~200 px with piled-up ticks)
        e1, e2 = st.columns(2) if max(a.shape[-1], b.shape[-1]) <= figs.DETAIL_MAX_TOKENS else (st.container(),
                                                                                                st.container())
        with e1:
            st.plotly_chart(figs.head_detail(a, capture.tokens, title=a_title, gamma=gamma, causal=capture.causal),
                            width="stretch")
        with e2:
            st.plotly_chart(figs.head_detail(b, b_tokens, title=b_title, gamma=gamma, causal=capture.causal),
                            width="stretch")
        if a.shape == b.shape:
            st.plotly_chart(figs.difference(a, b, capture.tokens, title="A − B: red = more attention in A, "
                                            "blue = more in B"), width="stretch")
            both = ~(np.isnan(a).any(-1) | np.isnan(b).any(-1))  # rows blank in neither (hidden sink)
            if both.any():
                d = np.abs(a[both] - b[both])
                st.write(f"Largest difference: {d.max():.3f}; total variation per query row: "
                         f"{0.5 * d.sum(-1).mean():.3f} (0 = same, 1 = disjoint)"
                         + (f", over the {int(both.sum()):,} rows blank in neither map." if not both.all() else "."))
            else:
                st.write("Every row is blank in A or B (almost all their weight is on the hidden sink).")
        else:
            st.info(f"Text B has {len(b_tokens)} tokens and text A {n}: the difference needs the same number of "
                    "tokens (keep the texts the same length in tokens).")

with tab_export:
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
    if size > MAX_EXPORT_BYTES:
        st.warning(f"{what} x {n:,}² weights would be {size / 2**30:.1f} GiB, over the "
                   f"{MAX_EXPORT_BYTES / 2**30:.0f} GiB an export builds: pick one layer or one head, or float16.")
    else:
        tag = {"This head": f"-L{layer}H{head}", "This layer": f"-L{layer}", "Every captured layer": ""}[scope]
        tag += "-f16" if half else ""
        for fmt in ("npz", "safetensors"):
            st.download_button(f"Pattern + tokens, {what} (.{fmt})",
                               data=lambda fmt=fmt: capture_to_bytes(capture, fmt, **export, dtype=dtype),
                               file_name=f"{stem}{tag}.{fmt}", mime="application/octet-stream",
                               key=f"heads_dl_{fmt}")
        st.caption(f"pattern [layer, head, query, key] = [{len(export['layers'] or capture.layers)}, "
                   f"{1 if export['heads'] else capture.n_heads}, {n:,}, {n:,}] {np.dtype(dtype).name}, "
                   f"{size / 2**20:,.1f} MiB before compression"
                   + (", computed from the layer's q and k when you press the button." if long_text else "."))
    st.download_button("Statistics table (.csv)", data=stats.to_csv(index=False), file_name=f"{stem}-stats.csv",
                       mime="text/csv", key="heads_dl_csv")
    st.write(f"{link}; the command line writes every layer's file (`python -m attnviz capture --model {model} "
             f"--text-file text.txt --out {stem}.npz`) and, at any length, the statistics (`python -m attnviz "
             f"stats --model {model} --text-file text.txt --out {stem}-stats.csv`).")

# The view goes into the link last, once every tab has drawn (the query token is chosen in its tab). The whole link
# is compared, text included: a text too long for the link must also take an older text= out of it, or the next
# rerun would read that older text back as a new link (from_link) over the user's own.
view["query"] = str(query)
if _link_key(st.query_params.to_dict()) != _link_key(view):
    st.query_params.from_dict(view)
st.session_state["heads_link_seen"] = _link_key(view)
