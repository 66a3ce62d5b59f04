"""Every head of a real model at its full context on this CPU: Gemma 3 270M at 32,768 tokens, SmolLM2-135M at 8,192,
against this machine's float32 matmul limit and against transformers' own SDPA forward pass.

The run first measures the float32 matmul rate (GFLOP/s, all threads). Each case then runs in a fresh child
process, so its peak resident memory (ru_maxrss) is its own, and reports its FLOP count (the forward pass's matmuls
plus q.k and p.v over the keys each layer's mask rule lets through: a sliding layer's window, not N²), its seconds,
and seconds / (FLOPs / rate), the multiple of the machine's limit. All cases run in one invocation, so their ratios
are measured under the same load.

  stats           python -m attnviz stats's path: the qk store, each layer's statistics computed in its forward pass
                  (the key tiles a sliding window hides are never computed), its q and k then dropped
  sdpa            transformers' own forward pass of the base model with SDPA attention (no attention returned)
  page            the Heads page run by Streamlit's AppTest: the first view of the text (the capture with every
                  head's statistics and grid tiles, and from 16,384 tokens every head's One head overview, then the
                  One head tab), and reruns after a head, layer, zoom and sink change
  dense vs qk     SmolLM2 at the largest N whose dense [layer, head, N, N] pattern fits attnviz's 2 GiB limit: the
                  dense pattern store plus head_stats, against the qk store plus streamed head_stats

    python benchmarks/longcontext.py
    python benchmarks/longcontext.py --repeat 5 "smol stats 8k"   one case 5 times, the rate measured before each
    python benchmarks/longcontext.py --quick    each kind of case once, on toy-llama-gqa at 1,100 tokens (long
                                                enough for the Heads page's zoom window; seconds, not figures)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TEXT = ROOT / "data" / "declaration_and_lincoln.txt"


def long_text(n_tokens: int, tokenizer) -> str:
    """The shipped text repeated until it is n_tokens long as the model reads it (its start token included), cut at
    a token boundary."""
    base = TEXT.read_text(encoding="utf-8")
    text = (base + "\n\n") * (1 + n_tokens * 6 // len(base))
    ids = tokenizer(text, add_special_tokens=False).input_ids
    extra = len(tokenizer("x").input_ids) - len(tokenizer("x", add_special_tokens=False).input_ids)
    return tokenizer.decode(ids[:n_tokens - extra])


def matmul_rate(size: int = 2048, repeats: int = 7) -> float:
    """This machine's float32 matmul rate in FLOP/s (the fastest of `repeats` [size, size] products, all threads)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)
    best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(repeats))
    return 2 * size**3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def forward_flops(loaded, n: int) -> float:
    """The matmul FLOPs of one forward pass over n tokens up to the last layer (no LM head): every linear layer of
    the decoder stack (2 n · its weights), and q.k plus p.v over the (query, key) pairs each layer's mask rule lets
    through (4 · head_dim · heads · pairs; attnviz.shape.LayerFacts gives the window)."""
    import torch

    from attnviz.attention import MaskRule

    shape = loaded.shape
    linear = sum(m.weight.numel() for name, m in loaded.model.named_modules()
                 if isinstance(m, torch.nn.Linear) and "lm_head" not in name)
    pairs = sum(MaskRule(n, n, causal=True, window=f.window if f.mask == "sliding" else None).visible_keys()
                for f in shape.layer_facts)
    return 2.0 * n * linear + 4.0 * shape.head_dim * shape.heads * pairs


