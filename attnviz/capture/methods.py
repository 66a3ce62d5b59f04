"""AttentionCapture's methods that reach modules above the store: by_words (whose limit is the pattern store's,
attnviz.capture.run.MAX_CAPTURE_BYTES), save (attnviz.capture.files), stats (attnviz.stats) and the notebook views
(attnviz.notebook). The store cannot import those modules (each imports the capture), so the package's front door,
attnviz/capture/__init__.py, which runs before any capture module can be used, sets them on the class (METHODS).
The statistics and the notebook import nothing of attnviz.capture for that reason."""

from __future__ import annotations

import numpy as np

from attnviz.capture import run
from attnviz.capture.files import save_capture
from attnviz.capture.modules import CaptureError
from attnviz.capture.store import AttentionCapture
from attnviz.capture.words import merged_layer, merged_queries, word_spans, word_strings, words_from_tokens
from attnviz.stats import head_stats

METHODS = ("by_words", "stats", "save", "show", "head_view", "token_view", "text_view", "to_html")


def by_words(self, words=None) -> "AttentionCapture":
    """The capture with its tokens merged into words, as Clark et al. 2019 ("What Does BERT Look At?", §4)
    merge them: for each head, the attention TO a word is the SUM of its tokens' columns (keys summed), and the
    attention FROM a word is the MEAN of its tokens' rows (queries averaged). Each merged row therefore still
    sums to 1 (a token's row sums to 1, summing keys keeps that, averaging rows keeps it); with a learned sink,
    each row plus the word's mean learned_sink sums to 1.

    Causal models: a word's row averages its tokens' rows as they were, so inside a word the earlier tokens did
    not see the later ones (the word's weight on itself is the mean of what each of its tokens gave the word's
    tokens up to itself); across words the map stays causal.

    words: one word number per token, as transformers' `encoding.word_ids()` gives them (consecutive tokens of
    one number are a word; None, a special token, is a word of its own). Default: the words the tokenizer's
    offsets gave at capture time (token_words), else the words read from the tokens' space markers; the rule is
    attnviz.capture.words's docstring (a run of letters and digits, or one punctuation character; whitespace
    joins the word after it; special tokens stay words of their own).

    Returns a pattern-store AttentionCapture whose tokens are the words (their tokens' strings joined), whose
    token_ids number distinct words (equal token sequences, equal ids: not vocabulary ids), and whose word_spans
    give each word's tokens here; every view, head_stats, save and span_attention take it. Its scores, inputs
    and values are None: a sum of softmax weights is no softmax of any q.k. In the qk store each layer is read a
    block of query rows at a time from q and k (no N x N array); refused with a CaptureError when the words' map
    [layer, head, word, word] would pass the pattern store's run.MAX_CAPTURE_BYTES (narrow it with select)."""
    if self.pattern is None and not self.inputs:
        raise CaptureError("This capture kept neither its weights nor its q and k, so it has no words to merge.")
    if words is None:
        words = self.token_words if self.token_words is not None else words_from_tokens(self.tokens)
    words = list(words)
    if len(words) != self.n_tokens:
        raise CaptureError(f"{len(words)} word numbers for {self.n_tokens} tokens: give one per token.")
    spans = word_spans(words)
    n_words = len(spans)
    need = self.n_layers * self.n_heads * n_words**2 * 4
    if need > run.MAX_CAPTURE_BYTES:
        raise CaptureError(f"{self.n_layers} layers x {self.n_heads} heads x {n_words:,}² word weights need "
                           f"{need / 2**30:.1f} GiB (limit {run.MAX_CAPTURE_BYTES / 2**30:.0f} GiB): merge fewer "
                           "layers (capture.select(layers).by_words()).")
    block = max(1, 2**22 // max(1, self.n_heads * self.n_tokens))  # [head, block, key] float64: 32 MiB
    pattern = np.stack([merged_layer(lambda a, b, layer=layer: self.layer_rows(layer, a, b), self.n_tokens,
                                     spans, block).astype(np.float32) for layer in self.layers])
    sink = self.learned_sink
    first: dict[tuple[int, ...], int] = {}
    ids = [first.setdefault(tuple(self.token_ids[a:b]), len(first)) for a, b in spans]
    return AttentionCapture(
        tokens=word_strings(self.tokens, spans), token_ids=ids, layers=list(self.layers),
        kv_head_of=list(self.kv_head_of), model_name=self.model_name, causal=self.causal, store="pattern",
        pattern=pattern,
        file_facts={**self.file_facts, "scaling": self.scaling, "head_dim": self.head_dim},
        _sink=None if sink is None else merged_queries(sink, spans).astype(np.float32),
        token_words=list(range(n_words)), word_spans=spans)


def stats(self):
    """Every captured head's statistics as a pandas DataFrame, one row per (layer, head): attnviz.stats."""
    return head_stats(self)


def save(self, path) -> None:
    """Writes the capture to path, .npz or .safetensors (attnviz.capture.files; read back with load_capture)."""
    save_capture(self, path)


# -- notebook views (attnviz.notebook): each draws in a notebook with no network; see its options there --
def _notebook():
    """attnviz.notebook, imported when a view is drawn: it draws with plotly, which the library alone does not
    install (the app's extra), and which a capture without views does not need."""
    from attnviz import notebook

    return notebook


def show(self, *, hide_sink: bool = False, gamma: float = 0.5):
    """The grid of all captured heads, as a View a notebook draws (attnviz.notebook.grid_view)."""
    return _notebook().grid_view(self, hide_sink=hide_sink, gamma=gamma)


def head_view(self, layer: int | None = None, head: int = 0, **options):
    """One head's map; a long text's max-pooled overview and an exact zoom window (notebook.head_view)."""
    return _notebook().head_view(self, layer, head, **options)


def token_view(self, query: int | None = None, **options):
    """Where one query token looks, one row per head (attnviz.notebook.token_view)."""
    return _notebook().token_view(self, query, **options)


def text_view(self, layer: int | None = None, head: int = 0, query: int | None = None, **options):
    """The text shaded by the weight one query of one head gives each token (attnviz.notebook.text_view)."""
    return _notebook().text_view(self, layer, head, query, **options)


def to_html(self, path, layer: int | None = None, head: int = 0, query: int | None = None, **options):
    """Writes the four views on one standalone page that needs no network; returns its path
    (attnviz.notebook.page_view)."""
    return _notebook().page_view(self, layer, head, query, **options).to_html(path)
