import numpy as np
import pandas as pd
import streamlit as st

from attnviz import kernels as kn  # sets TRITON_INTERPRET before Triton is imported when there is no GPU
from attnviz import snippets, ui
from attnviz.figures import kernel as figs
from attnviz.ui import kernel as uk
from attnviz.ui import snippets as snippet_ui


def kib(b):
    return f"{b / 2**10:,.1f} KiB"


def mib(b):
    return "not measured" if b is None else f"{b / 2**10:,.1f} KiB" if b < 2**20 else f"{b / 2**20:,.2f} MiB"


st.title("Tiled kernel")
st.markdown(
    "FlashAttention-2 (Dao, 2023) computes softmax(Q Kᵀ / √d) V without ever writing the N × N score matrix: "
    "each program keeps one block of BLOCK_M queries on chip and walks over the keys BLOCK_N at a time, keeping a "
    "running max **m_i**, a running sum **l_i** and an accumulator **acc** that it rescales by "
    "**alpha = exp(m_old − m_new)** whenever the max grows. Below, a Triton kernel does exactly that, and a torch "
    "copy of its loop shows every tile."
)
if kn.INTERPRETED:
    st.info("No GPU here: the Triton kernel runs under the Triton interpreter (numpy on the CPU, a few ms per tile "
            "step). Its numbers are the kernel's own; its time is a functional simulation, never a speed. On a GPU "
            "the same kernel compiles.")

c1, c2, c3, c4 = st.columns(4)
n = c1.slider("N (sequence length, tokens)", *uk.N_RANGE, 64, key="kernel_n", persist_state="session")
d = c2.select_slider("Head dim d", uk.HEAD_DIMS, 32, key="kernel_d", persist_state="session",
                     help="Not a power of two? The kernel pads it to the next one and masks the padding.")
block_m = c3.select_slider("BLOCK_M (queries per tile)", uk.BLOCKS, 16, key="kernel_block_m",
                           persist_state="session")
block_n = c4.select_slider("BLOCK_N (keys per tile)", uk.BLOCKS, 16, key="kernel_block_n",
                           persist_state="session")
c5, c8, c6, c7 = st.columns(4)
causal = c5.checkbox("Causal mask (query i sees keys ≤ i)", value=True, key="kernel_causal", persist_state="session")
window = c8.select_slider("Sliding window (keys)", ["off", *uk.WINDOWS], "off",
                          key="kernel_window", persist_state="session", disabled=not causal,
                          help="With the causal mask: each query sees only its last W keys, its own included, as "
                               "Gemma 3's local layers (W = 512) and Mistral do. Key blocks left of every query's "
                               "window are never loaded.")
window = None if window == "off" or not causal else int(window)
dtype = c6.selectbox("dtype", uk.DTYPES, key="kernel_dtype", persist_state="session")
seed = int(c7.number_input("Seed for Q, K, V", *uk.SEED_RANGE, 0, key="kernel_seed", persist_state="session"))
settings = (n, d, block_m, block_n, causal, dtype, seed)

traffic = kn.compare_traffic(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, window=window)

run = uk.kernel_run(*settings, window)  # None after the reason it cannot run here: every tab still draws
steps = None if run is None else run.steps


def traffic_counters(done_steps=None):
    """The bytes naive and tiled attention move for these settings (counted, nothing run), and with the steps run
    so far, their FLOPs and bytes loaded; without a run, the tile steps the kernel would take."""
    m1, m2, m3, m4 = st.columns(4)
    if done_steps is None:
        total = kn.tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window)
        m1.metric("Tile steps it would run", f"{total:,}", help="Key blocks right of the causal diagonal, and left of "
                  "a sliding window, are skipped.")
        m2.metric("Keys read by all query blocks (L)", f"{traffic.keys_read:,}",
                  help="Each query block reads every key block it visits, K and V alike.")
    else:
        m1.metric(f"FLOPs, steps 0–{len(done_steps) - 1}", f"{sum(s.flops for s in done_steps):,}",
                  help="4 · rows · cols · d per tile: q kᵀ and p v, a multiply-add counted as 2.")
        m2.metric(f"Bytes loaded, steps 0–{len(done_steps) - 1}", kib(sum(s.bytes_loaded for s in done_steps)),
                  help="K and V tiles each step, the Q tile on a block's first step.")
    m3.metric("Tiled, all steps: bytes moved", kib(traffic.tiled),
              help="Q once, K and V once per query block, O once.")
    m4.metric("Naive: bytes moved", kib(traffic.naive),
              help="Naive writes S = Q Kᵀ, reads it for the softmax, writes P, reads P for P V: the N × N matrix "
                   f"moves four times. Read {traffic.naive_read:,} B, written {traffic.naive_written:,} B.")
    verdict = (f"here tiling moves {kib(traffic.tiled)} against naive's {kib(traffic.naive)}"
               + (f", {traffic.naive / traffic.tiled:.2g}× less." if traffic.tiled < traffic.naive else
                  f", {traffic.tiled / traffic.naive:.2g}× more." if traffic.tiled > traffic.naive else ", the same."))
    bound = (f"here L = {traffic.keys_read:,}, so d < {traffic.break_even:,.1f}" if np.isfinite(traffic.break_even)
             else "here one query block reads each key once, so at any d")
    st.caption("Counters for one head in main memory (HBM on a GPU). Naive moves the N × N matrix through memory "
               "four times; the tiled kernel never stores it but re-reads K and V once per query block, so tiling "
               "saves traffic only while d < 2N²/(L − N), L being the keys all query blocks read together "
               f"({bound}; for long inputs about {'4' if causal else '2'}·BLOCK_M): " + verdict)


