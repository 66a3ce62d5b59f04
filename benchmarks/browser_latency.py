"""Seconds from a widget change until the page is idle again, in a real browser (headless Chromium).

Starts Streamlit on 127.0.0.1 (port 8641, or --port), opens each page in Chromium driven by playwright, lets its
first run finish (captures and caches warm), then makes each change below and times it: from the moment the
widget is changed until the server has answered, the app reports its script has stopped running, no skeleton is
left, every chart in view is drawn, and that has held for three polls 50 ms apart (the idle rule of
tests/test_browser.py, polled finer; the three quiet polls are not counted). Every change is made REPEAT times (back and
forth) and the median printed.

Two clocks: "driver" starts before playwright makes the change (so it includes the automation itself: opening a
selectbox, typing, clicking an option), "input" starts at the browser's own timestamp of the input event that
makes the change (the last pointerdown or keydown) and ends at the browser's timestamp of the first idle poll:
what a person at the page waits for.

  Heads, ~1,800 tokens of smollm2-135m (the shipped Declaration and Gettysburg text, repeated), layers 0-14 (the
      dense pattern store, 1.7 GiB) and every layer (the qk store): layer change, head change, boost toggle,
      hide-sink on, on the One head tab
  Sinks: on SmolLM2's capture of the page's text, the "One head" section's head changed, and its sinks hidden
  Positional: the RoPE section's "Query position m" slider moved one step
  Softmax: the "keys per query" slider moved one step on, to a value it has not had
  Kernel: the "Step" slider moved one step on (the page builds the next step's figures while the browser draws)

    python benchmarks/browser_latency.py [--port 8641] [--repeat 3] [--only heads-dense] [--only sinks] ...
    python benchmarks/browser_latency.py --quick    one action (the Positional page's slider), once

A page that fails is reported with a screenshot, the others are still measured, and the run exits 1.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "smollm2-135m"
N_TOKENS = 1_800
POLL_S = 0.05


def long_text(n_tokens: int) -> str:
    """The shipped text repeated, cut to n_tokens of smollm2's tokenizer (benchmarks/longcontext.py's text)."""
    from benchmarks.longcontext import long_text as cut
    from attnviz.models import load_model

    return cut(n_tokens, load_model(MODEL).tokenizer)


IDLE = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (document.querySelector('[data-testid="stSkeleton"]')) return false;
    for (const chart of document.querySelectorAll('[data-testid="stPlotlyChart"]')) {
        const shown = chart.getClientRects().length > 0;  // a chart in a closed tab has no box
        if (shown && !chart.querySelector('.main-svg')) return false;
    }
    return performance.now();
}"""


def _idle(page) -> bool:
    """tests/test_browser.py's idle rule, in one call into the page (a call per chart would add its own latency):
    the script is not running, no skeleton is left, every chart in view is drawn."""
    return page.evaluate(IDLE)  # the browser's clock when idle, else false


