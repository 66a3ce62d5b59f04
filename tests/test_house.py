"""The house rules ARCHITECTURE.md states, read from the source itself: no import cycle between attnviz's modules, no
module reading another's private names, streamlit imported only in attnviz.ui."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "attnviz"


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("attnviz", *path.relative_to(ROOT).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = ast.parse(path.read_text(encoding="utf-8"))
    return found


MODULES = _modules()


def _top_level_imports(name: str, tree: ast.Module) -> set[str]:
    """The attnviz modules a module imports when it is itself imported (its top-level statements)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnviz"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
    # importing a.b.c runs the package a.b's __init__ first: an edge to every enclosing package too
    parents = {".".join(m.split(".")[:i]) for m in out for i in range(2, m.count(".") + 1)}
    return (out | (parents & set(MODULES))) - {name} - {p for p in parents if name.startswith(p + ".")}


def _cycle() -> list[str] | None:
    graph = {name: _top_level_imports(name, tree) for name, tree in MODULES.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if not state.get(nxt):
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for name in sorted(graph):
        if not state.get(name):
            found = visit(name, [])
            if found:
                return found
    return None


def test_no_import_cycle_between_modules():
    assert _cycle() is None, " -> ".join(_cycle())


def test_a_cycle_is_found_when_there_is_one():
    """The cycle finder itself, on a made-up pair of modules that import each other."""
    saved = dict(MODULES)
    try:
        MODULES["attnviz.fake_a"] = ast.parse("from attnviz.fake_b import x")
        MODULES["attnviz.fake_b"] = ast.parse("from attnviz.fake_a import y")
        assert set(_cycle()) == {"attnviz.fake_a", "attnviz.fake_b"}
        # through a package's __init__: importing attnviz.fake_pkg.low runs attnviz.fake_pkg first
        del MODULES["attnviz.fake_b"]
        MODULES["attnviz.fake_a"] = ast.parse("from attnviz.fake_pkg.low import x")
        MODULES["attnviz.fake_pkg"] = ast.parse("from attnviz.fake_pkg.high import y")
        MODULES["attnviz.fake_pkg.low"] = ast.parse("import numpy")
        MODULES["attnviz.fake_pkg.high"] = ast.parse("from attnviz.fake_a import z")
        assert set(_cycle()) == {"attnviz.fake_a", "attnviz.fake_pkg", "attnviz.fake_pkg.high"}
    finally:
        MODULES.clear()
        MODULES.update(saved)


def _private_reads(tree: ast.Module) -> list[str]:
    """`from attnviz.x import _name` and `alias._name` where alias names an imported attnviz module."""
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnviz"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in MODULES:
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name in MODULES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_reads_another_modules_private_names():
    reads = {name: _private_reads(tree) for name, tree in MODULES.items()}
    assert {name: r for name, r in reads.items() if r} == {}
    assert _private_reads(ast.parse("from attnviz import knockout as ko\nko._forward(1)")) == ["ko._forward"]


def test_only_attnviz_ui_imports_streamlit():
    importers = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "streamlit" or n.startswith("streamlit.") for n in names):
                importers.append(name)
    assert importers and all(n == "attnviz.ui" or n.startswith("attnviz.ui.") for n in importers), importers


def _errors_outside_the_base(trees: dict[str, ast.Module]) -> list[str]:
    """Every class named *Error (and the other exceptions attnviz raises for its users) whose bases reach
    AttnvizError neither directly nor through another such class."""
    bases = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    wanted = {c for c in bases if c.endswith("Error") and c != "AttnvizError"} | (
        {"Unsupported", "OverBudget", "StorageRefused", "NotALanguageModel"} & set(bases))

    def reaches(c, seen=()):
        return c == "AttnvizError" or (c in bases and c not in seen and any(reaches(b, (*seen, c)) for b in bases[c]))

    return sorted(c for c in wanted if not reaches(c))


def test_every_attnviz_error_derives_from_attnviz_error():
    import attnviz

    assert _errors_outside_the_base(_modules()) == []
    assert attnviz.AttnvizError is attnviz.CaptureError.__mro__[1]


def test_an_error_outside_the_base_is_found():
    made_up = {"a": ast.parse("class AttnvizError(Exception): pass\nclass GoodError(AttnvizError, ValueError): pass\n"
                              "class ChildError(GoodError): pass\nclass LoneError(ValueError): pass\n")}
    assert _errors_outside_the_base(made_up) == ["LoneError"]


PAGES = Path(__file__).resolve().parent.parent / "app_pages"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def _rooms() -> dict[str, str]:
    """Every source file of the library and of the pages, by its path from the repository's root."""
    files = [*ROOT.rglob("*.py"), *PAGES.glob("*.py")]
    return {str(p.relative_to(ROOT.parent)): p.read_text(encoding="utf-8") for p in files}


def _long_rooms(sources: dict[str, str]) -> list[str]:
    return sorted(f"{path}: {text.count(chr(10))} lines" for path, text in sources.items()
                  if text.count("\n") > MAX_FILE_LINES)


def _long_functions(sources: dict[str, str]) -> list[str]:
    """Functions over MAX_FUNCTION_LINES lines, docstring included; the Triton kernels (@triton.jit) keep the
    shape of the Triton tutorial's and are left out."""
    found = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
                if not jit and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    found.append(f"{path}: {node.name}, {node.end_lineno - node.lineno + 1} lines")
    return sorted(found)


def test_every_room_fits_a_screen_or_two():
    """No file of attnviz/ or app_pages/ over 400 lines, no function over 60 (ARCHITECTURE.md, the house rules)."""
    rooms = _rooms()
    assert len(rooms) > 50
    assert _long_rooms(rooms) == []
    assert _long_functions(rooms) == []


def test_a_long_room_and_a_long_function_are_found():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    made_up = {"big.py": "x = 1\n" * 401, "short.py": f"def f():\n{body}\n",
               "kernel.py": f"@triton.jit\ndef k():\n{body}\n", "fits.py": f"def g():\n{body[:-12]}\n"}
    assert _long_rooms(made_up) == ["big.py: 401 lines"]
    assert _long_functions(made_up) == ["short.py: f, 61 lines"]