def _child(case: str, model: str, n_tokens: int) -> dict:
    import torch

    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import head_stats, streaming_attend

    loaded = load_model(model)
    text = long_text(n_tokens, loaded.tokenizer)
    ids = loaded.tokenizer(text).input_ids
    out = {"threads": torch.get_num_threads(), "n_tokens": len(ids), "flops": forward_flops(loaded, len(ids))}
    started = time.perf_counter()
    if case == "stats":
        during = streaming_attend(ids, keep_inputs=False)
        capture_attention(loaded, text, store="qk", during=during)
        assert len(during.summary) == loaded.shape.layers
    elif case == "sdpa":
        out.update(_sdpa_forward(loaded, ids))
    elif case == "page":
        out.update(_page(text, model))
    elif case in ("dense", "qk"):
        head_stats(capture_attention(loaded, text, store="pattern" if case == "dense" else "qk"))
    else:
        raise SystemExit(f"unknown case {case}")
    out["seconds"] = out.pop("first_view_s", None) or time.perf_counter() - started
    out["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    return out


def _sdpa_forward(loaded, ids: list[int]) -> dict:
    """transformers' forward pass of the same weights (the converted folder attnviz loads; a toy's, saved to a
    temporary folder) with SDPA attention and no attention output, through the decoder stack only (as the
    statistics' pass; no LM head). Timed alone."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from attnviz import gguf_convert, models

    with tempfile.TemporaryDirectory() as tmp:
        if loaded.spec.source == "toy":
            loaded.model.save_pretrained(tmp)
            folder = tmp
        else:
            # the folder attnviz loads
            folder = gguf_convert.converted_folder(models._bundled_gguf(loaded.spec.name)[1])
        peer = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                    attn_implementation="sdpa").eval()
    started = time.perf_counter()
    with torch.no_grad():
        peer.model(input_ids=torch.tensor([ids]), use_cache=False)
    return {"first_view_s": time.perf_counter() - started}


def _page(text: str, model: str) -> dict:
    """The Heads page itself, run by Streamlit's AppTest (script time on the server, without the browser)."""
    from streamlit.testing.v1 import AppTest

    from attnviz.models import load_model

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=3600)
    at.run()
    at.switch_page("app_pages/heads.py")
    at.session_state["heads_model"] = model
    at.run()
    at.session_state["heads_tab"] = "One head"  # only the open tab runs: the one with the zoom window
    started = time.perf_counter()
    at.text_area(key="heads_text").set_value(text).run()
    first = time.perf_counter() - started
    said = [x.value for x in (*at.exception, *at.error, *at.warning)]
    if not any(b.key == "heads_head" for b in at.selectbox):
        raise SystemExit(f"the Heads page drew no head picker: {said}")
    reruns = []
    shape = load_model(model).shape  # a toy (--quick) has fewer heads, layers and tokens than these
    for change in (lambda: at.selectbox(key="heads_head").set_value(min(2, shape.heads - 1)),
                   lambda: at.selectbox(key="heads_layer").set_value(min(5, shape.layers - 1)),
                   lambda: at.slider(key="heads_zoom_q").set_value(min(4000, at.slider(key="heads_zoom_q").max)),
                   lambda: at.toggle(key="heads_hide_sink").set_value(True)):
        change()
        t = time.perf_counter()
        at.run()
        reruns.append(time.perf_counter() - t)
        assert not at.exception, at.exception
    return {"first_view_s": first, "reruns_s": reruns}


