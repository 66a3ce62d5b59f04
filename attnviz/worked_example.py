"""Scaled dot-product attention on a small example, step by step, with every intermediate number.

Q K^T, the scaled and the masked scores come from attnviz.attention.attention_scores, the pattern and the output
from scaled_dot_product_attention; only the exponentials and sums of each softmax row between them are spelled
out here, so a page can show them. Shapes: q [n_query, d_k], k [n_key, d_k], v [n_key, d_v].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from attnviz.attention import attention_scores, causal_mask, scaled_dot_product_attention
from attnviz.errors import AttnvizError

MAX_SIZE = 8  # rows and columns a hand-typed matrix may have: every number is shown on the page

# Q, K, V as text, one row per line: small enough to check every number by hand.
EXAMPLES: dict[str, tuple[str, str, str]] = {
    "2 × 2": ("1, 2\n0, -1", "2, 0\n1, 1", "10, 20\n30, 40"),
    "3 × 3": ("1, 0, 1\n0, 2, 0\n1, 1, 0", "1, 1, 0\n0, 1, 1\n1, 0, 1", "1, 0, 0\n0, 1, 0\n0, 0, 1"),
    "3 tokens, d_k = 2": ("1, 0\n0, 1\n1, 1", "1, 0\n0, 1\n1, 1", "1, 0\n0, 1\n1, 1"),
}

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class MatrixError(AttnvizError, ValueError):
    """A typed matrix that cannot be used (empty, not numbers, ragged, too big, shapes that do not fit); the message
    says which and where."""


def parse_matrix(text: str, name: str = "matrix") -> np.ndarray:
    """A matrix typed as rows on lines (or separated by ';'), numbers separated by commas or spaces.

    Only plain decimal numbers are accepted (no expressions, nan or inf). Returns float64 [rows, cols].
    Raises ValueError with a message a user can act on.
    """
    rows = [r.strip().strip("[]").strip() for r in re.split(r"[;\n]", text or "")]
    rows = [r for r in rows if r]
    if not rows:
        raise MatrixError(f"{name} is empty: type one row per line, numbers separated by commas.")
    values = []
    for i, row in enumerate(rows, start=1):
        cells = [c for c in re.split(r"[,\s]+", row.strip().strip("[]")) if c]
        for c in cells:
            if not _NUMBER.match(c):
                raise MatrixError(f"{name}, row {i}: {c[:20]!r} is not a number.")
        values.append([float(c) for c in cells])
    widths = {len(r) for r in values}
    if len(widths) != 1:
        raise MatrixError(f"{name}: every row needs the same number of values (rows have {sorted(widths)}).")
    matrix = np.array(values, dtype=np.float64)
    if matrix.shape[0] > MAX_SIZE or matrix.shape[1] > MAX_SIZE:
        raise MatrixError(f"{name} is {matrix.shape[0]} × {matrix.shape[1]}: keep it within {MAX_SIZE} × {MAX_SIZE}"
                         " so every number fits on the page.")
    if not np.all(np.isfinite(matrix)) or np.abs(matrix).max() > 1e6:
        raise MatrixError(f"{name}: keep the values between -1e6 and 1e6.")
    return matrix


def check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Raises ValueError unless q [n_query, d_k], k [n_key, d_k], v [n_key, d_v] fit together."""
    if q.shape[1] != k.shape[1]:
        raise MatrixError(f"Q has {q.shape[1]} columns and K has {k.shape[1]}: queries and keys need the same "
                         "length d_k to take dot products.")
    if k.shape[0] != v.shape[0]:
        raise MatrixError(f"K has {k.shape[0]} rows and V has {v.shape[0]}: every key needs exactly one value.")


