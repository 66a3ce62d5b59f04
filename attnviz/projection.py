"""The attention output projection of each layer (o_proj, c_proj, dense, out_proj, ...): the module that takes the
heads' outputs side by side, [batch, query, head * d_v], head h in input columns h * d_v ... (h + 1) * d_v - 1.
Head knock-outs edit those columns (attnviz.knockout); norm-based attention multiplies a head's value vectors by
them (attnviz.norms)."""

from __future__ import annotations

import torch

from attnviz.capture import numbered_attention
from attnviz.errors import AttnvizError

PROJECTION_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "wo", "o", "out_lin", "proj")


class KnockoutError(AttnvizError, ValueError):
    """A knock-out (or anything else that needs a head's output columns) cannot be done; the message says why and
    what to do."""


def _in_features(module) -> int | None:
    if isinstance(module, torch.nn.Linear):
        return module.in_features
    if type(module).__name__ == "Conv1D":  # GPT-2: weight [in, out]
        return int(module.weight.shape[0])
    return None


def output_projection(model, layer: int) -> torch.nn.Module:
    """The module that takes layer `layer`'s concatenated head outputs [.., head * d_v]: a child of the attention
    module named as in PROJECTION_NAMES, else (BERT: BertSelfOutput.dense) such a module under the attention
    module's parent. Raises KnockoutError when none is found."""
    attn = numbered_attention(model).get(int(layer))  # by model layer: a hybrid's attention may be layer 3 of 4
    if attn is None:
        raise KnockoutError(f"Layer {layer} has no softmax attention: it has no heads to knock out.")
    names = {id(m): name for name, m in model.named_modules()}
    by_name = dict(model.named_modules())
    for name, child in attn.named_children():
        if name in PROJECTION_NAMES and _in_features(child):
            return child
    parent_name = names[id(attn)].rpartition(".")[0]
    inside = {id(m) for m in attn.modules()}
    for name, module in by_name[parent_name].named_modules():
        if id(module) not in inside and name.rpartition(".")[2] in PROJECTION_NAMES and _in_features(module):
            return module
    raise KnockoutError(f"{type(attn).__name__} has no output projection attnviz recognises (one of "
                        f"{', '.join(PROJECTION_NAMES)}): head knock-outs and norm-based attention are not available "
                        "for this model.")


def projection_weight(module) -> torch.Tensor:
    """The projection's weight as [out, in] (torch Linear's layout; GPT-2's Conv1D stores [in, out])."""
    w = module.weight
    return w.T if type(module).__name__ == "Conv1D" else w


def head_width(loaded, layer: int = 0) -> int:
    """d_v: the projection's input width divided by the number of heads."""
    width = _in_features(output_projection(loaded.model, layer))
    heads = loaded.shape.heads
    if width % heads:
        raise KnockoutError(f"The output projection takes {width} inputs, not a multiple of {heads} heads: attnviz "
                            "cannot tell the heads' columns apart in this model.")
    return width // heads
