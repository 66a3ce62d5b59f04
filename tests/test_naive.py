"""attnviz.kernels.naive: naive and two-pass tiled attention against the float64 reference and torch's SDPA, and
the memory each holds."""

from __future__ import annotations

import pytest
import torch

from attnviz.kernels import naive_attention, peak_cpu_bytes, reference_attention, two_pass_attention
from tests.kernel_cases import inputs


@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_two_pass_match_float64_reference(causal):
    q, k, v = inputs(75, 32, "float32")
    reference = reference_attention(q, k, v, causal=causal)
    assert (naive_attention(q, k, v, causal=causal).double() - reference).abs().max() < 1e-5
    tiled = two_pass_attention(q, k, v, causal=causal, block_m=32, block_n=16)
    assert (tiled.double() - reference).abs().max() < 1e-5
    # against torch's own implementation too
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(naive_attention(q, k, v, causal=causal), sdpa, atol=1e-5)


def test_naive_holds_the_square_matrix_and_tiled_does_not():
    q, k, v = inputs(512, 32, "float32")
    naive = peak_cpu_bytes(lambda: naive_attention(q, k, v))
    tiled = peak_cpu_bytes(lambda: two_pass_attention(q, k, v, block_m=64, block_n=64))
    assert naive >= 512 * 512 * 4  # at least one float32 [N, N] matrix
    assert tiled < naive / 4
