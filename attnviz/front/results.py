"""What the front door's experiments return: each result keeps today's result object (`raw`), the readable tokens
and the model's name, and gives the numbers as a tidy DataFrame (to_frame), a notebook view drawn with
attnviz.figures (_repr_html_, view()) and files (save: .html, .svg, .pdf, .png by attnviz.export; .csv the frame).
The views import plotly only when drawn."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnviz.flow import normalised


@dataclass(repr=False)
class Result:
    """The common part of every front-door result: the model's name and the text's tokens, readable."""

    model_name: str
    tokens: list[str]

    def to_frame(self) -> pd.DataFrame:
        """The numbers as a tidy DataFrame, one row per measured thing."""
        raise NotImplementedError

    def view(self):
        """The notebook view (attnviz.notebook.View): charts with a sentence saying what to see."""
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return self.view().html()

    def save(self, path, *, print_style: bool = True) -> list[Path]:
        """Writes the result in the format its suffix names and returns the files written: .csv the frame;
        .html the view as a page; .svg, .pdf or .png each chart (attnviz.notebook.View.save)."""
        path = Path(os.fspath(path))
        if path.suffix.lower() == ".csv":
            self.to_frame().to_csv(path, index=False)
            return [path]
        return self.view().save(path, print_style=print_style)

    def __repr__(self) -> str:
        return f"<attnviz {type(self).__name__}: {self.model_name}, {len(self.tokens)} tokens>"


def _view(title: str, parts: list):
    from attnviz.notebook import View

    return View(title, parts)


def _note(text: str) -> str:
    import html

    return f'<p style="font-size:0.9rem;color:#555;margin:0.2rem 0 1rem">{html.escape(text)}</p>'


def _label(heads) -> str:
    return " + ".join(f"L{layer}H{head}" for layer, head in heads) or "none"


# -- knock-outs ------------------------------------------------------------------------------------------------------

@dataclass(repr=False)
class KnockoutResults(Result):
    """Each row's knock-out and its effect (raw: attnviz.knockout.KnockoutResult): the mean next-token loss over
    the text, and log p(answer) at `position` when an answer was given, against the run without a knock-out."""

    raw: Any
    n_layers: int
    n_heads: int
    answer: str | None = None

    def to_frame(self) -> pd.DataFrame:
        """heads ("L1H2", or "L0H1 + L1H3" together), layer and head (single heads; <NA> otherwise), loss and
        delta_loss (nats), and with an answer target_logprob and delta_target (nats)."""
        r = self.raw
        single = [len(x) == 1 for x in r.rows]
        frame = pd.DataFrame({
            "heads": [_label(x) for x in r.rows],
            "layer": pd.array([x[0][0] if s else None for x, s in zip(r.rows, single)], dtype="Int64"),
            "head": pd.array([x[0][1] if s else None for x, s in zip(r.rows, single)], dtype="Int64"),
            "loss": r.loss, "delta_loss": r.delta_loss})
        if r.target_logprob is not None:
            frame["target_logprob"], frame["delta_target"] = r.target_logprob, r.delta_target
        return frame

    def grid(self, column: str = "delta_loss") -> np.ndarray:
        """[layer, head] of a column of to_frame for the rows that knock out one head each (NaN elsewhere)."""
        return self.raw.grid(np.asarray(self.to_frame()[column], dtype=float), self.n_layers, self.n_heads)

    def view(self):
        from attnviz.figures import experiments as figs

        r, parts = self.raw, []
        target = f"log p({self.answer}) after position {r.target[0]}" if r.target is not None else None
        if len(r.rows) > 1 and all(len(x) == 1 for x in r.rows):
            parts += [figs.effect_grid(self.grid(), what="Change in mean next-token loss", unit="nats"),
                      _note("Red heads carry the loss: knocking them out makes the text harder to predict.")]
            if target:
                parts += [figs.effect_grid(self.grid("delta_target"), what=f"Change in {target}", unit="nats"),
                          _note("Blue heads support the answer: knocking them out lowers its log-probability.")]
        else:
            labels = [_label(x) for x in r.rows]
            parts += [figs.score_parts(labels, r.delta_loss, title="Change in mean next-token loss",
                                       x_title="change in loss (nats)", y_title="heads knocked out"),
                      _note(f"Without a knock-out the loss is {r.base_loss:.4f} nats; a bar to the right means the "
                            "heads helped predict the text.")]
            if target:
                parts += [figs.score_parts(labels, r.delta_target, title=f"Change in {target}",
                                           x_title="change in log-probability (nats)", y_title="heads knocked out"),
                          _note("A bar to the left means the heads supported the answer.")]
        return _view(f"{self.model_name}: knock-outs ({r.mode})", parts)


# -- patching --------------------------------------------------------------------------------------------------------

SITE_WORDS = {"heads": "Each head's output", "resid": "The residual stream entering each layer, by position",
              "attn": "Each attention output, by position", "mlp": "Each MLP output, by position"}


@dataclass(repr=False)
class PatchingResults(Result):
    """The corrupted prompt with each site patched from the clean one (method "activation": measured, one run per
    site; "attribution": the AtP first-order estimate of every site from one backward pass). share [layer, head or
    position]: 0 = the corrupted run's metric, 1 = the clean run's. values, clean_value, corrupted_value: the raw
    metric of each patched run and of the two unpatched runs (activation patching only; None otherwise). pair: the
    attnviz.patching.TokenPair."""

    method: str
    site: str
    metric: str
    share: np.ndarray
    values: np.ndarray | None
    clean_value: float | None
    corrupted_value: float | None
    pair: Any

    @property
    def columns(self) -> list[str]:
        """The grid's column labels: head numbers, or each position's clean token (and corrupted, where it
        differs)."""
        return [str(h) for h in range(self.share.shape[1])] if self.site == "heads" else self.pair.position_labels()

    def to_frame(self) -> pd.DataFrame:
        """method, site, layer, then head, or position and token, then share (0 corrupted, 1 clean) and value (the
        raw metric; NaN for attribution patching)."""
        layers, cols = np.indices(self.share.shape)
        index = "head" if self.site == "heads" else "position"
        frame = pd.DataFrame({"method": self.method, "site": self.site, "layer": layers.ravel(),
                              index: cols.ravel()})
        if index == "position":
            frame["token"] = [self.columns[c] for c in cols.ravel()]
        frame["share"] = self.share.ravel()
        frame["value"] = np.nan if self.values is None else self.values.ravel()
        return frame

    def view(self):
        from attnviz.figures import experiments as figs

        what = SITE_WORDS[self.site]
        how = "patched from the clean run" if self.method == "activation" else "attribution patching's estimate"
        fig = figs.patching_grid(self.share, self.columns, title=f"{what}, {how}",
                                 x_title="head" if self.site == "heads" else "position (clean / corrupted token)")
        note = (f"1 = the clean run's {self.metric}, 0 = the corrupted run's: red sites carry the difference "
                "between the prompts.")
        return _view(f"{self.model_name}: {self.method} patching", [fig, _note(note)])


# -- direct logit attribution ----------------------------------------------------------------------------------------

@dataclass(repr=False)
class LogitAttributionResults(Result):
    """Each part's share of logit[answer] - logit[wrong] at `position` (raw: attnviz.logit_attribution.
    LogitAttribution, the norms' scales frozen at the run); the parts add up to raw.logit_diff."""

    raw: Any
    answer: str
    wrong: str

    def to_frame(self) -> pd.DataFrame:
        """part ("embeddings", "L3H5", "L3 attn bias", "L3 MLP", "final bias"), kind, layer and head (<NA> where
        none), logits: the rows sum to the model's logit difference."""
        rows = []
        for label, value in self.raw.terms():
            kind, layer, head = label, None, None
            if label.startswith("L") and label[1].isdigit():
                layer_text, _, rest = label[1:].partition(" ")
                if "H" in layer_text:
                    layer_text, head_text = layer_text.split("H")
                    kind, head = "head", int(head_text)
                else:
                    kind = rest
                layer = int(layer_text)
            rows.append((label, kind, layer, head, value))
        frame = pd.DataFrame(rows, columns=["part", "kind", "layer", "head", "logits"])
        frame["layer"], frame["head"] = frame["layer"].astype("Int64"), frame["head"].astype("Int64")
        return frame

    def view(self):
        from attnviz.figures import experiments as figs

        r = self.raw
        grid = figs.effect_grid(r.heads, what="Direct logit attribution", unit="logits").update_layout(
            title_text=f"Each head's output onto logit({self.answer}) − logit({self.wrong}), position {r.position}")
        layers = range(r.heads.shape[0])
        labels = ["embeddings"] + [x for i in layers for x in (f"L{i} heads", f"L{i} MLP")] + ["biases"]
        values = [r.embeddings] + [x for i in layers for x in (r.heads[i].sum() + r.attn_bias[i], r.mlp[i])] \
            + [r.final_bias]
        return _view(f"{self.model_name}: direct logit attribution", [
            grid, _note("Red heads push the answer over the wrong token, blue ones against it; the norms' scales "
                        "are frozen at this run, so every part is linear."),
            figs.logit_parts(labels, values, total=r.logit_diff),
            _note(f"The parts sum to {r.total:+.4f}; the model's own logit difference is {r.logit_diff:+.4f}.")])