@dataclass(frozen=True)
class WorkedSteps:
    """Every intermediate of softmax(Q K^T * scale, masked) V, float64.

    scores [n_query, n_key] = Q K^T; scaled = scores * scale; masked: scaled with -inf where the mask forbids;
    row_max [n_query]; exp [n_query, n_key] = exp(masked - row_max); row_sum [n_query];
    pattern [n_query, n_key] = exp / row_sum (from attnviz.attention); output [n_query, d_v] (from attnviz.attention).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    mask: np.ndarray | None
    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray
    row_max: np.ndarray
    exp: np.ndarray
    row_sum: np.ndarray
    pattern: np.ndarray
    output: np.ndarray


def worked_steps(q, k, v, *, scaled: bool = True, causal: bool = False) -> WorkedSteps:
    """All steps of attention on small q [n_query, d_k], k [n_key, d_k], v [n_key, d_v].

    scaled=False uses scale 1 (no division by sqrt(d_k)); causal=True lets query i see keys j <= i
    (queries aligned to the last keys, as attnviz.attention.causal_mask).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    check_shapes(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[1]) if scaled else 1.0
    mask = causal_mask(q.shape[0], k.shape[0]) if causal else None
    output, pattern = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)

    scores = attention_scores(q, k, scale=1.0)  # [n_query, n_key], Q K^T
    scaled_scores = attention_scores(q, k, scale=scale)
    masked = attention_scores(q, k, mask=mask, scale=scale)
    row_max = masked.max(axis=1)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # a fully masked row keeps zero weights
    exp = np.exp(masked - row_max[:, None])
    return WorkedSteps(q=q, k=k, v=v, scale=scale, mask=mask, scores=scores, scaled=scaled_scores, masked=masked,
                       row_max=row_max, exp=exp, row_sum=exp.sum(axis=1), pattern=pattern, output=output)


def fmt(x: float, digits: int = 3) -> str:
    """A number as the page writes it: whole numbers plainly, others with `digits` decimals, -inf as −∞."""
    if np.isneginf(x):
        return r"-\infty"
    if float(x).is_integer() and abs(x) < 1e9:
        return str(int(x))
    return f"{x:.{digits}f}"


def difference(a: float, b: float, digits: int = 3) -> str:
    """a − b as the page writes it (LaTeX), a negative b in parentheses: 1 − (−2), never 1--2."""
    right = fmt(b, digits)
    return f"{fmt(a, digits)}-" + (f"({right})" if right.startswith("-") else right)


def latex_matrix(a: np.ndarray, digits: int = 3) -> str:
    """A 2-D array as a LaTeX bmatrix."""
    rows = [" & ".join(fmt(x, digits) for x in row) for row in np.atleast_2d(a)]
    return r"\begin{bmatrix}" + r" \\ ".join(rows) + r"\end{bmatrix}"


def dot_product_lines(steps: WorkedSteps, digits: int = 3) -> list[str]:
    """LaTeX, one line per (query, key): S_ij = q_i · k_j written out term by term, and its value."""
    lines = []
    for i, j in np.ndindex(steps.scores.shape):
        terms = " + ".join(f"({fmt(a, digits)})({fmt(b, digits)})" for a, b in zip(steps.q[i], steps.k[j]))
        lines.append(rf"S_{{{i + 1}{j + 1}}} = q_{i + 1}\cdot k_{j + 1} = {terms} = {fmt(steps.scores[i, j], digits)}")
    return lines


def softmax_lines(steps: WorkedSteps, digits: int = 3) -> list[str]:
    """LaTeX, one block per query: each exponent (score minus the row's max); under it the row's sum and the
    weights."""
    lines = []
    for i, row in enumerate(steps.masked):
        exps = ", ".join(r"e^{-\infty}=0" if math.isinf(s) else
                         rf"e^{{{difference(s, steps.row_max[i], digits)}}}={fmt(e, digits)}"
                         for s, e in zip(row, steps.exp[i]))
        # two lines, so a row of eight keys fits a narrow window: the exponents, then the sum and the weights
        lines.append(rf"\begin{{gathered}}\text{{row }}{i + 1}:\ {exps};\\ \Sigma={fmt(steps.row_sum[i], digits)};\ \ "
                     rf"p_{i + 1} = {latex_matrix(steps.pattern[i][None], digits)}\end{{gathered}}")
    return lines


def output_lines(steps: WorkedSteps, digits: int = 3) -> list[str]:
    """LaTeX, one line per query: o_i as the weighted sum of the value rows it does not give weight 0."""
    lines = []
    for i, weights in enumerate(steps.pattern):
        terms = " + ".join(rf"{fmt(p, digits)}\,{latex_matrix(steps.v[j][None], digits)}"
                           for j, p in enumerate(weights) if p != 0)
        lines.append(rf"o_{i + 1} = {terms or '0'} = {latex_matrix(steps.output[i][None], digits)}")
    return lines
