"""Links: a page's view in its URL query, so a shared link reproduces it, and an odd link never breaks the page.

One mechanism for every page that has a link. A page declares a `Link`: a table of link keys -> `Param` (the
session key a value goes to, its kind and bounds). `read` applies a new link (a query the page did not write
itself, so a rerun never overrides the visitor's own choices): every value is parsed, then clamped or replaced
with one st.warning that says so. What only the model or the text can check (a layer, a head, a token) is
remembered as asked, and `check_asked` (or `choice_box`) clamps it with a warning once the options are known.
`write` puts the view back into the URL only when it changed.

A value from a link is shown back shortened and inside a code span (no 100 kB echo, no markdown from a link). A
model name that is not attnviz's own (toy, bundled or toy-lab) is never loaded from a link before the visitor
confirms it (`model_confirmed`): it would be read from this server's disk or Hugging Face cache.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Mapping

import streamlit as st

MAX_MODEL_NAME_CHARS = 1_000  # a folder or hub id fits; a longer value is not a model and is not echoed back
SHOWN_CHARS = 40  # a link's value is shown back at most this long
HUGE = 10**18  # a whole number of more digits than this is beyond any option (and int() of 4,300+ digits raises)
WHOLE = re.compile(r"-?[0-9]+")
RANGE = re.compile(r"([0-9]+)-([0-9]+)")


@dataclass(frozen=True)
class Param:
    """One link key. kind: "model", "text", "int" (bounded by lo and hi, or, for an index whose hi is None, by the
    model or text: asked, checked later), "range" (first-last, asked), "float" (lo, hi, step) or "choice"
    (link value -> session value). noun: what the value is, in warnings ("head", "token"); within: what has
    the index ("model", "text")."""

    key: str
    kind: str
    noun: str = ""
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    within: str = "model"
    choices: Mapping[str, object] = field(default_factory=dict)
    also: tuple[str, ...] = ()  # further session keys set to the same value


@dataclass(frozen=True)
class Link:
    """A page's link: its state prefix (its seen, asked and pending keys start with it) and its keys."""

    prefix: str
    params: Mapping[str, Param]

    def with_choices(self, name: str, choices: Mapping[str, object]) -> Link:
        """The same link with the choices of `name` known only when the page runs (the Heads page's tabs)."""
        return replace(self, params={**self.params, name: replace(self.params[name], choices=choices)})

    def state(self, what: str) -> str:
        return f"{self.prefix}link_{what}"


def link_key(link: Link, query: Mapping[str, object]) -> tuple:
    """The part of a URL query the page reads, as a comparable tuple."""
    return tuple(sorted((k, str(v)) for k, v in query.items() if k in link.params))


def shown(name: str, value: str | None = None) -> str:
    """`name=value` for a message: control characters replaced, backticks made quotes (it sits in a code span,
    so nothing in it is markdown), cut to SHOWN_CHARS with its length said."""
    if value is None:
        return f"`{name}`"
    clean = "".join("\ufffd" if unicodedata.category(c).startswith("C") else c for c in value).replace("`", "'")
    if len(clean) > SHOWN_CHARS:
        return f"`{name}={clean[:SHOWN_CHARS - 1]}…` ({len(value):,} characters)"
    return f"`{name}={clean}`"


def read(link: Link) -> None:
    """Applies the URL query when it is not the one this page last wrote (a new link, or one from another page):
    each value parsed, clamped or replaced with one warning per key; indices only the model or text can check are
    remembered in the session's "asked" dict for check_asked."""
    query = st.query_params
    seen = link_key(link, query.to_dict())
    if seen == st.session_state.get(link.state("seen")):
        return
    st.session_state[link.state("seen")] = seen
    asked: dict[str, object] = {}
    for name, param in link.params.items():
        values = query.get_all(name)
        if not values:
            continue
        notes = [f"The link gives {shown(name)} {len(values)} times: the last, {shown(name, values[-1])}, "
                 "counts."] if len(values) > 1 else []
        note = _apply(link, name, param, values[-1], asked)
        if note:
            notes.append(note)
        if notes and param.kind == "model" and not note and link.state("model_pending") in st.session_state:
            st.session_state[link.state("model_note")] = " ".join(notes)  # said with model_confirmed's warning
        elif notes:
            st.warning(" ".join(notes))
    st.session_state[link.state("asked")] = asked


