"""What a causal language model predicts: next-token log-probabilities, per-token loss and top-k, from one
forward pass. Used beside the attention maps (which tokens the model gets right), by the knock-out experiments
(the loss a head carries) and by generation.

At any length the model takes, predictions() runs the model's forward pass with fused attention (no [head, n, n]
weights) and applies the language-model head to blocks of the final hidden states, keeping each position's loss and
top-k: the [n, vocab] logits (8,192 x 49,152 float32 = 1.6 GB for SmolLM2) are never held whole."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.capture import Recorder, SharedHooks, attention_modules, decoder_layers, recording
from attnviz.capture.modules import causal_lm_class, is_language_model
from attnviz.errors import AttnvizError
from attnviz.budget import capture_working_bytes
from attnviz.shape import hidden_size


class NotALanguageModel(AttnvizError, ValueError):
    """The model has no language-model head (an encoder such as BERT / MiniLM): it predicts no next token."""


@torch.no_grad()
def next_token_logits(model, token_ids, *, attention_mask=None) -> torch.Tensor:
    """[batch, n, vocab] float32 logits of the token after each position. token_ids: [n] or [batch, n]."""
    if not (causal_lm_class(model) or is_language_model(model)):
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
    logits = torch.as_tensor(logits)
    if logits.dim() == 3:
        logits = logits[0]
    ids = torch.as_tensor(token_ids).long().reshape(-1)
    _, top = block_predictions(logits, ids[1:], k)
    return top


def block_predictions(logits: torch.Tensor, following, k: int) -> tuple[np.ndarray, TopK]:
    """(losses [m], TopK) of a block of positions: logits [rows, vocab], following [m] (m = rows, or rows - 1 for
    the block that ends the text) the token after each of the first m positions. In float64 from the log-sum-exp:
    loss = logsumexp(z) - z[next], p = exp(z - logsumexp(z)); a rank counts the logits above the next token's."""
    z = torch.as_tensor(logits).double()
    following = torch.as_tensor(following).long().reshape(-1)
    m = following.shape[0]
    lse = torch.logsumexp(z, dim=-1)  # [rows]
    actual = z[:m].gather(-1, following[:, None])[:, 0]  # [m]
    rank = (z[:m] > actual[:, None]).sum(-1)
    top = torch.topk(z, max(1, min(int(k), z.shape[-1])), dim=-1)
    losses = (lse[:m] - actual).numpy()
    return losses, TopK(ids=top.indices.numpy(), probs=torch.exp(top.values - lse[:, None]).numpy(),
                        actual_prob=torch.exp(actual - lse[:m]).numpy(), actual_rank=rank.numpy())


# -- predictions at any length ------------------------------------------------------------------------------------

BLOCK_ROWS = 256  # positions per block of the LM head: 256 x 49,152 (SmolLM2's vocabulary) float64 = 96 MiB


class PredictionError(AttnvizError, ValueError):
    """The model's predictions cannot be computed here; the message says why."""


def prediction_bytes(config, n_tokens: int, *, block: int = BLOCK_ROWS, k: int = 5, uses_sdpa: bool = True) -> int:
    """Estimated peak bytes of predictions() beyond the weights: the forward pass's working set (as a capture that
    keeps no layer: attnviz.budget.capture_working_bytes) plus two more [n, inner] float32 MLP temporaries (GPT-2's
    gelu_new makes about five where that estimate counts three: measured on toy-gpt2 at 4,000 tokens, 1% over it
    without them), the final hidden states [n, hidden] float32, one block's logits [block, vocab] as float32 and
    float64 with two float64-sized temporaries (log-sum-exp, top-k) and a bool comparison, and the results,
    n x (2k + 3) numbers."""
    n, rows = int(n_tokens), min(int(block), int(n_tokens))
    hidden = hidden_size(config)
    inner = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    forward = capture_working_bytes(config, n, 0, store="qk", uses_sdpa=uses_sdpa) + 2 * n * inner * 4
    return int(forward + n * hidden * 4 + rows * vocab * (4 + 3 * 8 + 1) + n * (2 * k + 3) * 8)


@dataclass(frozen=True)
class Predictions:
    """losses [n - 1] (nats, float64): -log p(x_{t+1} | x_<=t); top: TopK of every position."""

    losses: np.ndarray
    top: TopK


