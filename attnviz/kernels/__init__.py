"""Attention kernels: naive attention, a two-pass tiled version, the online-softmax stepper and the fused Triton kernel.

triton_attention holds the kernel; stepper mirrors it in torch, one tile at a time; stages holds the stage bounds both
use (and the tile map drawn from them); traffic counts the bytes naive and tiled attention move; limits says what may
run here; timing checks and times every method; naive holds the plain versions and the float64 reference;
triton_stats runs the same forward pass with the head statistics' epilogue (attnviz.stats's columns on a GPU);
steps_view runs the stepper and the kernel at one setting and draws the Tiled kernel page's step view (imported on
its own, as it draws with plotly).

Without CUDA the Triton kernel runs under the Triton interpreter. The interpreter is chosen when @triton.jit runs,
so TRITON_INTERPRET is set here, before the kernel module is imported (an explicit setting is left alone): importing
attnviz.kernels is what makes that choice for the process; `import attnviz` alone changes nothing. triton.language
decorates its own functions when it is first imported, which building any transformers model does (through
torch._dynamo): imported that way before attnviz.kernels, the interpreted kernel cannot run, and
triton_attention.UNAVAILABLE says so (flash_attention raises it, refusal returns it). Import attnviz.kernels first,
or start Python with TRITON_INTERPRET=1.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .naive import naive_attention, reference_attention, two_pass_attention
from .stages import (
    TILE_FULL, TILE_MASKED, TILE_SKIPPED, TILE_WINDOW, StageBounds, keys_read, stage_bounds, tile_map,
)
from .stepper import TileStep, online_attention, tiled_steps, trace_difference
from .limits import ITEMSIZE, MAX_INTERPRETED_STEPS, refusal, tile_steps
from .timing import (
    MethodResult, compare_methods, device_peak_tflops, forward_flops, make_inputs, peak_bytes, peak_cpu_bytes,
    peak_memory_at, peak_memory_scan, time_call,
)
from .traffic import Traffic, break_even_head_dim, compare_traffic, naive_traffic, tiled_traffic
from .triton_attention import INTERPRETED, KERNEL_DEVICE, UNAVAILABLE, KernelError, KernelTrace, flash_attention
from .triton_stats import StatsLaunch, Unsupported, kernel_stats, prepare_stats, stats_on_device

__all__ = [
    "INTERPRETED", "ITEMSIZE", "KERNEL_DEVICE", "MAX_INTERPRETED_STEPS", "KernelError", "KernelTrace", "MethodResult",
    "StageBounds",
    "StatsLaunch", "TILE_FULL", "TILE_MASKED", "TILE_SKIPPED", "TILE_WINDOW", "TileStep", "Traffic", "UNAVAILABLE",
    "Unsupported", "break_even_head_dim",
    "compare_methods", "compare_traffic", "device_peak_tflops", "flash_attention", "forward_flops", "kernel_stats",
    "keys_read",
    "make_inputs", "naive_attention", "naive_traffic", "online_attention", "peak_bytes", "peak_cpu_bytes",
    "peak_memory_at", "peak_memory_scan", "prepare_stats", "reference_attention", "refusal", "stage_bounds",
    "stats_on_device", "tile_map", "tile_steps",
    "tiled_steps", "tiled_traffic", "time_call", "trace_difference", "two_pass_attention",
]
