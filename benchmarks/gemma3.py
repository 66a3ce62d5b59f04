"""Gemma 3 270M's own findings: attention sinks by layer kind, massive activations and their intervention, the
StreamingLLM experiment and induction heads, on the bundled model (gemma3-270m: the Q4_K_M GGUF, dequantized to
float32, so every number is the quantized model's).

    .venv/bin/python benchmarks/gemma3.py [--windows 32] [--window-tokens 64] [--text-tokens 512]
        [--stream-windows 256,1024] [--sinks 4] [--induction-length 50] [--seeds 3] [--rolling-tokens 32]
        [--rolling-window 16] [--stream-tokens N] [--references 8] [--reference-tokens 64]
    .venv/bin/python benchmarks/gemma3.py --quick    every part at its smallest: 2 windows of 16 tokens, a
        32-token text, 2 reference texts of 16, StreamingLLM over the text's first 48 tokens with a window of 16,
        one seed of 8 tokens

Prints, from this one run, each number computed by attnviz:
(1) per layer, with its kind read from the model's config: Sink_0^0.3 and the mean alpha_0 over --windows windows
    of --window-tokens tokens of the shipped text (attnviz.sinks; Gu et al., ICLR 2025), and the layer's largest
    hidden-state value on a --text-tokens window of the same text (attnviz.massive; Sun et al., 2024);
(2) every dimension with values that are massive in Sun et al.'s sense: at how many tokens, in which layers, and
    its largest ones;
(3) the intervention: token 0's massive dimensions set to zero or to their mean over 8 windows of 64 tokens (as
    the Sinks page does), after the layer where they have all appeared and after each full-attention layer but the
    last: perplexity on the --text-tokens window and the sink mass of the layers after the edit;
(4) the StreamingLLM experiment over the whole shipped text, or its first --stream-tokens tokens
    (attnviz.streaming: full attention, a window of the last W tokens, the window plus --sinks first tokens) for
    each W;
(5) the induction test (attnviz.diagnostics: a random sequence of --induction-length tokens repeated, --seeds
    seeds): the top heads by prefix-matching score and the loss on each copy;
(6) cross-checks of those numbers against transformers' own outputs of the same weights with its eager attention
    and no attnviz code (output_attentions, output_hidden_states, the labels= loss, a forward hook of this script
    that zeroes the same values), and of the one masked pass against the rolling KV cache decoded token by token
    (--rolling-window, on the first --rolling-tokens tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import diagnostics, massive, sinks, streaming
from attnviz.models import load_model

REFERENCE_WINDOWS, REFERENCE_TOKENS = 8, 64  # the texts the mean intervention averages over, as on the Sinks page


def layer_kinds(shape) -> list[str]:
    """Each layer's attention, "sliding" (a window of keys) or "full", from the model's per-layer facts
    (attnviz.shape.LayerFacts; Gemma 3 270M: full on layers 5, 11 and 17)."""
    return ["sliding" if facts.mask == "sliding" else "full" for facts in shape.layer_facts]


def by_kind(values, kinds: list[str], kind: str) -> np.ndarray:
    """The entries of values [..., layer, head] that belong to layers of this kind: [..., layers of kind, head]."""
    return np.asarray(values)[..., [i for i, k in enumerate(kinds) if k == kind], :]


def massive_mask(hidden) -> np.ndarray:
    """[layer, token, dim] bool: the values that are massive in Sun et al.'s sense (over massive.MASSIVE_VALUE and
    over massive.MASSIVE_RATIO times their layer's median |value|)."""
    h = np.abs(np.asarray(hidden))
    return (h > massive.MASSIVE_VALUE) & (h > massive.MASSIVE_RATIO * massive.median_magnitude(hidden)[:, None, None])


