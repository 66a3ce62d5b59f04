"""Positional encodings: sinusoidal (Vaswani et al. 2017), RoPE (Su et al., RoFormer) and ALiBi (Press et al. 2022).

Everything here is plain maths in float64 numpy, except apply_rope, which keeps the type of its input (numpy in ->
numpy out, torch in -> torch out). Shapes are written [..., n, d]; distances are query position minus key position,
so a causal model only looks at distances >= 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnviz.attention import masked_softmax

SCALINGS = ("none", "linear", "ntk")


# ---------------------------------------------------------------- sinusoidal


def _check_even(d: int, what: str) -> int:
    d = int(d)
    if d < 2 or d % 2:
        raise ValueError(f"{what} must be an even number >= 2, got {d}")
    return d


def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> np.ndarray:
    """omega_i = base^(-2i/d_model), i = 0 .. d_model/2 - 1. Returns [d_model // 2] (radians per position)."""
    d_model = _check_even(d_model, "d_model")
    return float(base) ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)


def sinusoidal_encoding(n_positions: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al. 2017 §3.5: PE[p, 2i] = sin(p omega_i), PE[p, 2i+1] = cos(p omega_i).

    Returns [n_positions, d_model], float64.
    """
    angles = np.arange(int(n_positions), dtype=np.float64)[:, None] * sinusoidal_frequencies(d_model, base)
    pe = np.empty((int(n_positions), int(d_model)), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def sinusoidal_shift_matrix(k: float, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The fixed linear map M_k with PE_(p+k) = M_k PE_p for every p (Vaswani et al. 2017 §3.5).

    Per (sin, cos) pair: sin((p+k)w) = cos(kw) sin(pw) + sin(kw) cos(pw) and
    cos((p+k)w) = -sin(kw) sin(pw) + cos(kw) cos(pw), so M_k is block diagonal with 2x2 rotations
    [[cos kw, sin kw], [-sin kw, cos kw]]. It depends on k only. Returns [d_model, d_model].
    """
    w = sinusoidal_frequencies(d_model, base) * float(k)
    m = np.zeros((d_model, d_model), dtype=np.float64)
    i = np.arange(0, d_model, 2)
    m[i, i] = np.cos(w)
    m[i, i + 1] = np.sin(w)
    m[i + 1, i] = -np.sin(w)
    m[i + 1, i + 1] = np.cos(w)
    return m


def sinusoidal_dot(offsets, d_model: int, base: float = 10000.0) -> np.ndarray:
    """PE_p . PE_(p+k) = sum_i cos(k omega_i): the same for every p, even in k. Returns [len(offsets)]."""
    k = np.asarray(offsets, dtype=np.float64).reshape(-1)
    return np.cos(k[:, None] * sinusoidal_frequencies(d_model, base)).sum(axis=-1)


# ---------------------------------------------------------------- RoPE


def rope_frequencies(d_head: int, base: float = 10000.0) -> np.ndarray:
    """RoFormer eq. 15: theta_i = base^(-2i/d_head), i = 0 .. d_head/2 - 1. Returns [d_head // 2], float64."""
    d_head = _check_even(d_head, "d_head")
    return float(base) ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)


