"""What a causal language model predicts: next-token log-probabilities, per-token loss and top-k, from one
forward pass. Used beside the attention maps (which tokens the model gets right), by the knock-out experiments
(the loss a head carries) and by generation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class NotALanguageModel(ValueError):
    """The model has no language-model head (an encoder such as BERT / MiniLM): it predicts no next token."""


def is_language_model(model) -> bool:
    """Whether the model returns next-token logits (a *ForCausalLM / *LMHeadModel with an output embedding)."""
    try:
        return model.get_output_embeddings() is not None and bool(getattr(model.config, "is_decoder", True)
                                                                    or _causal_class(model))
    except (AttributeError, NotImplementedError):
        return False


def _causal_class(model) -> bool:
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


@torch.no_grad()
def next_token_logits(model, token_ids, *, attention_mask=None) -> torch.Tensor:
    """[batch, n, vocab] float32 logits of the token after each position. token_ids: [n] or [batch, n]."""
    if not (_causal_class(model) or is_language_model(model)):
        raise NotALanguageModel(f"{type(model).__name__} is not a causal language model: it predicts no next token.")
    ids = torch.as_tensor(token_ids)
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=ids.to(device), attention_mask=None if attention_mask is None else attention_mask.to(device),
                use_cache=False)
    return out.logits.float().cpu()


def token_losses(logits: torch.Tensor, token_ids) -> np.ndarray:
    """Cross-entropy in nats of each token after the first given the ones before it: -log p(x_{t+1} | x_<=t).
    logits: [n, vocab] or [batch, n, vocab]; token_ids: [n] or [batch, n]. Returns [n - 1] or [batch, n - 1],
    float64, computed in float64 (log-sum-exp)."""
    logits = torch.as_tensor(logits).double()
    ids = torch.as_tensor(token_ids).long()
    squeeze = logits.dim() == 2
    logits = logits.unsqueeze(0) if squeeze else logits
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    out = -logp.gather(-1, ids[:, 1:, None].to(logp.device))[..., 0]
    out = out.numpy()
    return out[0] if squeeze else out


@dataclass(frozen=True)
class TopK:
    """At each position t: the k most likely next tokens (ids [n, k]) and their probabilities ([n, k]), and the
    probability and rank (0 = the model's first choice) of the token that actually follows ([n - 1])."""

    ids: np.ndarray
    probs: np.ndarray
    actual_prob: np.ndarray
    actual_rank: np.ndarray


def top_k(logits: torch.Tensor, token_ids, k: int = 5) -> TopK:
    """TopK of logits [n, vocab] (float64 softmax) for the text token_ids [n]."""
    logits = torch.as_tensor(logits).double()
    if logits.dim() == 3:
        logits = logits[0]
    ids = torch.as_tensor(token_ids).long().reshape(-1)
    probs = torch.softmax(logits, dim=-1)
    k = max(1, min(int(k), probs.shape[-1]))
    top = torch.topk(probs, k, dim=-1)
    actual = probs[:-1].gather(-1, ids[1:, None])[:, 0]
    rank = (probs[:-1] > actual[:, None]).sum(-1)
    return TopK(ids=top.indices.numpy(), probs=top.values.numpy(), actual_prob=actual.numpy(),
                actual_rank=rank.numpy())
