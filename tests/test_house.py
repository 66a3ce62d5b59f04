"""The house rules ARCHITECTURE.md states, read from the source itself: no import cycle between attnviz's modules
(counting the imports inside functions), no module reading another's private names, streamlit imported only in
attnviz.ui."""

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


def _module_named(name: str, node: ast.ImportFrom, package: bool) -> str | None:
    """The absolute module a `from ... import` names (relative imports resolved against `name`)."""
    if not node.level:
        return node.module
    base = name.split(".")[: len(name.split(".")) - (node.level - 1) - (0 if package else 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level string constants (NAME = "attnviz.x"), which import_module(NAME) may name."""
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _imports(name: str, tree: ast.Module, modules: dict[str, ast.Module], top_level_only: bool = False) -> set[str]:
    """The attnviz modules a module imports: every `import` and `from ... import` anywhere in it (inside functions
    too, where it runs later but still needs the other module: a loop closed there is a loop), and every
    importlib.import_module("attnviz....") of a literal name or a module constant. top_level_only: the statements
    run when the module is itself imported."""
    package = any(m.startswith(name + ".") for m in modules)
    constants = _constants(tree)
    out = set()
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            module = _module_named(name, node, package)
            if module and module.startswith("attnviz"):
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    out.add(full if full in modules else module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            arg = node.args[0]
            named = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", None))
            if isinstance(named, str) and named in modules:
                out.add(named)
    # importing a.b.c runs the package a.b's __init__ first: an edge to every enclosing package too
    parents = {".".join(m.split(".")[:i]) for m in out for i in range(2, m.count(".") + 1)}
    return (out | (parents & set(modules))) - {name} - {p for p in parents if name.startswith(p + ".")}


def _cycle(modules: dict[str, ast.Module] = MODULES, top_level_only: bool = False) -> list[str] | None:
    graph = {name: _imports(name, tree, modules, top_level_only) for name, tree in modules.items()}
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
    """No loop among attnviz's modules, counting the imports inside functions: a function may defer a heavy import
    (streamlit, triton, transformers' model classes, the toy lab, plotly), never close a loop."""
    assert _cycle(top_level_only=True) is None, " -> ".join(_cycle(top_level_only=True))
    assert _cycle() is None, " -> ".join(_cycle())
    assert len(MODULES) > 100 and sum(map(len, map(_own_imports, MODULES))) > 300  # the graph was read


def _own_imports(name: str) -> set[str]:
    return _imports(name, MODULES[name], MODULES)


def _made_up(**sources: str) -> dict[str, ast.Module]:
    """Made-up modules attnviz.<key> (a double underscore for a dot) from their source."""
    return {"attnviz." + key.replace("__", "."): ast.parse(text) for key, text in sources.items()}


def test_a_cycle_is_found_when_there_is_one():
    """The cycle finder itself, on made-up modules that import each other at the top."""
    pair = _made_up(fake_a="from attnviz.fake_b import x", fake_b="from attnviz.fake_a import y")
    assert set(_cycle(pair, top_level_only=True)) == set(_cycle(pair)) == {"attnviz.fake_a", "attnviz.fake_b"}
    # through a package's __init__: importing attnviz.fake_pkg.low runs attnviz.fake_pkg first
    through = _made_up(fake_a="from attnviz.fake_pkg.low import x", fake_pkg="from attnviz.fake_pkg.high import y",
                       fake_pkg__low="import numpy", fake_pkg__high="from attnviz.fake_a import z")
    assert set(_cycle(through)) == {"attnviz.fake_a", "attnviz.fake_pkg", "attnviz.fake_pkg.high"}
    assert _cycle({**through, "attnviz.fake_pkg.high": ast.parse("import numpy")}) is None


def test_a_cycle_closed_inside_a_function_is_found():
    """A loop closed by an import inside a function or method, by importlib.import_module of a literal name or of a
    module constant, or by a relative import: invisible to the top-level reading, found by the full one."""
    closings = ["def f():\n    from attnviz.fake_a import x\n",
                "import importlib\ndef f():\n    return importlib.import_module('attnviz.fake_a')\n",
                "import importlib\nFRONT = 'attnviz.fake_a'\ndef f():\n    importlib.import_module(FRONT)\n",
                "class C:\n    def m(self):\n        from .fake_a import x\n"]
    for closing in closings:
        pair = _made_up(fake_a="from attnviz.fake_b import x", fake_b=closing)
        assert _cycle(pair, top_level_only=True) is None, closing
        assert set(_cycle(pair)) == {"attnviz.fake_a", "attnviz.fake_b"}, closing
    deferred = _made_up(fake_a="from attnviz.fake_b import x",
                        fake_b="def f():\n    import numpy\n    from attnviz import fake_c\n", fake_c="")
    assert _cycle(deferred) is None  # a deferred import that closes no loop is allowed


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
