import numpy as np
import pandas as pd
import streamlit as st

from attnviz import kernels as kn  # sets TRITON_INTERPRET before Triton is imported when there is no GPU
from attnviz.figures import kernel as figs

MEMORY_SIZES = (128, 256, 512, 1024, 2048)


# every TileStep keeps its tiles (up to 4096 steps of 128 x 128 scores): hold only the last two sizes
@st.cache_resource(max_entries=2, show_spinner=False)
def run_stepper(n, d, block_m, block_n, causal, dtype, seed):
    q, k, v = kn.make_inputs(n, d, dtype=dtype, seed=seed)
    steps = list(kn.tiled_steps(q, k, v, causal=causal, block_m=block_m, block_n=block_n))
    out, trace = kn.flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n, trace=True)
    reference = kn.reference_attention(q, k, v, causal=causal)[0, 0].numpy()
    return steps, out[0, 0].double().numpy(), trace, reference


@st.cache_data(max_entries=8, show_spinner=False)
def run_comparison(n, d, block_m, block_n, causal, dtype, seed):
    results = kn.compare_methods(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed)
    return [r.__dict__ for r in results]


@st.cache_data(max_entries=16, show_spinner=False)
def run_memory_at(n, d, block_m, block_n, causal, dtype, seed):
    return kn.peak_memory_at(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed)


@st.cache_data(max_entries=16, show_spinner=False)
def run_memory_scan(d, causal):  # the scan over N depends on nothing else: moving N or the blocks reuses it
    return kn.peak_memory_scan(MEMORY_SIZES, d, block_m=64, block_n=64, causal=causal)


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
n = c1.slider("N (sequence length, tokens)", 1, 4096, 64, key="kernel_n", persist_state="session")
d = c2.select_slider("Head dim d", [8, 16, 32, 48, 64, 80, 96, 128], 32, key="kernel_d", persist_state="session",
                     help="Not a power of two? The kernel pads it to the next one and masks the padding.")
block_m = c3.select_slider("BLOCK_M (queries per tile)", [16, 32, 64, 128], 16, key="kernel_block_m",
                           persist_state="session")
block_n = c4.select_slider("BLOCK_N (keys per tile)", [16, 32, 64, 128], 16, key="kernel_block_n",
                           persist_state="session")
c5, c6, c7 = st.columns(3)
causal = c5.checkbox("Causal mask (query i sees keys ≤ i)", value=True, key="kernel_causal", persist_state="session")
dtype = c6.selectbox("dtype", ["float32", "float16", "bfloat16"], key="kernel_dtype", persist_state="session")
seed = int(c7.number_input("Seed for Q, K, V", 0, 10_000, 0, key="kernel_seed", persist_state="session"))

reason = kn.refusal(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype)
if reason:
    st.error(f"Not run: {reason}")
    st.stop()

BLOCKS_TOO_BIG = ("Not run: {}. Pick a smaller BLOCK_N or BLOCK_M, a smaller head dim, or float16, and it will "
                  "run.")
try:
    with st.spinner("Running the stepper and the Triton kernel…"):
        steps, kernel_out, trace, reference = run_stepper(n, d, block_m, block_n, causal, dtype, seed)
except ValueError as exc:  # the kernel's refusals, e.g. blocks that need more shared memory than the GPU has
    st.error(BLOCKS_TOO_BIG.format(exc))
    st.stop()

st.header("1. Step through the kernel")
st.markdown(f"Q, K, V are seeded N(0, 1) draws, [{n}, {d}] each, one head. The kernel runs "
            f"**{len(steps)} tile steps** for {-(-n // block_m)} query blocks; move the slider to walk through them "
            "in the order one program runs them (key blocks left to right, then the next query block).")
if len(steps) > 1:
    if st.session_state.get("kernel_step", 0) > len(steps) - 1:  # the sizes changed under the slider
        st.session_state["kernel_step"] = len(steps) - 1
    index = st.slider("Step", 0, len(steps) - 1, 0, key="kernel_step", persist_state="session")
else:
    index = 0
step = steps[index]

codes = kn.tile_map(n, n, block_m=block_m, block_n=block_n, causal=causal)
done = [(s.q_block, s.k_block) for s in steps[:index]]
states = figs.tile_states(codes, done, (step.q_block, step.k_block))
q_edges = [min(i * block_m, n) for i in range(codes.shape[0] + 1)]
k_edges = [min(j * block_n, n) for j in range(codes.shape[1] + 1)]
left, right = st.columns(2)
left.plotly_chart(figs.tile_map_figure(states, q_edges, k_edges, causal=causal,
                                       title=f"Step {index}: query block {step.q_block}, key block {step.k_block}"),
                  width="stretch")
