"""Less resident memory for long texts, with the same numbers: what a capture's forward pass and a model's load
leave in memory that they do not need.

Measured on Gemma 3 270M at 32,768 tokens (float32, 2-core CPU), what held memory at the statistics' peak:
- each decoder layer's MLP: gate, up and their product are [N, intermediate] float32 each, 3 x 268 MB at once;
- the tokenizer: transformers keeps the Python lists it built the Rust tokenizer from (262,144 vocabulary entries
  and 514,906 merges), and the C allocator keeps the pages that building it freed (about 200 MB in all);
- freed pages the C allocator holds on to between layers instead of giving them back;
- the weights of the layers already run: transformers maps the safetensors file, and every page a pass reads stays
  resident (0.45 GB of layer weights by the last layer).
The float32 weights are not copied: transformers maps the safetensors file, so the 671 MB token embedding (tied to
the LM head) is resident only for the rows a text reads, and only weights a pass reads count at all.

What this module does about it:
- lean_forward(model): for the block, this thread's forward passes run each decoder layer's MLP over blocks of
  positions (exact: an MLP is position-wise; only the matmul's row count changes, so results agree within float32
  rounding) and give freed memory back to the system after a layer whose hidden states are mapped (over
  HEAP_BYTES) or once the heap's freed memory grew by RETAIN_BYTES (read from HEAP_CHECK_TOKENS tokens on), and
  when the pass ends; over a text of LONG_TEXT tokens or more, each layer's weights read from a mapped file are
  then paged out (MADV_PAGEOUT: their values stay; a later read maps them again from the page cache or the file),
  so only the layer running is resident.
  Other threads, and the model afterwards, are untouched.
- slim_tokenizer(tokenizer): drops the build-only copies of the vocabulary and merges (the Rust tokenizer that
  encodes and decodes holds its own).
- release_free_memory(): hands freed heap pages back to the system (glibc's malloc_trim; elsewhere nothing).

Memory given back costs time when it is taken again: every fresh page is a fault and a page of zeros written by
the kernel. Handing it all back after every layer, and MLP blocks of 32 MB (above glibc's 32 MB ceiling for
serving an allocation from its heap, so each was a fresh mapping), made a long pass fault millions of pages. With
blocks of BLOCK_BYTES, whose activations reuse the heap memory the last block freed, and that memory kept until the
pass ends (unless it grows by RETAIN_BYTES), most of those faults go. A pass whose [N, hidden] activations are
mapped afresh whatever the allocator keeps (Gemma 3 at 32,768 tokens) still gives freed memory back after each
layer: keeping it would raise its peak (benchmarks/longcontext.py measures the peaks). So does the Heads page's
pass where its freed memory grows layer by layer (it keeps each layer's q and k between the freed blocks).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import threading
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from attnviz.capture.hooks import SharedHooks
from attnviz.capture.modules import decoder_layers

BLOCK_BYTES = 12 * 2**20  # one [rows, widest] float32 activation of a blocked MLP stays about this size
HEAP_BYTES = 32 * 2**20  # glibc serves allocations up to this size from its heap (its own ceiling)
KEEP_BYTES = 128 * 2**20  # glibc keeps up to this much freed memory at its heap's top for the next allocations
RETAIN_BYTES = 128 * 2**20  # a lean pass gives freed heap memory back after a layer once it grew by this much
MIN_ROWS = 256  # never fewer rows per block: below it the matmuls lose speed
POSITION_WISE = ("mlp", "feed_forward")  # a decoder layer's child that acts on each position alone
LONG_TEXT = 4096  # from this many tokens on, a lean pass pages out each layer's mapped weights after the layer
# from this many tokens on, a lean pass reads the heap's freed memory after each layer (_heap_grew): glibc's
# mallinfo2 walks every free chunk of every arena, a cost a short capture would pay on every layer for layers that
# free a few MB each (the pass's end gives those back; benchmarks/capture.py measures the capture's overhead)
HEAP_CHECK_TOKENS = 1024
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (file-backed ones are read again when next touched)

_LEAN: ContextVar[bool] = ContextVar("attnviz_lean_forward", default=False)
_LIBC_LOCK = threading.Lock()
_LIBC: list = []
_RELEASED = [0]  # the freed bytes the heap held right after the last release_free_memory()
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


class _MallInfo2(ctypes.Structure):
    """glibc 2.33+'s struct mallinfo2: the allocator's totals over all its arenas, in bytes."""
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def release_free_memory() -> bool:
    """Gives the heap pages that freed allocations left behind back to the system (glibc's malloc_trim(0)), so
    the resident memory falls to what is in use. True where it ran; False where the C library has no such call
    (macOS, musl), where it is simply not needed or not possible."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    _RELEASED[0] = free_heap_bytes() or 0
    return True


def free_heap_bytes() -> int | None:
    """The bytes the C allocator holds freed in its heaps (glibc's mallinfo2, over all arenas; pages already given
    back count too); None where it cannot tell."""
    info = getattr(_libc(), "mallinfo2", None)
    return None if info is None else int(info().fordblks)


def _libc():
    """The C library, loaded once (madvise given its argument types, glibc's allocator tuned: _tune_allocator);
    None where it cannot be loaded."""
    with _LIBC_LOCK:
        if not _LIBC:
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            except OSError:
                libc = None
            if libc is not None and hasattr(libc, "madvise"):
                libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            if libc is not None and hasattr(libc, "mallinfo2"):
                libc.mallinfo2.restype = _MallInfo2
            _tune_allocator(libc)
            _LIBC.append(libc)
        return _LIBC[0]


def _tune_allocator(libc) -> None:
    """glibc serves allocations up to HEAP_BYTES from its heap (the ceiling its own sliding threshold reaches after
    the first large free) and keeps up to KEEP_BYTES freed at the heap's top rather than at most twice that
    threshold: a layer's activations then reuse the memory the last layer freed, and release_free_memory hands it
    back when asked. Nothing where the C library has no mallopt (not glibc)."""
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None and getattr(libc, "malloc_trim", None) is not None:
        mallopt(M_MMAP_THRESHOLD, HEAP_BYTES)  # set first: setting either one ends glibc's sliding threshold
        mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)


