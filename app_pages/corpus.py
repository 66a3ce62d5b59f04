"""Corpus: every head's statistics over the windows of a data set, read from corpus runs (`attnviz corpus run`, in
the operator's runs folder) or from a small run started here."""

import streamlit as st

from attnviz import snippets, streaming, ui
from attnviz.corpus import layer_means
from attnviz.figures import compare as compare_figs
from attnviz.figures import corpus as figs
from attnviz.ui import corpus as corpus_ui
from attnviz.ui import corpus_start
from attnviz.ui import links
from attnviz.ui import snippets as snippet_ui

DEFAULT_PASTE = streaming.shipped_text()[:3000].rsplit("\n\n", 1)[0]  # whole paragraphs
SOURCES = ("Paste texts", "Upload a file")


def start_form() -> str | None:
    """The small run's widgets; the new run's name once one has been made, else None."""
    st.markdown(f"Up to {corpus_ui.MAX_WINDOWS} windows per length and {corpus_ui.MAX_LENGTHS} lengths, through a "
                "model this server lists. The run is yours for this session and is listed with the others. Large "
                "runs are started from the command line: `attnviz corpus run --model M --data DATA --window 128 "
                "--out RUNS/NAME` (resumable, any size, .txt, JSON Lines, Parquet or a saved `datasets` folder).")
    source = st.radio("Texts", SOURCES, horizontal=True, key="corpus_source", persist_state="session")
    texts, upload, field = None, None, "text"
    if source == SOURCES[0]:
        st.session_state.setdefault("corpus_paste", DEFAULT_PASTE)
        pasted = st.text_area(f"Texts (a line holding only {corpus_ui.SEPARATOR} starts the next; the Declaration of "
                              "Independence to start with)", key="corpus_paste", persist_state="session", height=120)
    else:
        file = st.file_uploader(f"A .txt, .jsonl or .parquet file (UTF-8, up to {corpus_ui.MAX_UPLOAD_MB} MB)",
                                type=list(corpus_ui.UPLOAD_TYPES), key="corpus_upload",
                                max_upload_size=corpus_ui.MAX_UPLOAD_MB)
        field = st.text_input("Text field or column (JSON Lines, Parquet)", "text", key="corpus_field",
                              persist_state="session").strip() or "text"
    c1, c2, c3 = st.columns(3)
    with c1:
        model = ui.model_picker("corpus_model", default="toy-gpt2")
    windows = c2.multiselect("Window lengths (tokens)", corpus_ui.WINDOW_CHOICES, default=[32, 64],
                             max_selections=corpus_ui.MAX_LENGTHS, key="corpus_windows", persist_state="session",
                             help="Each text is cut into consecutive windows of this many tokens, each run on its "
                                  "own. Two or more lengths: the statistics against context length.")
    max_windows = c3.slider("Windows at most, per length", 1, corpus_ui.MAX_WINDOWS, 16, key="corpus_max_windows",
                            persist_state="session")
    if not st.button("Start the run", key="corpus_start", type="primary"):
        return None
    if source == SOURCES[0]:
        texts = corpus_start.pasted_texts(pasted)
    else:
        data = corpus_start.upload_checked(file)
        upload = None if data is None else (file.name, data)
    return corpus_start.start_run(model, texts, upload, field, sorted(windows), max_windows)


def pick(label: str, names: list[str], key: str) -> str:
    if st.session_state.get(key) not in names:
        st.session_state[key] = names[0]
    return st.selectbox(label, names, key=key, persist_state="session")


def window_choice(run_name: str, lengths: list[int]) -> int:
    """The window length shown: a link's, when the run has it (else a warning), or the visitor's."""
    asked = st.session_state.pop("corpus_link_window", None)
    if asked is not None and asked not in lengths:
        st.warning(f"The link's {links.shown('window', str(asked))}: the run {run_name} has windows of "
                   f"{', '.join(map(str, lengths))} tokens, showing {lengths[0]}.")
        asked = lengths[0]
    if asked is not None:
        st.session_state["corpus_window"] = asked
    if len(lengths) == 1:
        st.session_state["corpus_window"] = lengths[0]
        return lengths[0]
    return ui.choice_box("Window length (tokens)", lengths, "corpus_window", lengths[0])


