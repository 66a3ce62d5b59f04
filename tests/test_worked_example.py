"""attnviz.worked_example against an independent float64 computation written out with Python floats and math.exp,
and its parser against good and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.worked_example import EXAMPLES, check_shapes, parse_matrix, worked_steps


def _reference(q, k, v, scaled, causal):
    """Attention with plain Python loops over float64 scalars: (scores, pattern, output) as nested lists."""
    n_q, n_k, d_k, d_v = len(q), len(k), len(q[0]), len(v[0])
    scale = 1 / math.sqrt(d_k) if scaled else 1.0
    scores = [[sum(q[i][c] * k[j][c] for c in range(d_k)) for j in range(n_k)] for i in range(n_q)]
    pattern = []
    for i in range(n_q):
        allowed = [j for j in range(n_k) if not causal or j <= i + (n_k - n_q)]
        top = max(scores[i][j] * scale for j in allowed) if allowed else 0.0
        e = [math.exp(scores[i][j] * scale - top) if j in allowed else 0.0 for j in range(n_k)]
        total = sum(e)
        pattern.append([x / total if total else 0.0 for x in e])
    output = [[sum(pattern[i][j] * v[j][c] for j in range(n_k)) for c in range(d_v)] for i in range(n_q)]
    return np.array(scores), np.array(pattern), np.array(output)


@pytest.mark.parametrize("example", list(EXAMPLES))
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_every_step_matches_an_independent_float64_computation(example, scaled, causal):
    q, k, v = (parse_matrix(t) for t in EXAMPLES[example])
    steps = worked_steps(q, k, v, scaled=scaled, causal=causal)
    scores, pattern, output = _reference(q.tolist(), k.tolist(), v.tolist(), scaled, causal)
    np.testing.assert_allclose(steps.scores, scores, rtol=1e-14)
    np.testing.assert_allclose(steps.pattern, pattern, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(steps.output, output, rtol=1e-12, atol=1e-12)
    # The spelled-out softmax (exp / row_sum) agrees with the pattern attnviz.attention returns.
    np.testing.assert_allclose(steps.exp / steps.row_sum[:, None], steps.pattern, rtol=1e-12, atol=1e-15)
    assert steps.scale == (1 / math.sqrt(q.shape[1]) if scaled else 1.0)


def test_two_by_two_walkthrough_by_hand():
    # Q K^T by hand: [1*2 + 2*0, 1*1 + 2*1; 0*2 - 1*0, 0*1 - 1*1] = [2, 3; 0, -1]. Row 1 scaled by 1/sqrt(2):
    # weights 1/(1 + e^{1/sqrt 2}) and e^{1/sqrt 2}/(1 + e^{1/sqrt 2}) (a 2-way softmax is a logistic of the gap).
    steps = worked_steps(*(parse_matrix(t) for t in EXAMPLES["2 × 2"]))
    np.testing.assert_array_equal(steps.scores, [[2.0, 3.0], [0.0, -1.0]])
    gap = 1 / math.sqrt(2)
    first = 1 / (1 + math.exp(gap))
    np.testing.assert_allclose(steps.pattern[0], [first, 1 - first], rtol=1e-13)
    np.testing.assert_allclose(steps.pattern[1], [1 - first, first], rtol=1e-13)
    np.testing.assert_allclose(steps.output[0], [10 * first + 30 * (1 - first), 20 * first + 40 * (1 - first)])


def test_causal_mask_hides_later_keys():
    q, k, v = (parse_matrix(t) for t in EXAMPLES["3 × 3"])
    steps = worked_steps(q, k, v, causal=True)
    assert steps.pattern[0, 0] == 1.0 and np.all(np.triu(steps.pattern, 1) == 0)
    np.testing.assert_array_equal(steps.output[0], v[0])


@pytest.mark.parametrize("text,expected", [
    ("1, 2\n3, 4", [[1, 2], [3, 4]]),
    ("1 2; 3 4", [[1, 2], [3, 4]]),
    ("[1.5, -2e-1]\n[.5, +3]\n", [[1.5, -0.2], [0.5, 3.0]]),
])
def test_parse_matrix_reads_rows_and_numbers(text, expected):
    np.testing.assert_array_equal(parse_matrix(text), expected)


@pytest.mark.parametrize("text", ["", "  \n ", "1, 2\n3", "1, x", "__import__('os')", "nan, 1", "1, inf",
                                  "1e400, 1", "\n".join(["1"] * 9)])
def test_parse_matrix_refuses_bad_input_with_a_message(text):
    with pytest.raises(ValueError, match=r"\w"):
        parse_matrix(text, "Q")


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="columns"):
        check_shapes(np.ones((2, 3)), np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="rows"):
        worked_steps(np.ones((2, 2)), np.ones((3, 2)), np.ones((2, 2)))


@pytest.mark.parametrize("a,b,text", [
    (-1.0, -2.0, "-1-(-2)"),  # not "-1--2"
    (0.5, 0.25, "0.500-0.250"),
    (1.0, 0.0, "1-0"),
    (-3.0, 2.0, "-3-2"),
    (0.0, -0.0001, "0-(-0.000)"),  # rounds to -0.000: still a minus sign to bracket
])
def test_difference_brackets_a_negative_subtrahend(a, b, text):
    from attnviz.worked_example import difference

    assert difference(a, b, 3) == text


def test_page_softmax_exponents_never_show_a_double_minus():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.ui import PAGES

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=120)
    at.run()
    at.switch_page(next(p.script for p in PAGES if p.url_path == "worked-example")).run()
    # every score negative: each row's max is negative, so each exponent subtracts a negative number
    at.text_area(key="worked_q").set_value("-1, 0\n0, -1").run()
    at.text_area(key="worked_k").set_value("1, 0\n2, 1").run()
    assert not at.exception, at.exception
    latex = " ".join(x.value for x in at.latex)
    assert "e^{" in latex and "--" not in latex.replace(r"-\infty", "")
    assert "-(-" in latex


@pytest.mark.parametrize("n_q", [1, 2, 3, 8])
def test_colour_bars_lie_under_their_own_map_clear_of_the_other(n_q):
    """Issue 14: the scores' colour bar stood in the gap between the two maps and ran over the next map's title in
    a narrow window. Each bar now lies flat under its own map: horizontal, below the plot area (past the axis
    title), centred on its map's x domain and no wider than it, and inside the figure's bottom margin."""
    from attnviz.figures.worked import scores_and_pattern_figure

    rng = np.random.default_rng(n_q)
    scores = rng.standard_normal((n_q, 4))
    pattern = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    fig = scores_and_pattern_figure(scores, pattern, scale_text="× 0.5")
    layout = fig.layout
    plot_px = layout.height - layout.margin.t - layout.margin.b
    for trace, axis in zip(fig.data, (layout.xaxis, layout.xaxis2)):
        bar = trace.colorbar
        lo, hi = axis.domain
        assert bar.orientation == "h" and bar.lenmode == "fraction"
        assert bar.xanchor == "center" and bar.x == pytest.approx((lo + hi) / 2)
        assert bar.len <= hi - lo + 1e-12
        assert bar.yanchor == "top" and -bar.y * plot_px >= 75  # below the tick labels and the axis title
        bottom_px = -bar.y * plot_px + bar.thickness + 30  # the bar and its tick labels
        assert bottom_px <= layout.margin.b
    assert fig.data[0].colorbar.x + fig.data[0].colorbar.len / 2 < layout.xaxis2.domain[0]


def test_the_pages_lines_write_out_the_2_by_2_example_by_hand():
    # Q = [1, 2; 0, -1], K = [2, 0; 1, 1], V = [10, 20; 30, 40] (the "2 × 2" example), unscaled so every number is
    # short: S = [2, 3; 0, -1]; row 1: e^{2-3} = 0.368, e^{3-3} = 1, sum 1.368, p = [0.269, 0.731];
    # o_1 = 0.269 [10, 20] + 0.731 [30, 40] = [24.621, 34.621]
    from attnviz.worked_example import dot_product_lines, output_lines, softmax_lines

    steps = worked_steps(*(parse_matrix(t) for t in EXAMPLES["2 × 2"]), scaled=False)
    assert dot_product_lines(steps) == [
        r"S_{11} = q_1\cdot k_1 = (1)(2) + (2)(0) = 2", r"S_{12} = q_1\cdot k_2 = (1)(1) + (2)(1) = 3",
        r"S_{21} = q_2\cdot k_1 = (0)(2) + (-1)(0) = 0", r"S_{22} = q_2\cdot k_2 = (0)(1) + (-1)(1) = -1"]
    first = softmax_lines(steps)[0]
    assert r"e^{2-3}=0.368" in first and r"e^{3-3}=1" in first and r"\Sigma=1.368" in first
    assert r"p_1 = \begin{bmatrix}0.269 & 0.731\end{bmatrix}" in first
    assert output_lines(steps)[0] == (r"o_1 = 0.269\,\begin{bmatrix}10 & 20\end{bmatrix} + "
                                      r"0.731\,\begin{bmatrix}30 & 40\end{bmatrix} = "
                                      r"\begin{bmatrix}24.621 & 34.621\end{bmatrix}")


def test_a_masked_key_is_left_out_of_the_output_line():
    from attnviz.worked_example import output_lines, softmax_lines

    steps = worked_steps(*(parse_matrix(t) for t in EXAMPLES["2 × 2"]), scaled=False, causal=True)
    assert r"e^{-\infty}=0" in softmax_lines(steps)[0]
    assert output_lines(steps)[0] == (r"o_1 = 1\,\begin{bmatrix}10 & 20\end{bmatrix} = "
                                      r"\begin{bmatrix}10 & 20\end{bmatrix}")
