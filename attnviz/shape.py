"""ModelShape: the facts of a model's configuration that attnviz reads, computed once when the model is loaded.

transformers families spell the same fact several ways (num_attention_heads / n_head / n_heads, hidden_size /
n_embd / d_model, num_key_value_heads / num_kv_heads / multi_query, max_position_embeddings / n_positions). This
module reads them in one place, as TransformerLens' config object does; everything else reads `loaded.shape`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from attnviz.errors import AttnvizError


class ShapeError(AttnvizError, ValueError):
    """A configuration does not say one of the facts attnviz needs."""


MASKS = ("full", "causal", "sliding", "chunked")


@dataclass(frozen=True)
class LayerFacts:
    """What one layer's attention does, read from the config (and the layer's own module for its scaling).

    mask: "full" (every key: an encoder), "causal", "sliding" (the last `window` keys, the query's own included,
    as transformers' sliding_window_overlay defines it) or "chunked" (causal inside the query's chunk of `window`
    positions, Llama 4's chunked_attention); rope_base: this layer's RoPE base (None without RoPE); rope_type: how
    RoPE's frequencies are rescaled ("default", "linear", "yarn", "llama3", ...; None without RoPE); scaling: the
    factor q.k is multiplied by before the softmax (None where the layer does not say it); mixer: the layer's token
    mixer, one of attnviz.mixers.kinds.KINDS ("softmax", "gated softmax", "gated delta rule", "mamba2", "conv",
    "indexed", ...); heads: the mixer's heads (a gated delta rule layer's value heads, a Mamba2 layer's heads;
    None where the config does not say); state: the numbers the layer carries from token to token (a linear
    mixer's fixed state, layer_sizes; None for softmax attention, whose cache grows with the text)."""

    mask: str
    window: int | None = None
    rope_base: float | None = None
    rope_type: str | None = None
    scaling: float | None = None
    mixer: str = "softmax"
    heads: int | None = None
    state: int | None = None

    @property
    def local(self) -> bool:
        """A layer that sees only nearby keys (sliding window or chunk)."""
        return self.mask in ("sliding", "chunked")

    @property
    def kind(self) -> str:
        """"local" or "global", the two groups the pages compare."""
        return "local" if self.local else "global"

    @property
    def reach(self) -> str:
        """The mask in words: "causal", "sliding window 512", "chunks of 8192", "full (bidirectional)"."""
        return {"full": "full (bidirectional)", "causal": "causal", "sliding": f"sliding window {self.window}",
                "chunked": f"chunks of {self.window}"}[self.mask]

    def describe(self) -> str:
        """One phrase: "sliding window 512, RoPE base 10000"; a layer without softmax attention by its mixer alone
        ("gated delta rule"), one with a gate or an indexer by its mixer first ("gated softmax, causal, ...")."""
        rope = "" if self.rope_base is None else f", RoPE base {self.rope_base:g}" + (
            f" ({self.rope_type})" if self.rope_type not in (None, "default") else "")
        if self.mixer == "softmax":
            return self.reach + rope
        if "softmax" in self.mixer or self.mixer == "indexed":
            return f"{self.mixer}, {self.reach}{rope}"
        return self.mixer


@dataclass(frozen=True)
class ModelShape:
    """family: config.model_type; layers, heads, kv_heads (GQA/MQA: fewer than heads); head_dim: the width of q
    and k per head (MLA: nope + rope parts); d_model: the residual width; max_positions: the longest input the
    model takes (None: no learned limit, as ALiBi); causal: a decoder; position: "rope", "alibi", "learned",
    "sinusoidal" or "other"; rope_base: RoPE's theta base where position == "rope" (the global layers' base where
    layers differ, as in Gemma 3); vocab: vocabulary size; layer_facts: each layer's LayerFacts (mask, window, RoPE
    base and type, scaling)."""

    family: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None
    causal: bool
    position: str
    rope_base: float | None
    vocab: int
    layer_facts: tuple[LayerFacts, ...] = ()

    @property
    def local_layers(self) -> list[int]:
        """The layers that see only nearby keys (sliding window or chunk); empty for most models."""
        return [i for i, facts in enumerate(self.layer_facts) if facts.local]

    def layer_kind(self, layer: int) -> str:
        """"local" or "global" (every layer is global in a model without sliding or chunked layers)."""
        return self.layer_facts[layer].kind if self.layer_facts else "global"

    def layer_mark(self, layer: int) -> str:
        """A short mark beside a layer's number in a chart: L or G (local or global softmax), or the mixer's own
        ("gated", "top-k", "+SSM") where a layer's softmax attention is gated, indexed or runs beside Mamba2."""
        facts = self.layer_facts[layer] if self.layer_facts else None
        marks = {"gated softmax": "gated", "indexed": "top-k", "softmax + mamba2": "+SSM"}
        return marks.get(facts.mixer, facts.kind[0].upper()) if facts else "G"

    def relative_depth(self, layers=None) -> list[float]:
        """Each layer's place in the stack, layer / (layers - 1): 0 the first, 1 the last. Two models of different
        depths (SmolLM2's 30 layers, Gemma 3's 18) are compared on this axis."""
        layers = range(self.layers) if layers is None else layers
        return [int(x) / max(self.layers - 1, 1) for x in layers]

    def layer_groups(self) -> dict[tuple[str, str], list[int]]:
        """{(kind, the facts in words): the layers}, in order of first layer; one entry when every layer is alike. The
        kind is "local" or "global" for softmax layers, else the layer's mixer ("gated delta rule", "mamba2", ...)."""
        groups: dict[tuple[str, str], list[int]] = {}
        for layer, facts in enumerate(self.layer_facts):
            kind = facts.kind if facts.mixer == "softmax" else facts.mixer
            groups.setdefault((kind, facts.describe()), []).append(layer)
        return groups

    def kinds_summary(self) -> str:
        """"Local layers 0–4, 6–10, 12–16 (sliding window 512, RoPE base 10000); global layers 5, 11, 17 (causal,
        RoPE base 1e+06)", or "" when every layer attends alike."""
        groups = self.layer_groups()
        if len(groups) < 2:
            return ""
        text = "; ".join(f"{kind} layer{'s' if len(layers) > 1 else ''} {spans(layers)}"
                         + ("" if facts == kind else f" ({facts.removeprefix(kind + ', ')})")
                         for (kind, facts), layers in groups.items())
        return text[0].upper() + text[1:]

    @property
    def kv_head_of(self) -> list[int]:
        """For each query head, the key/value head it reads."""
        from attnviz.attention import kv_head_of

        return kv_head_of(self.heads, self.kv_heads)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 for MHA, heads for MQA)."""
        return self.heads // self.kv_heads


def spans(numbers: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0–2, 4, 6–7"."""
    runs: list[list[int]] = []
    for x in numbers:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def _first(config, keys, default=None):
    for key in keys:
        value = getattr(config, key, None)
        if value:
            return value
    return default


