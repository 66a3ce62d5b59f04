"""Odd links never break a page. Over 200 distinct query strings, made from a fixed seed (unknown keys, huge,
negative and fractional numbers, empty values, ../ and absolute model names, non-UTF-8 percent escapes, NUL bytes,
100 kB values, repeated keys), are sent to every page of attnviz.ui.PAGES, each page getting many of them. Every
run ends without an exception; no message shows a path of this server or an exception's text, nor echoes a long
value back; every value the test itself judges odd (its own account of what each page's link takes, below) gets a
warning naming its key; a layer, head or token past what the model or text has is shown clamped to the last one,
with a warning; pages that read no link ignore the query quietly.

Query strings are decoded as Streamlit decodes a browser's (urllib.parse.parse_qs: invalid UTF-8 becomes U+FFFD).
Toy models only: the Heads page's own default (a real model) is replaced in the session before the link is read."""

from __future__ import annotations

import math
import random
import re
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, quote

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui import CUSTOM_MODEL, MAX_TEXT_CHARS, PAGES

pytestmark = pytest.mark.slow  # hundreds of odd links, each page run in AppTest

ROOT = Path(__file__).resolve().parent.parent
SEED = 2024
N_CASES = 280
TIMEOUT_S = 120
TOYS = ("toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi")
REGISTERED = {*TOYS, "minilm-l6", "smollm2-135m"}
VIEWS = ("Generation", "Knock-outs", "Rollout", "Norm-based attention")
TABS = ("grid", "head", "token", "predict", "stats", "induction", "corpus", "compare", "export")
# What each page's link takes, by kind: "model", "text", "index" (a whole number from 0 that the model or text
# bounds), "range" (first-last), "flag" (0 or 1), "temperature" (0 to 2 in steps of 0.1), a (lo, hi) pair of whole
# numbers, or the tuple of words it accepts. Pages not named here read no link.
READS = {
    "heads": {"model": "model", "text": "text", "layer": "index", "head": "index", "query": "index",
              "layers": "range", "boost": "flag", "sink": "flag", "tab": TABS},
    "experiments": {"model": "model", "text": "text", "prompt": "text", "layer": "index", "head": "index",
                    "query": "index", "step": "index", "new": (1, 64), "seed": (0, 1_000_000),
                    "temperature": "temperature", "view": VIEWS, "mode": ("zero", "mean")},
    "corpus": {"run": "text", "b": "text", "stat": ("entropy", "sink_mass", "induction"), "window": (1, 10**9),
               "layer": "index", "head": "index", "order": ("high", "low")},
    "sinks": {"model": "model", "text": "text", "layer": "index", "head": "index", "sink": "flag"},
}
WIDGETS = {"heads": {"layer": "heads_layer", "head": "heads_head", "query": "heads_query"},
           "experiments": {"layer": "exp_layer", "head": "exp_head", "query": "exp_query"},
           "sinks": {"layer": "sinks_layer", "head": "sinks_head"}}
UNKNOWN_KEYS = ("zz", "utm_source", "Model", "HEAD", "layer%5B%5D", "%ff%fe", "", "a%00b", "page", "x" * 60)
ODD = ("-1", "-0", "-42", "1" + "0" * 30, "9" * 25, "1e30", "1.5", "0.15", "-0.0", "nan", "inf", "", "%20",
       "+", "abc", "%ff%fe", "%00", "1%002", "0x1f", "%D9%A3", "%EF%BC%93", "..%2F..%2Fetc", "../../etc",
       "%2Fetc%2Fpasswd", "/etc/passwd", "%7E%2F.ssh", "C:%5CWindows%5Csystem32", "lab%2F..%2F..%2Fetc", "lab/",
       "lab/%00", "%3Cscript%3Ealert(1)%3C%2Fscript%3E", "%60x%60", "**bold**", "%5Bx%5D(http%3A%2F%2Fa)",
       "3-5", "5-3", "-1-2", "0-999", "1-", "1-2-3", "toy-gpt2%00", "%20toy-gpt2%20", "Rollout%00", "1%0A2")
BIG = ("a" * 100_000, "9" * 100_000, "..%2F" * 20_000, "%ff" * 33_000, "%00" * 33_000)
SERVER_MARKERS = tuple(m for m in {str(ROOT), sys.prefix, str(Path.home()) + "/", tempfile.gettempdir() + "/",
                                   "site-packages", "Traceback (most recent", 'File "'} if len(m) > 2)