left.caption("Orange is the tile this step computes; blue tiles are done, grey ones to do, yellow ones cut by the "
             "causal diagonal. Near-white tiles lie wholly right of the diagonal: the kernel never loads them, which "
             "is where causal attention saves half the work. The kernel runs the whole tiles first with no mask at "
             "all, then the yellow ones and a ragged last column of keys with masks.")
right.plotly_chart(figs.tile_scores_figure(
    step.scores, step.q_start, step.k_start,
    title=f"S tile: queries {step.q_start}–{step.q_stop - 1}, keys {step.k_start}–{step.k_stop - 1}"),
    width="stretch")
right.caption("The scores q·k/√d of this tile only: the one piece of the N × N matrix that exists right now. "
              "Blank cells are hidden by the causal mask" + (" (a whole blank row is fine: its m_i keeps the "
                                                              "previous value)." if step.partial else "."))

done_steps = steps[:index + 1]
itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
naive = kn.naive_traffic(n, n, d, itemsize)
tiled_bytes = sum(s.bytes_loaded + s.bytes_stored for s in steps)
naive_bytes = naive["read"] + naive["written"]
m1, m2, m3, m4 = st.columns(4)
m1.metric("FLOPs so far", f"{sum(s.flops for s in done_steps):,}",
          help="4 · rows · cols · d per tile: q kᵀ and p v, a multiply-add counted as 2.")
m2.metric("Bytes loaded so far", kib(sum(s.bytes_loaded for s in done_steps)),
          help="K and V tiles each step, the Q tile on a block's first step.")
m3.metric("Tiled, all steps: bytes moved", kib(tiled_bytes),
          help="Q once, K and V once per query block, O once.")
m4.metric("Naive: bytes moved", kib(naive_bytes),
          help="Naive writes S = Q Kᵀ, reads it for the softmax, writes P, reads P for P V: the N × N matrix moves "
               f"four times. Read {naive['read']:,} B, written {naive['written']:,} B.")
keys_read = sum(s.k_stop - s.k_start for s in steps)  # L: the keys every query block reads, summed
# tiled moves (2N + 2L)·d values (Q and O once, K and V for every block), naive 4N·d + 4N² (Q, K, V, O, and
# S and P each written and read): tiled moves less exactly while d < 2N² / (L − N)
break_even = 2 * n * n / (keys_read - n) if keys_read > n else float("inf")
verdict = (f"here tiling moves {kib(tiled_bytes)} against naive's {kib(naive_bytes)}"
           + (f", {naive_bytes / tiled_bytes:.2g}× less." if tiled_bytes < naive_bytes else
              f", {tiled_bytes / naive_bytes:.2g}× more." if tiled_bytes > naive_bytes else ", the same."))
bound = (f"here L = {keys_read:,}, so d < {break_even:,.1f}" if np.isfinite(break_even) else
         "here one query block reads each key once, so at any d")
st.caption("Counters for one head in main memory (HBM on a GPU). Naive moves the N × N matrix through memory four "
           "times; the tiled kernel never stores it but re-reads K and V once per query block, so tiling saves "
           "traffic only while d < 2N²/(L − N), L being the keys all query blocks read together "
           f"({bound}; for long inputs about {'4' if causal else '2'}·BLOCK_M): " + verdict)

rows = np.arange(step.q_start, step.q_stop)
st.plotly_chart(figs.state_figure(rows, step.m_prev, step.m_i, step.l_prev, step.l_i, step.alpha), width="stretch")
kernel_m = trace.m_i[0, 0, step.k_block, step.q_start:step.q_stop]
kernel_l = trace.l_i[0, 0, step.k_block, step.q_start:step.q_stop]
st.caption("Where a row's max grows, alpha < 1 shrinks the old sum and accumulator before this tile's terms are "
           "added; where it does not, alpha = 1. The Triton kernel wrote its own m_i and l_i for this step to a "
           f"debug buffer: they differ from the torch stepper's by at most "
           f"{np.nanmax(np.abs(kernel_m - step.m_i), initial=0):.1e} (m_i) and "
           f"{np.nanmax(np.abs(kernel_l - step.l_i), initial=0):.1e} (l_i).")

a1, a2 = st.columns(2)
a1.plotly_chart(figs.accumulator_figure(step.acc_rescaled, step.q_start, title="acc · alpha (old acc, rescaled)"),
                width="stretch")
a2.plotly_chart(figs.accumulator_figure(step.acc, step.q_start, title="acc after + p v (this tile's values)"),
                width="stretch")
