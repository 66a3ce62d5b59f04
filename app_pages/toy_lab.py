"""Toy lab: train a small transformer on a synthetic task and watch previous-token and induction heads form."""

import math

import numpy as np
import streamlit as st

from attnviz import lab, snippets, ui
from attnviz.figures import lab as figs
from attnviz.ui import lab as lab_ui
from attnviz.ui import lab_hybrid
from attnviz.ui import snippets as snippet_ui

st.title("Toy lab")
st.markdown(
    "Train a 2-layer transformer on a task with a known answer, here on the server's CPU, and watch its heads "
    "specialise. On the **induction** task every row is a random string of letters, the same string again, then "
    "random letters (`<bos> d a f c h d a f c h g b …`): the repeat is predictable only by finding where the "
    "current letter appeared before and copying the letter after it. Two heads working together do exactly that: "
    "a **previous-token head** (each position looks one back) and an **induction head** (looks at the token "
    "after the earlier copy of the current one). Once trained, the model opens on every other page like any model.")

st.subheader("Set up a run")
c1, c2, c3, c4 = st.columns(4)
task = c1.selectbox("Task", lab.TASKS, key="lab_task",
                    persist_state="session", help="; ".join(f"{t}: {d}" for t, d in lab.TASK_INFO.items()))
positional = c2.selectbox("Positions", lab.POSITIONAL, index=lab.POSITIONAL.index("rope"), key="lab_positional",
                          persist_state="session",
                          format_func=lambda p: f"{p} ({lab.ARCHITECTURE[p]})",
                          help="Which way the model knows positions; it picks the transformers architecture. With "
                               "the default settings an induction head forms in about 500 steps with RoPE and 1,400 "
                               "with learned positions; sinusoidal and ALiBi need more than 1,500.")
attention = c3.selectbox("Attention", lab.ATTENTION, key="lab_attention", persist_state="session",
                         format_func=lambda a: a.replace("_", " "),
                         help="; ".join(f"{a.replace('_', ' ')}: {d}" for a, d in lab.ATTENTION_INFO.items())
                              + ". The four variants are one gpt-oss model (RoPE) that differs only in its attention.")
seed = c4.number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="lab_seed",
                       persist_state="session",
                       help="Same settings and seed, same weights and losses.")
c1, c2, c3 = st.columns(3)
steps = c1.slider("Training steps", 20, lab.MAX_STEPS, 1000, step=20, key="lab_steps", persist_state="session",
                  help=f"At most {lab.MAX_STEPS} steps and {lab.MAX_SECONDS:.0f} s per run, so nobody holds the "
                       "server for long.")
lr = c2.select_slider("Learning rate", [3e-4, 1e-3, 3e-3, 1e-2, 3e-2], value=3e-3, key="lab_lr",
                      persist_state="session",
                      format_func=lambda v: f"{v:g}")
segment_len = c3.slider("Segment length L (letters)", 3, 20, 8, key="lab_segment_len", persist_state="session",
                        help="Letters per segment; on the induction task each row's repeat has between 3 and L.")
with st.expander("Letters, text rows, model size, batch and weight decay"):
    c0, c1, c2, c3, c4 = st.columns(5)
    n_letters = c0.slider("Letters used", 3, 26, 8, key="lab_letters", persist_state="session",
                          help="Tasks use the first n letters a, b, c, …; fewer letters train faster.")
    n_layers = c1.slider("Layers", 1, 3, 2, key="lab_layers", persist_state="session",
                         help="One layer cannot make an induction head: it needs a head that reads another's output.")
    n_heads = c2.selectbox("Heads per layer", [1, 2, 4, 8], index=2, key="lab_heads", persist_state="session")
    d_model = c3.selectbox("Width d_model", [32, 64, 128], index=1, key="lab_width", persist_state="session")
    batch_size = c4.selectbox("Batch size", [16, 32, 64], index=1, key="lab_batch", persist_state="session")
    c0, c1, _ = st.columns([1, 1, 3])
    text_len = c0.select_slider("Text rows (tokens)", [16, 32, 64, 128], value=64, key="lab_text_len",
                                persist_state="session", help="Tokens per row of the text task, <bos> included.")
    weight_decay = c1.select_slider("Weight decay", [0.0, 0.01, 0.1, 0.3], value=0.01, key="lab_weight_decay",
                                    persist_state="session", help="AdamW's decoupled weight decay.")

