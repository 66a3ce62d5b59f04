"""The Triton interpreter's own overheads, cut without changing a number it computes (tests/test_triton_attention.py
runs the kernel both ways and compares bit for bit). Applied once, by triton_attention, when the kernels run
interpreted (no GPU); a Triton whose interpreter lacks a hook is left as it is."""

from __future__ import annotations

import dataclasses
import inspect


def no_overflow_checks() -> None:
    """The interpreter computes no integer overflow checks, as a compiled kernel runs none. Triton builds a check
    (in int64, compared with the type's bounds) around every integer +, - and * and keeps it only for a device
    assert, which is dropped when the kernel is not built in debug mode (the interpreter's default, as a
    compiled kernel's); the interpreter computed each check with numpy all the same: a third of a small run's time
    (the Tiled kernel page at N = 66: 0.15 -> 0.10 s)."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    if dataclasses.is_dataclass(getattr(builder, "options", None)) and \
            "sanitize_overflow" in {f.name for f in dataclasses.fields(builder.options)}:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)  # else: a Triton without it


def builtins_found_once() -> None:
    """The interpreter finds triton.language's builtins by name once, not on every call.

    Before every launch, and again before every call of a @triton.jit function inside a kernel (tl.max and tl.sum
    are such functions: two calls a tile), the interpreter swaps each builtin of triton.language, its core, math,
    tensor and tensor descriptor for a numpy version, finding them with inspect.getmembers over the whole module
    (hundreds of members, fetched and sorted each time): 34 of the 124 ms of the Tiled kernel page's kernel call at
    N = 70, d = 32, 16 x 16 tiles. Here the names of those five's builtins are listed once, now, before any kernel
    has run and swapped one, and only those are read again; each is swapped exactly when it is still a builtin, as
    before. Anything else is searched as Triton searches it."""
    from triton.runtime import interpreter

    patch_attr, searching = getattr(interpreter, "_patch_attr", None), getattr(interpreter, "_patch_builtin", None)
    if patch_attr is None or _params(searching) != ["pkg", "builder", "scope"]:
        return  # another Triton: its own way
    tl = interpreter.tl
    is_builtin = tl.core.is_builtin
    packages = (tl, tl.core, getattr(tl, "math", None), tl.tensor, getattr(tl.core, "tensor_descriptor_base", None))
    names = {id(pkg): [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
             for pkg in packages if pkg is not None}

    def patch_builtin(pkg, builder, scope):
        if id(pkg) not in names:
            return searching(pkg, builder, scope)
        for name in names[id(pkg)]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.searching = searching  # Triton's own, kept for the test that compares them
    interpreter._patch_builtin = patch_builtin


def _params(fn) -> list[str] | None:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
