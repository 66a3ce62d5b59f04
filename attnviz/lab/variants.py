"""The toy lab's models: one real transformers architecture per positional scheme, and four attention variants
on one gpt-oss skeleton that differ only in their attention, so that they train side by side.

Positional schemes (attention="standard"): learned -> GPT2LMHeadModel; sinusoidal -> the same GPT-2 with its
position table wpe set to the sinusoidal encoding of Vaswani et al. 2017 §3.5 and frozen; rope ->
LlamaForCausalLM; alibi -> BloomForCausalLM.

Attention variants (GptOssForCausalLM: RoPE, one local expert chosen for every token, so a dense MLP; every
layer full attention; its sliding_window is set only because gpt-oss builds that mask anyway). gpt-oss adds one
sink logit s_h per head to every softmax row (the gpt-oss model card), weights
exp(x_i) / (exp(s_h) + sum_j exp(x_j)), whose share goes to no token:
- softmax: s_h = -inf, frozen: exactly the plain softmax;
- off_by_one: s_h = 0, frozen: exp(x_i) / (1 + sum_j exp(x_j)), the "softmax off by one";
- learned_sink: s_h learned (initialised at 0), as gpt-oss trains it;
- gated: s_h = -inf, and the attention output of head h is multiplied by a sigmoid gate
  g_h = sigmoid(x W_g + b_g)[h] computed from the layer's attention input x (gated attention, Qiu et al. 2025,
  the head-wise gate). The gate changes what a head writes, not its pattern, so attnviz reads its maps as for
  any gpt-oss model. transformers has no family with a head-wise gate, so the gate is attnviz's own: config.json
  says GATE_FLAG, the gate weights sit in the safetensors file beside the others (GATE_PREFIX names them), and
  attnviz.models installs the gate at load with install_gate (forward pre-hooks; see install_gate).
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from transformers import (BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel, GptOssConfig,
                          GptOssForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel)

from attnviz.lab.config import LabConfig
from attnviz.lab.tasks import BOS_ID
from attnviz.positional import sinusoidal_encoding
from attnviz.tokenizer import VOCAB_SIZE

ARCHITECTURE = {"learned": "GPT2LMHeadModel", "sinusoidal": "GPT2LMHeadModel (frozen sinusoidal wpe)",
                "rope": "LlamaForCausalLM", "alibi": "BloomForCausalLM"}
VARIANT_ARCHITECTURE = {"softmax": "GptOssForCausalLM (sinks fixed at -inf)",
                        "off_by_one": "GptOssForCausalLM (sinks fixed at 0)",
                        "learned_sink": "GptOssForCausalLM (learned sinks)",
                        "gated": "GptOssForCausalLM (sinks fixed at -inf) + head-wise sigmoid output gate"}
SINK_INIT = {"softmax": float("-inf"), "off_by_one": 0.0, "learned_sink": 0.0, "gated": float("-inf")}
N_POSITIONS = 256         # learned/sinusoidal position table: room for text typed on other pages
INIT_STD = 0.02           # GPT-2's initializer_range, used for every architecture
GATE_FLAG = "attnviz_head_gate"        # config.json: True when the model has the head-wise output gate
GATE_PREFIX = "attnviz_gate"           # the gate module's name inside each layer's self_attn


def architecture(config: LabConfig) -> str:
    """The transformers class a config builds, in words."""
    return ARCHITECTURE[config.positional] if config.attention == "standard" \
        else VARIANT_ARCHITECTURE[config.attention]


def build_model(config: LabConfig) -> PreTrainedModel:
    """A fresh model for the config, eager attention, no dropout, weights drawn from a generator seeded with
    config.seed (not the global RNG, which other threads may reseed at any time): N(0, 0.02) for matrices and
    embeddings, 1 for norm scales, 0 for biases; gpt-oss sink logits as SINK_INIT says."""
    d, h, n = config.d_model, config.n_heads, config.n_layers
    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID, pad_token_id=BOS_ID)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if config.attention != "standard":
        cfg = GptOssConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=n, num_attention_heads=h,
                           num_key_value_heads=h, head_dim=d // h, num_local_experts=1, num_experts_per_tok=1,
                           max_position_embeddings=N_POSITIONS, sliding_window=N_POSITIONS,
                           layer_types=["full_attention"] * n, tie_word_embeddings=True, rope_parameters=rope,
                           **common)
        cls = GptOssForCausalLM
    elif config.positional in ("learned", "sinusoidal"):
        cfg = GPT2Config(n_embd=d, n_head=h, n_layer=n, n_positions=N_POSITIONS, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, **common)
        cls = GPT2LMHeadModel
    elif config.positional == "rope":
        cfg = LlamaConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=n, num_attention_heads=h,
                          num_key_value_heads=h, max_position_embeddings=N_POSITIONS, tie_word_embeddings=True,
                          rope_parameters=rope, **common)
        cls = LlamaForCausalLM
    elif config.positional == "alibi":
        cfg = BloomConfig(hidden_size=d, n_head=h, n_layer=n, hidden_dropout=0.0, attention_dropout=0.0, **common)
        cls = BloomForCausalLM
    else:
        raise ValueError(f"unknown positional scheme {config.positional!r}")
    cfg._attn_implementation = "eager"
    model = cls(cfg)
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):
                p.fill_(SINK_INIT[config.attention])
                p.requires_grad_(config.attention == "learned_sink")
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        if config.attention == "standard" and config.positional == "sinusoidal":
            model.transformer.wpe.weight.copy_(torch.from_numpy(sinusoidal_encoding(N_POSITIONS, d)))
            model.transformer.wpe.weight.requires_grad_(False)
    if config.attention == "gated":  # after the shared weights, so that they are drawn as in the other variants
        model.config.update({GATE_FLAG: True})
        install_gate(model, generator=g)
    return model


class _GateState(threading.local):
    """The gate of the layer being run, per thread: a model shared by every session may run in several threads."""

    def __init__(self):
        self.gates: dict[int, torch.Tensor] = {}


_STATE = _GateState()


def _attention_blocks(model) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "o_proj") and hasattr(m, "q_proj")]


def has_gate(model) -> bool:
    return any(hasattr(attn, GATE_PREFIX) for attn in _attention_blocks(model))


def install_gate(model, state_dict: dict | None = None, generator: torch.Generator | None = None) -> None:
    """Adds the head-wise output gate to every attention block: a Linear(d_model -> heads) named GATE_PREFIX inside
    self_attn, a forward pre-hook on self_attn that computes g = sigmoid(gate(x)) [batch, n, head] from its input
    x, and a forward pre-hook on o_proj that multiplies each head's slice of the attention output by its g before
    the output projection. state_dict, when given (a loaded model), holds the gate weights under the model's own
    parameter names (…self_attn.attnviz_gate.weight / .bias); otherwise the weights are drawn N(0, 0.02) from
    `generator` and the biases are 0 (every gate starts near 0.5). The gate of the running layer is kept per
    thread."""
    if has_gate(model):
        return
    names = {id(m): name for name, m in model.named_modules()}
    for attn in _attention_blocks(model):
        heads = model.config.num_attention_heads
        gate = nn.Linear(model.config.hidden_size, heads, bias=True)
        with torch.no_grad():
            gate.bias.zero_()
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * INIT_STD)
        if state_dict is not None:
            prefix = f"{names[id(attn)]}.{GATE_PREFIX}."
            try:
                gate.load_state_dict({"weight": state_dict[prefix + "weight"], "bias": state_dict[prefix + "bias"]})
            except KeyError as exc:
                raise ValueError(f"config.json says the model has a head-wise gate, but its weights lack {exc}")
        gate.to(next(attn.parameters()).device)
        attn.add_module(GATE_PREFIX, gate)
        attn.register_forward_pre_hook(_compute_gate, with_kwargs=True)
        attn.o_proj.register_forward_pre_hook(_apply_gate(id(attn), heads))


def _compute_gate(module, args, kwargs):
    x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]     # [batch, n, d_model]
    gate = getattr(module, GATE_PREFIX)
    _STATE.gates[id(module)] = torch.sigmoid(gate(x.to(gate.weight.dtype)))    # [batch, n, head]


def _apply_gate(key: int, heads: int):
    def hook(module, args):
        (out,) = args                                                         # [batch, n, head * d_head]
        g = _STATE.gates.pop(key)
        b, n, width = out.shape
        gated = out.view(b, n, heads, width // heads) * g[..., None].to(out.dtype)
        return (gated.view(b, n, width),)
    return hook


def load_gate_weights(folder) -> dict:
    """The gate weights of a saved gated model: every tensor of its safetensors files whose name holds
    GATE_PREFIX (transformers leaves them out when it loads the model, as weights it does not know)."""
    from pathlib import Path

    from safetensors import safe_open

    out = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                if f".{GATE_PREFIX}." in name:
                    out[name] = fh.get_tensor(name)
    return out