@torch.inference_mode()
def predictions(model, token_ids, *, k: int = 5, block: int = BLOCK_ROWS,
                progress: Callable[[int, int], None] | None = None) -> Predictions:
    """Every position's loss and top-k of a causal language model on token_ids [n], at any length it takes.

    One forward pass with fused attention (SDPA, as a long capture runs it; the family's eager attention for the
    few families read by hooks) keeps the final hidden states; the model's own head then maps `block` positions at a
    time to logits, with the family's transform of its logits (Gemma's soft-cap, Cohere's and Granite's scales).
    The model's own logits at the last position (the forward pass computes that one row, logits_to_keep=1) check
    the transform: a family that changes its logits in a way not known here raises PredictionError instead of
    showing wrong numbers. progress(done, total) after each decoder layer and each block of the head."""
    if not (causal_lm_class(model) or is_language_model(model)):
        raise NotALanguageModel(f"{type(model).__name__} is not a causal language model: it predicts no next token.")
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        raise PredictionError(f"{type(model).__name__} computes every position's logits at once (it takes no "
                              "logits_to_keep), which attnviz does not do for long texts.")
    ids = torch.as_tensor(token_ids).long().reshape(-1)
    n, step = ids.shape[0], max(1, int(block))
    steps = len(decoder_layers(model)) + -(-n // step)  # progress: every decoder layer, then every block
    done = [0]

    def advance():
        done[0] += 1
        if progress is not None:
            progress(min(done[0], steps), steps)

    device = model.get_input_embeddings().weight.device
    with _watched_pass(model, advance) as kept, _fused_attention(model):
        own = model(input_ids=ids[None].to(device), attention_mask=torch.ones_like(ids)[None].to(device),
                    use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
    if not kept:
        raise PredictionError(f"{type(model).__name__}: attnviz could not find the final hidden states its head "
                              "reads, so it cannot predict a long text block by block.")
    hidden = kept[-1]  # [n, hidden]
    head = model.get_output_embeddings()
    losses, tops = [], []
    for a in range(0, n, step):
        b = min(n, a + step)
        logits = _transformed(model.config, head(hidden[a:b])).float().cpu()  # [rows, vocab]
        if b == n:
            _check_last_row(model, logits[-1], own)
        block_losses, top = block_predictions(logits, ids[a + 1:b + 1], k)
        losses.append(block_losses)
        tops.append(top)
        del logits
        advance()
    return Predictions(losses=np.concatenate(losses), top=TopK(
        **{f: np.concatenate([getattr(t, f) for t in tops]) for f in ("ids", "probs", "actual_prob", "actual_rank")}))


def _transformed(config, logits: torch.Tensor) -> torch.Tensor:
    """What the families' *ForCausalLM.forward does to the head's output: Cohere multiplies by logit_scale,
    Granite divides by logits_scaling, Gemma 2 (and others) soft-cap: cap * tanh(logits / cap)."""
    scale = getattr(config, "logit_scale", None)
    if scale is not None:
        logits = logits * scale
    scaling = getattr(config, "logits_scaling", None)
    if scaling is not None:
        logits = logits / scaling
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _check_last_row(model, mine: torch.Tensor, own: torch.Tensor) -> None:
    """The blocked head's last row against the model's own, to the precision of the model's dtype (the same
    matmul on one row and on a block may round differently)."""
    dtype = model.get_output_embeddings().weight.dtype
    tolerance = max(1e-4, 16 * torch.finfo(dtype).eps) * max(1.0, float(own.abs().max()))
    if not torch.allclose(mine, own, rtol=0.0, atol=tolerance):
        raise PredictionError(f"{type(model).__name__} transforms its logits in a way attnviz does not reproduce "
                              f"(largest gap {float((mine - own).abs().max()):.3g} at the last position): its "
                              "predictions are not shown rather than shown wrong.")


@dataclass
class _Pass:
    """What the hooks keep for the thread running predictions(): the final hidden states [n, hidden] (batch row 0)
    of each forward pass, and a call after each decoder layer."""

    kept: list
    on_layer: Callable[[], None] | None = None


_PASS: ContextVar[_Pass | None] = ContextVar("attnviz_prediction_pass", default=None)


def _body(model) -> torch.nn.Module:
    """The module whose output the head reads: the decoder (OPT's head reads model.decoder, not model), else the
    base model."""
    try:
        return model.get_decoder() or model.base_model
    except (AttributeError, NotImplementedError):
        return model.base_model


def _install_pass_hooks(model) -> list:
    """Hooks on the body of the model (its output: the final hidden states) and on each decoder layer (progress)
    that act for the thread running predictions() only (_PASS); other threads' forward passes go through untouched."""
    def keep(_module, _args, output):
        state = _PASS.get()
        if state is not None:
            state.kept.append(output[0].detach()[0])

    def layer_done(_module, _args, _output):
        state = _PASS.get()
        if state is not None and state.on_layer is not None:
            state.on_layer()

    return [_body(model).register_forward_hook(keep)] + [
        layer.register_forward_hook(layer_done) for layer in decoder_layers(model)]


_PASS_HOOKS = SharedHooks(_install_pass_hooks)


@contextlib.contextmanager
def _watched_pass(model, on_layer: Callable[[], None] | None = None) -> Iterator[list]:
    """The list the final hidden states [n, hidden] of each forward pass in the block are appended to; on_layer()
    after each decoder layer."""
    state = _Pass(kept=[], on_layer=on_layer)
    with _PASS_HOOKS.serving(model, _PASS, state):
        yield state.kept


@contextlib.contextmanager
def _fused_attention(model) -> Iterator[None]:
    """The forward passes of this thread in the block run fused attention: attnviz's registered attention function
    with a recorder of the long-text store that wants no layer runs SDPA (or attnviz's blocked core for soft-capped
    and sink families) and records nothing. The model is shared: its attention setting is not changed."""
    modules = attention_modules(model)
    recorder = Recorder(wanted=set(), last=len(modules), dtype=np.dtype(np.float32), store="qk",
                         layer_of={id(m): i for i, m in enumerate(modules)}, stop=False)
    with recording(model, recorder):
        yield
