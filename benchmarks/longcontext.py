"""Every head of SmolLM2-135M at its full context (8,192 tokens) on this CPU, against the dense path.

Each case runs in a fresh child process, so its peak resident memory (ru_maxrss) is its own; all cases run in this
one invocation, so their ratios are measured under the same load.

  stats 8k       python -m attnviz stats's path: the qk store, each layer's statistics computed as soon as the
                 forward pass records its q and k, which are then dropped
  page 8k        the Heads page run by Streamlit's AppTest: its first view of an 8,192-token text (the qk
                 capture, whose forward pass also computes every layer's statistics and grid tiles, then the One
                 head tab: only the open tab runs), and reruns after a head change, a layer change, a zoom move and hiding the sink
  dense vs qk    at the largest N whose dense [layer, head, N, N] pattern fits attnviz's 2 GiB limit: the dense
                 pattern store plus head_stats, against the qk store plus streamed head_stats

    python benchmarks/longcontext.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "smollm2-135m"
TEXT = ROOT / "data" / "declaration_and_lincoln.txt"


def long_text(n_tokens: int, tokenizer) -> str:
    """The shipped text repeated until it is n_tokens long (cut at a token boundary)."""
    base = TEXT.read_text(encoding="utf-8")
    text = (base + "\n\n") * (1 + n_tokens * 6 // len(base))
    ids = tokenizer(text).input_ids[:n_tokens]
    return tokenizer.decode(ids)


def _child(case: str, n_tokens: int) -> dict:
    import torch

    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import head_stats, stats_frame, streamed_stats

    loaded = load_model(MODEL)
    text = long_text(n_tokens, loaded.tokenizer)
    out = {"threads": torch.get_num_threads()}
    started = time.perf_counter()
    if case == "stats":
        ids = loaded.tokenizer(text).input_ids
        per_layer = {}
        cap = capture_attention(loaded, text, store="qk", keep_inputs=False,
                                on_layer=lambda layer, x: per_layer.__setitem__(layer, streamed_stats(x, ids)))
        stats_frame([per_layer[i] for i in cap.layers], cap.layers, cap.kv_head_of, cap.n_tokens)
    elif case == "page":
        # the Heads page itself, run by Streamlit's AppTest (script time on the server, without the browser)
        from streamlit.testing.v1 import AppTest

        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=1800)
        at.run()
        at.switch_page("app_pages/heads.py")
        at.run()
        at.session_state["heads_tab"] = "One head"  # only the open tab runs: the one with the zoom window
        started = time.perf_counter()
        at.text_area(key="heads_text").set_value(text).run()
        out["first_view_s"] = time.perf_counter() - started
        assert not at.exception, at.exception
        reruns = []
        for change in (lambda: at.selectbox(key="heads_head").set_value(4),
                       lambda: at.selectbox(key="heads_layer").set_value(20),
                       lambda: at.slider(key="heads_zoom_q").set_value(4000),
                       lambda: at.toggle(key="heads_hide_sink").set_value(True)):
            change()
            t = time.perf_counter()
            at.run()
            reruns.append(time.perf_counter() - t)
            assert not at.exception, at.exception
        out["reruns_s"] = reruns
        cap = type("C", (), {"n_tokens": n_tokens})
    elif case in ("dense", "qk"):
        cap = capture_attention(loaded, text, store="pattern" if case == "dense" else "qk")
        head_stats(cap)
    else:
        raise SystemExit(f"unknown case {case}")
    out["n_tokens"] = cap.n_tokens
    out["seconds"] = time.perf_counter() - started
    out["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    return out


def run(case: str, n_tokens: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", case, str(n_tokens)], capture_output=True,
                          text=True, cwd=ROOT, timeout=1800)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from attnviz.capture import MAX_CAPTURE_BYTES

    layers, heads = 30, 9
    dense_n = int((MAX_CAPTURE_BYTES / (layers * heads * 4)) ** 0.5) // 100 * 100
    stats = run("stats", 8192)
    page = run("page", 8192)
    dense, qk = run("dense", dense_n), run("qk", dense_n)
    print(f"SmolLM2-135M, every layer (30 x 9 heads), float32, {stats['threads']} torch threads")
    print(f"{'case':48} {'tokens':>7} {'seconds':>8} {'peak GiB':>9}")
    print(f"{'python -m attnviz stats (qk store, streamed)':48} {stats['n_tokens']:>7,} {stats['seconds']:>8.1f} "
          f"{stats['peak_gib']:>9.2f}")
    print(f"{'Heads page, first view (AppTest)':48} {page['n_tokens']:>7,} "
          f"{page['first_view_s']:>8.1f} {page['peak_gib']:>9.2f}")
    for label, seconds in zip(("head change", "layer change", "zoom move", "sink hidden"),
                              page["reruns_s"]):
        print(f"{'  rerun after a ' + label:48} {'':>7} {seconds:>8.2f}")
    print(f"{'dense store + head_stats':48} {dense['n_tokens']:>7,} {dense['seconds']:>8.1f} {dense['peak_gib']:>9.2f}")
    print(f"{'qk store + streamed head_stats':48} {qk['n_tokens']:>7,} {qk['seconds']:>8.1f} {qk['peak_gib']:>9.2f}")
    print(f"at {dense['n_tokens']:,} tokens, the largest the dense store takes: qk/dense time "
          f"{qk['seconds'] / dense['seconds']:.2f}x, peak memory {qk['peak_gib'] / dense['peak_gib']:.2f}x")
    print(f"goal at {stats['n_tokens']:,} tokens: statistics under 60 s and 2 GiB: {stats['seconds']:.0f} s, "
          f"{stats['peak_gib']:.2f} GiB ({'met' if stats['seconds'] < 60 and stats['peak_gib'] < 2 else 'NOT met'}); "
          f"a rerun after a head, layer or zoom change under 1 s: {max(page['reruns_s'][:3]):.2f} s at most "
          f"({'met' if max(page['reruns_s'][:3]) < 1 else 'NOT met'})")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
