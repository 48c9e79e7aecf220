"""Stop keeping a memo of a value with history: the method computes it anew on every call."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading import source as src
from .edits import node_start
from .remove_statement import without


def stop_caching(source: src.Source, class_node: ast.ClassDef, store: ast.stmt, expression: str) -> Fix | None:
    """`self.adj_preped = adj_preped`, where the class reads `self.adj_preped` only once it has
    checked that it is not None (and computes it otherwise): without the store, every call
    computes the value with its own graph, as the first call did."""
    reads = [r for r in src.reads(class_node, expression) if not src.is_none_check(src.parent(r), expression)]
    if not reads or not all(_guarded(r, expression) for r in reads):
        return None
    return Fix(f"Don't keep `{expression}` between calls (`{source.segment(store)}`, line {store.lineno}): it "
               f"holds the graph of the call that made it, and where it is None the value is computed anew, "
               f"with a graph of its own", without(source, [store]))


def _guarded(read: ast.AST, expression: str) -> bool:
    """The read runs only where an enclosing `if` found the value set."""
    child = read
    for ancestor in src.ancestors(read):
        if isinstance(ancestor, ast.If):
            checks = [n for n in ast.walk(ancestor.test) if src.is_none_check(n, expression)]
            in_body = any(child is s for s in ancestor.body)
            if any(isinstance(c.ops[0], ast.IsNot) for c in checks) and in_body \
                    and (not isinstance(ancestor.test, ast.BoolOp) or isinstance(ancestor.test.op, ast.And)):
                return True
            if any(isinstance(c.ops[0], ast.Is) for c in checks) and not in_body and ancestor.test is checks[0]:
                return True
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = ancestor
    return False


def keyed_cache(located) -> ast.If | None:
    """The `if` that builds `located`'s value only when a key it keeps has changed: torch-pme's
    `if not torch.allclose(cell, self._cell_cache):`, whose body stores the new key
    (`self._cell_cache = cell.detach().clone()`) and builds `self._MI` from `cell`. None where
    the store is not in such an `if` (with no `else`), in a method of a class."""
    store = getattr(located, "store", None)
    if located is None or located.class_node is None or not isinstance(store, ast.stmt):
        return None
    block = src.parent(store)
    method = src.enclosing_function(store)
    if not isinstance(block, ast.If) or block.orelse or not any(s is store for s in block.body) \
            or getattr(method, "name", "__init__") == "__init__":
        return None
    # A key of its own, stored beside the value: not `if self.latent_avg is None:`, a memo.
    keys = {src.canonical(n) for n in ast.walk(block.test) if isinstance(n, ast.Attribute)
            and src.canonical(n).startswith("self.")} - {located.target_text}
    stored = {src.canonical(t) for stmt in block.body for t in src.targets_of(stmt)}
    return block if keys & stored else None


def rebuild_every_call(source: src.Source, block: ast.If) -> Fix:
    """`if not torch.allclose(cell, self._cell_cache): <body>` -> `<body>`, one level out."""
    indent = source.indent_of(block.lineno)
    inner = source.indent_of(block.body[0].lineno)
    lines = [source.line(row) for row in range(block.body[0].lineno, block.end_lineno + 1)]
    text = "\n".join(line[len(inner) - len(indent):] if line.startswith(inner) else line.strip() and line
                     for line in lines)
    return Fix(f"Build what `if {source.segment(block.test)}:` keeps on every call (line {block.lineno}): what it "
               f"built for an earlier call holds that call's graph, which its backward freed",
               (Edit(source.filename, text.lstrip(), node_start(source, block), _line_end(source, block.end_lineno)),))


def _line_end(source: src.Source, row: int) -> Location:
    """The end of line `row`, past a trailing comment the edit's text carries."""
    return Location(row, source.column(row, len(source.line(row).encode("utf-8"))))
