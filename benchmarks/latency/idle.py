"""When a page is idle again after a change, by two clocks (benchmarks/browser_latency.py's docstring says how)."""

from __future__ import annotations

import time

POLL_S = 0.05

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

# Counts the messages the server sends over Streamlit's websocket, and those the page sends it (installed before any
# page script runs).
COUNT_MESSAGES = """(() => {
    const Socket = window.WebSocket;
    window.__received = 0;
    window.__sent = 0;
    window.WebSocket = function (...args) {
        const socket = new Socket(...args);
        socket.addEventListener('message', () => { window.__received += 1; });
        const send = socket.send.bind(socket);
        socket.send = data => { window.__sent += 1; return send(data); };
        return socket;
    };
    window.WebSocket.prototype = Socket.prototype;
    Object.assign(window.WebSocket, Socket);
})();"""


def idle_at(page):
    """tests/test_browser.py's idle rule, in one call into the page (a call per chart would add its own latency):
    the script is not running, no skeleton is left, every chart in view is drawn. The browser's clock when idle,
    else False."""
    return page.evaluate(IDLE)


def watch(page) -> None:
    """Starts (or restarts) recording the script state's changes: call before each timed change."""
    page.evaluate(WATCH)


def quiet(page, timeout_s: float = 600.0) -> tuple[float, float]:
    """Polls the idle rule until it has held for three polls POLL_S apart (not counted): (the first of them by
    time.perf_counter(), by the browser's clock in ms)."""
    quiet_polls, since, since_browser = 0, None, None
    end = time.perf_counter() + timeout_s
    while quiet_polls < 3:
        if time.perf_counter() > end:
            raise TimeoutError(f"page still busy after {timeout_s} s")
        at = idle_at(page)
        if at:
            since = since or time.perf_counter()
            since_browser = since_browser or at
            quiet_polls += 1
        else:
            quiet_polls, since, since_browser = 0, None, None
        time.sleep(POLL_S)
    return since, since_browser


def answered(page, wait_s: float = 5.0) -> bool:
    """Whether the server answered the change within wait_s: a rerun seen running, or messages sent since watch().
    A move the page ignores (a disabled widget, a multiselect already at its limit) gets no answer."""
    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline:
        if page.evaluate("(window.__states || []).includes('running') || window.__received > window.__receivedAtWatch"):
            return True
        time.sleep(0.01)
    return False


def wait_idle(page, started: float, timeout_s: float = 600.0) -> tuple[float, float]:
    """(driver, input) seconds until the page became idle (and stayed so for three polls): driver from `started`,
    input from the browser's timestamp of the last pointerdown or keydown. The server must first answer (a change it
    has not answered yet looks idle): a MutationObserver installed by watch() records every change of the script
    state, and a rerun so short that the page never shows it running is seen by the messages the server sent since
    watch()."""
    answered(page)
    since, since_browser = quiet(page, timeout_s)
    pressed = page.evaluate("window.__input || 0")
    return since - started, (since_browser - pressed) / 1000.0


def settle(page, timeout_s: float) -> None:
    """Waits for a page just opened to finish its first run (not timed)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_s * 1000)
    watch(page)
    page.evaluate("window.__states.push('running')")  # the first run may have started before the observer
    wait_idle(page, time.perf_counter(), timeout_s)


def untimed(page, action) -> None:
    """Makes a change that reruns the page (a section picked to explore it) and waits for idle, not timed."""
    watch(page)
    action()
    wait_idle(page, time.perf_counter())