# -- QK attribution --------------------------------------------------------------------------------------------------

@dataclass(repr=False)
class QKAttributionResults(Result):
    """One head's pre-softmax score of `key` at `query` split into (query-side part, key-side part) terms (raw:
    attnviz.qk_attribution.QKAttribution); the terms add up to the model's own score, raw.score."""

    raw: Any

    def to_frame(self) -> pd.DataFrame:
        """query_part, key_part, term (score units): one row per pair of parts, summing to the score."""
        r = self.raw
        q, k = np.indices(r.terms.shape)
        return pd.DataFrame({"query_part": [r.q_labels[i] for i in q.ravel()],
                             "key_part": [r.k_labels[j] for j in k.ravel()], "term": r.terms.ravel()})

    def view(self):
        from attnviz.figures import experiments as figs

        r = self.raw
        name = f"layer {r.layer}, head {r.head}: key {r.key} ({self.tokens[r.key]}) at query {r.query}"
        parts = [figs.score_parts(r.q_labels, r.q_side(), title="Query side: what made the query",
                                  x_title="share of the score (score units)"),
                 _note(f"{name}. Each bar is one part of the residual stream at the query dotted with the whole key; "
                       f"the bars sum to the score, {r.score:+.4f}."),
                 figs.score_parts(r.k_labels, r.k_side(), title="Key side: what made the key",
                                  x_title="share of the score (score units)"),
                 _note("The same split on the key's side: the whole query dotted with each part of the key.")]
        if r.by_frequency is not None:
            parts += [figs.score_parts([str(i) for i in range(len(r.by_frequency))], r.by_frequency, top=16,
                                       title="The score by RoPE plane (the 16 largest)",
                                       x_title="share of the score (score units)",
                                       y_title="RoPE plane i (frequency base^(-2i/d))"),
                      _note("Low planes turn fast and carry position, high ones barely turn and carry content.")]
        return _view(f"{self.model_name}: QK attribution, {name}", parts)


