"""Stop keeping a memo of a value with history: the method computes it anew on every call."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading import source as src
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