def show_top_windows(run_name, run, model: str, stat: str, window: int, ranked) -> tuple[int, int]:
    """A head's top windows, each with its text and a link that opens it on the Heads page. Returns the head."""
    best = ranked.iloc[0]
    st.session_state.setdefault("corpus_layer", int(best["layer"]))  # first visit: the top-ranked head
    st.session_state.setdefault("corpus_head", int(best["head"]))
    c1, c2, c3 = st.columns(3)
    with c1:
        layer = links.choice_box(corpus_ui.LINK, "Layer", list(range(run.manifest["layers"])), "corpus_layer")
    with c2:
        head = links.choice_box(corpus_ui.LINK, "Head", list(range(run.manifest["heads"])), "corpus_head")
    k = c3.slider("Windows shown", 1, 20, 5, key="corpus_k", persist_state="session")
    top = corpus_ui.top(run_name, run, stat, layer, head, k, window)
    if top is None:
        return layer, head
    if top.empty:
        st.info(f"Layer {layer}, head {head} has no {stat} on any window of {window} tokens"
                + (" (induction needs a token that repeats within the window)." if stat == "induction" else "."))
        return layer, head
    units = figs.units(stat)
    for rank, row in enumerate(top.itertuples(), start=1):
        value = getattr(row, stat)
        source = str(row.source).replace("`", "'")
        st.markdown(f"**{rank}.** {stat} = **{figs.shown_value(stat, value)}** {units} · window "
                    f"{row.window_id:,} ({row.n_tokens} tokens) of `{source}`, from token {row.offset:,}")
        text_col, link_col = st.columns([5, 2], vertical_alignment="center")
        text_col.code(row.text, language=None, wrap_lines=True)
        query = corpus_ui.heads_link(model, row.text, layer, head)
        if query is not None:
            link_col.page_link("app_pages/heads.py", label="Open on the Heads page", icon="🧠", query_params=query,
                               help=f"The Heads page on this window's text, layer {layer}, head {head}")
        elif model not in corpus_ui.listed_models():
            link_col.caption("No Heads-page link: the run's model is not one this server lists by name.")
        else:
            link_col.caption(f"No Heads-page link: the text is {len(row.text):,} characters, over the "
                             f"{corpus_ui.HEADS_LINK_CHARS:,} a link holds. Copy it (the button at its top right) "
                             f"into the Heads page with {model}.")
    st.caption(f"The {len(top)} windows of {window} tokens on which layer {layer}, head {head} scores highest on "
               f"{stat}. A window is run on its own, with its model's start token; the Heads page runs its text "
               "again (re-tokenized, so a word cut at the window's edge may split differently).")
    return layer, head


def show_against_length(run_name, run, stat: str, layer: int, head: int) -> None:
    lengths = sorted(run.manifest["windows"])
    if len(lengths) < 2:
        st.caption(f"This run has one window length ({lengths[0]} tokens). A run with several "
                   "(`--window 64 --window 256`, or two lengths above) shows each statistic against context length.")
        return
    table = corpus_ui.against_length(run_name, run, stat)
    if table is None:
        return
    view = st.radio("Lines", ["Layer means", "Chosen heads"], horizontal=True, key="corpus_len_view",
                    persist_state="session")
    if view == "Layer means":
        shown = table.groupby(level="layer").mean()
        shown.index = [f"layer {x}" for x in shown.index]
        what = "each layer's mean over its heads"
    else:
        labels = [f"L{x} H{h}" for x, h in table.index]
        st.session_state.setdefault("corpus_len_heads", [f"L{layer} H{head}"])
        st.session_state["corpus_len_heads"] = [h for h in st.session_state["corpus_len_heads"] if h in labels]
        chosen = st.multiselect("Heads", labels, key="corpus_len_heads", persist_state="session")
        if not chosen:
            st.info("Choose one or more heads.")
            return
        shown = table.set_axis(labels)
        shown = shown.loc[chosen]
        what = "the chosen heads"
    ui.chart(figs.length_lines(shown, stat, title=f"{stat} against window length: {what}",
                               by_depth=view == "Layer means"),
             f"Each point is the mean of {stat} over every window of that length. A flat line is a role that does "
             "not depend on how much context the head has; entropy and mean distance grow with the window for any "
             "head that spreads its attention, since a longer window has more keys to spread it over.")


