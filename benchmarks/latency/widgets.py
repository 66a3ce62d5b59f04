"""A page's widgets, found in its DOM by Streamlit's data-testid attributes, and one move of each to a value it has
not had (benchmarks/browser_latency.py times the moves)."""

from __future__ import annotations

from dataclasses import dataclass

TIMED = ("Slider", "Selectbox", "MultiSelect", "Radio", "NumberInput", "Checkbox", "Toggle")
SKIPPED = {  # kinds found and left out, with the reason printed
    "Button": "a button: it starts long work (a capture, a run, training), not a view change",
    "TextArea": "text entry, not a move to a value",
    "TextInput": "text entry, not a move to a value",
    "FileUploader": "a file upload, not a move to a value",
}

# Every widget in view (a widget in a closed tab or a collapsed expander has no box), in page order; each is marked
# data-lat="<n>" for the locator. key: the Streamlit key (the container's st-key-<key> class).
DISCOVER = """(kinds) => {
    document.querySelectorAll('[data-lat]').forEach(e => e.removeAttribute('data-lat'));
    const out = [];
    for (const e of document.querySelectorAll(kinds.map(k => `[data-testid="st${k}"]`).join(','))) {
        if (!e.getClientRects().length) continue;
        let kind = e.dataset.testid.slice(2);
        if (kind === 'Checkbox' && e.querySelector('input[role="switch"]')) kind = 'Toggle';
        const box = e.closest('[class*="st-key-"]');
        const key = box ? [...box.classList].find(c => c.startsWith('st-key-')).slice(7) : '';
        const named = e.querySelector('input[aria-label]') || e.querySelector('[role="radiogroup"][aria-label]');
        const label = e.querySelector('[data-testid="stWidgetLabel"]');
        const text = (named && named.getAttribute('aria-label')) || (label && label.innerText.trim())
            || e.innerText.trim().split('\\n')[0];
        const main = e.querySelector('input, textarea, button');
        e.setAttribute('data-lat', String(out.length));
        out.push({n: out.length, kind, key, label: text.replace(/\\s+/g, ' ').slice(0, 70),
                  disabled: !!(main && main.disabled)});
    }
    return out;
}"""


class NoMove(Exception):
    """The widget has no other value to move to."""


@dataclass(frozen=True)
class Widget:
    n: int  # its data-lat mark in the latest discovery
    kind: str
    key: str
    label: str
    disabled: bool

    @property
    def ident(self) -> str:
        return self.key or f"{self.kind}:{self.label}"

    @property
    def name(self) -> str:
        return f"{self.label} ({self.kind.lower()}{', ' + self.key if self.key else ''})"

    def skip_reason(self) -> str | None:
        if self.kind in SKIPPED:
            return SKIPPED[self.kind]
        if self.disabled:
            return "disabled at the page's defaults"
        if self.kind == "Selectbox" and self.label.startswith("Model"):  # attnviz.ui.model_picker's labels
            return "picks another model: a load and a capture, not a view change"
        return None


def discover(page) -> list[Widget]:
    return [Widget(**w) for w in page.evaluate(DISCOVER, list(TIMED[:-1]) + list(SKIPPED))]


def element(page, widget: Widget):
    return page.locator(f'[data-lat="{widget.n}"]')


def move(page, widget: Widget, seen: set[str]) -> None:
    """One change of the widget to a value not in `seen` where it has one (a checkbox or toggle has two values: it
    flips), adding it to `seen`. NoMove when there is no other value."""
    el = element(page, widget)
    {"Slider": _slider, "Selectbox": _selectbox, "MultiSelect": _multiselect, "Radio": _radio,
     "NumberInput": _number, "Checkbox": _flip, "Toggle": _flip}[widget.kind](page, el, seen)


def _slider(page, el, seen: set[str]) -> None:
    """A step right, to values not had yet; at the right end, Home (the left end), then on right from there."""
    thumb = el.locator('input[type="range"]').first
    value, low, high = thumb.evaluate("i => [i.value, i.min, i.max]")
    if float(low) == float(high):
        raise NoMove("a slider with one value")
    seen.add(value)
    thumb.press("ArrowRight" if float(value) < float(high) else "Home")