def _valid(rng: random.Random, kind) -> str:
    if kind == "model":
        return rng.choice(TOYS)
    if kind == "text":
        return quote(rng.choice(["abcabc abcabc", "The cat sat.", "x", "Ünïcödé ✓ 🙂", "a\nb"]))
    if kind == "index":
        return str(rng.randrange(0, 8))
    if kind == "range":
        return rng.choice(["0-1", "1-1", "0-0"])
    if kind == "flag":
        return rng.choice("01")
    if kind == "temperature":
        return rng.choice(["0", "0.5", "1.2"])
    if isinstance(kind[0], int):
        return str(rng.randint(*kind))
    return quote(rng.choice(kind))


def _case(rng: random.Random, reads: dict) -> str:
    """One raw query string: one to four keys, mostly ones the page reads (or, for a page that reads none, ones
    another page reads), half of their values odd."""
    known = sorted({k for page in READS.values() for k in page})
    parts = []
    for _ in range(rng.randint(1, 4)):
        draw = rng.random()
        key = (rng.choice(sorted(reads)) if reads and draw < 0.65 else rng.choice(known) if draw < 0.85 else
               rng.choice(UNKNOWN_KEYS))
        kind = reads.get(key) or READS["heads"].get(key) or READS["experiments"].get(key) or "text"
        draw = rng.random()
        value = rng.choice(BIG) if draw < 0.06 else rng.choice(ODD) if draw < 0.55 else _valid(rng, kind)
        parts.append(f"{key}={value}")
        if rng.random() < 0.12:  # the same key again
            parts.append(f"{key}={rng.choice(ODD) if rng.random() < 0.5 else _valid(rng, kind)}")
    return "&".join(parts)


# Each meets every key a page reads (but the model, below) in _pinned; None stands for a valid value.
ESSENTIAL = ("-1", "1" + "0" * 30, "1.5", "", "%ff%fe", "%00", "../../etc", "a" * 100_000, "999", None)


def _pinned(name: str, rng: random.Random) -> list[str]:
    """Cases that make sure every key the page reads meets every essential odd value: a Latin square, case j
    giving key i the value j + i. The model stays the page's toy (an odd one stops the page before its widgets:
    the random cases and tests/test_links.py send those). Experiments: each view with indices past the end."""
    keys = sorted(k for k in READS[name] if k != "model")
    cases = ["&".join(f"{key}={_valid(rng, READS[name][key]) if value is None else value}"
                      for key, value in ((key, ESSENTIAL[(i + j) % len(ESSENTIAL)]) for i, key in enumerate(keys)))
             for j in range(len(ESSENTIAL))]
    if name == "experiments":
        cases += [f"view={quote(view)}&layer=999&head=-1&query={'9' * 40}&step=999" for view in VIEWS]
    return cases


def _schedule() -> list:
    """The pages in turn, those that read a link twice as often."""
    order = []
    for page in PAGES:
        order += [page] * (2 if page.url_path in READS else 1)
    return order


def _cases() -> dict[str, list[str]]:
    rng = random.Random(SEED)
    order = _schedule()
    by_page = {p.url_path: _pinned(p.url_path, rng) if p.url_path in READS else [] for p in PAGES}
    made = {raw for cases in by_page.values() for raw in cases}
    while len(made) < N_CASES:
        page = order[len(made) % len(order)]
        raw = _case(rng, READS.get(page.url_path, {}))
        if raw not in made:
            made.add(raw)
            by_page[page.url_path].append(raw)
    return by_page


CASES = _cases()


def _decoded(raw: str) -> dict[str, list[str]]:
    return parse_qs(raw, keep_blank_values=True)  # as Streamlit reads a browser's query string


def _number(v: str) -> float:
    """A whole number's value (math.inf past 18 digits: int() refuses 4,300 and more)."""
    return int(v) if len(v.lstrip("-")) <= 18 else math.copysign(math.inf, -1 if v.startswith("-") else 1)


def _odd(kind, value: str) -> bool:
    """The test's own judgement: does a page have to say something about this value, whatever the model?"""
    v = value.strip()
    if kind == "text":
        return len(value) > MAX_TEXT_CHARS
    if kind == "model":
        return v not in REGISTERED
    if kind == "index":
        return not re.fullmatch(r"-?[0-9]+", v) or _number(v) < 0
    if kind == "range":
        ends = re.fullmatch(r"([0-9]+)-([0-9]+)", v)
        return not ends or _number(ends[1]) > _number(ends[2])
    if kind == "flag":
        return v not in ("0", "1")
    if kind == "temperature":
        try:
            t = float(v)
        except ValueError:
            return True
        return not math.isfinite(t) or not 0 <= t <= 2 or abs(t * 10 - round(t * 10)) > 1e-9
    if isinstance(kind[0], int):
        return not re.fullmatch(r"-?[0-9]+", v) or not kind[0] <= _number(v) <= kind[1]
    return v not in kind


