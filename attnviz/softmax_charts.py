"""The Softmax page's first chart as library calls, for a notebook: seeded random q and k, their logits and first
rows scaled and unscaled (attnviz.softmax), drawn with an in-chart slider over d_k (attnviz.figures.softmax,
attnviz.figures.instant).

    fig, dims = variants_chart(64, n_keys=32, seed=0, temperature=1.0)   # drawn at d_k = 64, the slider over dims

The page keeps every d_k's figure in a cache of its own and hands variants_chart its cached `stop`.
"""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go

from attnviz import softmax as sm
from attnviz.figures import instant
from attnviz.figures import softmax as figs

N_QUERIES = 256  # rows sampled per setting: enough to see each statistic's spread, fast on a CPU
DIMS = sm.log_spaced_dims(1, 1024, per_octave=2)  # the d_k values of the page's control and of the chart's slider
ROWS_SHOWN = 12  # the first rows drawn as maps


def scale_text(d_k: int) -> dict[str, str]:
    """Each variant's name with its logits: "scaled: q·k / √d_k", "unscaled: q·k"."""
    return {sm.SCALED: f"scaled: q·k / √{d_k}", sm.UNSCALED: "unscaled: q·k"}


def predicted_variance(d_k: int, temperature: float) -> dict[str, float]:
    """The variance of a logit q·k × scale / T for independent unit-variance q and k entries: 1 / T² scaled,
    d_k / T² unscaled."""
    return {sm.SCALED: 1.0 / temperature**2, sm.UNSCALED: d_k / temperature**2}


def variant_logits(d_k: int, n_keys: int, seed: int, temperature: float) -> dict:
    """{variant: (scores [N_QUERIES, n_keys], pattern)} for the seeded random q and k, scaled and unscaled."""
    q, k = sm.random_qk(N_QUERIES, n_keys, d_k, seed)
    return {variant: sm.scores_and_pattern(q, k, scaled=scaled, temperature=temperature)
            for variant, scaled in ((sm.SCALED, True), (sm.UNSCALED, False))}


# the figure's titles and legend as every d_k stop has them (a stop that changed them would be drawn whole again,
# attnviz.figures.instant): d_k by name, its value on the slider
TITLES = {sm.SCALED: "scaled: q·k / √d_k", sm.UNSCALED: "unscaled: q·k"}


def _panels(logits: dict, d_k: int, temperature: float) -> dict:
    variance = predicted_variance(d_k, temperature)
    variance_text = {sm.SCALED: f"1 / T² = {variance[sm.SCALED]:.4g}", sm.UNSCALED: "d_k / T²"}
    return {variant: {"scores": scores, "pattern": pattern, "predicted_var": variance[variant],
                      "variance_text": variance_text[variant], "title": TITLES[variant]}
            for variant, (scores, pattern) in logits.items()}


def variants_figure(logits: dict, d_k: int, temperature: float, rows_shown: int = ROWS_SHOWN) -> go.Figure:
    """The logits' histograms (with the normal density of the predicted variance) and the first rows of both
    variants, at one d_k, from variant_logits."""
    return figs.variants_figure(_panels(logits, d_k, temperature), rows_shown=rows_shown)


def variants_stop(d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int = ROWS_SHOWN) -> dict:
    """One d_k's variants figure as plain dicts (a stop of the chart's d_k slider): binned logits, the shown rows'
    hover and their pictures (the layout's images)."""
    traces, layout = figs.variants_parts(_panels(variant_logits(d_k, n_keys, seed, temperature), d_k, temperature),
                                         rows_shown=rows_shown)
    return {"data": traces, "layout": {"images": layout["images"]}}


def variants_chart(d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int = ROWS_SHOWN, *,
                   stop: Callable[..., dict] = variants_stop) -> tuple:
    """(figure, d_ks): the variants figure at d_k with an in-chart slider over the d_k values d_ks, each a stop the
    browser draws: all of DIMS while their stops fit instant.FRAME_BUDGET, else every k-th counted from d_k (k = 2,
    one per doubling, at 256 keys per query; 3 at 512), with the first and last. stop(d_k, n_keys, seed,
    temperature, rows_shown) makes each stop (variants_stop, or a cached copy of it)."""
    if d_k not in DIMS:
        raise ValueError(f"d_k = {d_k} is not one of the chart's values {DIMS}")
    stop_bytes = instant.json_bytes(stop(d_k, n_keys, seed, temperature, rows_shown))
    dims = [DIMS[i] for i in instant.thinned(len(DIMS), DIMS.index(d_k), stop_bytes)]
    chart = variants_figure(variant_logits(d_k, n_keys, seed, temperature), d_k, temperature, rows_shown)
    instant.add_frame_slider(chart, [stop(d, n_keys, seed, temperature, rows_shown) for d in dims],
                             [str(d) for d in dims], dims.index(d_k), parameter="d_k")
    return chart, dims