def _pick(names: list[str], current: str, seen: set[str]) -> int:
    seen.add(current)
    fresh = [i for i, name in enumerate(names) if name not in seen]
    others = [i for i, name in enumerate(names) if name != current]
    if not fresh and not others:
        raise NoMove("no other option")
    i = (fresh or others)[0]
    seen.add(names[i])
    return i


def _open_list(page, field):
    """Opens a select box's list (a click; where that opened none, as near the window's edge, ArrowDown): its
    options in view."""
    field.click()
    options = page.locator('[role="option"]:visible')
    try:
        options.first.wait_for(timeout=2_000)
    except Exception:
        field.press("ArrowDown")
        options.first.wait_for(timeout=5_000)
    return options


def _selectbox(page, el, seen: set[str]) -> None:
    field = el.locator('input[role="combobox"]')
    current = field.input_value()
    options = _open_list(page, field)
    names = [name.strip() for name in options.all_inner_texts()]  # the list is virtualised: the first ones shown
    try:
        i = _pick(names, current, seen)
    except NoMove:
        page.keyboard.press("Escape")
        raise
    options.nth(i).click()


def _multiselect(page, el, seen: set[str]) -> None:
    """Adds the first option not chosen (the list offers only those; "Select all" is not one)."""
    options = _open_list(page, el.locator('input[role="combobox"]'))
    names = [name.strip() for name in options.all_inner_texts()]
    fresh = [i for i, name in enumerate(names) if name != "Select all"]
    if not fresh:
        page.keyboard.press("Escape")
        raise NoMove("every option is chosen")
    seen.add(names[fresh[0]])
    options.nth(fresh[0]).click()


def _radio(page, el, seen: set[str]) -> None:
    options = el.locator('[data-testid="stRadioOption"]')
    names = [name.strip() for name in options.all_inner_texts()]
    current = next(name for name, on in zip(names, options.evaluate_all(
        "os => os.map(o => o.querySelector('input').checked)")) if on)
    options.nth(_pick(names, current, seen)).click()


def _number(page, el, seen: set[str]) -> None:
    field = el.locator("input").first
    seen.add(field.input_value())
    up, down = (el.locator(f'[data-testid="stNumberInputStep{way}"]') for way in ("Up", "Down"))
    if not up.is_disabled():
        up.click()
    elif not down.is_disabled():
        down.click()
    else:
        raise NoMove("a number input with one value")


def _flip(page, el, seen: set[str]) -> None:
    el.locator("label").first.click()


def radio_options(page, widget: Widget) -> list[str]:
    return [name.strip() for name in element(page, widget).locator('[data-testid="stRadioOption"]').all_inner_texts()]


def choose_radio(page, widget: Widget, index: int) -> None:
    element(page, widget).locator('[data-testid="stRadioOption"]').nth(index).click()


OPEN_EXPANDERS = """() => {
    let opened = 0;
    for (const d of document.querySelectorAll('[data-testid="stExpander"] details:not([open])')) {
        if (d.getClientRects().length) { d.querySelector('summary').click(); opened += 1; }
    }
    return opened;
}"""


def open_expanders(page) -> int:
    """Opens every collapsed expander in view (in the browser only: no rerun), so that its widgets have a box."""
    return page.evaluate(OPEN_EXPANDERS)


def tabs(page) -> list[str]:
    """The names of the tabs in view."""
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid="stTabs"] [role="tab"]')]
        .filter(t => t.getClientRects().length).map(t => t.innerText.trim())""")


def open_tab(page, name: str) -> None:
    page.locator('[data-testid="stTabs"] [role="tab"]:visible', has_text=name).first.click()


def radio_choice(page, widget: Widget) -> int:
    """The index of the radio's chosen option."""
    return element(page, widget).locator('[data-testid="stRadioOption"] input').evaluate_all(
        "inputs => inputs.findIndex(i => i.checked)")