_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "mamba_n_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")


def n_heads(config) -> int:
    """Attention heads; a model without attention (Mamba2) its mixer's heads."""
    value = _first(config, _HEAD_KEYS)
    if value is None:
        raise ShapeError(f"Cannot tell how many heads {type(config).__name__} has.")
    return int(value)


def hidden_size(config) -> int:
    value = _first(config, _HIDDEN_KEYS)
    if value is None:
        raise ShapeError(f"Cannot tell the hidden size of {type(config).__name__}.")
    return int(value)


def n_kv_heads(config) -> int:
    """How many key/value heads the config's attention has."""
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        return 1  # GPT-BigCode (StarCoder), Falcon-7B: one KV head. Falcon-40B sets both and uses num_kv_heads.
    value = _first(config, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))  # Llama & most; Falcon; Falcon-RW
    return int(value) if value else n_heads(config)


def qk_head_dim(config) -> int:
    """Width of q and k per head: head_dim, or hidden / heads; MLA (DeepSeek-V3) uses nope + rope parts."""
    d = getattr(config, "head_dim", None) or hidden_size(config) // n_heads(config)
    mla = (getattr(config, "qk_nope_head_dim", 0) or 0) + (getattr(config, "qk_rope_head_dim", 0) or 0)
    return int(mla or d)