def run(case: str, model: str, n_tokens: int) -> dict | None:
    """One case in a fresh child process; None (its error printed) when it fails, so the other cases still run."""
    done = subprocess.run([sys.executable, __file__, "--child", case, model, str(n_tokens)], capture_output=True,
                          text=True, cwd=ROOT, timeout=3600)
    if done.returncode:
        print(f"  {case} {model} {n_tokens:,}: FAILED: {done.stderr.strip().splitlines()[-1][:300]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(label: str, r: dict, rate: float) -> str:
    limit = r["flops"] / rate
    return (f"{label:44} {r['n_tokens']:>7,} {r['flops'] / 1e12:>7.2f} {r['seconds']:>8.1f} {r['peak_gib']:>8.2f} "
            f"{r['seconds'] / limit:>8.2f}x")


CASES = (  # (key, case, model, tokens, label)
    ("gemma stats 32k", "stats", "gemma3-270m", 32768, "gemma3-270m: attnviz stats, every head"),
    ("gemma stats 16k", "stats", "gemma3-270m", 16384, "gemma3-270m: attnviz stats, every head"),
    ("gemma sdpa 16k", "sdpa", "gemma3-270m", 16384, "gemma3-270m: transformers SDPA forward"),
    ("smol stats 8k", "stats", "smollm2-135m", 8192, "smollm2-135m: attnviz stats, every head"),
    ("gemma page 32k", "page", "gemma3-270m", 32768, "gemma3-270m: Heads page, first view"),
    ("smol page 8k", "page", "smollm2-135m", 8192, "smollm2-135m: Heads page, first view"),
    ("dense", "dense", "smollm2-135m", 0, "smollm2-135m: dense store + head_stats"),
    ("qk", "qk", "smollm2-135m", 0, "smollm2-135m: qk store + streamed head_stats"),
)


QUICK_MODEL, QUICK_TOKENS = "toy-llama-gqa", 1100  # --quick: the first case of each kind, on this model at this length


def main(quick: bool = False) -> None:
    from attnviz.capture import MAX_CAPTURE_BYTES

    rate = matmul_rate(256 if quick else 2048)
    dense_n = int((MAX_CAPTURE_BYTES / (30 * 9 * 4)) ** 0.5) // 100 * 100
    print(f"float32 matmul rate measured first: {rate / 1e9:.0f} GFLOP/s; limit = FLOPs / that rate; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          + (f"; --quick: each kind of case once, on {QUICK_MODEL} at {QUICK_TOKENS:,} tokens" if quick else ""))
    print(f"{'case':44} {'tokens':>7} {'TFLOP':>7} {'seconds':>8} {'peak GiB':>8} {'x limit':>9}", flush=True)
    c = {}
    kinds = set()
    for key, case, model, n, label in CASES:
        if quick:
            if case in kinds:
                continue
            kinds.add(case)
            model, n, label = QUICK_MODEL, QUICK_TOKENS, label.replace(model, QUICK_MODEL)
        c[key] = run(case, model, n or dense_n)
        if c[key] is not None:
            print(_row(label, c[key], rate), flush=True)
            if case == "page":
                print("    reruns after a head, layer, zoom and sink change: "
                      + ", ".join(f"{x:.2f} s" for x in c[key]["reruns_s"]), flush=True)
    _goals(c, rate)
    if None in c.values():
        sys.exit(f"{sum(r is None for r in c.values())} case(s) failed")


def _goals(c: dict, rate: float) -> None:
    ratio = lambda r: r["seconds"] / (r["flops"] / rate)  # noqa: E731
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    g32, g16, sd, smol = (c.get(k) for k in ("gemma stats 32k", "gemma stats 16k", "gemma sdpa 16k", "smol stats 8k"))
    if g32:
        print(f"goal gemma3-270m 32,768: peak under 2 GiB ({g32['peak_gib']:.2f}, {met(g32['peak_gib'] < 2)}), "
              f"within 2x of the limit ({ratio(g32):.2f}x, {met(ratio(g32) <= 2)})")
    if g16 and sd:
        print(f"goal gemma3-270m 16,384 against SDPA: time at most 0.5x ({g16['seconds'] / sd['seconds']:.2f}x, "
              f"{met(g16['seconds'] <= 0.5 * sd['seconds'])}), peak at most 0.5x "
              f"({g16['peak_gib'] / sd['peak_gib']:.2f}x, {met(g16['peak_gib'] <= 0.5 * sd['peak_gib'])})")
    if smol:
        print(f"goal smollm2-135m 8,192: within 1.5x of the limit ({ratio(smol):.2f}x, {met(ratio(smol) <= 1.5)})")
    if c.get("gemma page 32k"):
        reruns = c["gemma page 32k"]["reruns_s"]
        print(f"goal Heads page at 32,768: reruns after a head, layer or zoom change under 1 s ({max(reruns[:3]):.2f} "
              f"s at most, {met(max(reruns[:3]) < 1)}); after a sink change {reruns[3]:.2f} s")
    if c.get("dense") and c.get("qk"):
        print(f"at {c['dense']['n_tokens']:,} tokens, the largest the dense store takes: qk/dense time "
              f"{c['qk']['seconds'] / c['dense']['seconds']:.2f}x, peak memory "
              f"{c['qk']['peak_gib'] / c['dense']['peak_gib']:.2f}x")


def repeat(key: str, times: int) -> None:
    """One case (its key in CASES) `times` times, each against the matmul rate measured just before it: how far
    this machine's noise moves its multiple of the limit."""
    _, case, model, n, label = next(c for c in CASES if c[0] == key)
    ratios = []
    for i in range(times):
        rate = matmul_rate()
        r = run(case, model, n)
        if r is not None:
            ratios.append(r["seconds"] / (r["flops"] / rate))
            print(f"run {i + 1}: {rate / 1e9:.0f} GFLOP/s, load average {os.getloadavg()[0]:.1f}; "
                  + _row(label, r, rate), flush=True)
    if ratios:
        print(f"{key}: {min(ratios):.2f}x to {max(ratios):.2f}x the limit over {len(ratios)} runs, median "
              f"{sorted(ratios)[len(ratios) // 2]:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "--repeat":
        repeat(sys.argv[3], int(sys.argv[2]))
    else:
        main(quick=sys.argv[1:] == ["--quick"])