WATCH = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    window.__states = [];
    window.__receivedAtWatch = window.__received;
    if (!window.__watching) {
        new MutationObserver(() => window.__states.push(app.getAttribute('data-test-script-state')))
            .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
        for (const kind of ['pointerdown', 'keydown']) {  // the moment of the person's input, by the browser's clock
            document.addEventListener(kind, () => { window.__input = performance.now(); }, true);
        }
        window.__watching = true;
    }
}"""


# Counts the messages the server sends over Streamlit's websocket (installed before any page script runs).
COUNT_MESSAGES = """(() => {
    const Socket = window.WebSocket;
    window.__received = 0;
    window.WebSocket = function (...args) {
        const socket = new Socket(...args);
        socket.addEventListener('message', () => { window.__received += 1; });
        return socket;
    };
    window.WebSocket.prototype = Socket.prototype;
    Object.assign(window.WebSocket, Socket);
})();"""


def wait_idle(page, started: float, timeout_s: float = 600.0) -> tuple[float, float]:
    """Seconds from `started` until the page became idle (and stayed so for three polls). The server must first
    answer (a change it has not answered yet looks idle): a MutationObserver installed by watch() records every
    change of the script state, and a rerun so short that the page never shows it running is seen by the messages
    the server sent since watch()."""
    deadline = time.perf_counter() + 5.0
    while time.perf_counter() < deadline and not page.evaluate(
            "(window.__states || []).includes('running') || window.__received > window.__receivedAtWatch"):
        time.sleep(0.01)
    quiet, since, since_browser = 0, None, None
    end = time.perf_counter() + timeout_s
    while quiet < 3:
        if time.perf_counter() > end:
            raise TimeoutError(f"page still busy after {timeout_s} s")
        idle_at = _idle(page)
        if idle_at:
            since = since or time.perf_counter()
            since_browser = since_browser or idle_at
            quiet += 1
        else:
            quiet, since, since_browser = 0, None, None
        time.sleep(POLL_S)
    pressed = page.evaluate("window.__input || 0")
    return since - started, (since_browser - pressed) / 1000.0


def watch(page) -> None:
    """Starts (or restarts) recording the script state's changes: call before each timed change."""
    page.evaluate(WATCH)


