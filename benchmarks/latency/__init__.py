"""benchmarks/browser_latency.py's parts: the idle rule and its two clocks (idle.py), and the page's widgets,
found in its DOM and each moved to a value it has not had (widgets.py)."""