def position_limit(config) -> int:
    """The longest input: max_position_embeddings / n_positions, or sys.maxsize (ALiBi has no learned limit)."""
    value = _first(config, ("max_position_embeddings", "n_positions"))
    return int(value) if value else sys.maxsize


def model_shape(config, *, causal: bool | None = None, lab: str | None = None, attention=None) -> ModelShape:
    """The ModelShape of a transformers config. causal: whether the model is a decoder (when the caller knows it
    from the model class); lab: the positional scheme a toy-lab folder's lab.json records, which the caller reads
    (attnviz.models.lab_positional; position_scheme);
    attention: the model's attention modules, {model layer: module} (or a list, one per layer), whose own scaling
    each layer's facts report."""
    if causal is None:
        causal = not (getattr(config, "model_type", "") in ("bert", "roberta", "distilbert", "electra")
                      or getattr(config, "is_encoder_decoder", False))
    limit = position_limit(config)
    scheme = position_scheme(config, lab)
    n_layers = int(_first(config, ("num_hidden_layers", "n_layer", "n_layers", "num_layers"), 0))
    return ModelShape(
        family=str(getattr(config, "model_type", "unknown")), layers=n_layers,
        heads=n_heads(config), kv_heads=n_kv_heads(config), head_dim=qk_head_dim(config),
        d_model=hidden_size(config), max_positions=None if limit == sys.maxsize else limit, causal=bool(causal),
        position=scheme, rope_base=rope_settings(config)[1] if scheme == "rope" else None,
        vocab=int(getattr(config, "vocab_size", 0) or 0),
        layer_facts=layer_facts(config, n_layers, causal=bool(causal), rope=scheme == "rope", attention=attention))


def layer_facts(config, n_layers: int, *, causal: bool, rope: bool, attention=None) -> tuple[LayerFacts, ...]:
    """Each layer's LayerFacts. The mask follows config.layer_types where the config has them ("sliding_attention",
    "chunked_attention", "full_attention"), else a config.sliding_window on every layer (Mistral, Phi-3,
    Starcoder2 build their sliding mask whenever it is set), else causal (or full for an encoder). The RoPE base and
    type follow the layer type where rope_parameters are given per type (Gemma 3). attention: {model layer: its
    attention module} (a hybrid's layers without one have no scaling), or a list with one per layer."""
    from attnviz.mixers.kinds import layer_kinds

    types = getattr(config, "layer_types", None)
    if not types or len(types) != n_layers:
        types = ["sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"] * n_layers
    mixers = layer_kinds(config)
    mixers = mixers if len(mixers) == n_layers else ("softmax",) * n_layers
    attention = dict(enumerate(attention)) if isinstance(attention, (list, tuple)) else attention or {}
    facts = []
    for i, kind in enumerate(types):
        mask, window = ("full", None) if not causal else {
            "sliding_attention": ("sliding", getattr(config, "sliding_window", None)),
            "chunked_attention": ("chunked", getattr(config, "attention_chunk_size", None))}.get(kind, ("causal", None))
        base, rope_type = _layer_rope(config, kind) if rope else (None, None)
        heads, state = layer_sizes(config, mixers[i])
        facts.append(LayerFacts(mask=mask, window=None if window is None else int(window), rope_base=base,
                                rope_type=rope_type, scaling=_module_scaling(attention.get(i)), mixer=mixers[i],
                                heads=heads, state=state))
    return tuple(facts)


def layer_sizes(config, kind: str) -> tuple[int | None, int | None]:
    """(heads, state size) of a layer of `kind` (attnviz.mixers.kinds.KINDS) under this config. The state is what
    the layer carries from one token to the next, in numbers per layer: a gated delta rule head keeps a d_k x d_v
    matrix, a Mamba2 head a d_state x head_dim one, a short convolution the last (kernel - 1) inputs of every
    channel. None where the config does not say, where the kind has no fixed state (softmax attention: its
    key/value cache grows with the text) or no heads (a convolution)."""
    config = getattr(config, "text_config", None) or config
    if kind == "gated delta rule":
        heads = _first(config, ("linear_num_value_heads", "linear_num_heads"))
        d_k = _first(config, ("linear_key_head_dim", "linear_head_dim"))
        d_v = _first(config, ("linear_value_head_dim", "linear_head_dim"))
        return heads, None if None in (heads, d_k, d_v) else heads * d_k * d_v
    if kind == "conv":
        width, hidden = _first(config, ("conv_L_cache",)), _first(config, _HIDDEN_KEYS)
        return None, None if None in (width, hidden) else hidden * (width - 1)
    if kind == "mlp" or kind.startswith("unknown"):
        return None, None
    if kind == "mamba2":
        return _mamba2_sizes(config)
    # softmax attention (a Falcon-H1 layer's beside its Mamba2 mixer): its heads, and no fixed state of its own
    return _first(config, _HEAD_KEYS), _mamba2_sizes(config)[1] if kind == "softmax + mamba2" else None