def _set(param: Param, value) -> None:
    for key in (param.key, *param.also):
        st.session_state[key] = value


def _apply(link: Link, name: str, param: Param, raw: str, asked: dict) -> str | None:
    """Puts one link value into the session. Returns what the warning says, or None when it was taken as is."""
    value = raw.strip()
    if param.kind == "text":
        return _text(name, param, raw)
    if not value:
        return f"The link's {shown(name, '')} is empty: ignored."
    if param.kind == "model":
        return _model(link, name, param, value)
    if param.kind == "choice":
        # a choice by its code (tab=stats) or by what the page shows (tab=Statistics, any case)
        by_label = {str(label).casefold(): label for label in param.choices.values()}
        if value not in param.choices and value.casefold() not in by_label:
            return f"The link's {shown(name, raw)} is not one of {', '.join(param.choices)}: ignored."
        _set(param, param.choices[value] if value in param.choices else by_label[value.casefold()])
        return None
    if param.kind == "float":
        return _float(name, param, raw)
    if param.kind == "range":
        found = RANGE.fullmatch(value)
        if not found or _whole(found[1]) > _whole(found[2]):
            return f"The link's {shown(name, raw)} is not a range of {param.noun}s such as 3-5: ignored."
        first, last = _whole(found[1]), _whole(found[2])
        _set(param, (first, last))
        asked[param.key] = ((first, last), value)
        return None
    return _int(name, param, raw, asked)


def _whole(digits: str) -> int:
    """int(digits), or ±HUGE for more digits than any option has (int() of 4,300 digits or more raises)."""
    sign = -1 if digits.startswith("-") else 1
    return int(digits) if len(digits.lstrip("-")) <= 18 else sign * HUGE


def _int(name: str, param: Param, raw: str, asked: dict) -> str | None:
    if not WHOLE.fullmatch(raw.strip()):
        return f"The link's {shown(name, raw)} is not a whole number: ignored."
    value = _whole(raw.strip())
    lo = 0 if param.lo is None else int(param.lo)
    if value < lo:
        _set(param, lo)
        return (f"The link's {shown(name, raw)}: {param.noun}s are numbered from {lo}, showing {param.noun} {lo}."
                if param.hi is None else f"The link's {shown(name, raw)}: at least {lo:,}, showing {lo:,}.")
    if param.hi is None:  # an index: only the model or text knows the last one (check_asked)
        _set(param, value)
        asked[param.key] = (value, raw.strip())
        return None
    if value > param.hi:
        _set(param, int(param.hi))
        return f"The link's {shown(name, raw)}: at most {int(param.hi):,}, showing {int(param.hi):,}."
    _set(param, value)
    return None


def _float(name: str, param: Param, raw: str) -> str | None:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        return f"The link's {shown(name, raw)} is not a number: ignored."
    clamped = min(param.hi, max(param.lo, value))
    stepped = round(round(clamped / param.step) * param.step, 6)
    _set(param, stepped)
    if clamped != value:
        return (f"The link's {shown(name, raw)}: {'at least' if value < param.lo else 'at most'} {clamped:g}, "
                f"showing {stepped:g}.")
    if abs(stepped - value) > 1e-9:
        return f"The link's {shown(name, raw)}: the {param.noun} moves in steps of {param.step:g}, showing {stepped:g}."
    return None


def _text(name: str, param: Param, raw: str) -> str | None:
    from attnviz import ui

    _set(param, raw[:ui.MAX_TEXT_CHARS])
    if len(raw) > ui.MAX_TEXT_CHARS:
        return (f"The link's {shown(name)} is {len(raw):,} characters, over the {ui.MAX_TEXT_CHARS:,} a {param.noun} "
                f"may have: only its first {ui.MAX_TEXT_CHARS:,} are used.")
    return None


