"""Seconds from a widget change until the page is idle again, for every widget of every page, in a real browser
(headless Chromium).

Starts Streamlit on 127.0.0.1 (port 8641, or --port), opens each page of attnviz.ui.PAGES by its deep link on the
page's defaults (its default model; the Heads page on toy-gpt2), lets its first run finish (captures and caches
warm), then finds the page's widgets in its DOM by Streamlit's data-testid attributes (stSlider, stSelectbox,
stMultiSelect, stRadio, stNumberInput, stCheckbox; a toggle is an stCheckbox whose input has role="switch"), so a
widget added to a page is timed the next run. Every widget in view is moved REPEAT times, each time to a value it
has not had (a slider a step on, a select box or radio an option not chosen yet, a number input a step up; a
checkbox or toggle flips), radios last; then every tab is opened and every option of every radio chosen (not timed),
and the widgets this brings into view are timed the same way. Collapsed expanders are opened first (in the browser
only). Left out, and listed with the reason: buttons (they start long work: a capture, a corpus run, training),
model pickers (a new model is a load and a capture, not a view change), text areas, text inputs and file uploaders,
and widgets disabled at the defaults.

Each move is timed until the server has answered, the app reports its script has stopped running, no skeleton is
left, every chart in view is drawn, and that has held for three polls 50 ms apart (the idle rule of
tests/test_browser.py, polled finer; the three quiet polls are not counted). Two clocks: "driver" starts before
playwright makes the change (so it includes the automation itself: opening a select box, clicking an option),
"input" starts at the browser's own timestamp of the input event that makes the change (the last pointerdown or
keydown) and ends at the browser's timestamp of the first idle poll: what a person at the page waits for.

The sliders plotly draws inside a chart (the instant ones: frames or trace groups switched by the browser,
attnviz.figures.instant) are found in every chart in view and timed apart: a click on a stop not clicked yet, REPEAT
times, from the pointerdown to the first paint after plotly applied the stop, with the messages the page sent the
server meanwhile (benchmarks/latency/charts.py). Their table has its own goal: 0.1 s, and no message.

Beside the table: the float32 matmul rate measured first (benchmarks/longcontext.matmul_rate) and the load average
after each widget. Rows whose median input -> idle is over the goal (0.5 s) are marked.

Besides the pages at their defaults, two views of the Heads page on ~1,800 tokens of smollm2-135m (the shipped text
repeated): layers 0-14 (the dense pattern store, 1.7 GiB; heads-1800-dense) and every layer (the qk store;
heads-1800-qk).

    python benchmarks/browser_latency.py [--port 8641] [--repeat 3] [--page positional] [--page variants] ...
    python benchmarks/browser_latency.py --quick    one widget (the Positional page's first), once
    python benchmarks/browser_latency.py --busy-cores 1    the same with one core kept busy all along (on 2 cores:
        about half the matmul rate, as on a slower or shared machine)
    python benchmarks/browser_latency.py --page heads --tab head --limit 4    the Heads page's layer, head, boost
        and sink changes with its One head tab open (--tab: the tab a Heads view opens on, by its link's slug)
    python benchmarks/browser_latency.py --page softmax --open-tab "Against d_k"    the controls above a page's tabs
        timed with another tab open than the first (--open-tab: a tab's label, clicked once the page is drawn)
    python benchmarks/browser_latency.py --page heads-1800-dense --pause 2    each move made 2 s after the page was
        idle, as a person reads it first (the default, 0, moves back to back: the worst case for what a page
        builds ahead in the background)

A page that fails is reported with a screenshot, the others are still measured, and the run exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.latency.idle import COUNT_MESSAGES, answered, settle, untimed, wait_idle, watch  # noqa: E402
from benchmarks.latency.charts import chart_sliders, click_stop, next_stop  # noqa: E402
from benchmarks.latency.widgets import (  # noqa: E402
    NoMove, Widget, choose_radio, discover, move, open_expanders, open_tab, radio_choice, radio_options, tabs)

# Widgets whose moves run the model again (a new capture or forward pass over the text), unless built ahead: their
# rows say so beside OVER, and the count of rows over the goal gives them apart. A forward of a 135M-parameter model
# over 1,800 tokens is seconds on 2 cores; no view of its result can answer in 0.5 s. (The layer range's start moved
# right narrows the range: a slice of the capture already made, no new work; a widened range runs the model.)
NEW_WORK = {
    "heads_layer_range": "new work where the range widens: a capture of other layers",
    "heads_induction_length": "new work: a forward pass over a new random sequence, unless built ahead",
    "heads_induction_seed": "new work: a forward pass over a new random sequence, unless built ahead",
    "heads_compare_mode": "new work where it moves to Two texts: a capture of text B",
    "exp_new": "new work: the model generates the tokens again",
    "exp_temperature": "new work: the model generates the tokens again",
    "exp_seed": "new work: the model generates the tokens again",
}
MODEL = "smollm2-135m"
N_TOKENS = 1_800
GOAL_S = 0.5
CHART_GOAL_S = 0.1  # an in-chart slider: drawn by the browser, no message to the server


def long_text(n_tokens: int) -> str:
    """The shipped text repeated, cut to n_tokens of smollm2's tokenizer (benchmarks/longcontext.py's text)."""
    from attnviz.models import load_model
    from benchmarks.longcontext import long_text as cut

    return cut(n_tokens, load_model(MODEL).tokenizer)


def targets() -> dict[str, tuple[str, str, callable]]:
    """{name: (title, url path, its query's parameters (a function: the long text is made only when asked))}."""
    from attnviz.ui import PAGES

    def heads(layers):
        return lambda: {"model": MODEL, "text": long_text(N_TOKENS), "layer": "10", "head": "0", "boost": "1",
                        "sink": "0", **({"layers": layers} if layers else {})}

    out = {p.url_path: (p.title, p.url_path, dict) for p in PAGES}
    out["heads"] = ("Heads", "heads", lambda: {"model": "toy-gpt2"})  # the toy model: its default text, at once
    out["heads-1800-dense"] = (f"Heads, {N_TOKENS:,} tokens, layers 0-14 (dense store)", "heads", heads("0-14"))
    out["heads-1800-qk"] = (f"Heads, {N_TOKENS:,} tokens, every layer (qk store)", "heads", heads(None))
    return out


@dataclass
class Run:
    """One page's timings and what was left out."""
    title: str
    repeat: int
    limit: int | None
    pause: float = 0.0  # seconds between the page's idle and the next move (a reader)
    rows: list = field(default_factory=list)  # (page, widget, [(driver s, input s)], load average)
    skipped: list = field(default_factory=list)  # (page, widget, why)
    chart_rows: list = field(default_factory=list)  # (page, slider, [(seconds, messages sent)])
    failed: list = field(default_factory=list)  # (page, widget, what went wrong)
    done: set = field(default_factory=set)  # widget idents timed or left out
    explored: set = field(default_factory=set)  # radios and tabs whose every option was opened
    seen: dict = field(default_factory=dict)  # widget ident: the values it has had
    flipped: list = field(default_factory=list)  # checkboxes and toggles its moves left changed (idents)

    def full(self) -> bool:
        return self.limit is not None and len(self.rows) >= self.limit


def find(page, ident: str) -> Widget | None:
    return next((w for w in discover(page) if w.ident == ident), None)


def time_widget(page, run: Run, widget: Widget) -> list[tuple[float, float]]:
    """REPEAT moves of the widget, each timed (fewer when a move took it out of view). A widget that answers no
    move while checkboxes or toggles moved before it are left changed (one disables it: the kernel's causal mask its
    window) is timed again with them set back, and they are then changed again (untimed), for what they bring into
    view."""
    times = _moves(page, run, widget)
    if run.flipped and times and all(math.isnan(t[1]) for t in times):
        flipped, run.flipped = run.flipped, []
        _flip(page, flipped[::-1])  # the last changed first: an earlier one may hide or disable it
        times = _moves(page, run, widget)
        _flip(page, flipped)
        run.flipped = flipped
    if widget.kind in ("Checkbox", "Toggle") and sum(not math.isnan(t[1]) for t in times) % 2:
        run.flipped.append(widget.ident)
    return times


def _flip(page, idents: list[str]) -> None:
    """Flips each of these checkboxes and toggles once, untimed."""
    for ident in idents:
        if (now := find(page, ident)) is not None:
            untimed(page, lambda: move(page, now, set()))  # called at once


def _moves(page, run: Run, widget: Widget) -> list[tuple[float, float]]:
    seen = run.seen.setdefault(widget.ident, set())
    times = []
    for _ in range(run.repeat):
        now = find(page, widget.ident)
        if now is None:
            break
        time.sleep(run.pause)
        watch(page)
        started = time.perf_counter()
        move(page, now, seen)
        if not answered(page):  # the page ignored the move (disabled, or already at its limit): nothing to time
            times.append((math.nan, math.nan))
            continue
        times.append(wait_idle(page, started, 600))
    return times


def time_charts_in_view(page, run: Run) -> None:
    """Clicks REPEAT stops of every in-chart slider in view not timed yet (benchmarks/latency/charts.py)."""
    for slider in chart_sliders(page):
        if slider.ident in run.done or slider.stops < 2:
            continue
        run.done.add(slider.ident)
        seen, current, times = {slider.active}, slider.active, []
        try:
            for _ in range(run.repeat):
                current = next_stop(slider, seen, current)
                seen.add(current)
                times.append(click_stop(page, slider, current))
        except Exception as exc:  # the page's other sliders are still timed
            run.failed.append((run.title, slider.name, f"{type(exc).__name__}: {(str(exc) or '-').splitlines()[0]}"))
        if times:
            run.chart_rows.append((run.title, slider.name, times))


def time_in_view(page, run: Run) -> None:
    """Times every in-chart slider and every widget in view not timed yet, radios last (a radio changes what is in
    view), and the widgets that its moves bring into view."""
    time_charts_in_view(page, run)
    while not run.full():
        open_expanders(page)
        fresh = [w for w in discover(page) if w.ident not in run.done]
        if not fresh:
            return
        widget = min(fresh, key=lambda w: w.kind == "Radio")  # the first in page order that is not a radio
        run.done.add(widget.ident)
        if reason := widget.skip_reason():
            run.skipped.append((run.title, widget.name, reason))
            continue
        try:
            times = time_widget(page, run, widget)
        except NoMove as exc:
            run.skipped.append((run.title, widget.name, str(exc)))
            continue
        except Exception as exc:  # the page's other widgets are still timed
            page.keyboard.press("Escape")
            run.failed.append((run.title, widget.name, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
            continue
        if times:
            run.rows.append((run.title, widget.name, times, os.getloadavg()[0]))
            say(run.rows[-1])


def explore(page, run: Run) -> None:
    """time_in_view, then the same in every tab and every option of every radio in view (opened, not timed)."""
    time_in_view(page, run)
    for name in tabs(page):
        if run.full() or f"tab:{name}" in run.explored:
            continue
        run.explored.add(f"tab:{name}")
        untimed(page, lambda: open_tab(page, name))  # called at once; the Heads page's tabs rerun it
        explore(page, run)
    for radio in [w for w in discover(page) if w.kind == "Radio"]:
        if run.full() or radio.ident in run.explored:
            continue
        run.explored.add(radio.ident)
        for i in range(len(radio_options(page, radio))):
            now = find(page, radio.ident)
            if now is None or run.full():
                break
            if radio_choice(page, now) != i:
                untimed(page, lambda: choose_radio(page, now, i))  # called at once
            explore(page, run)


def say(row) -> None:
    page, widget, times, load = row
    print(f"{page}: {widget}: driver {', '.join(f'{t[0]:.2f}' for t in times)} s; input "
          f"{', '.join(f'{t[1]:.2f}' for t in times)} s; load {load:.1f}", file=sys.stderr, flush=True)


def measure(page, url: str, target, run: Run, tab: str | None = None, open_label: str | None = None) -> None:
    title, path, query = target
    params = query()
    if tab and path == "heads":
        params = {**params, "tab": tab}
    page.goto(f"{url}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else ""))
    page.wait_for_selector('[data-testid="stSidebarNavLink"]', timeout=600_000)
    settle(page, 1200)  # the first run, a capture included (not timed)
    if open_label:
        untimed(page, lambda: open_tab(page, open_label))
    explore(page, run)


def run_pages(names: list[str], args) -> list[Run]:
    from playwright.sync_api import sync_playwright

    from tests.servers import CHROMIUM_ARGS, streamlit_server  # the browser tests' server and Chromium flags

    every = targets()
    runs = []
    # --server.fileWatcherType none: a file saved during the run must not reload modules under it
    with streamlit_server(port=args.port, options=("--server.fileWatcherType", "none")) as (url, _):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 1300})
            context.add_init_script(COUNT_MESSAGES)
            page = context.new_page()
            for name in names:
                title = every[name][0] + (f" ({args.tab} tab)" if args.tab and every[name][1] == "heads" else "") \
                    + (f" (tab {args.open_tab} open)" if args.open_tab else "")
                run = Run(title, args.repeat, args.limit, args.pause)
                runs.append(run)
                try:
                    measure(page, url, every[name], run, args.tab, args.open_tab)
                except Exception as exc:  # the other pages are still measured
                    traceback.print_exc()
                    shot = f"browser-latency-{name}-failed.png"
                    page.screenshot(path=shot, full_page=True)
                    run.failed.append((run.title, "(the page)", f"{type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0]}; screenshot {shot}"))
            browser.close()
    return runs


def table(runs: list[Run], repeat: int, rate: float, load_before: float, busy: int = 0) -> None:
    print(f"float32 matmul rate measured first: {rate / 1e9:.0f} GFLOP/s; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs"
          + (f", {busy} of them kept busy by a spinning process throughout" if busy else "")
          + (f"; each move {runs[0].pause:g} s after the page was idle" if runs and runs[0].pause else "")
          + f"; {repeat} runs of each widget; goal {GOAL_S} s from input to idle")
    print("| page | widget | input -> idle, median s | driver -> idle, median s | input -> idle, all runs (s) | "
          "load | over the goal |")
    print("|---|---|---|---|---|---|---|")
    over = new_work = 0
    for run in runs:
        for page, widget, times, load in run.rows:
            timed = [t for t in times if not math.isnan(t[1])]
            runs_text = ", ".join("no rerun" if math.isnan(t[1]) else f"{t[1]:.2f}" for t in times)
            if not timed:  # every move ignored: the row says so, and no figure is made up
                print(f"| {page} | {widget} | no rerun | no rerun | {runs_text} | {load:.1f} |  |")
                continue
            median = statistics.median(t[1] for t in timed)
            why = next((text for key, text in NEW_WORK.items() if widget.endswith(f", {key})")), "")
            over += median > GOAL_S
            new_work += median > GOAL_S and bool(why)
            mark = ("OVER" + (f" ({why})" if why else "")) if median > GOAL_S else ""
            print(f"| {page} | {widget} | {median:.2f} | {statistics.median(t[0] for t in timed):.2f} | "
                  f"{runs_text} | {load:.1f} | {mark} |")
    print(f"{sum(len(r.rows) for r in runs)} widgets timed, {over} over the goal"
          + (f", {new_work} of them new work (the model run again)" if new_work else ""))
    chart_table(runs)
    for kind, what in (("left out", "skipped"), ("failed", "failed")):
        lines = [row for run in runs for row in getattr(run, what)]
        if lines:
            print(f"{kind}:")
            for page, widget, why in lines:
                print(f"  {page}: {widget}: {why}")


def chart_table(runs: list[Run]) -> None:
    """The in-chart sliders: seconds from the click to the first paint after plotly applied the stop, and the
    messages the page sent the server meanwhile (none, for a slider the browser draws by itself)."""
    rows = [row for run in runs for row in run.chart_rows]
    if not rows:
        return
    print(f"\nIn-chart sliders (drawn by the browser): goal {CHART_GOAL_S} s from the click to the redraw, no "
          "message to the server")
    print("| page | in-chart slider | click -> drawn, median s | all runs (s) | messages sent | over the goal |")
    print("|---|---|---|---|---|---|")
    over = 0
    for page, slider, times in rows:
        median = statistics.median(t for t, _ in times)
        sent = sum(n for _, n in times)
        bad = median > CHART_GOAL_S or sent > 0
        over += bad
        print(f"| {page} | {slider} | {median:.3f} | {', '.join(f'{t:.3f}' for t, _ in times)} | {sent} | "
              f"{'OVER' if bad else ''} |")
    print(f"{len(rows)} in-chart sliders timed, {over} over the goal")


@contextlib.contextmanager
def busy_cores(n: int):
    """n processes that each keep a core busy (a loop with no end) while the block runs, yielded: another program's
    work on a shared machine, or a slower one."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(2.0 if n else 0.0)  # the load average starts to show them
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    names = list(targets())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8641)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--page", choices=names, action="append", help="time this page only (repeatable)")
    parser.add_argument("--limit", type=int, help="time at most this many widgets of each page")
    parser.add_argument("--quick", action="store_true", help="one widget, once: the Positional page's first")
    parser.add_argument("--tab", help="the tab the Heads views open on, by its link's slug (grid, head, token, ...)")
    parser.add_argument("--open-tab", help="a tab's label, opened on every page timed before its widgets are")
    parser.add_argument("--busy-cores", type=int, default=0,
                        help="keep this many cores busy with a spinning process for the whole run (a slower or shared "
                             "machine: on 2 cores, one busy halves the matmul rate)")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds to wait once the page is idle before each move, as a person reads it (default "
                             "0: back to back)")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.page, args.limit, args.port = 1, ["positional"], 1, None  # None: a free port
    from benchmarks.longcontext import matmul_rate

    with busy_cores(args.busy_cores):
        load_before = os.getloadavg()[0]
        rate = matmul_rate(512, 3) if args.quick else matmul_rate()  # --quick: a small product, a rough rate
        runs = run_pages(args.page or names, args)
    table(runs, args.repeat, rate, load_before, args.busy_cores)
    if any(run.failed for run in runs):
        sys.exit("failed: " + ", ".join(run.title for run in runs if run.failed))


if __name__ == "__main__":
    main()
