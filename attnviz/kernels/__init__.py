"""Attention kernels: naive attention, a two-pass tiled version, the online-softmax stepper and the fused Triton kernel.

Without CUDA the Triton kernel runs under the Triton interpreter. The interpreter is chosen when @triton.jit runs,
so TRITON_INTERPRET is set here, before the kernel module is imported (an explicit setting is left alone).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .naive import naive_attention, reference_attention, two_pass_attention  # noqa: E402
from .stepper import (  # noqa: E402
    TILE_FULL, TILE_PARTIAL, TILE_SKIPPED, TileStep, naive_traffic, online_attention, tile_map, tiled_steps,
)
from .timing import (  # noqa: E402
    MAX_INTERPRETED_STEPS, MethodResult, compare_methods, device_peak_tflops, forward_flops, make_inputs,
    peak_bytes, peak_cpu_bytes, peak_memory_at, peak_memory_scan, refusal, tile_steps, time_call,
)
from .triton_attention import INTERPRETED, KERNEL_DEVICE, KernelTrace, flash_attention  # noqa: E402

__all__ = [
    "INTERPRETED", "KERNEL_DEVICE", "MAX_INTERPRETED_STEPS", "KernelTrace", "MethodResult", "TILE_FULL",
    "TILE_PARTIAL", "TILE_SKIPPED", "TileStep", "compare_methods", "device_peak_tflops", "forward_flops",
    "flash_attention", "make_inputs", "naive_attention", "naive_traffic", "online_attention", "peak_bytes",
    "peak_cpu_bytes", "peak_memory_at", "peak_memory_scan", "reference_attention", "refusal", "tile_map",
    "tile_steps", "tiled_steps", "time_call", "two_pass_attention",
]
