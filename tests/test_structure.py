"""The package's shape, counted from its source: no import circle between modules, no
part of the control plane importing its composition root, and files, classes and
functions within their sizes (600, 400 and 150 lines).

Every import statement counts, those under ``TYPE_CHECKING`` too (an import a type
checker follows is still a dependency a reader follows); importing ``a.b.c`` counts as
importing the packages ``a`` and ``a.b`` as well, as Python runs their ``__init__``.

What is over a limit today is listed in ``OVER`` with its size: such an entry may
shrink and must then be lowered or dropped, never grow, and nothing may join it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
FILE_LINES, CLASS_LINES, FUNCTION_LINES = 600, 400, 150
ROOT = "plait.server.controlplane.core"

#: what is over its limit today: "path" for a file, "path:Name" for a class or a
#: function (its lines)
OVER: dict[str, int] = {}
#: import circles today, each as its sorted modules
CIRCLES: list[list[str]] = []
#: parts of the control plane that still import its root
ROOT_IMPORTERS: set[str] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "plait").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _known(name: str) -> str | None:
    """The module ``name`` names, or the one it is an attribute of."""
    while name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imports(name: str, tree: ast.Module) -> set[str]:
    package = name.split(".") if MODULES[name].name == "__init__.py" else name.split(".")[:-1]
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # (``from a.b import c`` names the package a.b itself, even for a module c)
            named.add(module)
            named.update(f"{module}.{a.name}" for a in node.names
                         if f"{module}.{a.name}" in MODULES)
    found = set()
    for target in filter(None, map(_known, named)):
        found.add(target)  # (named: counted, its own package's __init__ too)
        parts = target.split(".")
        for k in range(1, len(parts)):
            enclosing = ".".join(parts[:k])
            # (a package's own modules do not run its __init__ again)
            if enclosing in MODULES and not name.startswith(enclosing + "."):
                found.add(enclosing)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, tree) for name, tree in TREES.items()}


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(GRAPH.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return sorted(out)


def _sizes() -> dict[str, int]:
    over = {}
    for name, tree in TREES.items():
        path = MODULES[name].relative_to(SRC).as_posix()
        lines = len(MODULES[name].read_text().splitlines())
        if lines > FILE_LINES:
            over[path] = lines
        for node in ast.walk(tree):
            limit = (CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
                     if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None)
            if limit is not None:
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    over[f"{path}:{node.name}"] = size  # type: ignore[attr-defined]
    return over


def test_no_import_circle_but_those_known() -> None:
    found = _circles()
    new = [c for c in found if c not in CIRCLES]
    assert not new, f"import circles: {new}"
    gone = [c for c in CIRCLES if c not in found]
    assert not gone, f"circles gone (drop them from CIRCLES): {gone}"


def test_no_part_of_the_control_plane_imports_its_root() -> None:
    importers = {name for name, targets in GRAPH.items()
                 if ROOT in targets and name.startswith("plait.server.controlplane.")}
    assert importers <= ROOT_IMPORTERS, f"import {ROOT}: {sorted(importers - ROOT_IMPORTERS)}"
    assert importers == ROOT_IMPORTERS, \
        f"no longer import the root (drop them): {sorted(ROOT_IMPORTERS - importers)}"


@pytest.mark.parametrize("kind", ["grown or new", "shrunk"])
def test_sizes_within_their_limits(kind: str) -> None:
    found = _sizes()
    if kind == "grown or new":
        bad = {k: v for k, v in found.items() if v > OVER.get(k, 0)}
        assert not bad, (f"over {FILE_LINES} lines a file, {CLASS_LINES} a class, "
                         f"{FUNCTION_LINES} a function: {bad}")
    else:
        smaller = {k: (OVER[k], found.get(k)) for k in OVER if found.get(k, 0) < OVER[k]}
        assert not smaller, f"lower or drop them in OVER (was, now): {smaller}"


def test_the_counter_sees_a_circle_and_a_size() -> None:
    """The counter itself: a circle made by hand is found, as is a long function."""
    saved = dict(GRAPH)
    try:
        GRAPH["plait.a"], GRAPH["plait.b"] = {"plait.b"}, {"plait.a"}
        assert ["plait.a", "plait.b"] in _circles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)
    tree = ast.parse("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    node = tree.body[0]
    assert node.end_lineno - node.lineno + 1 > FUNCTION_LINES  # type: ignore[operator]