def timing_table(results):
    """Each method's error and time, measured in one run (kernels.compare_methods), as a table and a chart."""
    st.dataframe(pd.DataFrame({
        "method": [r["method"] for r in results],
        "max |O − O_float64|": [f"{r['error']:.1e}" for r in results],
        "time (ms)": [f"{r['seconds'] * 1e3:,.2f}" for r in results],
        "tile steps": ["" if r["steps"] is None else str(r["steps"]) for r in results],
        "how to read the time": [r["note"] for r in results],
    }), hide_index=True, width="stretch")
    where = ("on one CPU thread" if kn.INTERPRETED else
             f"on the GPU ({kn.KERNEL_DEVICE}), the stepper on one CPU thread")
    kernel_timing = ("the interpreted kernel: one call, as nothing is compiled" if kn.INTERPRETED else
                     "the Triton kernel's first call, which compiles it, is not timed")
    st.caption(f"Measured in one run on this machine, {where}: after one untimed warm-up call, a median of 5 calls, "
               f"or one call for a method slower than {kn.timing.SLOW_CALL_S:g} s ({kernel_timing}). Errors are "
               f"against a float64 computation of the same {dtype} inputs.")
    speeds = [r for r in results if not (kn.INTERPRETED and r["method"] == "fused Triton kernel")]
    ui.plot(figs.timing_figure([r["method"] for r in speeds], [r["seconds"] * 1e3 for r in speeds]),
                    width="stretch")
    if kn.INTERPRETED:
        st.caption("On a CPU the Python-loop tiled versions lose to one big matmul: tiling pays off on a GPU, where "
                   "the N × N matrix would have to go through slow main memory. The interpreted Triton kernel is "
                   "left out: its time is not a speed.")
    else:
        st.caption("Compare the fused Triton kernel with torch SDPA (both fused GPU kernels) and with naive, which "
                   "sends the N × N matrix through GPU memory; the two Python-loop tiled versions pay one launch "
                   "per tile, and the stepper runs on the CPU.")


@st.fragment
def step_view():
    """Everything that depends on the step: moving the slider reruns this part of the page only."""
    if len(steps) > 1:
        if st.session_state.get("kernel_step", 0) > len(steps) - 1:  # the sizes changed under the slider
            st.session_state["kernel_step"] = len(steps) - 1
        index = st.slider("Step", 0, len(steps) - 1, 0, key="kernel_step", persist_state="session")
    else:
        index = 0
    step = steps[index]
    fig, shown = uk.step_view(*settings, window, index)
    every = "every step" if len(shown) == len(steps) else f"steps {shown.start}–{shown.stop - 1}"
    st.caption(f"**Instant:** the step slider inside the chart below walks {every} in the browser, no server; the "
               "Step slider above (and every setting) recomputes, and the counters under the chart follow it.")
    ui.plot(fig, width="stretch")
    st.caption("Top left, the whole score matrix by tiles: orange is the tile this step computes; blue tiles are "
               "done, grey ones to do; yellow ones run masked: the causal diagonal cuts them, or they hold the ragged "
               "last keys. Near-white tiles lie wholly right of the diagonal: the kernel never loads them, which is "
               "where causal attention saves half the work." + (" Lilac tiles lie wholly left of every query's "
               f"sliding window of {window} keys: never loaded either, so the work grows as N·W, not N²."
               if window else "") + " Each query block runs its whole tiles first with no mask at "
               "all (stage 1), then the yellow ones with masks (stage 2)" + (", after the yellow tiles the window's "
               "edge cuts" if window else "") + ". Top right, the scores q·k/√d of this tile only: the one piece of "
               "the N × N matrix that exists right now; blank cells are hidden by the causal mask (a whole blank row "
               "is fine: its m_i keeps the previous value). The tile's panels count rows and columns from its first "
               "query and key (its title names them, the hover gives each position), so their axes stay put while "
               "the slider moves; the scores and the accumulator keep one colour scale each over the steps in the "
               "chart. Middle: where a row's max grows, alpha < 1 shrinks the "
               "old sum and accumulator before this tile's terms are added; where it does not, alpha = 1. Bottom: "
               "the accumulator is an unnormalised weighted sum of value rows; rescaling keeps every term relative "
               "to the current max. On a block's first key tile the old acc is all zeros. O = acc / l_i is taken "
               "after a query block's last key tile.")
    snippet_ui.show(snippets.kernel_step(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype,
                                         seed=seed, window=window, step=index))

    traffic_counters(steps[:index + 1])

    checked = uk.checked_run(run, *settings, window)  # after the view: the browser draws it meanwhile
    if checked is not None:
        gap_m, gap_l = kn.trace_difference(checked.trace, step)
        st.caption(f"At step {index}, the Triton kernel wrote its own m_i and l_i to a debug buffer: they differ from "
                   f"the torch stepper's by at most {gap_m:.1e} (m_i) and {gap_l:.1e} (l_i).")
    if step.last:
        st.success(f"Step {index} is the last key block of its query block: O = acc / l_i, max |O − float64 "
                   f"reference| = {run.out_error[index]:.1e}.")
        if index == len(steps) - 1 and checked is not None:
            st.success(f"Done. The whole Triton output differs from the float64 reference by at most "
                       f"{checked.kernel_error:.1e}.")
    if uk.fragment_alone():  # a Step move; in a full run the prefetch waits for the timing (see the page's end)
        uk.prefetch_step(*settings, window, index + 1)


