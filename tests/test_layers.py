"""The package's layers, read from its imports (module level and inside functions alike):
no import cycle, the two engines never import each other, the reading layer and the fix
builders sit below both, and no part of the engine imports a renderer or a front-end (pyflakes'
checker/reporter split)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "explainer"
# The engine: what analyses code and errors and returns facts.
ENGINE = ("explainer.model", "explainer.causes", "explainer.reading", "explainer.fixes", "explainer.static",
          "explainer.runtime")
# What only renders findings, or brings them to users.
FRONT = ("explainer.render", "explainer.cli", "explainer.ipython", "explainer.notes", "explainer.editor",
         "explainer.handoff")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """The package's modules that `name` imports. `from pkg import x` imports `pkg` (Python runs
    its `__init__` first) and, where `x` is a submodule, `x` too: the reading of
    ../shared/tools/import_cycles.py, which this test must agree with."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            candidates = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def within(name: str, layers) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_the_import_reader_sees_lazy_imports_and_packages():
    assert "explainer.runtime.postmortem" in GRAPH["explainer"]  # imported inside explain()
    # `from . import source as src`: the package, then its module.
    assert {"explainer.reading", "explainer.reading.source"} <= GRAPH["explainer.reading.training"]


def test_no_import_cycle():
    assert cycles() == []


def test_the_engines_never_import_each_other():
    crossing = [(a, b) for a, targets in GRAPH.items() for b in targets
                if within(a, ["explainer.runtime"]) and within(b, ["explainer.static"])
                or within(a, ["explainer.static"]) and within(b, ["explainer.runtime"])]
    assert crossing == []


def test_the_reading_layer_and_the_fixes_sit_below_both_engines():
    above = ("explainer.runtime", "explainer.static", *FRONT)
    wrong = [(a, b) for a, targets in GRAPH.items() for b in targets
             if within(a, ["explainer.reading", "explainer.fixes"]) and within(b, above)]
    assert wrong == []


def test_the_engine_imports_no_renderer_and_no_front_end():
    wrong = [(a, b) for a, targets in GRAPH.items() for b in targets if within(a, ENGINE) and within(b, FRONT)]
    assert wrong == []
