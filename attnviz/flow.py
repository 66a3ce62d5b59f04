"""Attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", §3): how much of each input
token can reach one position, through the layers, when attention weights are read as pipe capacities.

The layer graph. Node (0, j) is input token j; node (l, i) is position i after layer l (l = 1 .. L). Each layer's
attention is averaged over its heads and mixed with the residual connection exactly as attnviz.rollout does
(A'_l = 0.5 A_l + 0.5 I, rows renormalised: rollout.layer_matrix), and every weight A'_l[i, k] > 0 is a directed
edge (l - 1, k) -> (l, i) with capacity A'_l[i, k]. The attention flow from input token j to position `query` after
layer l is the value of the maximum flow from source (0, j) to sink (l, query) in that graph.

Rollout multiplies the same weights along every path and adds the paths up; its path products are themselves a
feasible flow (each edge carries A'_l[i, k] times two numbers <= 1, and what enters a node leaves it), so
rollout <= flow <= 1 for every token and layer. Flow differs from rollout where one token reaches the query along
many paths: rollout multiplies (a long path of weights 0.5 dwindles), flow is limited only by the narrowest cut.
The reference implementation of the paper divides each position's flows by their sum; normalised() does that.

The max-flow is scipy's (scipy.sparse.csgraph.maximum_flow, Dinic's algorithm, compiled). It is exact on integer
capacities, held in 32 bits, so each capacity is rounded to a multiple of 1 / SCALE: a flow is then off by at most
(edges in a minimum cut) / (2 SCALE), 4.7e-10 an edge; under 1e-7 for any text attention_flow accepts by default,
whose cut at the query's own edges has at most MAX_FLOW_TOKENS edges. The tests hold it to graphs solved by hand, to
minimum cuts found by enumeration, and to networkx's max-flow on the same integer graph (equal to the unit).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

from attnviz.errors import AttnvizError
from attnviz.rollout import layer_matrix

SCALE = 2**30  # capacities are rounded to multiples of 1 / SCALE; each is at most 1, so 2**30 as an int32
# The longest text whose flows through SmolLM2-135M's last layer (of 30; what the page shows beside rollout) are
# computed by default. Each input token is one max-flow on a graph of up to layers x tokens nodes and about layers x
# tokens^2 / 2 edges. The time grows about as tokens^3 and linearly with the depth of each layer asked for: through
# SmolLM2's last layer on the shipped text, 0.05 s for 32 tokens and 2.5 s for 128 on a 2-core CPU (networkx's
# pure-Python max-flow, used before, took 6.3 s for 32), and other layers get the length that costs as much:
# token_limit.
MAX_FLOW_TOKENS = 128
FLOW_WORK = 30 * MAX_FLOW_TOKENS**3  # sum over the layers asked for of (layer + 1) x tokens^3, at the limit


class FlowError(AttnvizError, ValueError):
    """Attention flow cannot be computed as asked; the message says why."""


def capacities(attentions, residual: float = 0.5) -> np.ndarray:
    """[layer, n, n] float64 edge capacities A'_l: `attentions` is an attnviz AttentionCapture holding every layer
    from 0 (each layer's heads read through capture.layer_rows) or an array [layer, n, n] of attention already
    averaged over heads; each layer is mixed with the identity and renormalised by rollout.layer_matrix."""
    if hasattr(attentions, "layer_rows"):
        if list(attentions.layers) != list(range(len(attentions.layers))):
            raise FlowError(f"Attention flow needs every layer from 0 up; the capture holds layers "
                            f"{attentions.layers}.")
        return np.stack([layer_matrix(attentions.layer_rows(layer), residual) for layer in attentions.layers])
    a = np.asarray(attentions, dtype=np.float64)
    if a.ndim != 3 or a.shape[1] != a.shape[2] or not len(a):
        raise FlowError(f"Attentions must be [layer, n, n] (averaged over heads); got {list(a.shape)}.")
    return np.stack([layer_matrix(layer[None], residual) for layer in a])


def _reaching(caps: np.ndarray, query: int, top: int) -> list[np.ndarray]:
    """For l = 0 .. top: the positions whose node (l, i) has a path to (top, query), as sorted index arrays."""
    alive = np.zeros(caps.shape[-1], dtype=bool)
    alive[query] = True
    out = [np.flatnonzero(alive)]
    for layer in range(top, 0, -1):
        alive = (caps[layer - 1][alive] > 0).any(0)
        out.append(np.flatnonzero(alive))
    return out[::-1]


def layer_graph(caps: np.ndarray, query: int, top: int) -> tuple[csr_array, list[np.ndarray]]:
    """The graph of layers 0 .. top (top >= 1) restricted to the nodes that reach (top, query), as (capacities,
    nodes): nodes[l] the positions i of layer l's nodes (l, i), numbered layer after layer (node (l, nodes[l][a]) is
    number len(nodes[0]) + ... + len(nodes[l - 1]) + a); capacities an int32 sparse matrix whose entry [u, v] is the
    capacity round(A'_l[i, k] * SCALE) of the edge u = (l - 1, k) -> v = (l, i), wherever that is positive."""
    nodes = _reaching(caps, query, top)
    first = np.cumsum([0] + [len(positions) for positions in nodes])
    rows, cols, values = [], [], []
    for layer in range(1, top + 1):
        block = np.rint(caps[layer - 1][np.ix_(nodes[layer], nodes[layer - 1])] * SCALE).astype(np.int32)
        a, b = np.nonzero(block > 0)
        rows.append(first[layer - 1] + b)
        cols.append(first[layer] + a)
        values.append(block[a, b])
    return csr_array((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))),
                     shape=(first[-1], first[-1])), nodes