def step_section() -> None:
    """1: the stepper, or without a run the counters alone."""
    if run is None:
        traffic_counters()
        return
    st.markdown(f"Q, K, V are seeded N(0, 1) draws, [{n}, {d}] each, one head. The kernel runs "
                f"**{len(steps)} tile steps** for {run.codes.shape[0]} query blocks; move a step slider to walk "
                "through them in the order one program runs them (key blocks left to right, then the next query "
                "block).")
    step_view()


def methods_section() -> None:
    """2: the five methods, their errors and times."""
    st.markdown(
        "- **naive**: S = Q Kᵀ, the softmax over each row of S, then P V: the whole N × N matrix in memory.\n"
        "- **two-pass tiled**: one tile of S at a time; pass 1 finds each row's max, pass 2 sums exp(s − max) and "
        "weights V. No N × N matrix, but every score is computed twice and K is read twice.\n"
        "- **online softmax**: one pass; the max is a running max, and alpha repairs what was summed before it grew "
        "(the stepper of the first tab).\n"
        "- **fused Triton kernel**: the same loop as one GPU kernel, tiles held on chip."
    )
    if run is None:
        st.info("Not timed at these settings: the comparison runs the same Triton kernel and tiled loops, which "
                "cannot run here (the reason is above). The byte counts of the first tab need no run.")
        return
    # the interpreted kernel's one traced call is the table's; elsewhere the table times its own calls
    checked = uk.checked_run(run, *settings, window) if kn.INTERPRETED and window is None else run
    if checked is None:
        return
    results = uk.comparison(*settings, run=checked)
    if results is not None:
        timing_table(results)


def memory_section() -> None:
    """3: peak memory at this N, and the scan over N (opt-in)."""
    st.markdown("Measured with torch.profiler's allocation events: the most bytes torch's CPU allocator held during "
                "the call, beyond its inputs. The profiler's first start takes a few seconds, so this is opt-in.")
    if not st.toggle("Measure peak memory", value=False, key="kernel_memory", persist_state="session"):
        return
    with st.spinner("Measuring peak memory…"):
        at_n = None if run is None else uk.memory_at(*settings)
        peaks = uk.memory_scan(d, causal)
    if at_n is None:
        st.info(f"Not measured at N = {n:,}: the measurement runs the same tiled loops, which cannot run here (the "
                f"reason is above). The scan below, up to N = {uk.MEMORY_SIZES[-1]:,}, does not depend on N.")
    else:
        for col, (name, b) in zip(st.columns(len(at_n)), at_n.items()):
            col.metric(f"{name.split(' (')[0]}, N = {n}", mib(b))
    ui.plot(figs.peak_memory_figure(uk.MEMORY_SIZES, {"naive": peaks["naive"],
                                                      "two-pass tiled (64 × 64 tiles)": peaks["tiled"]}),
            width="stretch")
    st.caption(f"float32, d = {d}. Naive's peak grows as N² (it holds the score matrix and the pattern); the tiled "
               "version's grows as N (Q, K, V, O and one tile), so the gap widens with every doubling of N. "
               "The interpreted Triton kernel is not measured: the interpreter's numpy buffers are not its memory.")


# Only the open tab runs: a setting moved redraws (and, for the methods, times) the open tab alone.
SECTIONS = {"steps": "1. Step through the kernel", "methods": "2. From naive to fused",
            "memory": "3. Peak memory, naive vs tiled"}
tabs = dict(zip(SECTIONS, ui.lazy_tabs(list(SECTIONS.values()), "kernel_tab")))
for name, section in (("steps", step_section), ("methods", methods_section), ("memory", memory_section)):
    if tabs[name].open:
        with tabs[name]:
            section()
if run is not None:  # after the timing: a prefetch beside it would slow it down and skew its times
    shown = min(st.session_state.get("kernel_step", 0), len(steps) - 1)
    setting = dict(zip(("n", "d", "block_m", "block_n", "causal", "dtype", "seed"), settings), window=window)
    previous = ui.last_setting("kernel_last_setting", setting)
    uk.prefetch_neighbours(setting, previous, shown)  # a setting moved (or a first run): the settings a step away
    if previous is None or previous == setting:  # nothing moved but the step, which is then likelier moved on
        uk.prefetch_step(*settings, window, shown + 1)