# -- attention flow and rollout --------------------------------------------------------------------------------------

@dataclass(repr=False)
class FlowResults(Result):
    """Attention flow from each input token to position `query` (attnviz.flow): flow [layer, token] for layers
    0 .. the highest asked for (rows not asked for are NaN), and rollout [layer, token], the same query's rollout
    row after each of those layers, to compare."""

    flow: np.ndarray
    rollout: np.ndarray
    query: int
    layers: list[int]

    def to_frame(self) -> pd.DataFrame:
        """layer, position, token, flow (max-flow value), share (each layer's flows divided by their sum, as the
        paper shows them) and rollout, for the layers asked for."""
        share = normalised(self.flow)
        return pd.DataFrame([(layer, j, self.tokens[j], self.flow[layer, j], share[layer, j], self.rollout[layer, j])
                             for layer in self.layers for j in range(len(self.tokens))],
                            columns=["layer", "position", "token", "flow", "share", "rollout"])

    def view(self):
        from attnviz.figures import experiments as figs

        layer = self.layers[-1]
        fig = figs.bars_by_token({f"rollout through layer {layer}": self.rollout[layer],
                                  "attention flow (each row's share)": normalised(self.flow[layer][None])[0]},
                                 self.tokens, title=f"Query {self.query}: rollout beside attention flow",
                                 y_title="share of the query's input (unitless)")
        return _view(f"{self.model_name}: attention flow", [fig, _note(
            "Rollout multiplies the attention matrices, so mass piles onto the first tokens; flow reads every weight "
            "as a pipe's capacity, so tokens reachable by many paths keep their share.")])


