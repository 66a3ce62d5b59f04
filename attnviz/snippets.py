"""The code behind a page's figure: a few library calls that draw it again in a notebook, with the page's settings.

Each function takes what the page has set and returns Python source. Run as it is, the source defines `fig`, the
plotly figure the page draws (tests/test_snippets.py runs every page's snippet and compares its `fig` with the
page's chart); its last line, a comment, saves it for a paper (View.save or attnviz.export.write_figure: .svg, .pdf,
.png at 300 dpi; a View also .html). Values are written with repr, so any text comes back exactly as typed.

    heads_head(model, text, layer, head, ...)      the Heads page's One head map (notebook.head_view)
    sinks_grid(model, text)                        the Sinks page's sink score of every head on token 0
    positional_encoding(n_positions, d_model, base)  the Positional page's sinusoidal encoding
    variants_sharing(n_heads, n_kv)                the Variants page's who-reads-which-KV-head figure
    worked_example(q, k, v, scaled=..., causal=..., digits=...)  the Worked example's scores and weights
    span_attention(model, text, layer, head, queries, how=...)  the Heads page's span chart
    knockout_grid(model, text, mode=..., target=...)  the Experiments page's knock-outs, each head in turn
    generation_step(model, prompt, n_new, temperature, seed, step)  the Experiments page's rows of one generated token
    corpus_grid(run, stat, window)                 the Corpus page's mean of every head over a run's windows
    softmax_variants(d_k, n_keys, seed, temperature, rows_shown)  the Softmax page's random q·k, scaled and unscaled
    softmax_head(model, text, layer, head, temperature)  the Softmax page's real head at its own scale, unscaled, ÷ T
    kernel_step(n, d, block_m=..., block_n=..., causal=..., dtype=..., seed=..., window=..., step=...)  the Tiled
                                                   kernel page's step view
    lab_loss_curve(name)                           the Toy lab's loss curve, from a saved run's history
    lab_hybrid_maps(config, conv_kernel, a_max, head)  the Toy lab's hybrid beside its softmax models: every layer's map
    head_stats(model, text), knockout(model, text, heads)  the tables of a report (attnviz.report)
"""

from __future__ import annotations

SAVE = "# {target}.save({name!r})  # or .pdf, .png (300 dpi), .html"
EXPORT = "# from attnviz.export import write_figure; write_figure(fig, {name!r})  # or .pdf, .png (300 dpi)"


def _capture_line(model: str, text: str, layers=None) -> str:
    """The capture every model page starts from, as the page makes it (store="auto": the long-text store when the
    dense pattern would not fit)."""
    cut = "" if layers is None else f", layers={list(layers)!r}"
    return f"cap = attnviz.capture({model!r}, {text!r}{cut}, store=\"auto\")"


def _file_name(*parts) -> str:
    return "-".join(str(p).replace("/", "_") for p in parts) + ".svg"


def heads_head(model: str, text: str, layer: int, head: int, *, gamma: float = 1.0, hide_sink: bool = False,
               layers=None) -> str:
    """The Heads page's One head map: notebook.head_view's first chart (the map itself; a long text's max-pooled
    overview, as the page draws it)."""
    return "\n".join([
        "import attnviz",
        "from attnviz import notebook",
        "",
        _capture_line(model, text, layers),
        f"view = notebook.head_view(cap, {int(layer)}, {int(head)}, gamma={float(gamma)!r}, "
        f"hide_sink={bool(hide_sink)!r})",
        "fig = view.figures[0]  # view shows every chart of it in a notebook",
        SAVE.format(target="view", name=_file_name(model, f"L{layer}H{head}")),
    ])


def sinks_grid(model: str, text: str) -> str:
    """The Sinks page's first chart: every head's sink score alpha_0 (the mean attention its queries give token 0)."""
    return "\n".join([
        "import attnviz",
        "from attnviz import sinks",
        "from attnviz.figures import sinks as figs",
        "",
        _capture_line(model, text),
        "alpha = sinks.capture_sink_scores(cap)  # [layer, head, key]: the mean attention each key receives",
        "fig = figs.sink_score_grid(alpha[..., 0], cap.layers, threshold=sinks.SINK_THRESHOLD)",
        EXPORT.format(name=_file_name(model, "sink-scores")),
    ])


