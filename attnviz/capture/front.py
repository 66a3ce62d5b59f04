"""The front door for a notebook or a script, capture(); the package attnviz.capture is callable as it
(attnviz.doors). It sits above attnviz.models (a model given by name is loaded there, and models imports the
capture package), so the package's __init__ does not import it; `import attnviz` imports it before it hands out
attnviz.capture."""

from __future__ import annotations

from attnviz.capture.lending import lent
from attnviz.capture.run import capture_attention
from attnviz.capture.store import AttentionCapture
from attnviz.doors import open_door


def capture(model, text: str, *, tokenizer=None, layers=None, store: str = "auto") -> AttentionCapture:
    """The front door, also called as attnviz.capture(model, text, ...): every head of `layers` (None: all,
    negative counts from the end) on `text`.

    model: a registry name (attnviz.models.available_models()), a folder, a .gguf file or a cached hub id, loaded
    by attnviz.models.load_model; an attnviz LoadedModel; or a transformers model object, with its `tokenizer`. A
    model object is lent, not changed: afterwards its attention implementation, its training flags and so its
    outputs are what they were (attnviz.capture.lending.lent).
    store: "pattern" (the dense weights), "qk" (only q and k, for any length) or "auto": the pattern while it fits
    (MAX_TOKENS tokens, MAX_CAPTURE_BYTES), else "qk" where the family records q and k (choose_store). The limits
    live in attnviz.capture.run (patch them there)."""
    with lent(model, tokenizer) as loaded:  # "auto" is chosen inside, from the one walk of the model's modules
        return capture_attention(loaded, text, layers=layers, store=store)


open_door("attnviz.capture", capture)  # attnviz.capture(model, text, ...) is capture(model, text, ...)
