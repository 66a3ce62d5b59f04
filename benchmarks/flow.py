"""Attention flow (attnviz.flow): one max-flow per token through a layer, timed in this one run (the machine may be
shared and noisy), against networkx's pure-Python max-flow on the same integer graph (the tests' second
implementation, and what attnviz.flow used before) and against the length limit the page keeps (flow.token_limit).

For each length, SmolLM2-135M on the shipped text, the last query through the last layer (30 layers deep): seconds
for attnviz.flow (scipy's compiled max-flow), for networkx (up to --networkx-up-to tokens: it grows as tokens^3 too),
their ratio, and whether the two agree to the unit of the integer graph. The float32 matmul rate is printed first
as the machine's yardstick; a max-flow is branches and memory, not FLOPs, so no FLOP ratio is given.

    python benchmarks/flow.py
    python benchmarks/flow.py --quick    toy-gpt2 at 16 and 32 tokens
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import networkx as nx
import numpy as np

from benchmarks.longcontext import long_text, matmul_rate


def networkx_flows(caps: np.ndarray, query: int, top: int) -> np.ndarray:
    """[n] networkx's max-flow (Boykov-Kolmogorov) from each input token to (top, query) on attnviz.flow's integer
    graph, in units of 1 / SCALE."""
    from attnviz import flow

    graph, nodes = flow.layer_graph(caps, query, top)
    g = nx.DiGraph()
    g.add_nodes_from(range(graph.shape[0]))
    coo = graph.tocoo()
    g.add_weighted_edges_from(zip(coo.row.tolist(), coo.col.tolist(), coo.data.tolist()), weight="capacity")
    residual = nx.algorithms.flow.build_residual_network(g, "capacity")
    out = np.zeros(caps.shape[-1], dtype=np.int64)
    for source, j in enumerate(nodes[0]):
        out[j] = nx.maximum_flow_value(g, source, graph.shape[0] - 1, residual=residual,
                                       flow_func=nx.algorithms.flow.boykov_kolmogorov)
    return out


def main() -> None:
    from attnviz import flow
    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="toy-gpt2 at 16 and 32 tokens")
    parser.add_argument("--networkx-up-to", type=int, default=32, help="the longest text networkx solves too")
    args = parser.parse_args()
    name, lengths = ("toy-gpt2", (16, 32)) if args.quick else ("smollm2-135m", (16, 32, 64, 128))
    loaded = load_model(name)
    print(f"float32 matmul rate measured first: {matmul_rate(256 if args.quick else 2048) / 1e9:.0f} GFLOP/s")
    print(f"{name}, the last query through the last layer; the page's limit there: "
          f"{flow.token_limit([loaded.shape.layers - 1])} tokens")
    print("tokens   attnviz.flow s   networkx s   networkx / attnviz   equal to the unit")
    for n in lengths:
        capture = capture_attention(loaded, long_text(n, loaded.tokenizer))
        caps, last, query = flow.capacities(capture), capture.layers[-1], capture.n_tokens - 1
        started = time.perf_counter()
        flows = flow.attention_flow(capture, query, layers=[last], limit=False)[last]
        ours = time.perf_counter() - started
        if capture.n_tokens <= args.networkx_up_to:
            started = time.perf_counter()
            theirs = networkx_flows(caps, query, last + 1)
            slow = time.perf_counter() - started
            same = np.array_equal(np.rint(flows * flow.SCALE).astype(np.int64), theirs)
            print(f"{capture.n_tokens:6d}   {ours:14.3f}   {slow:10.3f}   {slow / ours:18.0f}x   {same}")
        else:
            print(f"{capture.n_tokens:6d}   {ours:14.3f}   {'-':>10}   {'-':>19}   -")


if __name__ == "__main__":
    main()