def positional_encoding(n_positions: int, d_model: int, base: float) -> str:
    """The Positional page's sinusoidal encoding PE[position, dimension]."""
    return "\n".join([
        "import attnviz",
        "from attnviz import positional",
        "from attnviz.figures import positional as figs",
        "",
        f"pe = positional.sinusoidal_encoding({int(n_positions)}, {int(d_model)}, {float(base)!r})  "
        "# [position, dimension]",
        "fig = figs.encoding_heatmap(pe)",
        EXPORT.format(name=_file_name("sinusoidal", n_positions, d_model)),
    ])


def variants_sharing(n_heads: int, n_kv: int) -> str:
    """The Variants page's first chart: which key/value head each query head reads in MHA, the chosen GQA and MQA."""
    return "\n".join([
        "import attnviz",
        "from attnviz import variants",
        "from attnviz.attention import kv_head_of",
        "from attnviz.figures import cost as figs",
        "",
        f"layouts = {{name: kv_head_of({int(n_heads)}, k) "
        f"for name, k in variants.variant_kv_heads({int(n_heads)}, {int(n_kv)}).items()}}",
        f"fig = figs.head_sharing_figure({int(n_heads)}, layouts)",
        EXPORT.format(name=_file_name("head-sharing", n_heads, n_kv)),
    ])


def worked_example(q: str, k: str, v: str, *, scaled: bool, causal: bool, digits: int) -> str:
    """The Worked example's scores and weights, from Q, K and V as typed on the page (rows on lines)."""
    scale_text = 'f"× {steps.scale:.4f}"' if scaled else '"(unscaled)"'
    return "\n".join([
        "import attnviz",
        "from attnviz import worked_example as we",
        "from attnviz.figures.worked import scores_and_pattern_figure",
        "",
        f"q, k, v = (we.parse_matrix(t, name) for t, name in (({q!r}, 'Q'), ({k!r}, 'K'), ({v!r}, 'V')))",
        f"steps = we.worked_steps(q, k, v, scaled={bool(scaled)!r}, causal={bool(causal)!r})",
        f"fig = scores_and_pattern_figure(steps.masked, steps.pattern, digits={int(digits)}, "
        f"scale_text={scale_text})",
        EXPORT.format(name=_file_name("worked-example")),
    ])


def head_stats(model: str, text: str, *, layers=None) -> str:
    """Every captured head's statistics (attnviz.stats.head_stats), the Heads page's Statistics table."""
    return "\n".join([
        "import attnviz",
        "",
        _capture_line(model, text, layers),
        "stats = cap.stats()  # one row per (layer, head): entropy, sink_mass, mean_distance, prev_token, ...",
        f"# stats.to_csv({_file_name(model, 'stats')[:-4] + '.csv'!r}, index=False)",
    ])


def knockout(model: str, text: str, heads, *, mode: str = "zero") -> str:
    """Each head knocked out alone, the text's mean next-token loss with and without it (attnviz.knockout)."""
    rows = [[(int(layer), int(head))] for layer, head in heads]
    return "\n".join([
        "from attnviz.knockout import knockout_effects",
        "from attnviz.models import load_model",
        "",
        f"loaded = load_model({model!r})",
        f"ids = loaded.tokenizer({text!r}).input_ids",
        f"result = knockout_effects(loaded, ids, {rows!r}, mode={mode!r})",
        "print(result.base_loss, result.delta_loss)  # nats: the loss without a knock-out, and each row's change",
    ])


def span_attention(model: str, text: str, layer: int, head: int, queries, *, how: str = "sum", layers=None) -> str:
    """The Heads page's span chart: the attention a set of queries gives every key in one head, summed or averaged
    over them (AttentionCapture.span_attention); a run of consecutive queries is written as a span (start, stop)."""
    queries = [int(q) for q in queries]
    span = queries == list(range(queries[0], queries[-1] + 1))
    chosen = f"({queries[0]}, {queries[-1] + 1})" if span else repr(queries)
    return "\n".join([
        "import attnviz",
        "from attnviz.figures import heads as figs",
        "",
        _capture_line(model, text, layers),
        f"queries = {chosen}  # a span (start, stop), or a list of positions",
        f"weights = cap.span_attention({int(layer)}, {int(head)}, queries, how={how!r})  # [key]",
        f"fig = figs.span_bars(weights, cap.tokens, {int(layer)}, {int(head)}, {queries!r}, {how!r})",
        EXPORT.format(name=_file_name(model, f"L{layer}H{head}-span")),
    ])


