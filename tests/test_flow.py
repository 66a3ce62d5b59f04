import itertools

import numpy as np
import pytest

from attnviz import flow as F
from attnviz.capture import capture_attention
from attnviz.models import load_model
from attnviz.rollout import capture_rollout, rollout
from benchmarks.flow import networkx_flows

# Two layers of three tokens, already averaged over heads; rows are queries, columns keys (causal).
A1 = [[1.0, 0.0, 0.0],
      [0.5, 0.5, 0.0],
      [0.2, 0.3, 0.5]]
A2 = [[1.0, 0.0, 0.0],
      [0.4, 0.6, 0.0],
      [0.6, 0.1, 0.3]]


def test_two_layers_three_tokens_solved_by_hand():
    flow = F.attention_flow(np.array([A1, A2]), query=2, residual=0.0)
    # After layer 0 the only path from token j to position 2 is the edge A1[2, j].
    np.testing.assert_allclose(flow[0], [0.2, 0.3, 0.5], atol=1e-9)
    # After layer 1, token j reaches (2, 2) through (1, k) for k = 0, 1, 2; the three paths share no edge, so the
    # max-flow is the sum over k of each path's narrowest edge, min(A1[k, j], A2[2, k]), A2[2] = [0.6, 0.1, 0.3]:
    #   j = 0: min(1.0, 0.6) + min(0.5, 0.1) + min(0.2, 0.3) = 0.6 + 0.1 + 0.2 = 0.9
    #   j = 1: min(0.0, 0.6) + min(0.5, 0.1) + min(0.3, 0.3) = 0.0 + 0.1 + 0.3 = 0.4
    #   j = 2: min(0.0, 0.6) + min(0.0, 0.1) + min(0.5, 0.3) = 0.0 + 0.0 + 0.3 = 0.3
    np.testing.assert_allclose(flow[1], [0.9, 0.4, 0.3], atol=1e-9)
    # Rollout multiplies along the same paths: A2[2] @ A1 = [0.6 + 0.05 + 0.06, 0.05 + 0.09, 0.15]; below the flow.
    np.testing.assert_allclose(rollout([[A1], [A2]], residual=0.0)[1, 2], [0.71, 0.14, 0.15], atol=1e-12)
    # Position 1, A2[1] = [0.4, 0.6, 0]: j = 0: min(1, 0.4) + min(0.5, 0.6) = 0.9; j = 1: min(0.5, 0.6) = 0.5;
    # token 2 comes after position 1 and has no path to it.
    np.testing.assert_allclose(F.attention_flow(np.array([A1, A2]), query=1, residual=0.0)[1], [0.9, 0.5, 0.0],
                               atol=1e-9)