def attention_flow(attentions, query: int = -1, *, residual: float = 0.5, layers: Iterable[int] | None = None,
                   limit: bool = True) -> np.ndarray:
    """[layer, n] float64: flow[l, j] is the maximum flow from input token j to position `query` after layer l
    (0-based, as rollout's R_l), in the layer graph of the module docstring. Rows of layers not in `layers` (None:
    every layer) are NaN. Tokens that have no path to the query (in a causal model, those after it) get 0.

    attentions: an AttentionCapture (every layer from 0) or [layer, n, n] head-averaged weights (capacities()).
    limit: FlowError for a text longer than token_limit(the layers asked for); False: no limit, for scripts that
    can wait."""
    caps = capacities(attentions, residual)
    n_layers, n = caps.shape[0], caps.shape[-1]
    wanted = _wanted(n_layers, layers)
    if limit and n > token_limit(wanted):
        raise FlowError(f"The text is {n} tokens long; attention flow runs one max-flow per layer and token and "
                        f"stays interactive up to {token_limit(wanted)} tokens for the layers asked for. Shorten "
                        "the text or pick fewer, earlier layers (rollout has no limit).")
    if not -n <= int(query) < n:
        raise FlowError(f"Query position {query} is outside the text (positions 0 to {n - 1}).")
    out = np.full((n_layers, n), np.nan)
    for layer in wanted:
        out[layer] = _flows_to(caps, int(query) % n, layer + 1)
    return out


def token_limit(layers: Iterable[int]) -> int:
    """The longest text attention_flow takes (with limit=True) for the rows of these layers (0-based): the largest n
    with sum(layer + 1) x n^3 <= FLOW_WORK. MAX_FLOW_TOKENS for SmolLM2's last layer; 51 for all its 30 layers; 275
    for both layers of a 2-layer toy."""
    depth = sum(int(layer) + 1 for layer in layers)
    n = int(round((FLOW_WORK / max(1, depth)) ** (1 / 3)))
    while (n + 1) ** 3 * depth <= FLOW_WORK:
        n += 1
    while n > 1 and n**3 * depth > FLOW_WORK:
        n -= 1
    return n


def _wanted(n_layers: int, layers: Iterable[int] | None) -> list[int]:
    wanted = list(range(n_layers)) if layers is None else sorted({int(x) for x in layers})
    for layer in wanted:
        if not 0 <= layer < n_layers:
            raise FlowError(f"Layer {layer} does not exist: the attentions have layers 0 to {n_layers - 1}.")
    if not wanted:
        raise FlowError("No layers asked for.")
    return wanted


def _flows_to(caps: np.ndarray, query: int, top: int) -> np.ndarray:
    """[n] the max-flow from each input node (0, j) to (top, query), on one graph (layer_graph): 0 for a token with
    no path to the query."""
    graph, nodes = layer_graph(caps, query, top)
    sink = graph.shape[0] - 1  # nodes[top] is the query alone
    out = np.zeros(caps.shape[-1])
    for source, j in enumerate(nodes[0]):
        out[j] = maximum_flow(graph, source, sink, method="dinic").flow_value / SCALE
    return out


def normalised(flow: np.ndarray) -> np.ndarray:
    """Each layer's flows divided by their sum, as the paper's reference implementation shows them (rows of NaN,
    or of zeros, stay as they are)."""
    flow = np.asarray(flow, dtype=np.float64)
    total = flow.sum(-1, keepdims=True)
    return np.divide(flow, total, out=flow.copy(), where=np.isfinite(total) & (total > 0))