def knockout_grid(model: str, text: str, *, mode: str = "zero", target: tuple[int, int] | None = None) -> str:
    """The Experiments page's knock-outs, each head in turn: the change in the text's mean next-token loss per head
    (attnviz.knockout.knockout_effects, figures.experiments.effect_grid)."""
    aim = "" if target is None else f", target={(int(target[0]), int(target[1]))!r}"
    return "\n".join([
        "import attnviz",
        "from attnviz.figures import experiments as figs",
        "from attnviz.knockout import knockout_effects",
        "from attnviz.models import load_model",
        "",
        f"loaded = load_model({model!r})",
        f"ids = loaded.tokenizer({text!r}).input_ids",
        "layers, heads = loaded.shape.layers, loaded.shape.heads",
        "rows = [[(layer, head)] for layer in range(layers) for head in range(heads)]  # each head alone",
        f"result = knockout_effects(loaded, ids, rows, mode={mode!r}{aim})",
        "fig = figs.effect_grid(result.grid(result.delta_loss, layers, heads), what=\"Change in mean next-token "
        "loss\", unit=\"nats\")",
        EXPORT.format(name=_file_name(model, "knockouts")),
    ])


def generation_step(model: str, prompt: str, n_new: int, temperature: float, seed: int, step: int) -> str:
    """The Experiments page's Generation view: the prompt continued (attnviz.generation.generate), and the newest
    token's attention row in every head at one generated token (figures.experiments.generation_step)."""
    return "\n".join([
        "import attnviz",
        "from attnviz.figures import experiments as figs",
        "from attnviz.generation import generate",
        "from attnviz.models import load_model",
        "",
        f"loaded = load_model({model!r})",
        f"gen = generate(loaded, {prompt!r}, {int(n_new)}, temperature={float(temperature)!r}, seed={int(seed)})",
        "print(gen.text)  # the generated tokens",
        f"fig = figs.generation_step(gen, {int(step)})  # the rows when generated token {int(step)} was chosen",
        EXPORT.format(name=_file_name(model, "generation", step)),
    ])


def corpus_grid(run: str, stat: str, window: int) -> str:
    """The Corpus page's grid of every head's mean over a run's windows (CorpusRun.summary, figures.corpus.mean_grid).
    The run is named, not located: RUNS is the folder `attnviz corpus run --out` wrote it in, on the reader's side."""
    return "\n".join([
        "from pathlib import Path",
        "",
        "from attnviz.corpus import CorpusRun",
        "from attnviz.figures import corpus as figs",
        "",
        "RUNS = Path(\"runs\")  # the folder that holds the run (attnviz corpus run ... --out runs/NAME)",
        f"summary = CorpusRun(RUNS / {run!r}, name={run!r}).summary()  # one row per (window length, layer, head)",
        f"n_windows = int(summary.loc[summary[\"window\"] == {int(window)}, \"n_windows\"].max())",
        f"fig = figs.mean_grid(summary, {stat!r}, {int(window)}, "
        f"title=f\"{stat}: each head's mean over {{n_windows:,}} windows of {int(window)} tokens\")",
        EXPORT.format(name=_file_name(run, stat, window)),
    ])