def test_three_layers_with_a_cut_inside_the_graph_solved_by_hand():
    b1 = [[1.0, 0.0, 0.0], [0.7, 0.3, 0.0], [0.1, 0.4, 0.5]]
    b2 = [[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.1, 0.1, 0.8]]
    b3 = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4]]
    flow = F.attention_flow(np.array([b1, b2, b3]), query=2, residual=0.0)
    np.testing.assert_allclose(flow[0], [0.1, 0.4, 0.5], atol=1e-9)  # b1[2]
    # sum_k min(b1[k, j], b2[2, k]), b2[2] = [0.1, 0.1, 0.8]: j = 0: 0.1 + 0.1 + 0.1; j = 1: 0 + 0.1 + 0.4;
    # j = 2: 0 + 0 + 0.5
    np.testing.assert_allclose(flow[1], [0.3, 0.5, 0.5], atol=1e-9)
    # Token 0 to (3, 2): the sink's edges carry at most b3[2] = 0.3 + 0.3 + 0.4 = 1.0, but (2, 2) is fed only by
    # (1, 0) -> 0.1, (1, 1) -> 0.1 and (1, 2) -> 0.8, and (1, 2) gets only b1[2, 0] = 0.1 from the source: at most
    # 0.3 reaches (2, 2). Flow 0.3 + 0.3 + 0.3 = 0.9 is sent (via (2, 0): 0.3 from (1, 0); via (2, 1): 0.3 from
    # (1, 0); via (2, 2): 0.1 from each of (1, 0), (1, 1), (1, 2)), and the cut {(2,0)->sink 0.3, (2,1)->sink 0.3,
    # (1,0)->(2,2) 0.1, (1,1)->(2,2) 0.1, (0,0)->(1,2) 0.1} has capacity 0.9: the maximum is 0.9.
    # Token 1: it reaches (1, 1) (0.3) and (1, 2) (0.4), not (2, 0); (1, 1) -> (2, 1) -> sink carries 0.3 and (1, 2)
    # -> (2, 2) -> sink 0.4 (edges 0.8, 0.4): 0.7, which is the capacity of the sink's edges it can reach.
    # Token 2: one path (0, 2) -> (1, 2) -> (2, 2) -> (3, 2) of edges 0.5, 0.8, 0.4: 0.4.
    np.testing.assert_allclose(flow[2], [0.9, 0.7, 0.4], atol=1e-9)
    # rollout of token 0: b2 @ b1[:, 0] = [1, 0.4 + 0.42, 0.1 + 0.07 + 0.08] = [1, 0.82, 0.25], then b3[2] @ that
    # = 0.3 + 0.246 + 0.1 = 0.646
    assert rollout([[b1], [b2], [b3]], residual=0.0)[2, 2, 0] == pytest.approx(0.646, abs=1e-12)
    np.testing.assert_allclose(F.normalised(flow)[2], [0.45, 0.35, 0.2], atol=1e-9)


def test_the_residual_is_mixed_in_as_rollout_mixes_it():
    flow = F.attention_flow(np.array([A1, A2]), query=2)  # residual 0.5: 0.5 A + 0.5 I
    np.testing.assert_allclose(flow[0], [0.1, 0.15, 0.75], atol=1e-9)  # 0.5 * [0.2, 0.3, 0.5] + 0.5 * [0, 0, 1]
    # capacities (0.5 A2 + 0.5 I)[2] = [0.3, 0.05, 0.65]; (0.5 A1 + 0.5 I)[:, 0] = [1, 0.25, 0.1]: token 0 gets
    # min(1, 0.3) + min(0.25, 0.05) + min(0.1, 0.65) = 0.3 + 0.05 + 0.1
    assert flow[1, 0] == pytest.approx(0.45, abs=1e-9)


def _min_cut_by_enumeration(caps: np.ndarray, source: int, query: int) -> float:
    """The minimum s-t cut of the layer graph, every node subset tried (max-flow = min-cut): float64, no networkx."""
    top, n = caps.shape[0], caps.shape[-1]
    inner = [(layer, i) for layer in range(top + 1) for i in range(n)
             if (layer, i) not in ((0, source), (top, query))]
    best = np.inf
    for bits in itertools.product((False, True), repeat=len(inner)):
        side = {node for node, b in zip(inner, bits) if b} | {(0, source)}
        cut = sum(caps[layer - 1][i, k] for layer in range(1, top + 1) for i in range(n) for k in range(n)
                  if (layer - 1, k) in side and (layer, i) not in side)
        best = min(best, cut)
    return best


@pytest.mark.parametrize("seed", [0, 1])
def test_random_non_causal_graphs_equal_their_minimum_cut(seed):
    rng = np.random.default_rng(seed)
    attentions = rng.dirichlet(np.ones(3), size=(3, 3))  # [layer, query, key], full (encoder-like) attention
    flow = F.attention_flow(attentions, query=1, residual=0.3)
    caps = F.capacities(attentions, residual=0.3)
    for j in range(3):
        assert flow[2, j] == pytest.approx(_min_cut_by_enumeration(caps, j, 1), abs=1e-9)
    assert np.all(flow >= rollout(caps[:, None], residual=0.0)[:, 1] - 1e-9)