config = lab.LabConfig(task=task, positional=positional, seed=int(seed), steps=int(steps), lr=float(lr),
                       batch_size=int(batch_size), segment_len=int(segment_len), n_layers=int(n_layers),
                       n_heads=int(n_heads), d_model=int(d_model), eval_every=max(10, int(steps) // 40),
                       n_letters=int(n_letters), attention=attention, text_len=int(text_len),
                       weight_decay=float(weight_decay))
problems = config.problems()
for p in problems:
    st.error(f"{p[0].upper()}{p[1:]}. Change the setting above.")

run: lab.LabRun | None = st.session_state.get("lab_run")
running = run is not None and not run.snapshot().finished

c1, c2, c3 = st.columns([1, 1, 3])
auto_save = c3.checkbox("Save automatically when training ends", value=True, key="lab_auto_save",
                        persist_state="session",
                        help=f"As lab/{config.default_name()}; the name comes from the settings.")
if c1.button("Train", type="primary", key="lab_train", disabled=running or bool(problems)):
    new_run = lab_ui.start_run(config, auto_save)
    if new_run is not None:
        st.session_state["lab_run"] = run = new_run
        running = True
if c2.button("Stop", key="lab_stop", disabled=not running):
    run.stop()


def show_no_run() -> None:
    symbols = "256 bytes" if task == "text" else f"{n_letters} letters"
    st.info(f"Nothing trained yet in this session. Press **Train**: the default run takes about half a minute to a "
            f"minute, depending on how busy the server is. The loss soon falls below "
            f"{lab.chance_loss(n_letters, task):.2f} nats (guessing among the {symbols}) and, on the induction task, "
            "drops further once heads find the earlier copy.")
    st.subheader("What to look for")
    example = lab.example_text(config) if config.task == "induction" else lab.example_text(
        lab.LabConfig(task="induction", n_letters=config.n_letters, segment_len=config.segment_len))
    tokens, targets = lab.target_patterns(example)
    st.caption(f"On the text `{example}`, the two patterns training should produce, computed from their definitions. "
               "A previous-token head is the stripe just below the diagonal; an induction head is the stripe "
               "offset by the repeat length, in the second half, with the first copy's queries resting on <bos>. "
               "After training, compare them with the real heads (here and on the Heads page).")
    for column, fig in zip(st.columns(2), figs.target_pattern_heatmaps(tokens, targets)):
        ui.plot(where=column, fig=fig, width="stretch")


@st.fragment(run_every=2.0 if running else None)
def live_view(run: lab.LabRun, was_running: bool) -> None:
    snap = run.snapshot()
    cfg = snap.config
    st.progress(min(1.0, snap.progress),
                text=f"{snap.status}: step {snap.step} of {cfg.steps}, {snap.elapsed_s:.0f} s "
                     f"({cfg.task}, {lab.architecture(cfg)}, {cfg.n_layers} layers × {cfg.n_heads} heads, "
                     f"d_model {cfg.d_model}, seed {cfg.seed})")
    if snap.error and snap.status == "failed":
        st.error(f"Training stopped: {snap.error}.")
    elif snap.error:  # the run trained, but its automatic save was refused (a limit) or failed
        st.warning(f"{snap.error[0].upper()}{snap.error[1:]}.")
    chance = lab.chance_loss(cfg.n_letters, cfg.task)
    chance_of = figs.chance_symbols(cfg.task)
    left, right = st.columns(2)
    with left:
        ui.plot(figs.loss_curve(snap.losses, chance, total_steps=cfg.steps, chance_of=chance_of),
                        width="stretch")
        st.caption("Cross-entropy on the tokens with a known answer. Below the dashed chance line the model has "
                   "learnt something beyond which letters exist.")
        if snap.saved_as:  # drawn again from the saved run's history: nothing trains
            snippet_ui.show(snippets.lab_loss_curve(snap.saved_as))
    ckpts = [c for c in snap.checkpoints if not math.isnan(c.loss)] or snap.checkpoints
    with right:
        best = {name: [getattr(c, name).max() for c in ckpts] for name in ("previous_token", "induction", "sink")}
        ui.plot(figs.best_heads_curve([c.step for c in ckpts], [c.loss for c in ckpts], best, chance,
                                              total_steps=cfg.steps, chance_of=chance_of), width="stretch")
        st.caption("The best head's score for each statistic on a fixed probe (random strings of several lengths, "
                   "each repeated twice). On the induction task the previous-token and induction scores rise "
                   "together as the loss falls below chance: the two heads form as a pair.")
    statistic = st.selectbox("Score over training, per head", list(figs.SCORE_TITLES), index=1, key="lab_statistic",
                             persist_state="session",
                             format_func=lambda s: figs.SCORE_TITLES[s])
    steps_axis = [c.step for c in snap.checkpoints]
    ui.plot(figs.score_curves(steps_axis, np.stack([getattr(c, statistic) for c in snap.checkpoints]),
                                      statistic=statistic, total_steps=cfg.steps), width="stretch")
    st.caption({
        "previous_token": "Mean over positions i ≥ 1 of the weight on position i−1: 1 for a head that always looks "
                          "one token back.",
        "induction": f"Mean over the second copy of the probe (positions L+1..2L, L = {cfg.segment_len}) of the "
                     "weight on the token after the earlier occurrence of the current token: 1 for a perfect "
                     "induction head.",
        "sink": "Mean over positions i ≥ 1 of the weight on <bos>: heads with nothing to do often park their "
                "attention there.",
    }[statistic])
    if was_running and snap.finished:
        st.rerun()


def show_trained(run: lab.LabRun) -> None:
    snap = run.snapshot()
    if not snap.finished or snap.status == "failed":
        return
    st.subheader("The trained model")
    cols = st.columns(3)
    last = snap.checkpoints[-1]
    for col, name in zip(cols, figs.SCORE_TITLES):
        ui.plot(where=col, fig=figs.final_scores_heatmap(getattr(last, name), name), width="stretch")
    st.caption("Each head's final scores: look for a previous-token head in layer 0 and an induction head in "
               "layer 1.")
    c1, c2 = st.columns([2, 1])
    name = c1.text_input("Save as", value=snap.saved_as or snap.config.default_name(), key="lab_save_name",
                         persist_state="session", max_chars=lab.MAX_NAME,
                         help="Lowercase letters, digits, '-', '_' and '.'. A name another visitor saved stays "
                              "theirs; saving again under one of your own replaces your model.")
    if c2.button("Save", key="lab_save"):
        lab_ui.save_run(run, name.strip())
        snap = run.snapshot()
    if snap.saved_as:
        taken = f" (lab/{run.auto_save} is another visitor's)" if run.auto_save and \
            snap.saved_as.startswith(f"{run.auto_save}-") and lab_ui.taken_by_another(run.auto_save) else ""
        st.success(f"Saved as the model **lab/{snap.saved_as}**{taken} (safetensors, in the attnviz cache).")
        example = lab.example_text(snap.config)
        st.page_link("app_pages/heads.py", label=f"Open lab/{snap.saved_as} on the Heads page", icon="🧠",
                     query_params={"model": f"lab/{snap.saved_as}", "text": example})
        st.markdown(f"There, with the text `{example}` (or any text in the task's letters), the induction head "
                    "of layer 1 looks from each repeated letter to the letter after its first copy, and the "
                    "previous-token head of layer 0 looks one letter back.")


def show_variant_maps(comparison: lab.VariantComparison) -> None:
    got = lab_ui.variant_maps(comparison)
    if got is None:
        return
    tokens, maps = got
    cfg = next(iter(comparison.runs.values())).config
    c1, c2, _ = st.columns([1, 1, 3])
    with c1:
        layer = ui.choice_box("Layer", list(range(cfg.n_layers)), "lab_map_layer", default=cfg.n_layers - 1)
    with c2:
        head = ui.choice_box("Head", list(range(cfg.n_heads)), "lab_map_head", default=0)
    shown = {name: m[layer, head] for name, m in maps.items()}
    ui.chart(figs.variant_maps(tokens, shown, {n: float(lab.weight_on_tokens(m)) for n, m in shown.items()},
                               layer=layer, head=head),
             "The same head of each trained variant on the same text (row: a query token, column: the key it "
             "reads; one colour scale). Softmax must spend each row in full, so a head with nothing to read lights "
             "up the <bos> column; off by one and the learned sink may leave part of a row on no token (the share "
             "on tokens is in each title); the gate's map is a softmax's, as the gate mutes a head's output, not "
             "its weights.")


def show_comparison(config: lab.LabConfig, problems: list[str]) -> None:
    st.markdown(
        "Why do heads park attention on the first token? Softmax must give every row a total of 1, so a head with "
        "nothing to read needs somewhere harmless to put it (Gu et al., ICLR 2025). Three changes to attention "
        "remove that need: **off by one** (softmax with 1 added to the denominator, weights can sum to less than "
        "1), a **learned sink** logit per head (gpt-oss), and a **sigmoid gate** per head on the output (gated "
        "attention, Qwen 2025: a head can switch itself off). Train the same small gpt-oss model with each, plus "
        "plain **softmax**, on the settings above, and compare their losses, their sink metric (Sink₀^0.3: the "
        "share of (text, layer, head) triples with α₀ > 0.3, measured on fixed texts of the task) and, once "
        "trained, their attention maps side by side.")
    st.caption(lab_ui.SINK_MEASUREMENT)
    comparison: lab.VariantComparison | None = st.session_state.get("lab_comparison")
    busy = comparison is not None and not comparison.finished
    c1, c2, _ = st.columns([1, 1, 3])
    if c1.button("Train the four variants", key="lab_compare", disabled=busy or bool(problems)):
        started = lab_ui.start_comparison(config)
        if started is not None:
            st.session_state["lab_comparison"] = comparison = started
            busy = True
    if c2.button("Stop them", key="lab_compare_stop", disabled=not busy):
        comparison.stop()
    if comparison is None:
        st.info(f"Trains {len(lab.VARIANTS)} models one step each in turn, {config.steps} steps each (at most "
                f"{lab.MAX_SECONDS:.0f} s in all), on the task and sizes set above; each is saved (as yours: another "
                "visitor's name is never replaced) and opens on the Heads page.")
        return

    # run_every is decided after the buttons: a click starts the polling
    st.fragment(run_every=2.0 if busy else None)(_comparison_view)(comparison, busy)

def _comparison_view(comparison, was_running: bool) -> None:
    """The four variants' training so far: progress, losses, sink metric; their maps once finished."""
    snaps = lab_ui.comparison_progress(comparison, "variant")
    first = next(iter(snaps.values()))
    left, right = st.columns(2)
    with left:
        losses = {n: s.losses for n, s in snaps.items()}
        ui.chart(figs.variant_loss_curves(losses, total_steps=first.config.steps),
                 "Loss on the task's answer tokens. Where the curves meet, the variants learn the task equally "
                 "well, and a difference in sinks is not a difference in skill.")
    with right:
        rates = {n: [c.sink_rate for c in s.checkpoints] for n, s in snaps.items()}
        steps = {n: [c.step for c in s.checkpoints] for n, s in snaps.items()}
        ui.chart(figs.variant_sink_curves(steps, rates, eps=0.3, threshold=lab_ui.SINK_TARGET,
                                          total_steps=first.config.steps),
                 "Sink₀^0.3 at each checkpoint: the share of (text, layer, head) triples whose α₀ on <bos> "
                 "exceeds 0.3. Off by one and the learned sink give attention a place to go that is not a "
                 "token; the gate lets a head write nothing; a token sink is what softmax alone forces.")
    saved = [s.saved_as for s in snaps.values() if s.saved_as]
    if saved:
        st.caption("Saved, to open on the Heads page: " + ", ".join(f"lab/{n}" for n in saved) + ".")
    if was_running and comparison.finished:
        st.rerun()
    if comparison.finished:
        show_variant_maps(comparison)


if run is None:
    show_no_run()
else:
    live_view(run, running)
    show_trained(run)
st.header("Sink-free attention, side by side")
show_comparison(config, problems)
st.header("A Qwen3-Next hybrid: Gated DeltaNet beside softmax")
lab_hybrid.section(config, problems)
lab_ui.my_models()
