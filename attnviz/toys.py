"""The toy models: tiny configs of real transformers classes (absolute positions; RoPE with GQA; ALiBi), with
weights drawn from a fixed seed and the byte tokenizer's vocabulary."""

from __future__ import annotations

import threading

import torch

from attnviz.model_files import ModelError
from attnviz.tokenizer import VOCAB_SIZE


TOY_SEED = 0


TOYS: dict[str, tuple[str, str]] = {
    "toy-gpt2": ("gpt2", "Tiny GPT-2: 2 layers x 4 heads, learned absolute positions, random weights."),
    "toy-llama-gqa": ("llama", "Tiny Llama: 2 layers, 4 query / 2 KV heads (GQA), RoPE, random weights."),
    "toy-bloom-alibi": ("bloom", "Tiny BLOOM: 2 layers x 4 heads, ALiBi position biases, random weights."),
}


def toy_config(name: str):
    """The tiny transformers config of a toy model: vocabulary = the 257 ids of the byte tokenizer."""
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=256, eos_token_id=256, pad_token_id=256)
    if name == "toy-gpt2":
        # initializer_range 0.2 instead of 0.02, so that random heads are not all uniform.
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=4096, initializer_range=0.2, **common)
    if name == "toy-llama-gqa":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2, **common)
    if name == "toy-bloom-alibi":
        return BloomConfig(hidden_size=64, n_layer=2, n_head=4, initializer_range=0.2, **common)
    raise ModelError(f"Unknown toy model {name!r}; toys are: {', '.join(TOYS)}.")


_toy_lock = threading.Lock()


def toy_model(name: str):
    """The toy `name` with its seeded weights, eager attention."""
    from transformers import AutoModelForCausalLM

    config = toy_config(name)
    config._attn_implementation = "eager"
    # from_config draws from torch's global generator: the lock keeps two toys built at once (two sessions) from
    # interleaving their draws, so a toy's weights are always the seeded ones.
    with _toy_lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(TOY_SEED)
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager")