@pytest.mark.parametrize("name", ["toy-llama-gqa", "toy-gpt2"])
def test_a_models_flow_lies_between_rollout_and_one(name):
    capture = capture_attention(load_model(name), "The cat sat on the mat")
    roll = capture_rollout(capture)
    caps = F.capacities(capture)
    for query in (capture.n_tokens - 1, 9):
        flow = F.attention_flow(capture, query)
        # rollout's path products are a feasible flow, and no more than the sink's in-capacity (1) can arrive
        assert np.all(flow >= roll[:, query] - 1e-9) and np.all(flow <= 1 + 1e-9)
        assert flow[0] == pytest.approx(roll[0, query], abs=1e-9)  # one layer: the single edge A'_0[query, j]
        # two layers: the paths j -> (1, k) -> (2, query) share no edge
        two = np.minimum(caps[0], caps[1][query][:, None]).sum(0)
        np.testing.assert_allclose(flow[1], two, atol=1e-9)
        assert not flow[:, query + 1:].any()  # causal: later tokens never reach the query
        assert (flow[1] - roll[1, query]).max() > 1e-3  # flow is not rollout


def test_only_some_layers_and_refusals():
    attentions = np.array([A1, A2])
    flow = F.attention_flow(attentions, query=-1, residual=0.0, layers=[1])
    assert np.isnan(flow[0]).all() and flow[1] == pytest.approx([0.9, 0.4, 0.3], abs=1e-9)
    # the limit: sum over the layers asked for of (layer + 1) x tokens^3 <= 30 x 128^3 (SmolLM2's last layer at 128):
    # every layer of 30, depth 465: 465 x 51^3 = 61,682,715 <= 62,914,560 < 465 x 52^3 = 65,382,720; layers 0 and 1,
    # depth 3: 3 x 275^3 = 62,390,625 <= 62,914,560 < 3 x 276^3 = 63,073,728
    assert F.FLOW_WORK == 62_914_560
    assert [F.token_limit(range(30)), F.token_limit([29]), F.token_limit([0, 1])] == [51, 128, 275]
    uniform = np.tril(np.ones((52, 52))) / np.arange(1, 53)[:, None]
    with pytest.raises(F.FlowError, match="stays interactive up to 51 tokens"):
        F.attention_flow(np.stack([uniform] * 30))
    assert F.attention_flow(np.stack([uniform] * 30), layers=[2])[2].sum() > 0  # one early layer: accepted
    with pytest.raises(F.FlowError, match="outside the text"):
        F.attention_flow(attentions, query=3)
    with pytest.raises(F.FlowError, match="Layer 2 does not exist"):
        F.attention_flow(attentions, layers=[2])
    with pytest.raises(F.FlowError, match=r"\[layer, n, n\]"):
        F.attention_flow(np.ones((2, 3, 4)))
    capture = capture_attention(load_model("toy-gpt2"), "a b c", layers=[1])
    with pytest.raises(F.FlowError, match="every layer from 0"):
        F.attention_flow(capture)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_causal_graphs_equal_networkx_to_the_unit(seed):
    """Peaked causal attention (most of a row on a few keys, as real heads have it), 5 layers of 14 tokens, three
    queries and every layer: the flows equal networkx's (its pure-Python Boykov-Kolmogorov max-flow, another
    implementation, benchmarks/flow.py) on the same integer capacities exactly, and lie between rollout and one."""
    rng = np.random.default_rng(seed)
    weights = np.tril(rng.random((5, 14, 14)) ** 6)
    attentions = weights / weights.sum(-1, keepdims=True)
    caps = F.capacities(attentions)
    roll = rollout(caps[:, None], residual=0.0)
    for query in (13, 7, 0):
        flow = F.attention_flow(attentions, query)
        for top in range(1, 6):
            assert np.array_equal(np.rint(flow[top - 1] * F.SCALE).astype(np.int64),
                                  networkx_flows(caps, query, top))
        assert np.all(flow >= roll[:, query] - 1e-9) and np.all(flow <= 1 + 1e-9)