def kernel_step(n: int, d: int, *, block_m: int, block_n: int, causal: bool, dtype: str, seed: int,
                window: int | None, step: int) -> str:
    """The Tiled kernel page's step view: the stepper and the Triton kernel on the page's seeded Q, K, V
    (attnviz.kernels.steps_view.kernel_run), drawn at one step with its in-chart slider (step_view)."""
    return "\n".join([
        "import attnviz",
        "from attnviz.kernels.steps_view import kernel_run, step_view  # imports attnviz.kernels first, as it must",
        "",
        f"run = kernel_run({int(n)}, {int(d)}, block_m={int(block_m)}, block_n={int(block_n)}, "
        f"causal={bool(causal)!r}, dtype={dtype!r}, seed={int(seed)}, window={window!r})",
        f"fig, shown = step_view(run, {int(step)})  # the slider in the chart walks the steps in `shown`",
        EXPORT.format(name=_file_name("kernel-step", n, d, step)),
    ])


def softmax_head(model: str, text: str, layer: int, head: int, temperature: float) -> str:
    """The Softmax page's real head, three ways: its pattern at its own scale, unscaled and at temperature T, from
    the captured q and k (attnviz.softmax.head_logits, head_variants; figures.softmax.head_patterns)."""
    return "\n".join([
        "import attnviz",
        "from attnviz import softmax as sm",
        "from attnviz.figures import softmax as figs",
        "",
        _capture_line(model, text),
        f"raw, bias, softcap = sm.head_logits(cap.inputs[{int(layer)}], {int(head)})  # q·k [query, key], "
        "the bias [key] or None",
        f"patterns = sm.head_variants(raw, cap.scaling, {float(temperature)!r}, bias=bias, softcap=softcap)",
        f"titles = figs.real_map_titles(cap.scaling, {float(temperature)!r}, bias=bias is not None, softcap=softcap)",
        "fig = figs.head_patterns({titles[name]: p for name, p in patterns.items()}, [str(t) for t in cap.tokens])",
        EXPORT.format(name=_file_name(model, f"L{layer}H{head}-softmax")),
    ])


def lab_loss_curve(name: str) -> str:
    """The Toy lab's loss curve, redrawn from the run saved as lab/<name> (its config and history, saved beside its
    weights: attnviz.lab.saved_history; figures.lab.saved_loss_curve). No training runs again."""
    return "\n".join([
        "import attnviz",
        "from attnviz import lab",
        "from attnviz.figures import lab as figs",
        "",
        f"saved = lab.saved_history({name!r})  # lab/{name}: its config, per-step losses and checkpoints",
        "fig = figs.saved_loss_curve(saved)",
        EXPORT.format(name=_file_name("lab", name, "loss")),
    ])


def lab_hybrid_maps(config: dict, conv_kernel: int, a_max: float, head: int) -> str:
    """The Toy lab's hybrid section: the Qwen3-Next hybrid and its softmax pair trained again with the page's settings
    (config: the LabConfig's fields; same settings and seed, same weights), then one head of every layer on the same
    text (attnviz.lab.hybrid.HybridComparison.maps, figures.lab_hybrid.layer_maps_grid)."""
    fields = ", ".join(f"{k}={v!r}" for k, v in config.items())
    return "\n".join([
        "import attnviz",
        "from attnviz import lab",
        "from attnviz.figures import lab_hybrid as figs",
        "",
        f"config = lab.LabConfig({fields})",
        f"comparison = lab.HybridComparison(config, conv_kernel={int(conv_kernel)}, a_max={float(a_max)!r})",
        "comparison.run()  # trains the three models here, one step of each in turn",
        "maps = comparison.maps(comparison.map_text())  # model -> LayerMaps: kinds, maps [head, query, key], scores",
        f"fig = figs.layer_maps_grid(maps, head={int(head)})",
        EXPORT.format(name=_file_name("lab", "hybrid", f"H{head}")),
    ])


def softmax_variants(d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int) -> str:
    """The Softmax page's first chart: seeded random q·k, scaled and unscaled, its logits and first rows, with the
    chart's slider over d_k (attnviz.softmax_charts.variants_chart)."""
    return "\n".join([
        "import attnviz",
        "from attnviz import softmax_charts",
        "",
        f"fig, dims = softmax_charts.variants_chart({int(d_k)}, n_keys={int(n_keys)}, seed={int(seed)}, "
        f"temperature={float(temperature)!r}, rows_shown={int(rows_shown)})  # the slider in the chart: d_k in dims",
        EXPORT.format(name=_file_name("softmax", d_k, n_keys, seed)),
    ])
