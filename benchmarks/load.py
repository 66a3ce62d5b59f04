"""Eight visitors at once on one server: what a class sees when it opens attnviz together.

Starts one Streamlit server on 127.0.0.1 (port 8651, or --port) and opens 8 browser contexts in one headless
Chromium (Debian's, driven by playwright), all at the same moment:
  - 6 visitors open the Heads page on smollm2-135m by link, each with its own short text, on the One head tab;
  - 1 visitor types an 8,192-token text (the shipped text repeated) into the Heads page;
  - 1 visitor trains a toy-lab model (the Toy lab page's Train button, default settings).
Every visitor is bounded in time (--timeout, default 900 s); the run ends when all have finished or timed out.

It reports, per visitor and in sum:
  - whether it saw its own text: the short ones, their own marker word in the token labels of the One head map and
    no other visitor's; the long one, "8,192 tokens" on its page;
  - any exception box or browser console error;
  - seconds from opening the page to its first drawn chart (the long visitor: from sending its text to its own
    chart; p50 and p95 over the visitors that drew one);
  - whether it was told it waits for memory, and any refusal message shown;
  - the server's peak resident memory (VmHWM, Linux) against the memory budget it ran with.

    python benchmarks/load.py                       # the machine's default budget
    python benchmarks/load.py --budget-mb 1000      # a small budget: refusals with messages, no crash
    python benchmarks/load.py --tight               # just the model and the long capture: it queues, and is told
    python benchmarks/load.py --quick               # one short visitor: the same server, browser and checks

The run exits 1 when a visitor saw another's result, timed out, or met an exception box or a console error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "smollm2-135m"
LONG_TOKENS = 8_192
MARKERS = ["giraffes", "volcanoes", "submarines", "cathedrals", "orchards", "glaciers"]
CHART = '[data-testid="stPlotlyChart"] .main-svg'
ALERTS = """() => Array.from(document.querySelectorAll('[data-testid="stAlert"], [data-testid="stSpinner"]'))
                .map(a => a.innerText).join(' | ')"""
TICKS = """() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .xtick text'))
                .map(t => t.textContent)"""


def short_text(marker: str) -> str:
    return f"In the morning the class read about {marker}, and then the class wrote about {marker} again."


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set (VmHWM in /proc/<pid>/status), or None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Visitor:
    def __init__(self, name: str, kind: str, marker: str | None = None):
        self.name, self.kind, self.marker = name, kind, marker
        self.first_chart_s: float | None = None
        self.own_result: bool | None = None
        self.told_waits = False
        self.exceptions: list[str] = []
        self.console_errors: list[str] = []
        self.refusals: list[str] = []
        self.timed_out = False
        self.refused = False


async def _watch(page, visitor: Visitor, done: asyncio.Event) -> None:
    """Polls the page twice a second for a waiting message, refusals and exception boxes until `done`."""
    while not done.is_set():
        try:
            text = await page.evaluate("() => document.body.innerText")
            visitor.told_waits |= "Waiting for memory" in text
            for box in await page.query_selector_all('[data-testid="stException"]'):
                visitor.exceptions.append((await box.inner_text())[:200])
            for box in await page.query_selector_all('[data-testid="stAlertContentError"]'):
                message = (await box.inner_text())[:200]
                if message not in visitor.refusals:
                    visitor.refusals.append(message)
        except Exception:  # the page is navigating or closing
            pass
        await asyncio.sleep(0.5)


async def _until_chart(page, started: float, visitor: Visitor, timeout_s: float) -> None:
    await page.wait_for_selector(CHART, timeout=timeout_s * 1000)
    visitor.first_chart_s = time.perf_counter() - started


async def _idle(page, timeout_s: float) -> None:
    await page.wait_for_function(
        """() => { const app = document.querySelector('[data-testid="stApp"]');
                   return app && app.getAttribute('data-test-script-state') === 'notRunning'; }""",
        timeout=timeout_s * 1000)


async def _visit(page, base: str, visitor: Visitor, long_text: str, timeout_s: float) -> None:
    started = time.perf_counter()
    if visitor.kind == "short":
        query = urllib.parse.urlencode({"model": MODEL, "text": short_text(visitor.marker), "tab": "head"})
        await page.goto(f"{base}/heads?{query}")
        await _until_chart(page, started, visitor, timeout_s)
        await _idle(page, timeout_s)
        # each tick reads "position:token"; a marker word may span tokens ("cat", "hedrals")
        labels = [re.sub(r"^\d+:", "", t) for t in await page.evaluate(TICKS)]
        ticks = "".join(labels).replace("␣", "").replace(" ", "")
        visitor.ticks = ticks
        visitor.own_result = visitor.marker in ticks and not any(m in ticks for m in MARKERS
                                                                 if m != visitor.marker)
    elif visitor.kind == "long":
        await page.goto(f"{base}/heads?{urllib.parse.urlencode({'model': MODEL})}")
        await _idle(page, timeout_s)
        box = page.locator('[data-testid="stTextArea"] textarea').first
        await box.fill(long_text)
        started = time.perf_counter()
        await box.press("Control+Enter")
        await page.wait_for_function(
            "() => document.body.innerText.includes('8,192 tokens')", timeout=timeout_s * 1000)
        await _idle(page, timeout_s)  # the default text's chart is on the page already: its own is drawn at idle
        refusal = await page.query_selector('[data-testid="stAlertContentError"]')
        if refusal:
            visitor.refused = True  # told why with a message (a budget too small for it): an outcome, not a hang
            message = (await refusal.inner_text())[:200]
            if message not in visitor.refusals:
                visitor.refusals.append(message)
            return
        await _until_chart(page, started, visitor, timeout_s)
        visitor.own_result = True
    else:
        await page.goto(f"{base}/toy-lab")
        await _idle(page, timeout_s)
        started = time.perf_counter()
        await page.get_by_role("button", name="Train", exact=True).click(timeout=timeout_s * 1000)
        await _until_chart(page, started, visitor, timeout_s)
        visitor.own_result = True


async def run_visitor(browser, base: str, visitor: Visitor, long_text: str, timeout_s: float) -> None:
    context = await browser.new_context(viewport={"width": 1400, "height": 3000})
    page = await context.new_page()

    def on_console(msg):
        # Streamlit's frontend first probes /<page>/_stcore/* on a deep link and gets 404: its own behaviour
        if msg.type == "error" and "/_stcore/" not in (msg.location or {}).get("url", ""):
            visitor.console_errors.append(f"{msg.text[:200]} ({(msg.location or {}).get('url', '')})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: visitor.console_errors.append(str(exc)[:200]))
    done = asyncio.Event()
    watcher = asyncio.create_task(_watch(page, visitor, done))
    try:  # the whole visit bounded at once: a visitor left waiting is reported, with what its page said
        await asyncio.wait_for(_visit(page, base, visitor, long_text, timeout_s), timeout_s)
    except Exception as exc:  # a timeout or a page that broke: reported, the others go on
        visitor.timed_out = "Timeout" in type(exc).__name__
        try:
            visitor.last_seen = (await page.evaluate(ALERTS))[:300]
        except Exception:  # the page is gone
            pass
        visitor.exceptions.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        done.set()
        await watcher
        await context.close()


async def run_all(base: str, timeout_s: float, quick: bool = False) -> list[Visitor]:
    from playwright.async_api import async_playwright

    from attnviz.models import load_model
    from benchmarks.longcontext import long_text

    visitors = ([Visitor(f"short-{i + 1}", "short", m) for i, m in enumerate(MARKERS[:1] if quick else MARKERS)]
                + ([] if quick else [Visitor("long", "long"), Visitor("toy-lab", "lab")]))
    text = "" if quick else long_text(LONG_TOKENS, load_model(MODEL).tokenizer)
    async with async_playwright() as p:
        from tests.servers import CHROMIUM_ARGS

        browser = await p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            await asyncio.gather(*(run_visitor(browser, base, v, text, timeout_s) for v in visitors))
        finally:
            await browser.close()
    return visitors


def report(visitors: list[Visitor], peak: int | None, budget_bytes: int, seconds: float) -> None:
    print(f"{'visitor':<10} {'own result':>10} {'first chart s':>14} {'waited':>7} {'exceptions':>10} "
          f"{'console errors':>14}  refusals")
    for v in visitors:
        shown = "-" if v.first_chart_s is None else f"{v.first_chart_s:.1f}"
        own = ("timeout" if v.timed_out else "refused" if v.refused
               else {True: "yes", False: "NO", None: "-"}[v.own_result])
        if getattr(v, "last_seen", ""):
            print(f"  {v.name} last saw: {v.last_seen!r}")
        if v.own_result is False:
            print(f"  {v.name} saw the tokens {getattr(v, 'ticks', '')[:300]!r}")
        print(f"{v.name:<10} {own:>10} {shown:>14} {'yes' if v.told_waits else 'no':>7} {len(v.exceptions):>10} "
              f"{len(v.console_errors):>14}  {' | '.join(v.refusals) or '-'}")
    times = sorted(v.first_chart_s for v in visitors if v.first_chart_s is not None)
    if times:
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        print(f"time to first chart: p50 {statistics.median(times):.1f} s, p95 {p95:.1f} s "
              f"({len(times)} of {len(visitors)} visitors drew one)")
    for v in visitors:
        for what, items in (("exception", v.exceptions), ("console error", v.console_errors)):
            for item in dict.fromkeys(items):  # each distinct one once
                print(f"  {v.name} {what}: {item}")
    mixed = [v.name for v in visitors if v.own_result is False]
    print(f"mixed results: {', '.join(mixed) or 'none'}; exception boxes: "
          f"{sum(len(v.exceptions) for v in visitors)}; console errors: {sum(len(v.console_errors) for v in visitors)}")
    if peak is not None:
        print(f"server peak RSS {peak / 2**30:.2f} GiB; memory budget {budget_bytes / 2**30:.2f} GiB "
              f"(ratio {peak / budget_bytes:.2f}; the peak also holds Python, torch and Streamlit themselves)")
    print(f"wall time {seconds:.0f} s")


def tight_budget_mb() -> int:
    """MiB for the model as the server keeps it, the long visitor's capture estimate and 6 MiB: the toy-lab run
    (its estimate, lab.training_bytes, is larger) must finish before the long capture is admitted."""
    from attnviz import budget, ui
    from attnviz.lab import LabConfig
    from attnviz.lab.training import training_bytes
    from attnviz.models import load_model
    from benchmarks.longcontext import long_text

    loaded = load_model(MODEL)
    n = len(loaded.tokenizer(long_text(LONG_TOKENS, loaded.tokenizer)).input_ids)
    need = budget.held_bytes(loaded) + ui.capture_need(loaded, n, None, "qk")
    spare = 6 * 2**20
    assert training_bytes(LabConfig()) > spare, "the toy-lab run would fit beside the long capture"
    return -(-(need + spare) // 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8651)
    parser.add_argument("--budget-mb", type=int, default=None, help="ATTNVIZ_MEMORY_BUDGET_MB for the server")
    parser.add_argument("--tight", action="store_true",
                        help="a budget that holds the model and the long capture with 6 MiB to spare, less than "
                             "the toy-lab run's estimate: the long visitor must queue while that run trains")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each visitor may take")
    parser.add_argument("--server-log", type=Path, default=None, help="write the server's output to this file")
    parser.add_argument("--quick", action="store_true", help="one short visitor, on a free port")
    args = parser.parse_args()
    if args.quick:
        args.port, args.timeout = None, 300.0  # None: a free port
    from attnviz.budget import default_budget_bytes

    if args.tight:
        args.budget_mb = tight_budget_mb()
    if args.budget_mb:
        os.environ["ATTNVIZ_MEMORY_BUDGET_MB"] = str(args.budget_mb)
    budget_bytes = default_budget_bytes()
    from tests.servers import streamlit_server  # the browser tests' server (it inherits the budget set above)

    log = subprocess.DEVNULL if args.server_log is None else open(args.server_log, "w")
    start = time.perf_counter()
    with streamlit_server(port=args.port, options=("--server.fileWatcherType", "none"), log=log) as (url, server):
        visitors = asyncio.run(run_all(url, args.timeout, args.quick))
        peak = peak_rss_bytes(server.pid)
    print(f"{len(visitors)} visitors at once, budget {budget_bytes / 2**20:,.0f} MiB, {os.cpu_count()} cores")
    report(visitors, peak, budget_bytes, time.perf_counter() - start)
    wrong = [v.name for v in visitors if v.own_result is False or v.timed_out or v.exceptions or v.console_errors]
    if wrong:
        sys.exit(f"visitors with a wrong result, a timeout, an exception or a console error: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
