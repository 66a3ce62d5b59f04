"""Attention during generation: a causal language model continues a prompt one token at a time with its KV cache,
and each step's attention row is recorded in every head.

Step i feeds the newest token (position n_prompt - 1 + i) as a single query against the cache, records that
query's row in every layer and head (attnviz.capture.recording_forward: one row, n_query = 1 < n_key), and picks
the next token from the logits it produced: greedily, or sampled at a temperature from a seeded generator. The
rows are those one forward pass over the whole generated text gives at the same positions (tested to 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz import lm
from attnviz.capture import MAX_TOKENS, numbered_attention, recording_forward
from attnviz.cores import one_core
from attnviz.errors import AttnvizError
from attnviz.tokenizer import readable_tokens

MAX_NEW_TOKENS = 64
TOP_K = 5


class GenerationError(AttnvizError, ValueError):
    """Generation cannot be done; the message says why and what to do."""


@dataclass
class Step:
    """One generation step.

    position:    the position of the query (the newest token, fed in this step)
    rows:        [layer, head, position + 1] float32, that query's attention row in every head
    top_ids, top_probs: [k] the most likely next tokens and their probabilities (float64 softmax, temperature 1)
    chosen:      the token id generated in this step, and chosen_prob its probability at temperature 1
    cache_tokens, cache_bytes: the KV cache's length and size after this step (every layer's keys and values)
    """

    position: int
    rows: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    chosen: int
    chosen_prob: float
    cache_tokens: int
    cache_bytes: int


@dataclass
class Generation:
    """A prompt and what followed it. token_ids: prompt then generated ids; tokens: readable strings; steps[i]
    generated token_ids[n_prompt + i]; ended: "length", "eos" (the model's end token) or "stopped" (asked to)."""

    token_ids: list[int]
    tokens: list[str]
    n_prompt: int
    steps: list[Step] = field(default_factory=list)
    ended: str = "length"

    @property
    def n_generated(self) -> int:
        return len(self.steps)

    @property
    def text(self) -> str:
        return "".join(self.tokens[self.n_prompt:])


def check_settings(loaded, prompt_ids, max_new_tokens: int, temperature: float) -> None:
    """GenerationError for an encoder, an empty or too long prompt, a count outside 1..MAX_NEW_TOKENS or a negative
    temperature."""
    if not lm.is_language_model(loaded.model):
        raise GenerationError(f"{loaded.spec.name} is an encoder: it has no next-token head and cannot generate. "
                              "Pick a decoder (toy-gpt2, smollm2-135m, ...).")
    if not numbered_attention(loaded.model):
        raise GenerationError(f"{loaded.spec.name} has no softmax attention layer: generation here shows each new "
                              "token's attention row, and this model has none to show.")
    if len(prompt_ids) == 0:
        raise GenerationError("The prompt is empty: type a prompt to continue.")
    if not 1 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
        raise GenerationError(f"Generate between 1 and {MAX_NEW_TOKENS} tokens, not {max_new_tokens}.")
    if temperature < 0:
        raise GenerationError(f"The temperature must be 0 (greedy) or more, not {temperature}.")
    limit = min(MAX_TOKENS, loaded.shape.max_positions or MAX_TOKENS)
    if len(prompt_ids) + int(max_new_tokens) > limit:
        raise GenerationError(f"The prompt is {len(prompt_ids):,} tokens; with {max_new_tokens} new tokens that is "
                              f"over the {limit:,} tokens generation takes here. Shorten the prompt.")


def cache_bytes(cache) -> int:
    """Bytes of every layer's cached keys and values."""
    return int(sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
                   if getattr(layer, "keys", None) is not None))


def generate(loaded, prompt: str | Sequence[int], max_new_tokens: int = 16, *, temperature: float = 0.0, seed: int = 0,
             k: int = TOP_K, stop_at_eos: bool = True, on_step: Callable[[Generation], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> Generation:
    """Continues `prompt` (a text, or token ids taken as they are) by up to max_new_tokens tokens (temperature 0:
    greedy; else sampled from softmax(logits / temperature) with torch.Generator seeded by `seed`), recording each
    step's attention row.

    on_step(generation so far) is called after each step; should_stop() is asked before each step, and a True
    ends the generation there (ended = "stopped")."""
    model, tokenizer = loaded.model, loaded.tokenizer
    if isinstance(prompt, str) and prompt.strip():
        prompt_ids = tokenizer(prompt).input_ids
    elif not isinstance(prompt, str) and prompt is not None:
        prompt_ids = [int(i) for i in prompt]  # token ids as they are
    else:
        raise GenerationError("The prompt is empty: type a prompt to continue.")
    check_settings(loaded, prompt_ids, max_new_tokens, temperature)
    device = model.get_input_embeddings().weight.device
    generator = torch.Generator().manual_seed(int(seed))
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = list(prompt_ids)
    out = Generation(token_ids=ids, tokens=readable_tokens(tokenizer, ids), n_prompt=len(ids))
    cache = None
    with torch.inference_mode():
        if len(ids) > 1:  # the prompt but its last token fills the cache; nothing is recorded there
            cache = model(input_ids=torch.tensor([ids[:-1]], device=device),
                          attention_mask=torch.ones(1, len(ids) - 1, dtype=torch.long, device=device),
                          use_cache=True).past_key_values
        # one token a step: its products are too small for a second core, which only waits on a loaded machine
        with recording_forward(model) as rec, one_core():
            for _ in range(int(max_new_tokens)):
                if should_stop is not None and should_stop():
                    out.ended = "stopped"
                    break
                rec.clear()
                position = len(ids) - 1
                result = model(input_ids=torch.tensor([[ids[-1]]], device=device), past_key_values=cache,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                               use_cache=True)
                cache = result.past_key_values
                logits = result.logits[0, -1].double().cpu()
                rows = np.stack([rec.pattern[layer][:, -1, :] for layer in sorted(rec.pattern)])
                chosen = _choose(logits, temperature, generator)
                top = lm.top_k(logits[None], [chosen], k=k)
                ids.append(chosen)
                out.tokens.extend(readable_tokens(tokenizer, [chosen]))
                out.steps.append(Step(position=position, rows=rows, top_ids=top.ids[0], top_probs=top.probs[0],
                                      chosen=chosen, chosen_prob=float(torch.softmax(logits, -1)[chosen]),
                                      cache_tokens=int(cache.get_seq_length()), cache_bytes=cache_bytes(cache)))
                if on_step is not None:
                    on_step(out)
                if stop_at_eos and eos is not None and chosen == eos:
                    out.ended = "eos"
                    break
    return out


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """argmax at temperature 0, else a draw from softmax(logits / temperature) in float64."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / float(temperature), -1)
    return int(torch.multinomial(probs, 1, generator=generator))
