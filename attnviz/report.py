"""One report of what was found, as a single HTML file that needs no network: the model, the text and the settings,
the chosen heads' views (attnviz.notebook), the statistics table, experiment results when given, and beside each
figure and table the code that makes it again (attnviz.snippets). plotly's JavaScript is inlined once (View.html);
nothing is loaded from a CDN. No streamlit.

    view = report(cap, text, heads=[(1, 2)], settings={...}, stats=cap.stats(), experiments={"Knock-outs": frame})
    write_report(path, cap, text, ...)     the same as a standalone page
    attnviz report --model NAME --text TEXT --out report.html [--heads 1.2,3.0] [--knockout]   (the command line)
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from attnviz import notebook, snippets
from attnviz.capture import CaptureError
from attnviz.stats import ROLES, top_heads
from attnviz.knockout import knockout_effects

STYLE = ("<style>.attnviz-report table{border-collapse:collapse;font-size:0.85rem;margin:0.4rem 0 1rem}"
         ".attnviz-report th,.attnviz-report td{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         ".attnviz-report table.settings td{text-align:left}"
         ".attnviz-report pre{background:#f6f6f6;padding:0.6rem;overflow-x:auto;font-size:0.8rem}"
         ".attnviz-report details{margin:0.2rem 0 1.2rem}</style>")
MAX_TEXT_SHOWN = 20_000  # characters of the text written out in full; a longer one is cut, with its length said


def default_heads(stats: pd.DataFrame | None, cap) -> list[tuple[int, int]]:
    """The best head of each role of attnviz.stats.ROLES (each head once), or the first head without statistics."""
    chosen: list[tuple[int, int]] = []
    for role in ROLES if stats is not None else ():
        for row in top_heads(stats, role, k=1).itertuples():
            if (int(row.layer), int(row.head)) not in chosen:
                chosen.append((int(row.layer), int(row.head)))
    return chosen or [(cap.layers[0], 0)]


def _heading(text: str) -> str:
    return f'<h3 style="margin:1.4rem 0 0.4rem">{html.escape(text)}</h3>'


def _code(code: str, what: str = "Reproduce in Python") -> str:
    return f"<details><summary>{html.escape(what)}</summary><pre><code>{html.escape(code)}</code></pre></details>"


def _table(frame: pd.DataFrame, classes: str | None = None) -> str:
    """A table as escaped HTML (pandas escapes every cell), floats to 4 significant digits."""
    return frame.to_html(index=False, escape=True, float_format=lambda x: f"{x:.4g}", na_rep="", border=0,
                         classes=classes)


def _settings(model: str, text: str, cap, settings: Mapping | None) -> list[str]:
    rows = {"model": model, "tokens": f"{cap.n_tokens:,}", "layers captured": f"{cap.layers[0]}–{cap.layers[-1]}",
            "heads per layer": str(cap.n_heads), "store": cap.store, **{k: str(v) for k, v in (settings or {}).items()}}
    shown = text if len(text) <= MAX_TEXT_SHOWN else text[:MAX_TEXT_SHOWN] + "…"
    cut = (f" (the first {MAX_TEXT_SHOWN:,} of its {len(text):,} characters)" if len(text) > MAX_TEXT_SHOWN else "")
    return [_heading("The model and the settings"),
            _table(pd.DataFrame(rows.items(), columns=["setting", "value"]), classes="settings"),
            _heading("The text" + cut), f'<pre style="white-space:pre-wrap">{html.escape(shown)}</pre>']


def _experiment(name: str, result) -> list[str]:
    """An experiment's result as a table: a DataFrame, or any result with .to_frame(); its code when it has one."""
    frame = result if isinstance(result, pd.DataFrame) else result.to_frame()
    code = getattr(result, "attrs", {}).get("snippet") if isinstance(result, pd.DataFrame) else None
    return [_heading(name), _table(frame)] + ([_code(code)] if code else [])


def report(cap, text: str, *, heads: Sequence[tuple[int, int]] | None = None, settings: Mapping | None = None,
           stats: pd.DataFrame | None = None, experiments: Mapping | None = None, hide_sink: bool = False,
           gamma: float | None = None, model: str | None = None) -> notebook.View:
    """The report as a View (View.to_html or View.save(".html") writes it). cap: the capture of `text` made with
    attnviz.capture(model, text, store="auto", layers=cap.layers); heads: (layer, head) pairs drawn with
    notebook.head_view (default: default_heads); settings: more rows for the settings table; stats: the statistics
    table (cap.stats()); experiments: title -> DataFrame (its attrs["snippet"] shown beside it) or a result with
    .to_frame(). model: the name the snippets load (default cap.model_name)."""
    model = cap.model_name if model is None else model
    heads = default_heads(stats, cap) if heads is None else [(int(layer), int(h)) for layer, h in heads]
    if not heads:
        raise CaptureError("No head chosen for the report: name at least one (layer, head).")
    gamma = notebook.default_gamma(cap) if gamma is None else float(gamma)
    layers = None if list(cap.layers) == list(range(cap.n_layers)) else list(cap.layers)
    parts = [STYLE, f"<h2>{html.escape(model)}: what its attention heads do on this text</h2>"]
    parts += _settings(model, text, cap, settings)
    for layer, head in heads:
        parts.append(_heading(f"Layer {layer}, head {head}"))
        parts += notebook.head_view(cap, layer, head, hide_sink=hide_sink, gamma=gamma).parts
        parts.append(_code(snippets.heads_head(model, text, layer, head, gamma=gamma, hide_sink=hide_sink,
                                               layers=layers)))
    if stats is not None:
        parts += [_heading("Every head's statistics"), _table(stats),
                  _code(snippets.head_stats(model, text, layers=layers))]
    for name, result in (experiments or {}).items():
        parts += _experiment(name, result)
    return notebook.View(f"{model}: attention report", ['<div class="attnviz-report">', *parts, "</div>"])


def write_report(path, cap, text: str, **options) -> Path:
    """Writes report(cap, text, **options) as one standalone HTML file (UTF-8, no network) and returns its path."""
    path = Path(os.fspath(path))
    if path.suffix.lower() not in (".html", ".htm"):
        raise CaptureError(f"A report is an HTML file: {path.name!r} must end in .html.")
    return report(cap, text, **options).to_html(path)


def knockout_table(loaded, text: str, heads: Sequence[tuple[int, int]], *, mode: str = "zero",
                   model: str | None = None) -> pd.DataFrame:
    """Each of `heads` knocked out alone (attnviz.knockout.knockout_effects): layer, head, the text's mean
    next-token loss with it knocked out and the change from the loss without (nats); attrs["snippet"]: its code,
    loading `model` (default: the loaded model's name)."""
    heads = [(int(layer), int(h)) for layer, h in heads]
    result = knockout_effects(loaded, loaded.tokenizer(text).input_ids, [[pair] for pair in heads], mode=mode)
    frame = pd.DataFrame({"layer": [x for x, _ in heads], "head": [h for _, h in heads], "loss_nats": result.loss,
                          "delta_loss_nats": result.delta_loss})
    frame.attrs["snippet"] = snippets.knockout(model or loaded.spec.name, text, heads, mode=mode)
    frame.attrs["base_loss"] = result.base_loss
    return frame
