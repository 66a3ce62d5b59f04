"""The output gate of gated softmax attention (Qwen3-Next, Qwen3.5; Qiu et al. 2025, "Gated Attention for Large
Language Models"): each head's attention output is multiplied, channel by channel, by sigmoid(gate), where q_proj
makes the query and the gate together ([heads, 2 x head_dim] per token, the query first). A gate near 0 lets the
head attend nowhere, which is what removes the attention sink.

The gate is read from q_proj's own output (a forward hook on it), split as the layer splits it."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnviz.mixers.kinds import has_output_gate
from attnviz.mixers.layers import layer_stack

SPARSE_BELOW = 0.1  # Qiu et al. report the share of gate scores under 0.1


def gated_attention(model) -> dict[int, torch.nn.Module]:
    """{decoder layer: its gated softmax attention module}."""
    found = {}
    for i, layer in enumerate(layer_stack(model)):
        for module in layer.modules():
            if type(module).__name__.endswith("Attention") and has_output_gate(module):
                found[i] = module
                break
    return found


def _gate_of(q_out: torch.Tensor, head_dim: int) -> torch.Tensor:
    """sigmoid(gate) [head, N, head_dim] of batch row 0 from q_proj's output [batch, N, heads x 2 x head_dim]."""
    per_head = q_out[0].detach().view(q_out.shape[1], -1, 2 * head_dim)  # [N, head, 2 x head_dim]
    _, gate = torch.chunk(per_head, 2, dim=-1)
    return torch.sigmoid(gate.float()).transpose(0, 1)


@contextmanager
def record_gates(model):
    """Within the block, this thread's forward passes of `model` fill the yielded dict {layer: sigmoid(gate)
    [head, query, head_dim]} of every gated softmax layer."""
    owner, gates, handles = threading.get_ident(), {}, []
    for layer, attention in gated_attention(model).items():
        def keep(_module, _args, out, layer=layer, head_dim=attention.head_dim):
            if threading.get_ident() == owner:
                gates[layer] = _gate_of(out, head_dim)

        handles.append(attention.q_proj.register_forward_hook(keep))
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


def gate_map(gate: torch.Tensor) -> torch.Tensor:
    """The gate per head and query, averaged over the head's channels: [head, query] from [head, query, head_dim]."""
    return gate.mean(-1)


@dataclass(frozen=True)
class GateStats:
    """Per head: mean, the mean gate over every query and channel; sparse, the share of those gates under
    SPARSE_BELOW (Qiu et al.'s sparsity: how often the head's output is all but shut)."""

    mean: torch.Tensor
    sparse: torch.Tensor


def gate_stats(gate: torch.Tensor, below: float = SPARSE_BELOW) -> GateStats:
    """GateStats of a sigmoid(gate) [head, query, head_dim]."""
    flat = gate.flatten(1)
    return GateStats(mean=flat.mean(-1), sparse=(flat < below).float().mean(-1))


def gated_weights(pattern: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Each key's weight times the query's mean gate: pattern [head, query, key] x gate_map [head, query]. The
    head's output at query t is sigmoid(gate_t) * sum_s p_ts v_s channel by channel; with the channel-mean gate,
    a row of this sums to the share of the head's output the gate lets through on average."""
    return pattern * gate[:, :, None]