def print_massive(hidden, tokens, top: int = 3) -> None:
    """Per dimension with a massive value: at how many tokens and in which layers, and its largest tokens."""
    h, hit = np.abs(np.asarray(hidden)), massive_mask(hidden)
    median = massive.median_magnitude(hidden)
    for dim in np.flatnonzero(hit.any(axis=(0, 1))):
        at = np.flatnonzero(hit[:, :, dim].any(axis=0))
        peaks = (h[:, at, dim] * hit[:, at, dim]).max(axis=0)
        print(f"  dim {dim}: massive at {len(at)} of {h.shape[1]} tokens, in layers "
              f"{spans(np.flatnonzero(hit[:, :, dim].any(axis=1)).tolist())}; largest:")
        for token in at[np.argsort(-peaks, kind="stable")][:top]:
            layers = np.flatnonzero(hit[:, token, dim])
            peak = int(layers[np.argmax(h[layers, token, dim])])
            value = h[peak, token, dim]
            print(f"    token {token} {tokens[token]!r}: layers {spans(layers.tolist())}, peak {value:,.0f} after "
                  f"layer {peak} ({value / median[peak]:,.0f}x median)")


def spans(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def print_layers(kinds, alpha, hidden, tokens) -> None:
    top = massive.top_activations(hidden, k=1)
    median = massive.median_magnitude(hidden)
    print(f"{'layer':>5} {'kind':<8}{'Sink_0^0.3':>11}{'mean a0':>9}   largest |value| (token, dim){'x median':>21}")
    for i, kind in enumerate(kinds):
        a = top[i][0]
        print(f"{i:>5} {kind:<8}{sinks.sink_rate(alpha[:, i]):>11.1%}{alpha[:, i].mean():>9.2f}   "
              f"{a.value:>9.0f} ({a.token} {tokens[a.token]!r}, {a.dim}){abs(a.value) / median[i]:>12,.0f}")


def sink_summary(alpha, kinds) -> None:
    parts = [f"all {sinks.sink_rate(alpha):.1%}"]
    for kind in ("sliding", "full"):
        chosen = by_kind(alpha, kinds, kind)
        layers = [i for i, k in enumerate(kinds) if k == kind]
        parts.append(f"{kind} layers ({len(layers)}) {sinks.sink_rate(chosen):.1%}, mean alpha_0 {chosen.mean():.2f}")
    print("Sink_0^0.3: " + "; ".join(parts))


def run_interventions(loaded, text, hidden, refs, kinds, dims):
    """(layer, mode, Intervention) for token 0's `dims`: zero after the layer where they have all appeared and
    after every full-attention layer but the last; their mean after the first of those layers."""
    settled = int(np.flatnonzero(massive_mask(hidden)[:, 0, dims].all(axis=1))[0])
    layers = sorted({settled} | {i for i, k in enumerate(kinds[:-1]) if k == "full" and i > settled})
    runs = []
    for layer in layers:
        for mode in massive.MODES if layer == settled else ("zero",):
            means = massive.mean_at(refs, layer, 0, dims) if mode == "mean" else None
            edit = massive.edit_for(hidden, layer, 0, dims, mode, means)
            runs.append((layer, mode, massive.intervention(loaded, text, edit)))
    return runs


def print_interventions(runs, hidden, dims, n_references: int = REFERENCE_WINDOWS) -> None:
    print(f"intervention at token 0, dimensions {', '.join(map(str, dims))}: perplexity on the text, sink mass "
          "(mean over heads of the attention queries 1..n-1 give token 0) of the layers after the edit")
    print(f"{'after layer':>11} {'set to':<28}{'values':>18}{'perplexity':>12}{'x':>8}{'sink mass':>20}")
    for layer, mode, r in runs:
        after = slice(layer + 1, None)
        label = "zero" if mode == "zero" else f"mean over {n_references} texts"
        values = ", ".join(f"{v:.0f}" for v in r.edit.values)
        print(f"{layer:>11} {label:<28}{values:>18}{r.edited_perplexity:>12.2f}"
              f"{r.edited_perplexity / r.perplexity:>8.2f}{r.sink_mass[after].mean():>10.3f} -> "
              f"{r.edited_sink_mass[after].mean():.3f}")
        if mode == "mean" and np.allclose(r.edit.values, hidden[layer, 0, list(dims)], rtol=1e-5):
            print(f"{'':>12}(token 0 sees only itself, so its hidden state is the same in every text: the mean is "
                  "its own value, and the edit changes nothing)")


def run_streaming(loaded, ids, windows, n_sinks):
    results, full = [], None
    for window in windows:
        r = streaming.streaming_experiment(loaded.model, ids, window=window, n_sinks=n_sinks, full_losses=full)
        full = r.losses[streaming.SETTINGS[0]]
        results.append(r)
    return results


def print_streaming(results, ids, n_sinks, first_seconds) -> None:
    print(f"StreamingLLM over the shipped text ({len(ids):,} tokens), {n_sinks} sink tokens at their cache slots")
    print(f"{'window W':>9}{'(a) full':>10}{'(b) window':>12}{'x full':>8}{'(c) + sinks':>13}{'x full':>8}"
          f"{'seconds (a, b, c)':>22}")
    for r in results:
        full, window_only, with_sinks = (r.perplexity[name] for name in streaming.SETTINGS)
        seconds = [r.seconds.get(name, first_seconds) for name in streaming.SETTINGS]
        print(f"{r.window:>9}{full:>10.2f}{window_only:>12.2f}{window_only / full:>8.2f}{with_sinks:>13.2f}"
              f"{with_sinks / full:>8.2f}{', '.join(f'{s:.0f}' for s in seconds):>22}")


def run_induction(loaded, length, seeds):
    tests = [diagnostics.induction_test(loaded, length, seed=seed) for seed in range(seeds)]
    table = tests[0].scores[["layer", "head"]].copy()
    for name in diagnostics.SCORES:
        table[name] = np.mean([t.scores[name].to_numpy() for t in tests], axis=0)
    return tests, table


def print_induction(tests, table, kinds, length, top=5) -> None:
    first = np.mean([t.loss_first for t in tests])
    second = np.mean([t.loss_second for t in tests])
    print(f"induction test: {length} random tokens repeated, seeds 0-{len(tests) - 1}; loss {first:.2f} nats on the "
          f"first copy, {second:.2f} on the second")
    print(f"{'layer':>5} {'head':>4} {'kind':<8}{'prefix matching':>16}{'duplicate':>11}{'previous':>10}")
    for row in table.sort_values("prefix_matching", ascending=False).head(top).itertuples():
        print(f"{row.layer:>5} {row.head:>4} {kinds[row.layer]:<8}{row.prefix_matching:>16.3f}"
              f"{row.duplicate_token:>11.3f}{row.previous_token:>10.3f}")
    for kind in ("sliding", "full"):
        scores = table.prefix_matching[[kinds[layer] == kind for layer in table.layer]]
        print(f"  {kind} layers: best head {scores.max():.3f}, heads above 0.3: {(scores > 0.3).sum()} of "
              f"{len(scores)}")


def reference_model(loaded):
    """The same weights through transformers alone: its eager attention, no attnviz attention function or hook."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(loaded.model.name_or_path, dtype=torch.float32,
                                                attn_implementation="eager").eval()


@torch.no_grad()
def reference_run(model, ids, **kwargs):
    return model(input_ids=torch.as_tensor(ids).reshape(1, -1), **kwargs)


@torch.no_grad()
def zeroed_perplexity(model, ids, layer: int, dims) -> float:
    """exp(labels= loss) with a forward hook of our own that zeroes `dims` at token 0 after decoder layer `layer`."""
    def zero(_module, _args, output):
        output[:, 0, list(dims)] = 0.0  # Gemma 3's layers return the hidden state itself
        return output

    handle = model.model.layers[layer].register_forward_hook(zero)
    try:
        ids = torch.as_tensor(ids).reshape(1, -1)
        return float(torch.exp(model(input_ids=ids, labels=ids).loss))
    finally:
        handle.remove()


def cross_checks(loaded, args, texts, alpha, text_ids, hidden, runs, stream, ids, tests, dims) -> None:
    """Each line: what attnviz computed, against the same quantity from transformers' own outputs."""
    reference = reference_model(loaded)
    print("cross-checks against transformers' own outputs (eager attention, no attnviz code):")
    diffs = []
    for i, text in enumerate(texts[:4]):
        a = np.stack([x[0].double().numpy() for x in reference_run(reference, loaded.tokenizer(text)["input_ids"],
                                                                    output_attentions=True).attentions])
        diffs.append(np.abs(a[..., :, 0].mean(-1) - alpha[i]).max())  # alpha_0: all n queries see key 0
    print(f"  alpha_0 on {len(diffs)} windows, from output_attentions: max |difference| {max(diffs):.1e}")
    out = reference_run(reference, text_ids, output_attentions=True, output_hidden_states=True,
                        labels=torch.as_tensor(text_ids)[None])
    mass = np.stack([x[0].double().numpy()[:, 1:, 0].mean(-1).mean() for x in out.attentions])
    print(f"  sink mass per layer on the {len(text_ids)}-token text: max |difference| "
          f"{np.abs(mass - runs[0][2].sink_mass).max():.1e}; perplexity {runs[0][2].perplexity:.4f} against "
          f"exp(labels= loss) {float(torch.exp(out.loss)):.4f}")
    theirs = torch.stack(out.hidden_states[1:-1])[:, 0].numpy()  # after layers 0..16 (the last is after the norm)
    scale = np.abs(theirs).max()
    print(f"  hidden states after layers 0-{len(theirs) - 1}, from output_hidden_states: max |difference| "
          f"{np.abs(hidden[:-1] - theirs).max():.1e} (largest value {scale:,.0f})")
    for layer, mode, r in runs:
        if mode == "zero":
            print(f"  zeroed after layer {layer}: perplexity {r.edited_perplexity:.4f}, with a hook of our own "
                  f"{zeroed_perplexity(reference, text_ids, layer, dims):.4f}")
    full = stream[0].perplexity[streaming.SETTINGS[0]]
    whole = reference_run(reference, ids, labels=ids[None]).loss
    print(f"  full attention over {len(ids):,} tokens: perplexity {full:.4f}, exp(labels= loss) "
          f"{float(torch.exp(whole)):.4f}")
    test = tests[0]
    p = np.stack([x[0].double().numpy() for x in reference_run(reference, test.capture.token_ids,
                                                                output_attentions=True).attentions])
    q = test.start + test.length + np.arange(test.length)  # the second copy's queries
    mine = test.scores.prefix_matching.to_numpy().reshape(p.shape[:2])
    print(f"  prefix matching (seed 0), from output_attentions at the key after each earlier copy: max "
          f"|difference| {np.abs(p[..., q, q - test.length + 1].mean(-1) - mine).max():.1e}")
    head = ids[:args.rolling_tokens]
    w, s = args.rolling_window, args.sinks
    rolling = streaming.rolling_cache_token_losses(loaded.model, head, window=w, n_sinks=s)
    one_pass = streaming.streaming_token_losses(loaded.model, head, window=w, n_sinks=s)
    print(f"  window {w} + {s} sinks on the first {len(head)} tokens, one masked pass against the rolling KV cache "
          f"decoded token by token: max |loss difference| {np.abs(rolling - one_pass).max():.1e} nats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=32, help="windows of the shipped text for Sink_0^0.3")
    parser.add_argument("--window-tokens", type=int, default=64, help="their length (Gu et al.: 64)")
    parser.add_argument("--text-tokens", type=int, default=512, help="the massive-activation text's length")
    parser.add_argument("--stream-windows", default="256,1024", help="StreamingLLM windows W, comma-separated")
    parser.add_argument("--sinks", type=int, default=streaming.DEFAULT_SINKS)
    parser.add_argument("--induction-length", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rolling-tokens", type=int, default=32)
    parser.add_argument("--rolling-window", type=int, default=16)
    parser.add_argument("--stream-tokens", type=int, default=None, help="StreamingLLM over this many tokens only")
    parser.add_argument("--references", type=int, default=REFERENCE_WINDOWS, help="texts the mean edit averages")
    parser.add_argument("--reference-tokens", type=int, default=REFERENCE_TOKENS, help="their length")
    parser.add_argument("--quick", action="store_true", help="every part at its smallest")
    args = parser.parse_args()
    if args.quick:
        args.windows, args.window_tokens, args.text_tokens = 2, 16, 32
        args.stream_windows, args.stream_tokens, args.rolling_tokens, args.rolling_window = "16", 48, 16, 8
        args.induction_length, args.seeds, args.references, args.reference_tokens = 8, 1, 2, 16
    start = time.perf_counter()
    loaded = load_model("gemma3-270m")
    config, tok, text = loaded.model.config, loaded.tokenizer, streaming.shipped_text()
    kinds = layer_kinds(loaded.shape)
    print(f"gemma3-270m: {loaded.spec.description}")
    print(f"from its config: {len(kinds)} layers ("
          f"{kinds.count('sliding')} sliding-window {config.sliding_window}, full on "
          f"{', '.join(str(i) for i, k in enumerate(kinds) if k == 'full')}), {config.num_attention_heads} query "
          f"heads on {config.num_key_value_heads} KV head of {config.head_dim}; {torch.get_num_threads()} torch "
          f"threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    texts = sinks.text_windows(text, tok, n_tokens=args.window_tokens, n_windows=args.windows)
    alpha = sinks.alpha_over_texts(loaded, texts)  # [text, layer, head]
    middle = sinks.text_windows(text, tok, n_tokens=args.text_tokens - 1, n_windows=3)[1]  # + <bos>
    text_ids = tok(middle)["input_ids"]
    hidden = massive.layer_outputs(loaded.model, text_ids)  # [layer, token, dim]
    tokens = tok.convert_ids_to_tokens(text_ids)
    print(f"\n(1) {len(texts)} windows of {args.window_tokens} tokens for alpha_0; the middle {len(text_ids)} tokens "
          "of the shipped text for the hidden states")
    print_layers(kinds, alpha, hidden, tokens)
    sink_summary(alpha, kinds)

    print(f"\n(2) massive activations (|value| > {massive.MASSIVE_VALUE:g} and > {massive.MASSIVE_RATIO:,.0f}x the "
          "layer's median) on the same tokens")
    print_massive(hidden, tokens)
    dims = np.flatnonzero(massive_mask(hidden)[:, 0].any(axis=0)).tolist()  # token 0's massive dimensions
    refs = [massive.layer_outputs(loaded.model, tok(t)["input_ids"])
            for t in sinks.text_windows(text, tok, n_tokens=args.reference_tokens, n_windows=args.references)]
    runs = run_interventions(loaded, middle, hidden, refs, kinds, dims)
    print(f"\n(3) unedited perplexity {runs[0][2].perplexity:.2f}")
    print_interventions(runs, hidden, dims, args.references)

    ids = torch.as_tensor(tok(text)["input_ids"][:args.stream_tokens])
    stream = run_streaming(loaded, ids, [int(w) for w in args.stream_windows.split(",")], args.sinks)
    print("\n(4) ", end="")
    print_streaming(stream, ids, args.sinks, stream[0].seconds.get(streaming.SETTINGS[0], float("nan")))
    for r in stream:
        print("  " + streaming.describe_experiment(r, "Gemma 3 270M (Q4_K_M)"))

    tests, table = run_induction(loaded, args.induction_length, args.seeds)
    print("\n(5) ", end="")
    print_induction(tests, table, kinds, args.induction_length)

    print("\n(6) ", end="")
    cross_checks(loaded, args, texts, alpha, text_ids, hidden, runs, stream, ids, tests, dims)
    print(f"\n{time.perf_counter() - start:.0f} s in all; load average {os.getloadavg()[0]:.1f} at the end "
          "(2 cores shared: seconds grow with the load)")


if __name__ == "__main__":
    main()