def show_comparison(runs: dict, run_name: str, run, summary, stat: str, window: int) -> str | None:
    """Run A against a second run: head by head where the shapes match, by relative depth otherwise."""
    others = [n for n in runs if n != run_name]
    if not others:
        st.info("Nothing to compare: this is the only run listed. Start a second one above (another model, or "
                "other texts) or ask the operator for another.")
        return None
    other_name = pick("Run B", others, "corpus_run_b")
    other = corpus_ui.open_run(other_name, runs[other_name])
    summary_b = None if other is None else corpus_ui.summary(other_name, other)
    if summary_b is None:
        return other_name
    if stat not in other.columns:
        st.info(f"Nothing to compare: run B ({other_name}) has no {stat}.")
        return other_name
    lengths_b = sorted(summary_b["window"].unique().tolist())
    window_b = window if window in lengths_b else min(lengths_b, key=lambda w: abs(w - window))
    units = figs.units(stat)
    a_rows, b_rows = summary[summary["window"] == window], summary_b[summary_b["window"] == window_b]
    st.caption(f"A: {run_name} ({corpus_ui.describe(run)})  \nB: {other_name} ({corpus_ui.describe(other)})"
               + ("" if window_b == window else f"  \nB has no windows of {window} tokens: its {window_b}-token "
                  "windows are shown."))
    if corpus_ui.same_shape(run, other) and window_b == window:
        merged = corpus_ui.compare((run_name, other_name), run, other, stat)
        if merged is None:
            return other_name
        ui.chart(figs.difference_grid(merged[merged["window"] == window], stat, a=run_name, b=other_name,
                                      title=f"{stat}, run A − run B, head by head ({window}-token windows)"),
                 "Red: the head scores higher in A, blue: higher in B, white: the same. Two runs of one model on "
                 "different texts show which roles depend on the text; two checkpoints of one model (toy-lab saves) "
                 "show which heads changed."
                 + ("" if run.manifest["model"] == other.manifest["model"] else " These are two different models: "
                    "head 2 of one need not correspond to head 2 of the other, so read the spread below too."))
    else:
        why = (f"the models differ in shape ({run.manifest['layers']} × {run.manifest['heads']} against "
               f"{other.manifest['layers']} × {other.manifest['heads']} heads)" if not corpus_ui.same_shape(run, other)
               else "the runs share no window length")
        means = {}
        for label, name, rows, r in (("A", run_name, a_rows, run), ("B", other_name, b_rows, other)):
            layer_mean = layer_means(rows, stat)
            means[f"{label}: {name} ({corpus_ui.model_shown(r.manifest['model'])})"] = (
                figs.relative_depth(layer_mean.index, r.manifest["layers"]), layer_mean.to_numpy(), None)
        ui.chart(compare_figs.depth_curves(means, title=f"{stat}, mean over each layer's heads, against relative "
                                           "depth", y_title=f"mean {stat} ({units})"),
                 f"Head by head is not possible here: {why}. Each point is one layer at its place in the stack "
                 "(0 the first, 1 the last), so models of different depths line up.")
    ui.chart(figs.run_distributions({f"A: {run_name}": a_rows[stat], f"B: {other_name}": b_rows[stat]}, stat,
                                    title=f"{stat} of every head, run A against run B"
                                    + ("" if window_b == window else f" ({window} against {window_b} tokens)")),
             "Each point is one head's mean over its run's windows; the box spans the middle half of the heads, the "
             "line in it is the median. Runs of any shape compare here.")
    return other_name


st.title("Corpus")
st.markdown("One text says little about a head: a sink or an induction score can come from the text's own shape. A "
            "**corpus run** cuts every document of a data set into windows of tokens, runs each window through the "
            "model on its own and keeps every head's statistics for every window. Averaged over the windows, a "
            "head's role is the one it plays on the language; the spread over windows says how steady it is.")
links.read(corpus_ui.LINK)

runs = corpus_ui.runs()
with st.expander("Start a small run on your own texts", expanded=not runs):
    started = start_form()
if started is not None:
    runs = corpus_ui.with_session_runs(runs)
    st.session_state["corpus_run"] = started
    st.success(f"The run {started} is done and shown below.")
names = list(runs)
corpus_ui.checked_link(names)
if not runs:
    corpus_ui.no_runs_note()
    st.stop()
if ui.runs_dir() is None:
    st.caption(f"This server has no runs folder ({ui.RUNS_DIR_ENV}): only your own runs are listed.")

top_row = st.columns([2, 1, 1])
with top_row[0]:
    run_name = pick("Run", names, "corpus_run")
run = corpus_ui.open_run(run_name, runs[run_name])
summary = None if run is None else corpus_ui.summary(run_name, run)
if summary is None:
    st.stop()