@dataclass(repr=False)
class RolloutResults(Result):
    """Attention rollout (attnviz.rollout): rollout [layer, query, key], float64, rows summing to 1; rollout[l]
    is the share of each key token's information in each query position after layer l."""

    rollout: np.ndarray

    def to_frame(self) -> pd.DataFrame:
        """layer, query, key, share: one row per entry of every layer's matrix (layer x tokens² rows)."""
        layer, query, key = np.indices(self.rollout.shape)
        return pd.DataFrame({"layer": layer.ravel(), "query": query.ravel(), "key": key.ravel(),
                             "share": self.rollout.ravel()})

    def view(self):
        from attnviz.figures import experiments as figs

        layer = self.rollout.shape[0] - 1
        return _view(f"{self.model_name}: rollout", [
            figs.rollout_map(self.rollout[layer], self.tokens, layer=layer),
            _note("Each row is a query's rollout through the last layer: in a causal model the mass piles up, layer "
                  "after layer, on the first tokens, which every later token can reach.")])


# -- generation ------------------------------------------------------------------------------------------------------

@dataclass(repr=False)
class GenerationResults(Result):
    """A prompt and what the model generated after it, one token per step with that step's attention row in every
    head (raw: attnviz.generation.Generation; raw.steps[i].rows [layer, head, position + 1]). tokens: the prompt's
    and the generated tokens, readable; top_tokens[i]: step i's most likely next tokens (raw.steps[i].top_ids),
    readable."""

    raw: Any
    top_tokens: list[list[str]]

    @property
    def text(self) -> str:
        """The generated continuation, readable."""
        return self.raw.text

    def to_frame(self) -> pd.DataFrame:
        """step, position (of the query fed in that step), token_id and token (generated), prob (its probability
        at temperature 1), cache_tokens and cache_bytes (the KV cache after the step)."""
        g = self.raw
        return pd.DataFrame([(i, s.position, s.chosen, g.tokens[g.n_prompt + i], s.chosen_prob, s.cache_tokens,
                              s.cache_bytes) for i, s in enumerate(g.steps)],
                            columns=["step", "position", "token_id", "token", "prob", "cache_tokens", "cache_bytes"])

    def view(self, step: int = -1):
        """Where step `step`'s query looked in every head, and its most likely next tokens."""
        from attnviz.figures import experiments as figs

        g = self.raw
        if not g.steps:
            return _view(f"{self.model_name}: generation", [_note("Nothing was generated.")])
        s = g.steps[step]
        chosen = next((i for i, t in enumerate(s.top_ids) if int(t) == s.chosen), None)
        labels = self.top_tokens[step]
        return _view(f"{self.model_name}: generation", [
            figs.step_rows(s.rows, g.tokens, query=f"{s.position}: {g.tokens[s.position]}"),
            _note("One row per head: where the newest token looked, over the prompt and what was generated so far."),
            figs.top_k_bars(labels, s.top_probs, chosen),
            _note(f"The step generated {g.tokens[s.position + 1]!r} with probability {s.chosen_prob:.3f}.")])
