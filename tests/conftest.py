"""Shared fixtures. Real models load once per test session; toy models are built from configs, no download."""

from __future__ import annotations

import os
import shutil

import pytest

# pytest.ini runs the tests in pytest-xdist workers, one per core (at most MAX_WORKERS). There, OpenMP's threads wait
# for work asleep rather than spinning: each worker's torch spins on every core otherwise, and the two workers of a
# 2-core machine then took the suite 946 s against 805 s (1,261 s in one process). Set before torch is imported.
MAX_WORKERS = 4
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Chooses Triton's backend (the interpreter without a GPU) before any test builds a transformers model, which imports
# triton.language: the kernel tests need it chosen first (attnviz.kernels).
import attnviz.kernels  # noqa: E402, F401

REAL_MODEL_FIXTURES = {"smollm2", "gemma3", "minilm"}


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core this process may run on, at most MAX_WORKERS (each starts its own models, servers
    and browsers)."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_collection_modifyitems(items):
    """`pytest -m "not slow"` is the quick loop: a test that drives the browser or takes a bundled real model by its
    fixture is slow as well as any marked so by hand."""
    for item in items:
        if item.get_closest_marker("browser") or REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2-135M (float32), loaded once for the whole session."""
    from attnviz.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3():
    """The bundled Gemma 3 270M (float32), loaded once for the whole session. Its first load on a machine converts
    its GGUF (`benchmarks/capture.py --load gemma3-270m` times it); later ones read the converted folder."""
    from attnviz.models import load_model

    return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 (BERT encoder), loaded once for the whole session."""
    from attnviz.models import load_model

    return load_model("minilm-l6")


@pytest.fixture()
def lab_cache(tmp_path, monkeypatch):
    """Toy-lab models are saved to a temporary cache."""
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def attention_of():
    """attention_of(model, token_ids): [layer, head, query, key] straight from the model's own output_attentions,
    in float64 (the reference captures are compared with)."""
    import torch

    def attention(model, token_ids):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([token_ids]), output_attentions=True)
        return torch.stack([a[0] for a in out.attentions]).double().numpy()

    return attention


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Debian's, driven by playwright), one per test module: the browser and notebook tests."""
    from playwright.sync_api import sync_playwright

    from tests.servers import CHROMIUM_ARGS

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: run `bash scripts/setup.sh --dev` (installs it with apt-get)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()