st.caption(corpus_ui.describe(run))
if summary.empty:
    st.info(f"The run {run_name} has no finished windows yet: it writes its statistics a shard of "
            f"{run.manifest['shard_windows']} windows at a time. Reload the page in a while.")
    st.stop()
if not run.complete:
    st.warning(f"The run {run_name} is not finished (still going, or stopped): what is shown covers the "
               f"{run.n_windows_done:,} windows done so far.")

if st.session_state.get("corpus_stat") not in run.columns:
    if st.session_state.get("corpus_stat") is not None:
        st.warning(f"The run {run_name} has no statistic {st.session_state['corpus_stat']}: showing {run.columns[0]}.")
    st.session_state["corpus_stat"] = run.columns[0]
stat = top_row[1].selectbox("Statistic", run.columns, key="corpus_stat", persist_state="session",
                            help="entropy: nats; sink_mass: attention on token 0; mean_distance: tokens; "
                                 "prev_token, self, induction: attention on the token before, the token itself, and "
                                 "the token after an earlier copy (the Heads page's Statistics tab defines each).")
lengths = sorted(int(w) for w in summary["window"].unique())  # a run still going may lack its later lengths
with top_row[2]:
    window = window_choice(run_name, lengths)
if len(lengths) < len(run.manifest["windows"]):
    st.caption(f"No window of {', '.join(str(w) for w in run.manifest['windows'] if w not in lengths)} tokens is "
               "done yet.")
units = figs.units(stat)
model = run.manifest["model"]

st.header("Every head")
rows = summary[summary["window"] == window]
ui.chart(figs.mean_grid(summary, stat, window, title=f"{stat}: each head's mean over {int(rows['n_windows'].max()):,} "
                        f"windows of {window} tokens"),
         f"Each cell is one head's mean {stat} over the run's windows, ± its standard deviation from window to "
         "window (hover for the 10th, 50th and 90th percentiles). A bright cell with a small spread is a head that "
         "plays its role on almost every text.")
snippet_ui.show(snippets.corpus_grid(run_name, stat, window))

st.header(f"Heads ranked by {stat}")
order = st.radio("Order", list(corpus_ui.ORDERS), horizontal=True, format_func=corpus_ui.ORDERS.get,
                 key="corpus_order", persist_state="session")
columns = ["layer", "head", "kv_head", stat, *(f"{stat}_{s}" for s in figs.SPREAD), "n_windows"]
ranked = rows[columns].sort_values([stat, "layer", "head"], ascending=[order == "low", True, True],
                                   na_position="last").reset_index(drop=True)
st.dataframe(ranked, hide_index=True, width="stretch", height=min(35 * (len(ranked) + 1) + 3, 423))
st.caption(f"Every head of the {window}-token windows, {corpus_ui.ORDERS[order]}: the mean over the windows, its "
           "standard deviation (std), its 10th, 50th and 90th percentiles (q10, q50, q90) and the windows counted "
           f"({stat} in {units}" + ("; induction counts only the windows in which a token repeats" if stat ==
                                     "induction" else "") + ").")

st.header("One head's top windows")
layer, head = show_top_windows(run_name, run, model, stat, window, ranked)

st.header("Against window length")
show_against_length(run_name, run, stat, layer, head)

st.header("Compare with another run")
run_b = show_comparison(runs, run_name, run, summary, stat, window)

st.header("Export")
stem = corpus_ui.file_stem(run_name)
e1, e2 = st.columns(2)
e1.download_button("Summary (.csv)", data=corpus_ui.summary_file(summary, "csv"), file_name=f"{stem}-summary.csv",
                   mime="text/csv", key="corpus_dl_csv")
e2.download_button("Summary (.parquet)", data=lambda: corpus_ui.summary_file(summary, "parquet"),
                   file_name=f"{stem}-summary.parquet", mime="application/octet-stream", key="corpus_dl_parquet")
st.caption("One row per (window length, layer, head): every statistic's mean, std, 10th, 50th and 90th percentiles "
           "and n_windows (CorpusRun.summary). The page's link keeps this view (run, statistic, window, head); "
           "`attnviz corpus summary RUN --out summary.csv` writes the same table on the command line.")

view = {"run": run_name, "stat": stat, "window": window, "layer": layer, "head": head, "order": order}
if run_b is not None:
    view["b"] = run_b
links.write(corpus_ui.LINK, view)
