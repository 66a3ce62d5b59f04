"""attnviz.cost_tables: the KV-cache, cost and parameter rows of the MHA, GQA, MQA page, and its crossover
equation, against the formulas multiplied out by hand."""

from __future__ import annotations

import pytest

from attnviz.cost import param_counts, preset_arch
from attnviz.cost_tables import KV_FORMULA, cost_table, crossover_latex, kv_cache_table, param_table


def test_kv_cache_table_by_hand_for_llama_2_70b():
    # 2 x 80 layers x 8 KV heads x 128 dims x 4,096 tokens x 2 sequences x 1 byte = 1,342,177,280 B = 1.25 GiB;
    # per token 2 x 80 x 8 x 128 x 1 = 163,840 B = 160 KiB
    (row,) = kv_cache_table({"70B": preset_arch("Llama-2-70B")}, context=4096, batch=2, bytes_per_value=1)
    assert row == {"model": "70B", KV_FORMULA: "2 × 80 × 8 × 128 × 4,096 × 2 × 1 B", "per token": "160.00 KiB",
                   "total": "1.25 GiB", "bytes": "1,342,177,280"}


def test_cost_table_by_hand():
    # 4 N^2 d at N = 512, d = 4096: 4 x 262,144 x 4096 = 4.295e9; Llama-2-7B caches 2 x 32 x 32 x 128 x 2 B =
    # 512 KiB a token, 256 MiB at 512 tokens
    (row,) = cost_table(preset_arch("Llama-2-7B"), [512], d_model=4096)
    assert row == {"N": 512, "Q Kᵀ + pattern V FLOPs per layer": "4.295e+09", "KV per token": "512.00 KiB",
                   "KV total (batch 1)": "256.00 MiB"}


def test_param_table_rows_carry_param_counts():
    archs = {name: preset_arch(name) for name in ("GPT-2 small", "SmolLM2-135M")}
    for row, (name, arch) in zip(param_table(archs), archs.items()):
        counts = param_counts(arch)
        assert row["model"] == name and row["total"] == counts["total"] == row["attention"] + row["MLP params"] + \
            row["embeddings"] + counts["norms"] + counts["lm_head"] + counts["pooler"]


@pytest.mark.parametrize("causal,kv_dim,solved,value", [
    (False, None, "2d", "8,192"), (True, None, "4d", "16,384"),  # 8 N d^2 = 4 N^2 d (or 2 N^2 d): N = 2d (or 4d)
    (False, 1024, "d+1024", "5,120"), (True, 1024, r"2(d+1024)", "10,240"),  # 4 N d (d + kv) = 4 N^2 d: N = d + kv
])
def test_crossover_latex_solves_the_equation(causal, kv_dim, solved, value):
    latex = crossover_latex(d_model=4096, causal=causal, kv_dim=kv_dim)
    assert latex.endswith(rf"\iff N^* = {solved} = {value}")
