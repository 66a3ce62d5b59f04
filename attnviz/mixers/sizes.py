"""Each kind of layer's heads and state size, read from the config.

The state is what the layer carries from one token to the next, in numbers per layer: a gated delta rule head keeps
a d_k x d_v matrix, a Mamba2 head a d_state x head_dim one, a short convolution the last (kernel - 1) inputs of every
channel. Softmax attention has no fixed state: its key/value cache grows with the text (None here)."""

from __future__ import annotations


def _first(config, keys) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _attention_heads(config) -> int | None:
    return _first(config, ("num_attention_heads", "n_head", "n_heads"))


def _delta(config) -> tuple[int | None, int | None]:
    heads = _first(config, ("linear_num_value_heads", "linear_num_heads"))
    d_k = _first(config, ("linear_key_head_dim", "linear_head_dim"))
    d_v = _first(config, ("linear_value_head_dim", "linear_head_dim"))
    return heads, None if None in (heads, d_k, d_v) else heads * d_k * d_v


def _mamba2(config) -> tuple[int | None, int | None]:
    heads = _first(config, ("mamba_n_heads", "mamba_num_heads", "num_heads"))
    d_state = _first(config, ("mamba_d_state", "ssm_state_size", "state_size"))
    d_head = _first(config, ("mamba_d_head", "mamba_head_dim", "head_dim"))
    return heads, None if None in (heads, d_state, d_head) else heads * d_state * d_head


def _conv(config) -> tuple[int | None, int | None]:
    width, hidden = _first(config, ("conv_L_cache",)), _first(config, ("hidden_size",))
    return None, None if None in (width, hidden) else hidden * (width - 1)


def layer_sizes(config, kind: str) -> tuple[int | None, int | None]:
    """(heads, state size) of a layer of `kind` (attnviz.mixers.kinds.KINDS) under this config; None where the
    config does not say, or where the kind has no fixed state (softmax attention) or no heads (a convolution)."""
    config = getattr(config, "text_config", None) or config
    if kind == "gated delta rule":
        return _delta(config)
    if kind == "mamba2":
        return _mamba2(config)
    if kind == "conv":
        return _conv(config)
    if kind == "softmax + mamba2":
        return _attention_heads(config), _mamba2(config)[1]
    if kind == "mlp" or kind.startswith("unknown"):
        return None, None
    return _attention_heads(config), None