def _mamba2_sizes(config) -> tuple[int | None, int | None]:
    heads = _first(config, ("mamba_n_heads", "mamba_num_heads", "num_heads"))
    d_state = _first(config, ("mamba_d_state", "ssm_state_size", "state_size"))
    d_head = _first(config, ("mamba_d_head", "mamba_head_dim", "head_dim"))
    return heads, None if None in (heads, d_state, d_head) else heads * d_state * d_head


def _layer_rope(config, kind: str) -> tuple[float, str]:
    """(base, rope_type) of a layer of type `kind`: its own rope_parameters entry where the config gives one per
    layer type, else the model's (GPT-J's rotary_dim without a base: 10,000)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get(kind), dict):
        params = params[kind]
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"]), str(params.get("rope_type", "default"))
    return float(_rope_theta(config) or 10000.0), "default"


def _module_scaling(module) -> float | None:
    """The factor an attention module multiplies q.k by: `scaling` (the interface families), BLOOM's and Falcon's
    inv_norm_factor, GPT-J's 1 / scale_attn; None for a module that names none."""
    if module is None:
        return None
    for name, invert in (("scaling", False), ("inv_norm_factor", False), ("scale_attn", True)):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) or getattr(value, "numel", lambda: 0)() == 1:  # a number or 1-element tensor
            return 1.0 / float(value) if invert else float(value)
    return None


# ---------------------------------------------------------------- how position enters

SCHEMES = ("rope", "alibi", "learned", "sinusoidal", "other")


def position_scheme(config, lab: str | None = None) -> str:
    """How a transformers config encodes position: "alibi" (BLOOM, or an `alibi` flag as in MPT/Falcon), "rope"
    (a RoPE base in the config, as in Llama, Mistral, Qwen) or "other" (learned absolute, sinusoidal, none).

    lab: the scheme a toy-lab folder's lab.json records (attnviz.models.lab_positional reads it, so this module
    imports nothing of the lab), which says which of "learned" or "sinusoidal" its GPT-2 uses: both are
    GPT2LMHeadModel with the same config, the sinusoidal one with its position table wpe set to the Vaswani et al.
    encoding and frozen, which only lab.json records. Either way the positions are added to the token embeddings.
    The config decides whenever it says RoPE or ALiBi.
    """
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) is True:
        return "alibi"
    if _rope_theta(config) is not None or getattr(config, "rotary_dim", None):  # GPT-J: rotary_dim, base 10,000
        return "rope"
    return lab if lab in ("learned", "sinusoidal") else "other"


def rope_settings(config) -> tuple[int, float]:
    """(d_head, base) of a transformers config that uses RoPE (Llama-style: rope_parameters or rope_theta)."""
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(d_head), float(_rope_theta(config) or 10000.0)


def _rope_theta(config) -> float | None:
    """The RoPE base of a config: rope_parameters["rope_theta"] (recent transformers), per layer type as Gemma 3
    writes it ({"full_attention": {...}, "sliding_attention": {...}}: the full-attention layers' base), or the
    older rope_theta attribute; None when the config names none."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        if "rope_theta" in params:
            return float(params["rope_theta"])
        nested = params.get("full_attention") or next((v for v in params.values() if isinstance(v, dict)), None)
        if isinstance(nested, dict) and "rope_theta" in nested:
            return float(nested["rope_theta"])
    base = getattr(config, "rope_theta", None)
    return float(base) if base else None
