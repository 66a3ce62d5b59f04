"""benchmarks/browser_latency.py's widget finder and moves (benchmarks/latency/): every widget the Worked example
page declares is found in its DOM, each of its kind, and each move reaches a value the widget has not had."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.latency.idle import wait_idle, watch  # noqa: E402
from benchmarks.latency.widgets import NoMove, _pick, discover, element, move  # noqa: E402


def test_pick_prefers_options_not_had_then_any_other():
    seen: set[str] = set()
    assert _pick(["a", "b", "c"], "a", seen) == 1
    assert _pick(["a", "b", "c"], "b", seen) == 2
    assert _pick(["a", "b", "c"], "c", seen) == 0  # every option had: the first that is not the current one
    with pytest.raises(NoMove):
        _pick(["a"], "a", set())


def test_a_move_the_page_ignored_is_shown_as_no_rerun_and_left_out_of_the_median(capsys):
    import math

    from benchmarks.browser_latency import Run, table

    run = Run(title="t", repeat=3, limit=None)
    run.rows = [("P", "ignored", [(math.nan, math.nan)] * 3, 1.0),
                ("P", "half", [(0.3, 0.2), (math.nan, math.nan), (0.5, 0.4)], 1.0),
                ("P", "slow", [(0.9, 0.8), (0.7, 0.6), (0.8, 0.7)], 1.0),
                ("P", "Layers (slider, heads_layer_range)", [(9.0, 8.9)] * 3, 1.0)]
    table([run], 3, 1e11, 0.5)
    out = capsys.readouterr().out
    assert "| P | ignored | no rerun | no rerun | no rerun, no rerun, no rerun | 1.0 |  |" in out
    assert "| P | half | 0.30 | 0.40 | 0.20, no rerun, 0.40 | 1.0 |  |" in out  # medians of the two answered
    assert "| P | slow | 0.70 | 0.80 | 0.80, 0.60, 0.70 | 1.0 | OVER |" in out
    assert ("| 8.90 | 9.00 | 8.90, 8.90, 8.90 | 1.0 | OVER (new work where the range widens: a capture of other "
            "layers") in out
    assert "4 widgets timed, 2 over the goal, 1 of them new work (the model run again)" in out


def test_busy_cores_keep_a_process_spinning_for_the_run_only_and_the_table_says_so(capsys):
    import time

    from benchmarks.browser_latency import Run, busy_cores, table

    with busy_cores(1) as spinners:
        assert len(spinners) == 1 and spinners[0].poll() is None
        before, end = _cpu_seconds(spinners[0].pid), time.monotonic() + 20
        while _cpu_seconds(spinners[0].pid) - before <= 0.2 and time.monotonic() < end:
            time.sleep(0.1)  # on a loaded machine a spinning process gets its CPU seconds later
        assert _cpu_seconds(spinners[0].pid) - before > 0.2  # it uses a core
    assert spinners[0].poll() is not None  # gone once the run ends
    table([Run(title="t", repeat=3, limit=None)], 3, 1e11, 0.5, busy=1)
    assert "CPUs, 1 of them kept busy by a spinning process throughout;" in capsys.readouterr().out
    table([Run(title="t", repeat=3, limit=None, pause=2.0)], 3, 1e11, 0.5)
    assert "CPUs; each move 2 s after the page was idle; 3 runs" in capsys.readouterr().out


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc/<pid>/stat)."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_in_chart_slider_is_over_its_goal_when_slow_or_when_it_spoke_to_the_server(capsys):
    from benchmarks.browser_latency import Run, chart_table

    run = Run(title="t", repeat=3, limit=None)
    run.chart_rows = [("P", "fast", [(0.05, 0), (0.04, 0), (0.06, 0)]),
                      ("P", "slow", [(0.2, 0), (0.15, 0), (0.3, 0)]),
                      ("P", "chatty", [(0.05, 1), (0.04, 0), (0.06, 0)])]
    chart_table([run])
    out = capsys.readouterr().out
    assert "| P | fast | 0.050 | 0.050, 0.040, 0.060 | 0 |  |" in out
    assert "| P | slow | 0.200 | 0.200, 0.150, 0.300 | 0 | OVER |" in out
    assert "| P | chatty | 0.050 | 0.050, 0.040, 0.060 | 1 | OVER |" in out
    assert "3 in-chart sliders timed, 2 over the goal" in out


@pytest.fixture(scope="module")
def page(browser):
    from tests.servers import watched_page

    with watched_page(browser, "worked-example") as tab:
        yield tab


def _value(page, key: str) -> str:
    box = page.locator(f".st-key-{key}")
    return box.evaluate("b => { const i = b.querySelector('input'); return i.type === 'checkbox' ? String(i.checked) "
                        ": i.value; }")


WIDGET_CALLS = {"selectbox": "Selectbox", "slider": "Slider", "text_area": "TextArea", "toggle": "Toggle",
                "checkbox": "Checkbox", "radio": "Radio", "number_input": "NumberInput", "multiselect": "MultiSelect"}


def declared_widgets(script: Path) -> dict[str, str]:
    """{key: kind} of every Streamlit widget call in a page's source (a key given as KEYS[m] stands for every value
    of the page's KEYS dict)."""
    tree = ast.parse(script.read_text())
    keys = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "KEYS")
    out = {}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") in WIDGET_CALLS:
            key = next(k.value for k in call.keywords if k.arg == "key")
            names = [key.value] if isinstance(key, ast.Constant) else list(keys.values())
            out.update(dict.fromkeys(names, WIDGET_CALLS[call.func.attr]))
    return out


@pytest.mark.browser
def test_finds_every_widget_the_page_declares(page):
    declared = declared_widgets(ROOT / "app_pages" / "worked_example.py")
    assert len(declared) == 7  # the example, decimal places, Q, K, V and two toggles
    found = {w.key: w.kind for w in discover(page)}
    assert found == declared
    assert found["worked_scaled"] == found["worked_causal"] == "Toggle"  # st.toggle: a checkbox with role=switch
    assert found["worked_digits"] == "Slider" and found["worked_example"] == "Selectbox"
    assert {found[k] for k in ("worked_q", "worked_k", "worked_v")} == {"TextArea"}


@pytest.mark.browser
@pytest.mark.parametrize("key", ["worked_digits", "worked_example", "worked_causal"])
def test_each_move_reaches_a_value_not_had(page, key):
    had, seen = [_value(page, key)], set()
    for _ in range(2):
        widget = next(w for w in discover(page) if w.key == key)
        assert element(page, widget).count() == 1
        watch(page)
        move(page, widget, seen)
        wait_idle(page, time.perf_counter(), 120)
        had.append(_value(page, key))
    if key == "worked_causal":  # two values: it flips
        assert had == ["false", "true", "false"]
    else:
        assert len(set(had)) == 3, had
