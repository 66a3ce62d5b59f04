"""The toy lab's Qwen3-Next models: transformers' own Qwen3NextForCausalLM at toy size, so that attnviz.mixers
reads them as it reads the real one (no real hybrid checkpoint is on the package index, so these are where a
visitor sees learned behaviour in a Gated DeltaNet layer).

- hybrid: Gated DeltaNet layers ("linear_attention") then one gated softmax layer ("full_attention") last, as
  Qwen3-Next mixes them (three to one in the real model: with 4 layers this is its block exactly);
- gated: every layer Qwen3-Next's gated softmax attention: q_proj makes each head's query and its gate, and the
  head's output is multiplied channel by channel by sigmoid(gate) (Qiu et al. 2025);
- ungated: the same model, the same weights drawn from the same seed, with the gate held open: a forward hook on
  each q_proj replaces the gate half of its output by +inf, so sigmoid(gate) is exactly 1 and the layer is plain
  softmax attention. The gate's weights stay in q_proj, unused (they get no gradient).

Dense MLPs (num_experts=0: Qwen3-Next's config allows no experts), RoPE on a quarter of each head as in Qwen3-Next,
eager attention. Key and value heads of the Gated DeltaNet layers as many as the softmax heads, each head_dim wide,
with Qwen3-Next's short convolution of 4 before the mixer.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, Qwen3NextConfig, Qwen3NextForCausalLM

from attnviz.lab.config import LabConfig
from attnviz.lab.tasks import BOS_ID
from attnviz.lab.variants import INIT_STD, N_POSITIONS
from attnviz.mixers.gates import gated_attention
from attnviz.tokenizer import VOCAB_SIZE

MODELS = ("hybrid", "gated", "ungated")
MODEL_INFO = {
    "hybrid": "Qwen3-Next hybrid: Gated DeltaNet layers, then one gated softmax layer",
    "gated": "Qwen3-Next with gated softmax attention in every layer",
    "ungated": "the same softmax model with its output gate held open (sigmoid = 1): plain softmax attention",
}
CONV_KERNEL = 4           # Qwen3-Next's linear_conv_kernel_dim
# 1: no short convolution, so that the previous-token step, which a width of 4 hands every position for free, has to
# be learnt in the Gated DeltaNet's own map
CONV_KERNELS = (1, 2, 4)
# A = exp(A_log) of each Gated DeltaNet head is drawn uniformly from (0.01, a_max); the decay per token is
# exp(-A softplus(a + dt_bias)). transformers draws Qwen3-Next's with a_max 16: most heads of a toy model then forget
# within a token, and a few hundred steps do not teach them otherwise. With a_max 1 they start able to look back.
A_MAXES = (1.0, 16.0)
A_MAX = 16.0
OPEN_GATE = "attnviz_gate_open"  # set on a q_proj whose gate is held open


def layer_types(n_layers: int, model: str) -> list[str]:
    """Each layer's type in the config: the hybrid's Gated DeltaNet layers before its one softmax layer, or softmax
    attention throughout."""
    if model == "hybrid":
        return ["linear_attention"] * (n_layers - 1) + ["full_attention"]
    return ["full_attention"] * n_layers


def qwen3_next_config(config: LabConfig, model: str, conv_kernel: int = CONV_KERNEL) -> Qwen3NextConfig:
    """The Qwen3NextConfig of one of MODELS at the lab config's size (d_model, heads, layers); conv_kernel: the width
    of the Gated DeltaNet layers' short convolution (1: none, each position keeps its own q, k and v)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    d, h, n = config.d_model, config.n_heads, config.n_layers
    head_dim = d // h
    cfg = Qwen3NextConfig(
        hidden_size=d, intermediate_size=4 * d, num_hidden_layers=n, num_attention_heads=h, num_key_value_heads=h,
        head_dim=head_dim, linear_num_key_heads=h, linear_num_value_heads=h, linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim, linear_conv_kernel_dim=conv_kernel, num_experts=0,
        layer_types=layer_types(n, model), max_position_embeddings=N_POSITIONS, tie_word_embeddings=True,
        initializer_range=INIT_STD, vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID,
        pad_token_id=BOS_ID)
    cfg._attn_implementation = "eager"
    return cfg


def build_qwen3_next(config: LabConfig, model: str, conv_kernel: int = CONV_KERNEL,
                     a_max: float = A_MAX) -> PreTrainedModel:
    """A fresh Qwen3NextForCausalLM of one of MODELS, eager attention, in training mode. Weights from a generator
    seeded with config.seed, never the global RNG: N(0, 0.02) for every matrix, embedding and convolution; A_log =
    log(uniform(0.01, a_max)) per Gated DeltaNet head (a_max 16 as transformers draws it); the rest as transformers
    sets them
    (dt_bias 1, Qwen3-Next's 1-centred norm weights 0). "gated" and "ungated" get the same weights."""
    if conv_kernel not in CONV_KERNELS:
        raise ValueError(f"the short convolution's width must be one of {CONV_KERNELS}")
    if not 0.01 < a_max <= 16.0:
        raise ValueError("a_max must be above 0.01 and at most 16")
    net = Qwen3NextForCausalLM(qwen3_next_config(config, model, conv_kernel))
    net.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, a_max, generator=g).log())
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
    if model == "ungated":
        open_gates(net)
    return net.train()


def open_gates(model) -> None:
    """Holds every gated softmax layer's output gate open: a forward hook on its q_proj puts +inf where the gate is
    (the second half of each head's [query, gate]), so that sigmoid(gate) = 1 exactly and no gradient reaches the
    gate's weights. attnviz.mixers.gates then reads a gate of 1 everywhere."""
    for attention in gated_attention(model).values():
        if not getattr(attention.q_proj, OPEN_GATE, False):
            attention.q_proj.register_forward_hook(_gate_held_open(attention.head_dim))
            setattr(attention.q_proj, OPEN_GATE, True)


def has_open_gates(model) -> bool:
    """Whether open_gates holds this model's gates open."""
    return any(getattr(a.q_proj, OPEN_GATE, False) for a in gated_attention(model).values())


def _gate_held_open(head_dim: int):
    def hook(_module, _args, out):
        b, n, width = out.shape                                            # [batch, n, heads x 2 x head_dim]
        query = out.view(b, n, -1, 2 * head_dim)[..., :head_dim]           # [batch, n, head, head_dim]
        held = torch.cat([query, torch.full_like(query, float("inf"))], dim=-1)
        return held.reshape(b, n, width)
    return hook