def _run(page, query: dict[str, list[str]]) -> AppTest:
    home = page.default  # Home links every page: it runs only inside app.py's navigation
    at = AppTest.from_file(str(ROOT / ("app.py" if home else page.script)), default_timeout=TIMEOUT_S)
    texts = [v for k in ("text", "prompt") for v in query.get(k, [])]
    if page.url_path == "sinks":  # toy models only: the page's own default is a real model
        at.session_state["sinks_model"] = "toy-gpt2"
    if page.url_path == "heads":
        # toy models only; and a text over 1,000 characters is not run at all (the page captures any text up to
        # the model's context, a long wait that is no part of reading a link): the picker then waits for a name
        long_text = any(len(t) > 1_000 for t in texts)
        at.session_state["heads_model"] = CUSTOM_MODEL if long_text else "toy-gpt2"
        if long_text:
            query = {k: v for k, v in query.items() if not (k == "model" and v[-1].strip() in REGISTERED)}
    for key, values in query.items():
        at.query_params[key] = values[0] if len(values) == 1 else values
    at.run()
    return at


def _check(page, raw: str, query: dict[str, list[str]], at: AppTest) -> None:
    where = f"{page.url_path}?{raw[:300]}"
    assert not at.exception, f"{where}: {at.exception}"
    alerts = [e.value for kind in ("warning", "error", "info", "success") for e in getattr(at, kind)]
    shown = alerts + [m.value for m in at.markdown] + [c.value for c in at.caption]
    for text in shown:
        leaked = [m for m in SERVER_MARKERS if m in text]
        assert not leaked, f"{where}: {leaked} in {text[:300]!r}"
    long_values = [v for values in query.values() for v in values if len(v) > 100]
    for text in alerts:
        assert len(text) < 1_000, f"{where}: a message of {len(text):,} characters"
        assert not any(v[:100] in text for v in long_values), f"{where}: a long value echoed in {text[:200]!r}"
    assert all(len(w.value or "") <= 1_000 for w in at.text_input), where
    assert all(len(w.value or "") <= MAX_TEXT_CHARS for w in at.text_area), where
    reads = READS.get(page.url_path)
    if reads is None:
        assert not any("link" in a.lower() for a in alerts), f"{where}: a page with no link spoke of it"
        return
    warnings = [w.value for w in at.warning]
    for key, values in query.items():
        if key in reads and (len(values) > 1 or _odd(reads[key], values[-1])):
            assert any(f"`{key}" in w for w in warnings), f"{where}: nothing said about {key}={values[-1][:50]!r}"
    for key, widget_key in WIDGETS.get(page.url_path, {}).items():
        asked = query.get(key, [""])[-1].strip()
        boxes = [b for b in at.selectbox if b.key == widget_key]
        if not re.fullmatch(r"[0-9]+", asked) or not boxes:
            continue
        options = [int(o) for o in boxes[0].options]
        if _number(asked) > options[-1]:  # past the last: shown clamped, and said
            assert boxes[0].value == options[-1], f"{where}: {key} shows {boxes[0].value}"
            assert any(f"`{key}=" in w for w in warnings), f"{where}: the {key} clamp was not said"
        elif _number(asked) in options and len(query[key]) == 1:
            assert boxes[0].value == int(asked), f"{where}: {key} shows {boxes[0].value}, asked {asked}"


def test_the_cases_are_many_distinct_and_reach_every_page():
    assert sum(len(c) for c in CASES.values()) == N_CASES >= 200
    assert len({raw for cases in CASES.values() for raw in cases}) == N_CASES
    assert min(len(c) for c in CASES.values()) >= 15
    values = [v for cases in CASES.values() for raw in cases for vs in _decoded(raw).values() for v in vs]
    for odd in ("-1", "1" + "0" * 30, "1.5", "", "../../etc", "/etc/passwd", "\ufffd\ufffd", "\x00", "a" * 100_000):
        assert odd in values, repr(odd[:20])
    assert any(len(vs) > 1 for cases in CASES.values() for raw in cases for vs in _decoded(raw).values())
    for name, reads in READS.items():  # the pages that read a link get many of their own keys, odd and not
        keys = [k for raw in CASES[name] for k in _decoded(raw) if k in reads]
        assert len(keys) >= 40 and len(set(keys)) == len(reads), (name, sorted(set(reads) - set(keys)))


@pytest.mark.parametrize("page", PAGES, ids=[p.url_path for p in PAGES])
def test_odd_links_never_break_a_page(page):
    for raw in CASES[page.url_path]:
        query = _decoded(raw)
        _check(page, raw, query, _run(page, query))