def _model(link: Link, name: str, param: Param, value: str) -> str | None:
    """A registered model (toy, bundled, toy-lab) is chosen; any other name goes into the picker's text box and
    waits for the visitor to confirm it (model_confirmed), which then says so."""
    from attnviz import ui
    from attnviz.models import available_models

    if len(value) > MAX_MODEL_NAME_CHARS:
        return f"The link's {shown(name)} is {len(value):,} characters, too long for a model name or folder: ignored."
    st.session_state.pop(link.state("model_note"), None)
    if value in {spec.name for spec in available_models()}:
        _set(param, value)
        st.session_state.pop(link.state("model_pending"), None)
        return None
    if not ui.model_roots():  # this server opens its listed models only: nothing to confirm
        return (f"The link's {shown(name, value)} is not one of attnviz's models (toy, bundled or toy-lab), and this "
                "server opens no folders of models: ignored.")
    _set(param, ui.CUSTOM_MODEL)
    st.session_state[f"{param.key}_custom"] = value
    st.session_state[link.state("model_pending")] = value
    return None


def model_confirmed(link: Link, model: str | None) -> bool:
    """False, after a warning and a Load it button, while `model` is a link's model that is not attnviz's own and
    the visitor has not confirmed it: a link must not make the server load whatever folder it names."""
    pending = st.session_state.get(link.state("model_pending"))
    if model is None or model != pending:
        return True
    said = st.session_state.get(link.state("model_note"), "")
    slot = st.empty()  # the warning and the button go as soon as it is pressed
    with slot.container():
        st.warning(f"{said} The link's {shown('model', model)} is not one of attnviz's models (toy, bundled or "
                   "toy-lab): a folder or hub id is read from this server, so it is loaded only when you press Load "
                   "it.".strip())
        if not st.button("Load it", key=link.state("model_confirm")):
            return False
    slot.empty()
    del st.session_state[link.state("model_pending")]
    st.session_state.pop(link.state("model_note"), None)
    return True


def check_asked(link: Link, key: str, options) -> None:
    """When the link asked for a value of `key` (an index, or a first-last range) that is not among `options`
    (consecutive whole numbers) and the session still holds it: the nearest option instead, with a warning."""
    value, raw = st.session_state.get(link.state("asked"), {}).pop(key, (None, ""))
    if value is None or st.session_state.get(key) != value or not len(options):
        return
    lo, hi = options[0], options[-1]
    name, param = next((n, p) for n, p in link.params.items() if p.key == key)
    has = f"this {param.within} has {param.noun}s {lo}–{hi}"
    if isinstance(value, tuple):  # a range: each end clamped
        if lo <= value[0] and value[1] <= hi:
            return
        first, last = (min(hi, max(lo, end)) for end in value)
        st.session_state[key] = (first, last)
        st.warning(f"The link's {shown(name, raw)}: {has}, showing {first}–{last}.")
        return
    if lo <= value <= hi:
        return
    nearest = min(hi, max(lo, value))
    st.session_state[key] = nearest
    which = f"no {param.noun} {value}" if value < HUGE else f"no such {param.noun}"
    st.warning(f"The link's {shown(name, raw)}: this {param.within} has {which} ({param.noun}s {lo}–{hi}), "
               f"showing {nearest}.")


def choice_box(link: Link, label: str, options: list[int], key: str, default: int | None = None) -> int:
    """ui.choice_box, after check_asked: a value the link asked for that the options lack is clamped with a
    warning."""
    from attnviz import ui

    check_asked(link, key, options)
    return ui.choice_box(label, options, key, default)


def write(link: Link, view: Mapping[str, object]) -> None:
    """Puts the view into the URL (only when the page's keys changed) and remembers it as the page's own link."""
    view = {k: str(v) for k, v in view.items()}
    if link_key(link, st.query_params.to_dict()) != link_key(link, view):
        st.query_params.from_dict(view)
    st.session_state[link.state("seen")] = link_key(link, view)


def forget_model(link: Link) -> None:
    """Takes the model out of the URL when the page could not open the one chosen (a refused folder, a model that
    failed to load): a copied link then names no model rather than the last one that worked."""
    if "model" in st.query_params:
        query = {k: v for k, v in st.query_params.to_dict().items() if k != "model"}
        st.query_params.from_dict(query)
        st.session_state[link.state("seen")] = link_key(link, query)