a1.caption("The accumulator is an unnormalised weighted sum of value rows; rescaling keeps every term relative to "
           "the current max. On a block's first key tile the old acc is all zeros.")
if step.last:
    error = np.abs(step.out - reference[step.q_start:step.q_stop]).max()
    a2.success(f"Last key block of this query block: O = acc / l_i, max |O − float64 reference| = {error:.1e}.")
    if index == len(steps) - 1:
        st.success(f"Done. The whole Triton output differs from the float64 reference by at most "
                   f"{np.abs(kernel_out - reference).max():.1e}.")
else:
    a2.caption("O = acc / l_i is taken after this block's last key tile.")

st.header("2. From naive to fused")
st.markdown(
    "- **naive**: S = Q Kᵀ, the softmax over each row of S, then P V: the whole N × N matrix in memory.\n"
    "- **two-pass tiled**: one tile of S at a time; pass 1 finds each row's max, pass 2 sums exp(s − max) and "
    "weights V. No N × N matrix, but every score is computed twice and K is read twice.\n"
    "- **online softmax**: one pass; the max is a running max, and alpha repairs what was summed before it grew "
    "(the stepper above).\n"
    "- **fused Triton kernel**: the same loop as one GPU kernel, tiles held on chip."
)
try:
    with st.spinner("Running and timing the five methods…"):
        results = run_comparison(n, d, block_m, block_n, causal, dtype, seed)
except ValueError as exc:
    st.error(BLOCKS_TOO_BIG.format(exc))
    st.stop()
table = pd.DataFrame({
    "method": [r["method"] for r in results],
    "max |O − O_float64|": [f"{r['error']:.1e}" for r in results],
    "time (ms)": [f"{r['seconds'] * 1e3:,.2f}" for r in results],
    "tile steps": ["" if r["steps"] is None else str(r["steps"]) for r in results],
    "how to read the time": [r["note"] for r in results],
})
st.dataframe(table, hide_index=True, width="stretch")
where = ("on one CPU thread" if kn.INTERPRETED else
         f"on the GPU ({kn.KERNEL_DEVICE}), the stepper on one CPU thread")
kernel_timing = ("the interpreted kernel: one call, as nothing is compiled" if kn.INTERPRETED else
                 "the Triton kernel's first call, which compiles it, is not timed")
st.caption(f"Measured in one run on this machine, {where}: after one untimed warm-up call, a median of 5 calls, or "
           f"one call for a method slower than {kn.timing.SLOW_CALL_S:g} s ({kernel_timing}). Errors are "
           f"against a float64 computation of the same {dtype} inputs.")
speeds = [r for r in results if not (kn.INTERPRETED and r["method"] == "fused Triton kernel")]
st.plotly_chart(figs.timing_figure([r["method"] for r in speeds], [r["seconds"] * 1e3 for r in speeds]),
                width="stretch")
if kn.INTERPRETED:
    st.caption("On a CPU the Python-loop tiled versions lose to one big matmul: tiling pays off on a GPU, where the "
               "N × N matrix would have to go through slow main memory. The interpreted Triton kernel is left out: "
               "its time is not a speed.")
else:
    st.caption("Compare the fused Triton kernel with torch SDPA (both fused GPU kernels) and with naive, which "
               "sends the N × N matrix through GPU memory; the two Python-loop tiled versions pay one launch per "
               "tile, and the stepper runs on the CPU.")

st.header("3. Peak memory, naive vs tiled")
st.markdown("Measured with torch.profiler's allocation events: the most bytes torch's CPU allocator held during "
            "the call, beyond its inputs. The profiler's first start takes a few seconds, so this is opt-in.")
if st.toggle("Measure peak memory", value=False, key="kernel_memory", persist_state="session"):
    with st.spinner("Measuring peak memory…"):
        at_n = run_memory_at(n, d, block_m, block_n, causal, dtype, seed)
        peaks = run_memory_scan(d, causal)
    m_cols = st.columns(len(at_n))
    for col, (name, b) in zip(m_cols, at_n.items()):
        col.metric(f"{name.split(' (')[0]}, N = {n}", mib(b))
    st.plotly_chart(figs.peak_memory_figure(MEMORY_SIZES, {"naive": peaks["naive"],
                                                           "two-pass tiled (64 × 64 tiles)": peaks["tiled"]}),
                    width="stretch")
    st.caption(f"float32, d = {d}. Naive's peak grows as N² (it holds the score matrix and the pattern); the tiled "
               "version's grows as N (Q, K, V, O and one tile), so the gap widens with every doubling of N. "
               "The interpreted Triton kernel is not measured: the interpreter's numpy buffers are not its memory.")