def slim_tokenizer(tokenizer):
    """The same tokenizer without the Python copies of its vocabulary (a dict) and merges (a list) that
    transformers keeps after building the Rust tokenizer from them: encoding, decoding and get_vocab read the Rust
    tokenizer. Only a tokenizer backed by one (`_tokenizer`) is changed; the freed pages go back to the system."""
    if getattr(tokenizer, "_tokenizer", None) is None:
        return tokenizer
    dropped = False
    for name, kind in (("_merges", list), ("_vocab", dict)):
        if isinstance(vars(tokenizer).get(name), kind) and getattr(tokenizer, name):
            setattr(tokenizer, name, kind())
            dropped = True
    if dropped:
        import gc

        gc.collect()
    release_free_memory()
    return tokenizer


def block_rows(module: torch.nn.Module) -> int:
    """Positions per block for a position-wise module: BLOCK_BYTES over its widest activation (the largest
    dimension of its weights, e.g. an MLP's intermediate size) in float32, at least MIN_ROWS."""
    widest = max((max(p.shape[-2:]) for p in module.parameters() if p.dim() >= 2), default=1)
    return max(MIN_ROWS, BLOCK_BYTES // (4 * int(widest)))


def blocked(forward, rows: int):
    """forward(x) computed over blocks of `rows` positions (dimension -2 of x) into one output, when this thread
    is inside lean_forward and x is longer than a block; otherwise forward itself. A module whose output is not one
    tensor of x's leading shape (a router's tuple) is run whole."""
    def run(x=None, *args, **kwargs):
        if not _LEAN.get() or args or kwargs or not isinstance(x, torch.Tensor) or x.dim() < 2 \
                or x.shape[-2] <= rows:
            return forward(x, *args, **kwargs) if x is not None else forward(*args, **kwargs)
        first = forward(x[..., :rows, :])
        if not isinstance(first, torch.Tensor) or first.shape[:-1] != x[..., :rows, :].shape[:-1]:
            return forward(x)
        out = first.new_empty((*x.shape[:-1], first.shape[-1]))
        out[..., :rows, :] = first
        del first
        for start in range(rows, x.shape[-2], rows):
            out[..., start:start + rows, :] = forward(x[..., start:start + rows, :])
        return out

    return run


class _Restore:
    """A handle whose remove() puts a module's own forward back (SharedHooks removes hooks through it)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.had = "forward" in vars(module)
        self.before = vars(module).get("forward")

    def remove(self) -> None:
        if self.had:
            self.module.forward = self.before
        else:
            vars(self.module).pop("forward", None)


def position_wise_modules(model) -> list[torch.nn.Module]:
    """Each decoder layer's MLP (its child named in POSITION_WISE): the modules lean_forward runs in blocks.
    Empty when the model has no stack of decoder layers that attnviz.capture.decoder_layers recognises."""
    try:
        layers = decoder_layers(model)
    except ValueError:
        return []
    found = []
    for layer in layers:
        found.extend(m for name, m in layer.named_children() if name in POSITION_WISE)
    return found


def mapped_weight_ranges(module: torch.nn.Module) -> list[tuple[int, int]]:
    """(start, length) of the whole pages holding the module's parameters that lie in a file mapped into memory
    (transformers maps safetensors files), clipped to that mapping; parameters in ordinary memory or on a GPU are
    left out.
    Empty where /proc/self/maps cannot be read."""
    try:
        with open("/proc/self/maps") as fh:
            files = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in fh
                     if len(line.split()) >= 6 and line.split()[5].startswith("/")]
    except OSError:
        return []
    page, found = mmap.PAGESIZE, set()
    for p in module.parameters():
        if p.device.type != "cpu":
            continue
        start, end = p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()
        for lo, hi in files:
            if lo <= start and end <= hi:
                a, b = max(lo, start // page * page), min(hi, -(-end // page) * page)
                found.add((a, b - a))
                break
    return sorted(found)


def page_out(ranges: list[tuple[int, int]]) -> bool:
    """Asks the kernel to reclaim these pages now (MADV_PAGEOUT): a file-backed page leaves the resident set and is
    read again, with the same contents, when next touched; an anonymous page is kept unless there is swap. False
    where the call is not available (not Linux, or a kernel before 5.4)."""
    madvise = getattr(_libc(), "madvise", None)
    if madvise is None:
        return False
    return all(madvise(start, length, MADV_PAGEOUT) == 0 for start, length in ranges)


def _after_layer(module, args, kwargs, output) -> None:
    """After a decoder layer in a lean pass: over a text of LONG_TEXT tokens the layer's mapped weights are paged
    out (found then: reading /proc/self/maps for every layer at the start of every pass cost a short capture a
    tenth of its time), and freed memory goes back to the system where the hidden states are larger than
    HEAP_BYTES (activations that size are mapped afresh each time, so the heap's freed memory would sit unused) or,
    over a text of HEAP_CHECK_TOKENS, the heap's freed memory grew by more than RETAIN_BYTES since the last release
    (or cannot be told): what a layer frees is then not what the next one takes. Otherwise the next layer's
    activations reuse it, and lean_forward gives it back at the end."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if not _LEAN.get() or not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
        return
    if hidden.shape[-2] >= LONG_TEXT:
        page_out(mapped_weight_ranges(module))
    if hidden.numel() * hidden.element_size() > HEAP_BYTES or (hidden.shape[-2] >= HEAP_CHECK_TOKENS
                                                               and _heap_grew()):
        release_free_memory()


def _heap_grew() -> bool:
    """Whether the heap's freed memory grew by more than RETAIN_BYTES since the last release (True where it cannot
    be told)."""
    free = free_heap_bytes()
    return free is None or free > _RELEASED[0] + RETAIN_BYTES


def _install(model) -> list:
    handles = []
    for module in position_wise_modules(model):
        handle = _Restore(module)
        module.forward = blocked(module.forward, block_rows(module))
        handles.append(handle)
    try:
        layers = decoder_layers(model)
    except ValueError:
        layers = []
    handles.extend(layer.register_forward_hook(_after_layer, with_kwargs=True) for layer in layers)
    return handles


_SHARED = SharedHooks(_install)


@contextlib.contextmanager
def lean_forward(model) -> Iterator[None]:
    """This thread's forward passes of `model` inside the block run each decoder layer's MLP over blocks of
    positions and return freed memory to the system between layers (see _after_layer) and at the end. The
    wrappers are installed by the first thread inside and removed by the last (also on an exception); other threads
    run the model's own forward."""
    try:
        with _SHARED.serving(model, _LEAN, True):
            yield
    finally:
        release_free_memory()