def scaled_rope_frequencies(d_head: int, base: float = 10000.0, *, scaling: str = "none",
                            factor: float = 1.0) -> np.ndarray:
    """RoPE frequencies stretched to a context `factor` times the trained one. Returns [d_head // 2].

    "linear": position interpolation (Chen et al. 2023), theta_i / factor, i.e. positions divided by factor.
    "ntk": NTK-aware scaling (bloc97, 2023), base' = base * factor^(d/(d-2)); the highest frequency (theta_0 = 1)
    is kept and the lowest is divided by exactly `factor`, the ones between by less.
    "none": rope_frequencies(d_head, base).
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    factor = float(factor)
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    if scaling == "linear":
        return rope_frequencies(d_head, base) / factor
    if scaling == "ntk":
        d_head = _check_even(d_head, "d_head")
        exponent = d_head / (d_head - 2) if d_head > 2 else 1.0
        return rope_frequencies(d_head, float(base) * factor ** exponent)
    return rope_frequencies(d_head, base)


def interleaved_to_half_permutation(d_head: int) -> np.ndarray:
    """Index p with x_half = x_interleaved[..., p]: [0, 2, 4, ..., d-2, 1, 3, ..., d-1]. Returns [d_head].

    The paper rotates adjacent pairs (x_2i, x_2i+1); transformers' rotate_half rotates (x_i, x_(i + d/2)).
    Reordering the features of q and k by p (what transformers' GGUF loader does to the rows of llama.cpp's W_q and
    W_k, head by head) turns one convention into the other: apply_rope(x[..., p]) == apply_rope(x,
    interleaved=True)[..., p]. The inverse permutation is np.argsort(p).
    """
    d_head = _check_even(d_head, "d_head")
    return np.concatenate([np.arange(0, d_head, 2), np.arange(1, d_head, 2)])


def rope_rotation_matrix(position: float, d_head: int, base: float = 10000.0, *, interleaved: bool = False,
                         frequencies=None) -> np.ndarray:
    """R_m of RoFormer eq. 15, the orthogonal matrix with apply_rope(x) = x R_m^T at position m. Returns [d, d].

    interleaved=True pairs features (2i, 2i+1) as in the paper; False pairs (i, i + d/2) as rotate_half does.
    """
    theta = rope_frequencies(d_head, base) if frequencies is None else np.asarray(frequencies, dtype=np.float64)
    half = len(theta)
    first, second = (np.arange(0, 2 * half, 2), np.arange(1, 2 * half, 2)) if interleaved else \
        (np.arange(half), np.arange(half, 2 * half))
    angle = float(position) * theta
    r = np.zeros((2 * half, 2 * half), dtype=np.float64)
    r[first, first] = np.cos(angle)
    r[first, second] = -np.sin(angle)
    r[second, first] = np.sin(angle)
    r[second, second] = np.cos(angle)
    return r


def apply_rope(x, positions=None, base: float = 10000.0, interleaved: bool = False, *, scaling: str = "none",
               factor: float = 1.0):
    """Rotates every feature pair of x by position * theta_i (RoFormer eq. 34; transformers' apply_rotary_pos_emb).

    x: [..., n, d_head]; positions: [n] or anything broadcastable to [..., n] (default 0 .. n-1; may be negative
    or fractional). interleaved=False is transformers' rotate_half layout, pairs (i, i + d/2):
    x * cos + rotate_half(x) * sin. interleaved=True is the paper's layout, pairs (2i, 2i+1).
    The angles are computed in float64 and the result has x's dtype. Numpy in -> numpy out; torch in -> torch out.
    """
    as_numpy = not isinstance(x, torch.Tensor)
    t = torch.tensor(np.asarray(x)) if as_numpy else x  # a copy: x may be a read-only view
    if t.dim() < 2:
        raise ValueError(f"x must be [..., n, d_head], got shape {tuple(t.shape)}")
    n, d = t.shape[-2], t.shape[-1]
    theta = torch.as_tensor(scaled_rope_frequencies(d, base, scaling=scaling, factor=factor))  # [d/2]
    pos = torch.arange(n, dtype=torch.float64) if positions is None else \
        (positions if isinstance(positions, torch.Tensor) else torch.tensor(np.asarray(positions)))
    angles = pos.detach().cpu().to(torch.float64)[..., None] * theta  # [..., n, d/2], on the CPU in float64
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    cos, sin = torch.cos(angles).to(t.device, work), torch.sin(angles).to(t.device, work)
    xw = t.to(work)
    if interleaved:
        x1, x2 = xw[..., 0::2], xw[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = xw[..., : d // 2], xw[..., d // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    out = out.to(t.dtype)
    return out.numpy() if as_numpy else out


def rope_partial_sums(distances, d_head: int = 128, base: float = 10000.0, *, scaling: str = "none",
                      factor: float = 1.0) -> np.ndarray:
    """S_j = sum_{k=0}^{j-1} exp(i r theta_k) for j = 1 .. d/2 (RoFormer §3.4.3). Returns complex [len(r), d/2].

    With h_i = q_[2i:2i+1] k*_[2i:2i+1] (h_(d/2) = 0) the paper's Abel summation reads
    sum_i h_i e^(i r theta_i) = -sum_{i=0}^{d/2-1} S_(i+1) (h_(i+1) - h_i), hence the bound
    |score| <= max_i |h_(i+1) - h_i| * sum_j |S_j|.
    """
    r = np.asarray(distances, dtype=np.float64).reshape(-1)
    theta = scaled_rope_frequencies(d_head, base, scaling=scaling, factor=factor)
    return np.cumsum(np.exp(1j * r[:, None] * theta), axis=-1)


def rope_decay_bound(distances, d_head: int = 128, base: float = 10000.0, *, scaling: str = "none",
                     factor: float = 1.0) -> np.ndarray:
    """RoFormer §3.4.3 (their Figure 2): (1/(d/2)) sum_{j=1}^{d/2} |S_j|, S_j = sum_{k<j} e^(i r theta_k).

    At r = 0 every S_j = j, so the bound is (d/2 + 1) / 2. Returns [len(distances)], float64.
    """
    return np.abs(rope_partial_sums(distances, d_head, base, scaling=scaling, factor=factor)).mean(axis=-1)


def rope_pair_at(x, pair: int, positions, base: float = 10000.0) -> np.ndarray:
    """Feature pair `pair` of x [d_head] (features 2 pair and 2 pair + 1, the paper's layout) after RoPE at each
    position: apply_rope(x, positions, base, interleaved=True)[:, 2 pair : 2 pair + 2]. Returns [len(positions), 2]."""
    x = np.asarray(x, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64).reshape(-1)
    rotated = apply_rope(np.broadcast_to(x, (len(positions), len(x))).copy(), positions=positions, base=base,
                         interleaved=True)
    return rotated[:, 2 * pair: 2 * pair + 2]


def rope_score(q, k, distances, base: float = 10000.0) -> np.ndarray:
    """RoPE score of a query r positions after its key: <R_p q, R_(p-r) k> = <q, R_(-r) k> (RoFormer eq. 16).

    q, k: [d_head]; distances r: [len(r)] (query position minus key position). Returns [len(r)], float64.
    Only the difference matters, so the key is rotated by -r and the query is left alone.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    r = np.asarray(distances, dtype=np.float64).reshape(-1)
    rotated = apply_rope(np.broadcast_to(k, (len(r), len(k))).copy(), positions=-r, base=base)
    return rotated @ q


# ---------------------------------------------------------------- ALiBi


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes exactly as the paper's reference code (ofirpress/attention_with_linear_biases) builds them.

    For a power of two n: a geometric sequence starting at and with ratio 2^(-8/n). Otherwise the n' = 2^floor(log2 n)
    slopes, then every other slope of the 2n' sequence (its 1st, 3rd, ...) for the n - n' remaining heads.
    Returns [n_heads], float64.
    """
    n_heads = int(n_heads)
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return np.array(power_of_2(n_heads), dtype=np.float64)
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = alibi_slopes(2 * closest)[0::2][: n_heads - closest]
    return np.concatenate([power_of_2(closest), extra]).astype(np.float64)


def alibi_bias(n_heads: int, n_query: int, n_key: int | None = None, causal: bool = True) -> np.ndarray:
    """ALiBi (Press et al. 2022, §3): bias[h, i, j] = -m_h * (i - j), added to the scaled scores.

    Queries are aligned to the last keys (query i sits at key position i + n_key - n_query, as with a KV cache).
    causal=True: keys after the query get -inf (the bias doubles as the causal mask). causal=False: -m_h * |i - j|,
    the symmetric form for encoders. Returns [n_heads, n_query, n_key], float64.
    """
    n_key = n_query if n_key is None else n_key
    if n_query < 1 or n_key < n_query:
        raise ValueError(f"need 1 <= n_query <= n_key, got n_query={n_query}, n_key={n_key}")
    distance = (np.arange(n_query)[:, None] + (n_key - n_query)) - np.arange(n_key)[None, :]  # [query, key]
    slopes = alibi_slopes(n_heads)[:, None, None]
    if not causal:
        return -slopes * np.abs(distance)
    bias = -slopes * np.maximum(distance, 0)
    return np.where(distance[None] >= 0, bias, -np.inf)


def alibi_pattern(n_heads: int, n: int, scores=None) -> np.ndarray:
    """softmax(scores + alibi_bias) over the keys, causal. scores: [n_heads or 1, n, n] or None (all zero,
    i.e. position only). Returns the pattern [n_heads, n, n], float64."""
    logits = alibi_bias(n_heads, n)  # -inf above the diagonal: the causal mask
    if scores is not None:
        logits = logits + np.asarray(scores, dtype=np.float64)
    return masked_softmax(logits)[0]  # the core's masked softmax


def alibi_by_distance(n_heads: int, n: int, *, exclude_keys: int = 0) -> np.ndarray:
    """attention_by_distance(alibi_pattern(n_heads, n), exclude_keys=...) in closed form, without the n x n patterns.

    With position alone, query i gives key i - r the weight e^(-m r) (1 - e^(-m)) / (1 - e^(-m (i+1))) (a geometric
    series over its i + 1 keys); average that over the queries i >= r + exclude_keys, then over heads.
    Returns [n - exclude_keys], float64.
    """
    m = alibi_slopes(n_heads)[:, None]  # [head, 1]
    i = np.arange(n, dtype=np.float64)[None, :]  # query positions
    norm = np.expm1(-m) / np.expm1(-m * (i + 1))  # (1 - e^-m) / (1 - e^-m(i+1)), [head, query]
    tail = np.cumsum(norm[:, ::-1], axis=-1)[:, ::-1]  # sum over queries >= index
    r = np.arange(n - int(exclude_keys))
    first = r + int(exclude_keys)
    per_head = np.exp(-m * r) * tail[:, first] / (n - first)
    return per_head.mean(axis=0)


def compare_schemes(q, k, n: int, *, base: float = 10000.0, alibi_slope: float = 0.0625) -> dict[str, np.ndarray]:
    """Scores of one query at position n-1 against the same key vector at positions n-1-r, r = 0 .. n-1.

    q, k: [d]. With identity projections (so the schemes differ only in how position enters):
    "no position": q.k / sqrt(d);  "sinusoidal": (q + PE_(n-1)).(k + PE_(n-1-r)) / sqrt(d) (added to the input);
    "RoPE": <R_(n-1) q, R_(n-1-r) k> / sqrt(d);  "ALiBi": q.k / sqrt(d) - m r.
    Returns {name: scores [n]} indexed by distance r.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    d = len(q)
    r = np.arange(n, dtype=np.float64)
    scale = 1.0 / math.sqrt(d)
    pe = sinusoidal_encoding(n, d, base)
    plain = float(q @ k) * scale
    return {
        "no position": np.full(n, plain),
        "sinusoidal": ((k + pe[n - 1 - np.arange(n)]) @ (q + pe[n - 1])) * scale,
        "RoPE": rope_score(q, k, r, base) * scale,
        "ALiBi": plain - float(alibi_slope) * r,
    }


def softmax_over_distance(scores) -> np.ndarray:
    """softmax of scores [..., n] over its last axis (the keys, indexed by distance). Returns [..., n]."""
    return masked_softmax(np.asarray(scores, dtype=np.float64))[0]


# ---------------------------------------------------------------- the identities the page shows, in numbers


def shift_identity(p: int, k: float, d_model: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray, float]:
    """PE_(p+k) two ways: the fixed rotation M_k applied to PE_p, and the formula evaluated at p + k directly (which
    may be a negative position). Returns (M_k PE_p [d_model], PE(p + k) [d_model], max |difference|)."""
    mapped = sinusoidal_shift_matrix(k, d_model, base) @ sinusoidal_encoding(p + 1, d_model, base)[p]
    w = sinusoidal_frequencies(d_model, base)
    direct = np.empty(d_model)
    direct[0::2], direct[1::2] = np.sin((p + k) * w), np.cos((p + k) * w)
    return mapped, direct, float(np.abs(mapped - direct).max())


def rope_identity(q, k, m: int, n: int, base: float = 10000.0, shift: int = 1000) -> dict[str, float]:
    """RoPE's relative-position identity with these vectors (interleaved pairs, as the paper writes it):
    <R_m q, R_n k>, <q, R_(n-m) k>, the same pair moved by `shift` positions, plain <q, k>, and the norms of q
    and R_m q."""
    def rot(x, pos):
        return apply_rope(np.asarray(x, dtype=np.float64)[None], [pos], base, interleaved=True)[0]

    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    qm = rot(q, m)
    return {"rotated": float(qm @ rot(k, n)), "relative": float(q @ rot(k, n - m)),
            "shifted": float(rot(q, m + shift) @ rot(k, n + shift)), "plain": float(q @ k),
            "norm_q": float(np.linalg.norm(q)), "norm_rotated_q": float(np.linalg.norm(qm))}


def layouts_agree(x, m: int, base: float = 10000.0) -> float:
    """max |rotate_half(P x) - P interleaved(x)| for vectors x [..., d]: the two RoPE layouts give the same
    rotation once the features are reordered by interleaved_to_half_permutation."""
    x = np.asarray(x, dtype=np.float64)
    perm = interleaved_to_half_permutation(x.shape[-1])
    a = apply_rope(x[..., perm], [m], base)
    b = apply_rope(x, [m], base, interleaved=True)[..., perm]
    return float(np.abs(a - b).max())
