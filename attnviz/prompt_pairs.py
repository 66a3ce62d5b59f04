"""The prompt pairs that patching compares: a clean and a corrupted prompt of the same token length with the two
answers (ready-made ones: an IOI name swap and a factual-recall pair), and their tokens in one model's tokenizer,
checked (same length, answers that start with different tokens, a decoder).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnviz import interventions as iv
from attnviz import lm
from attnviz.errors import AttnvizError


class PatchingError(AttnvizError, ValueError):
    """A patching experiment cannot be run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class PromptPair:
    """Two prompts as text: the clean one (whose next token should be `answer`) and the corrupted one (`wrong`)."""

    name: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    note: str = ""


READY_PAIRS = {
    "ioi": PromptPair("ioi", "When Mary and John went to the store, John gave a drink to",
                      "When Mary and John went to the store, Mary gave a drink to", " Mary", " John",
                      "Indirect object (name swap): the repeated name changes, so the answer becomes the other name."),
    "factual": PromptPair("factual", "The Eiffel Tower is in the city of", "The Colosseum is in the city of",
                          " Paris", " Rome", "Factual recall: the landmark changes, so the city changes."),
}


@dataclass(frozen=True)
class TokenPair:
    """A PromptPair in one tokenizer: ids of equal length, the two answer token ids, each position's tokens."""

    name: str
    clean_ids: tuple[int, ...]
    corrupted_ids: tuple[int, ...]
    answer: int
    wrong: int
    clean_tokens: tuple[str, ...]
    corrupted_tokens: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.clean_ids)

    def position_labels(self) -> list[str]:
        """One label per position: the clean token, and the corrupted one where they differ."""
        return [c if c == k else f"{c} / {k}" for c, k in zip(self.clean_tokens, self.corrupted_tokens)]


def tokenize_pair(loaded, pair: PromptPair) -> TokenPair:
    """The pair in the model's tokenizer. ValueError (PatchingError) when the prompts' token lengths differ, when
    the answers' first tokens are the same token, or for an encoder."""
    if not lm.is_language_model(loaded.model):
        raise PatchingError(f"{loaded.spec.name} is an encoder: it predicts no next token, so there is no answer to "
                            "patch toward. Pick a decoder (toy-gpt2, smollm2-135m, ...).")
    tok = loaded.tokenizer
    clean, corrupted = list(tok(pair.clean).input_ids), list(tok(pair.corrupted).input_ids)
    if len(clean) != len(corrupted):
        raise PatchingError(f"{pair.name}: the clean prompt is {len(clean)} tokens and the corrupted one "
                            f"{len(corrupted)} in {loaded.spec.name}'s tokenizer; patching needs the same length. "
                            "Reword one prompt (a name or place of the same token count).")
    answer, wrong = (tok(text, add_special_tokens=False).input_ids for text in (pair.answer, pair.wrong))
    if not answer or not wrong or answer[0] == wrong[0]:
        raise PatchingError(f"{pair.name}: the answers {pair.answer!r} and {pair.wrong!r} do not start with "
                            f"different tokens in {loaded.spec.name}'s tokenizer; the logit difference needs two.")
    iv.check_text(loaded, clean, error=PatchingError, what="patching")
    return TokenPair(pair.name, tuple(clean), tuple(corrupted), int(answer[0]), int(wrong[0]),
                     tuple(tok.decode([i]) for i in clean), tuple(tok.decode([i]) for i in corrupted))


def ready_pair(loaded, name: str) -> TokenPair:
    """READY_PAIRS[name] in the model's tokenizer."""
    if name not in READY_PAIRS:
        raise PatchingError(f"Unknown prompt pair {name!r}: ready-made pairs are {', '.join(READY_PAIRS)}.")
    return tokenize_pair(loaded, READY_PAIRS[name])
