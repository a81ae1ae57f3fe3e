"""The package's import graph keeps its layers: no import cycles, compressors independent of exploration.

Read from the source files (nothing is imported): every module of `sparta_explore`, found
where pyproject.toml puts each package (pruners/, quantizers/ and kernels/ live beside
sparta_explore/), parsed with `ast` for every import statement, those inside functions
included, relative imports resolved. ``import a.b.c`` imports module a.b.c; ``from a.b
import c`` imports a.b.c when that is a module, else a.b.

* No cycle among module-level imports (those that run when a module is imported).
* No cycle closed by lazy imports either (inside functions, under ``if TYPE_CHECKING:``):
  they do not fail at import time, but they still tie the modules together. A registry
  holds only its table and decorator, and a module above it imports what registers.
* Pruners and quantizers come before exploration in the flow: no import of theirs, lazy
  or not, reaches the zoo (built-in models and data), `workload.py` or `explore/`.
"""

from __future__ import annotations

import ast
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparta_explore"
COMPRESSORS = ("sparta_explore.pruners", "sparta_explore.quantizers")
LATER_THAN_COMPRESSORS = ("sparta_explore.zoo", "sparta_explore.workload", "sparta_explore.explore")


@dataclass(frozen=True)
class Import:
    target: str   # the sparta_explore module imported
    line: int
    eager: bool   # runs when the importing module is imported (not in a function, not TYPE_CHECKING)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def source_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package), for every module of the package."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {PACKAGE: PACKAGE, **setuptools.get("package-dir", {})}
    found: dict[str, tuple[Path, bool]] = {}

    def walk(package: str, folder: Path) -> None:
        found[package] = (folder / "__init__.py", True)
        for info in pkgutil.iter_modules([str(folder)]):
            name = f"{package}.{info.name}"
            if name in roots:  # a package that lives elsewhere (package-dir): walked from there
                continue
            if info.ispkg:
                walk(name, folder / info.name)
            else:
                found[name] = (folder / f"{info.name}.py", False)

    for package, folder in roots.items():
        if _within(package, PACKAGE) and (ROOT / folder / "__init__.py").is_file():
            walk(package, ROOT / folder)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, eager))
            lazy = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.If) and _is_type_checking(child))
            visit(child, eager and not lazy)

    visit(tree, True)
    return out


def _known(name: str, modules: dict) -> str | None:
    """`name`, or its longest prefix that is a module of the package (None: not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, list[Import]]:
    """Module -> the package's modules it imports."""
    modules = source_modules()
    graph: dict[str, list[Import]] = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        here = module.split(".") if is_package else module.split(".")[:-1]
        edges = []
        for node, eager in _imports_of(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here[:len(here) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names]
            for name in names:
                target = _known(name, modules) if _within(name, PACKAGE) else None
                if target is not None and target != module:
                    edges.append(Import(target, node.lineno, eager))
        graph[module] = edges
    return graph


def _groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (each lies on a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups


def _cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through `group`'s first module, as the path back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first within the group
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other, as the path back to its start."""
    return sorted(_cycle(graph, g) for g in _groups(graph))


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    return import_graph()


def _edges(graph: dict[str, list[Import]], *, eager_only: bool) -> dict[str, set[str]]:
    return {m: {i.target for i in imports if i.eager or not eager_only} for m, imports in graph.items()}


def _listed(found: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(c) for c in found)


def test_every_module_is_found(graph):
    for name in ("sparta_explore", "sparta_explore.workload", "sparta_explore.pruners.block",
                 "sparta_explore.quantizers.calibrate_split", "sparta_explore.kernels", "sparta_explore.zoo.workloads",
                 "sparta_explore.compile.passes"):
        assert name in graph, name
    assert any(i.target == "sparta_explore.pruners.registry" for i in graph["sparta_explore.pruners.block"])


def test_no_import_cycles(graph):
    found = cycles(_edges(graph, eager_only=True))
    assert not found, "module-level import cycles (each module imports the next):\n" + _listed(found)


def test_no_cycles_through_lazy_imports(graph):
    found = cycles(_edges(graph, eager_only=False))
    assert not found, ("import cycles closed by imports inside functions (or under TYPE_CHECKING):\n" + _listed(found)
                       + "\nmove what both sides need into a module before them")


def test_the_cycle_check_names_the_modules():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("later", LATER_THAN_COMPRESSORS)
def test_compressors_never_import_later_stages(graph, later):
    bad = [f"{module}:{i.line} imports {i.target}" for module, imports in sorted(graph.items())
           if any(_within(module, c) for c in COMPRESSORS) for i in imports if _within(i.target, later)]
    assert not bad, f"pruners / quantizers come before {later}:\n" + "\n".join("  " + b for b in bad)
