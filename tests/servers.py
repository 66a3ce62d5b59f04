"""A Streamlit server of the app and Chromium's flags: what the browser tests, the command line's test and
benchmarks/browser_latency.py share (`from tests.servers import streamlit_server`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Debian's chromium, driven by playwright (never `playwright install`)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def watched_page(browser, path: str, timeout_s: float = 300.0, scripts: tuple[str, ...] = ()):
    """A tab of the app at `path` (a page and its link's query) in its own browser context, 1400 x 1300, with
    benchmarks/latency/idle.py's message counters and `scripts` (run in the tab before the page's own) installed,
    once its first run has finished (not timed)."""
    from benchmarks.latency.idle import COUNT_MESSAGES, settle

    with streamlit_server() as (url, _):
        context = browser.new_context(viewport={"width": 1400, "height": 1300})
        for script in (COUNT_MESSAGES, *scripts):
            context.add_init_script(script)
        tab = context.new_page()
        tab.goto(f"{url}/{path}")
        tab.wait_for_selector('[data-testid="stSidebarNavLink"]', timeout=timeout_s * 1000)
        settle(tab, timeout_s)
        try:
            yield tab
        finally:
            context.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(command: list[str] | None = None, *, port: int | None = None, cwd: Path = ROOT,
                     options: tuple[str, ...] = (), log=subprocess.DEVNULL,
                     start_s: float = 60.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """Starts the app on 127.0.0.1 (headless, no usage statistics) and yields (its URL, the process) once its
    health check answers 200; stops it by its own PID afterwards. command: what starts it (default `python -m
    streamlit run app.py`; the command line's test passes `attnviz app`); port: a free one when None; options:
    further Streamlit flags; log: where its output goes. RuntimeError when it has not answered within start_s
    seconds or has exited."""
    port = free_port() if port is None else port
    command = command or [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py")]
    proc = subprocess.Popen([*command, "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--server.headless", "true", "--browser.gatherUsageStats", "false", *options],
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_s
        while not _healthy(url):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"Streamlit did not start ({' '.join(command)})")
            time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
