"""attnviz.figures.softmax: the panels that share one figure draw each curve, box and map in its own subplot, with
the data they were given, and mark the current d_k in every panel."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnviz import softmax as sm
from attnviz.figures import softmax as figs
from attnviz.figures.common import ATTENTION_SCALE
from tests.test_figures_raster import QUANTUM, cell_colours, expected_colours


def _sweep() -> pd.DataFrame:
    rows = []
    for variant, factor in (("scaled", 1.0), ("unscaled", 3.0)):
        for d_k in (1, 4, 16, 64):
            rows.append({"variant": variant, "d_k": d_k, "a": factor * d_k, "b": 1 / (factor * d_k),
                         "lo": 0.5 * d_k, "hi": 2.0 * d_k})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # the figure sorts by d_k itself


def _axis_titles(fig, axis: str) -> dict[str, str]:
    return {name: fig.layout[name].title.text for name in fig.layout if name.startswith(axis)}


def test_sweep_panels_draw_each_column_in_its_own_panel_with_one_legend():
    sweep = _sweep()
    fig = figs.sweep_panels(sweep, [
        {"column": "a", "title": "A", "y_title": "a (units)", "band": ("lo", "hi"), "reference": True},
        {"column": "b", "title": "B", "y_title": "b (log scale)", "log_y": True},
    ], reference={"theory": ([1, 64], [1, 64])}, cols=2)
    assert [a.text for a in fig.layout.annotations if a.text in ("A", "B")] == ["A", "B"]
    lines = {(t.name, t.xaxis): t for t in fig.data if t.mode == "lines+markers"}
    for variant, factor in (("scaled", 1.0), ("unscaled", 3.0)):
        part = sweep[sweep.variant == variant].sort_values("d_k")
        np.testing.assert_array_equal(lines[(variant, "x")].y, factor * part.d_k.to_numpy(float))
        np.testing.assert_array_equal(lines[(variant, "x2")].y, 1 / (factor * part.d_k.to_numpy(float)))
        assert lines[(variant, "x")].showlegend and not lines[(variant, "x2")].showlegend  # one legend entry
    assert [t.name for t in fig.data if t.name == "theory"] == ["theory"]  # only the panel that asked for it
    assert sum(1 for t in fig.data if t.fill == "toself") == 2  # the band, per variant, in panel A only
    assert fig.layout.yaxis.type != "log" and fig.layout.yaxis2.type == "log"
    assert _axis_titles(fig, "yaxis") == {"yaxis": "a (units)", "yaxis2": "b (log scale)"}
    assert set(_axis_titles(fig, "xaxis").values()) == {"d_k (log scale)"}


def test_variants_figure_draws_each_variants_logits_and_rows():
    rng = np.random.default_rng(0)
    panels = {name: {"scores": rng.normal(size=(20, 8)) * scale, "pattern": rng.dirichlet(np.ones(8), size=20),
                     "predicted_var": scale**2, "title": name}
              for name, scale in (("scaled", 1.0), ("unscaled", 4.0))}
    fig = figs.variants_figure(panels, rows_shown=12)
    hists = [t for t in fig.data if (t.name or "").endswith("sampled logits")]
    hovers = [t for t in fig.data if t.customdata is not None and t.mode == "lines" and t.line.width == 0]
    assert len(hists) == 2 and len(hovers) == 2 and len(fig.layout.images) == 2
    for hist, hover, image, panel in zip(hists, hovers, fig.layout.images, panels.values()):
        # each step of the line: the logits in its bin (counted here), over all logits and the bin's width; the
        # line holds each value to the next edge, and its last point closes the last bin
        assert hist.line.shape == "hv" and hist.fill == "tozeroy"
        x = panel["scores"].ravel()
        lo, hi = np.asarray(hist.customdata).T[:, :-1]
        counts = [np.sum((x >= a) & ((x < b) | ((b == hi[-1]) & (x == b)))) for a, b in zip(lo, hi)]
        assert len(counts) == figs.LOGIT_BINS and sum(counts) == x.size and lo[0] == x.min() and hi[-1] == x.max()
        np.testing.assert_allclose(hist.y[:-1], np.array(counts) / (x.size * (hi - lo)))
        assert hist.y[-1] == hist.y[-2] and hist.x[-1] == hi[-1]
        np.testing.assert_allclose(hist.x[:-1], lo)
        np.testing.assert_allclose(hist.x[1:], hi)
        assert np.sum(hist.y[:-1] * np.diff(hist.x)) == pytest.approx(1.0)  # a density: area 1
        rows = panel["pattern"][:12]
        np.testing.assert_array_equal(hover.customdata, rows.ravel())  # the hover: every weight as computed
        np.testing.assert_allclose(cell_colours(image.to_plotly_json(), rows.shape),
                                   expected_colours(rows, ATTENTION_SCALE, 0.0, 1.0), atol=QUANTUM)
        assert (image.xref, image.yref) == (hover.xaxis, hover.yaxis)
    bars = [t for t in fig.data if t.marker.showscale]
    assert len(bars) == 1 and (bars[0].marker.cmin, bars[0].marker.cmax) == (0.0, 1.0)  # one scale, one bar
    densities = [t for t in fig.data if "normal" in (t.name or "")]
    assert len(densities) == 2
    for curve, panel in zip(densities, panels.values()):  # the normal density of the predicted variance
        sd = np.sqrt(panel["predicted_var"])
        x = np.asarray(curve.x)
        np.testing.assert_allclose(curve.y, np.exp(-0.5 * (x / sd) ** 2) / (sd * np.sqrt(2 * np.pi)))


def test_row_distributions_keep_every_row_and_floor_only_the_drawing_on_log_axes():
    values = np.array([0.5, 1e-30, 0.1])
    fig = figs.row_distributions([
        {"values": {"scaled": values}, "title": "lin", "y_title": "v"},
        {"values": {"scaled": values}, "title": "log", "y_title": "v (log scale)", "log_y": True},
    ])
    lin, log = fig.data
    np.testing.assert_array_equal(lin.y, values)
    np.testing.assert_array_equal(log.y, np.maximum(values, figs.NORM_FLOOR))
    np.testing.assert_array_equal(log.customdata, values)  # the hover gives the true value
    assert (lin.yaxis, log.yaxis) == ("y", "y2") and fig.layout.yaxis2.type == "log"


def test_prefetch_builds_one_step_either_way_of_the_slider_just_moved(monkeypatch):
    from attnviz.ui import softmax as ui_softmax

    built = []

    monkeypatch.setattr(ui_softmax, "build_in_background",  # runs the thread's work at once
                        lambda cached, calls, name: [cached(*call) for call in calls])
    monkeypatch.setattr(ui_softmax, "tab_figure", lambda *a: built.append(a))
    temps = [0.5, 1.0, 2.0]
    base = {"d_k": 64, "n_keys": 33, "seed": 0, "temperature": 1.0}
    ui_softmax.prefetch_next(base, {**base, "n_keys": 32}, temps, 12, "rows")  # moved up: the next one up first
    assert built == [("rows", 64, 34, 0, 1.0, 12), ("rows", 64, 32, 0, 1.0, 12)]
    built.clear()
    ui_softmax.prefetch_next(base, base, temps, 12, "rows")  # nothing moved: nothing built
    ui_softmax.prefetch_next(base, None, temps, 12, "rows")  # first run
    assert built == []
    top = {**base, "n_keys": 512}
    ui_softmax.prefetch_next(top, {**top, "n_keys": 511}, temps, 12, "rows")  # at the slider's end: one side only
    assert built == [("rows", 64, 511, 0, 1.0, 12)]
    built.clear()
    dims = list(ui_softmax.DIMS)
    i = dims.index(64)
    ui_softmax.prefetch_next(base, {**base, "d_k": dims[i - 1]}, temps, 12, "rows")
    assert built == [("rows", dims[i + 1], 33, 0, 1.0, 12), ("rows", dims[i - 1], 33, 0, 1.0, 12)]
    built.clear()
    ui_softmax.prefetch_next(base, {**base, "temperature": 2.0}, temps, 12, "rows")  # moved down: the next down first
    assert built == [("rows", 64, 33, 0, 0.5, 12), ("rows", 64, 33, 0, 2.0, 12)]
    built.clear()
    ui_softmax.prefetch_next(base, {**base, "seed": 1}, temps, 12, "rows")  # the seed's - button: no lower neighbour
    assert built == [("rows", 64, 33, 1, 1.0, 12)]
    built.clear()
    ui_softmax.prefetch_next({**base, "seed": 7}, base, temps, 12, "rows")  # a seed typed in
    assert built == [("rows", 64, 33, 8, 1.0, 12), ("rows", 64, 33, 6, 1.0, 12)]


def test_a_tab_figure_builds_its_own_tab_only(monkeypatch):
    """The open tab's figure is built without the others: the logits tab never computes the sweeps against d_k
    (0.3 s on 2 cores), and each tab gets the figure it draws."""
    from attnviz.ui import softmax as ui_softmax

    def no_sweeps(*args):
        raise AssertionError("the sweeps were computed for another tab")

    monkeypatch.setattr(ui_softmax, "_sweeps", no_sweeps)
    build = ui_softmax.tab_figure.__wrapped__
    fig, dims = build("logits", 64, 16, 3, 1.0, 12)
    assert 64 in dims and len(fig.layout.sliders[0].steps) == len(dims)
    variants, grads = ui_softmax.sample(64, 16, 3, 1.0)
    rows = build("rows", 64, 16, 3, 1.0, 12)
    np.testing.assert_array_equal(rows.data[0].y, variants[sm.SCALED][2].max_weight)
    gradients = build("gradients", 64, 16, 3, 1.0, 12)
    np.testing.assert_array_equal(gradients.data[0].customdata, grads[sm.SCALED])
    monkeypatch.undo()
    assert build("sweeps", 64, 16, 3, 1.0, 12) is ui_softmax.sweeps_chart(16, 3, 1.0)


def test_head_patterns_draw_each_softmax_of_a_head_on_one_scale():
    rng = np.random.default_rng(1)
    maps = {f"map {i}": rng.dirichlet(np.ones(5), size=5) for i in range(3)}
    tokens = ["a", "b", "a", "c", "d"]  # a repeated token keeps its own column
    fig = figs.head_patterns(maps, tokens)
    assert [t.name for t in fig.data] == list(maps)
    for trace, p in zip(fig.data, maps.values()):
        np.testing.assert_array_equal(trace.z, p)
        assert (trace.zmin, trace.zmax) == (0.0, 1.0)
        assert len(set(trace.x)) == 5
    assert [t.showscale for t in fig.data] == [False, False, True]
    assert [t.xaxis for t in fig.data] == ["x", "x2", "x3"]


def _traces_on(state: dict, kind: str) -> list[dict]:
    return [t for t in state["data"] if t["type"] == kind]


def test_the_variants_charts_d_k_slider_draws_the_librarys_logits_and_rows_at_every_stop():
    """Each stop of the in-chart d_k slider, replayed as plotly.js applies its frame, draws softmax.scores_and_pattern
    of that d_k's random q and k: the first rows exactly, the logits binned, the predicted normal density."""
    from attnviz import softmax as sm
    from attnviz.figures import instant
    from attnviz.ui import softmax as ui_softmax

    n_keys, seed, temperature, rows = 32, 0, 2.0, 12
    fig, dims = ui_softmax.variants_chart(64, n_keys, seed, temperature, rows)
    assert dims == ui_softmax.DIMS  # at 32 keys per query every value of the d_k control fits
    assert instant.json_bytes(fig) < 1_000_000
    for i, d_k in enumerate(dims):
        state = instant.drawn(fig, [(0, i)])
        q, k = sm.random_qk(ui_softmax.N_QUERIES, n_keys, d_k, seed)
        lines = _traces_on(state, "scatter")
        bars = [c for c in lines if c.get("name", "").endswith("sampled logits")]
        curves = [c for c in lines if "normal" in c.get("name", "")]
        hovers = [c for c in lines if "customdata" in c and c.get("line", {}).get("width") == 0]
        for scaled, bar, hover, image, curve in zip((True, False), bars, hovers, state["layout"]["images"], curves):
            scores, pattern = sm.scores_and_pattern(q, k, scaled=scaled, temperature=temperature)
            # to the last bits only: OpenBLAS may sum a product in another order for other memory alignments
            np.testing.assert_allclose(instant.array(hover["customdata"]), pattern[:rows].ravel(), rtol=1e-12, atol=0)
            np.testing.assert_allclose(cell_colours(image, (rows, n_keys)),
                                       expected_colours(pattern[:rows], ATTENTION_SCALE, 0.0, 1.0), atol=QUANTUM)
            density, edges = np.histogram(scores.ravel(), bins=figs.LOGIT_BINS, density=True)
            np.testing.assert_allclose(instant.array(bar["y"]), np.append(density, density[-1]), rtol=1e-12, atol=0)
            np.testing.assert_allclose(instant.array(bar["x"]), edges, rtol=1e-12, atol=1e-15)
            sd = np.sqrt((1.0 if scaled else d_k) / temperature**2)
            x = instant.array(curve["x"])
            np.testing.assert_allclose(instant.array(curve["y"]),
                                       np.exp(-0.5 * (x / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), rtol=1e-12)
        assert state["layout"]["sliders"][0]["steps"][i]["label"] == str(d_k)
    # drawn in place: the steps animate frames that change line traces and the maps' pictures only
    assert {s.method for s in fig.layout.sliders[0].steps} == {"animate"}


def test_the_variants_chart_thins_its_d_k_stops_to_stay_small_at_512_keys():
    from attnviz.figures import instant
    from attnviz.ui import softmax as ui_softmax

    fig, dims = ui_softmax.variants_chart(64, 512, 0, 1.0, 12)
    assert instant.json_bytes(fig) < 2_000_000
    assert {1, 64, 1024} <= set(dims) and len(dims) < len(ui_softmax.DIMS)
    assert [s.label for s in fig.layout.sliders[0].steps] == [str(d) for d in dims]


def test_the_sweeps_charts_temperature_slider_draws_the_librarys_sweep_at_every_temperature():
    """Each stop of the in-chart T slider draws softmax.saturation_sweep at that temperature in every panel, and the
    theory lines d_k / T² and 1 / T², which the variance drawn follows at every T (the same ratio at every stop;
    the variance was of the logits before T while its lines divided by T²)."""
    from attnviz import softmax as sm
    from attnviz.figures import instant
    from attnviz.ui import softmax as ui_softmax

    n_keys, seed = 16, 3
    fig = ui_softmax.sweeps_chart(n_keys, seed, 1.0)
    assert [s.label for s in fig.layout.sliders[0].steps] == [instant.stop_label(t) for t in ui_softmax.TEMPERATURES]
    columns = ["logit_var", "max_weight", "entropy", "saturated_share", "jac_p50", "grad_q_p50"]
    logged = {"logit_var", "jac_p50", "grad_q_p50"}
    dims, ratios = np.array(ui_softmax.DIMS, dtype=float), {}
    for i, temperature in enumerate(ui_softmax.TEMPERATURES):
        state = instant.drawn(fig, [(0, i)])
        table = sm.saturation_sweep(ui_softmax.DIMS, n_queries=ui_softmax.N_QUERIES, n_keys=n_keys, seed=seed,
                                    temperature=temperature)
        lines = {(t["name"], t["xaxis"]): t for t in state["data"] if t.get("mode") == "lines+markers"}
        for panel, column in enumerate(columns):
            axis = "x" if panel == 0 else f"x{panel + 1}"
            for variant in ("scaled", "unscaled"):
                want = table[table.variant == variant].sort_values("d_k")[column].to_numpy(float)
                want = np.maximum(want, figs.NORM_FLOOR) if column in logged else want
                np.testing.assert_allclose(instant.array(lines[(variant, axis)]["y"]), want, rtol=1e-12, atol=0)
        theory = {t["name"]: instant.array(t["y"]) for t in state["data"] if t["name"].startswith("theory")}
        np.testing.assert_allclose(theory["theory: d_k / T²"], dims / temperature**2, rtol=1e-12)
        np.testing.assert_allclose(theory["theory: 1 / T²"], np.full(len(dims), 1 / temperature**2), rtol=1e-12)
        for variant, line in (("scaled", "theory: 1 / T²"), ("unscaled", "theory: d_k / T²")):
            # the variance drawn and its theory line move together with T: their ratio is T's own at every stop
            ratio = instant.array(lines[(variant, "x")]["y"]) / theory[line]
            ratios.setdefault(variant, ratio) if i == 0 else np.testing.assert_allclose(ratio, ratios[variant],
                                                                                        rtol=1e-9)
    assert instant.json_bytes(fig) < 500_000


def test_the_library_variants_chart_refuses_a_d_k_off_its_slider_and_matches_the_pages_cache():
    """attnviz.softmax_charts.variants_chart, which the page's Reproduce in Python code calls: a d_k that is not one
    of its slider's values is refused with the values; built afresh it equals the page's cached chart."""
    import json

    import plotly.io as pio

    from attnviz import softmax_charts
    from attnviz.ui import softmax as ui_softmax

    with pytest.raises(ValueError, match="d_k = 5 is not one of"):
        softmax_charts.variants_chart(5, 16, 0, 1.0)
    fresh, dims = softmax_charts.variants_chart(8, 16, 1, 0.5)
    cached, cached_dims = ui_softmax.variants_chart(8, 16, 1, 0.5, softmax_charts.ROWS_SHOWN)
    assert dims == cached_dims and json.loads(pio.to_json(fresh)) == json.loads(pio.to_json(cached))