def settle(page, timeout_s: float) -> None:
    """Waits for a page just opened to finish its first run (not timed)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_s * 1000)
    watch(page)
    page.evaluate("window.__states.push('running')")  # the first run may have started before the observer
    wait_idle(page, time.perf_counter(), timeout_s)


def choose(page, label: str, option: str) -> None:
    box = page.locator('[data-testid="stSelectbox"]', has_text=label).first
    field = box.locator('input[role="combobox"]')
    field.click()
    field.fill(option)  # the list is virtualised: typing brings the option into it
    page.get_by_role("option", name=option, exact=True).first.click()


def toggle(page, label: str) -> None:
    page.locator('[data-testid="stCheckbox"]', has_text=label).first.locator("label").first.click()


def slider_step(page, label: str, key: str) -> None:
    page.locator('[data-testid="stSlider"]', has_text=label).first.locator('input[type="range"]').first.press(key)


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).first.click()


def timed(page, action, repeat: int) -> list[tuple[float, float]]:
    out = []
    for i in range(repeat):
        watch(page)
        started = time.perf_counter()
        action(i)
        out.append(wait_idle(page, started))
    return out


def heads_rows(page, url: str, repeat: int, layers: str | None = None) -> list[tuple[str, list[float]]]:
    """layers None: every layer (30 x 9 x 1,800^2 weights do not fit the dense store: the qk store); "0-14": 15
    layers, 1.7 GiB, the dense pattern store (the case of the issue's table)."""
    text = long_text(N_TOKENS)
    view = {"model": MODEL, "text": text, "layer": "10", "head": "0", "boost": "1", "sink": "0"}
    query = urllib.parse.urlencode({**view, **({"layers": layers} if layers else {})})
    page.goto(f"{url}/heads?{query}")
    page.wait_for_selector('[data-testid="stSidebarNavLink"]', timeout=600_000)
    settle(page, 1200)  # the capture and the first views (not timed)
    if page.get_by_role("tab", name="One head", exact=True).count():
        watch(page)
        open_tab(page, "One head")
        wait_idle(page, time.perf_counter())
    rows = [
        ("layer change", timed(page, lambda i: choose(page, "Layer", ["11", "10"][i % 2]), repeat)),
        ("head change", timed(page, lambda i: choose(page, "Head", ["1", "0"][i % 2]), repeat)),
        ("boost toggle", timed(page, lambda i: toggle(page, "Boost small weights"), repeat)),
    ]
    sink = []
    for _ in range(repeat):  # on, timed; off again, not timed
        watch(page)
        started = time.perf_counter()
        toggle(page, "Hide the sink")
        sink.append(wait_idle(page, started))
        watch(page)
        toggle(page, "Hide the sink")
        wait_idle(page, time.perf_counter())
    rows.append(("hide sink on", sink))
    store = f"layers {layers}, dense store" if layers else "every layer, qk store"
    return [(f"Heads, {N_TOKENS:,} tokens ({store}): {name}", times) for name, times in rows]


def softmax_rows(page, url: str, repeat: int) -> list[tuple[str, list[float]]]:
    page.goto(f"{url}/softmax")
    settle(page, 600)
    # always a value not shown before (its sample, sweep and figures are computed, not read from a cache)
    return [("Softmax: slider move to a new value", timed(page, lambda i: slider_step(page, "keys per query",
                                                                                        "ArrowRight"), repeat))]


def sinks_rows(page, url: str, repeat: int) -> list[tuple[str, list[float]]]:
    page.goto(f"{url}/sinks?model={MODEL}")
    settle(page, 600)
    return [("Sinks: one head, head change", timed(page, lambda i: choose(page, "Head", ["3", "4"][i % 2]), repeat)),
            ("Sinks: one head, hide the sinks", timed(page, lambda i: toggle(page, "Hide the sinks"), repeat))]


def positional_rows(page, url: str, repeat: int) -> list[tuple[str, list[float]]]:
    page.goto(f"{url}/positional")
    settle(page, 600)
    watch(page)
    page.get_by_text("RoPE", exact=True).first.click()
    wait_idle(page, time.perf_counter())
    return [("Positional, RoPE: query position moved", timed(page, lambda i: slider_step(page, "Query position m",
                                                                                         "ArrowRight"), repeat))]


def kernel_rows(page, url: str, repeat: int) -> list[tuple[str, list[float]]]:
    page.goto(f"{url}/kernel")
    settle(page, 600)
    return [("Kernel: one step", timed(page, lambda i: slider_step(page, "Step", "ArrowRight"), repeat))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8641)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["heads-dense", "heads-qk", "sinks", "positional", "softmax", "kernel"],
                        action="append")
    parser.add_argument("--quick", action="store_true", help="one action, once: the Positional page's slider")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.only, args.port = 1, ["positional"], None  # None: a free port
    from playwright.sync_api import sync_playwright

    from tests.servers import CHROMIUM_ARGS, streamlit_server  # the browser tests' server and Chromium flags

    # --server.fileWatcherType none: a file saved during the run must not reload modules under it
    with streamlit_server(port=args.port, options=("--server.fileWatcherType", "none")) as (url, _):
        rows, failed = [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 1300})
            context.add_init_script(COUNT_MESSAGES)
            page = context.new_page()
            for name, measure in (("heads-dense", lambda *a: heads_rows(*a, layers="0-14")),
                                  ("heads-qk", heads_rows), ("sinks", sinks_rows), ("positional", positional_rows),
                                  ("softmax", softmax_rows), ("kernel", kernel_rows)):
                if args.only and name not in args.only:
                    continue
                try:
                    for row in measure(page, url, args.repeat):
                        rows.append(row)
                        print(f"{row[0]}: driver {', '.join(f'{t[0]:.2f}' for t in row[1])} s; input "
                              f"{', '.join(f'{t[1]:.2f}' for t in row[1])} s", file=sys.stderr, flush=True)
                except Exception as exc:  # the other pages are still measured
                    failed.append(name)
                    page.screenshot(path=f"browser-latency-{name}-failed.png", full_page=True)
                    print(f"{name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0]}); screenshot "
                          f"browser-latency-{name}-failed.png", file=sys.stderr, flush=True)
            browser.close()
    print(f"| page: action | input -> idle, median s | driver -> idle, median s | input -> idle, all runs (s) |"
          f"   ({args.repeat} runs each)")
    print("|---|---|---|---|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(t[1] for t in times):.2f} | "
              f"{statistics.median(t[0] for t in times):.2f} | {', '.join(f'{t[1]:.2f}' for t in times)} |")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
