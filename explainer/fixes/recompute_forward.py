"""Recompute the forward after an optimizer step, instead of reusing a graph built before it."""
from __future__ import annotations

import ast

from ..model import Fix
from ..source import Source, canonical, names_read, own_nodes, reads, targets_of
from .edits import insert_lines_before, statement_text

_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)


def _simple_statements(scope: ast.AST) -> list[ast.stmt]:
    found = [n for n in own_nodes(scope) if isinstance(n, _SIMPLE)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return found


def _reads_any(stmt: ast.AST, expressions: set[str]) -> bool:
    return any(reads(stmt, e) for e in expressions)


def recompute_before_use(source: Source, scope: ast.AST, carrier_stmt: ast.stmt, after_row: int,
                         failing_stmt: ast.stmt, why: str) -> Fix | None:
    """Re-run `carrier_stmt` (and what was derived from it before `after_row`) just before the
    first statement after `after_row` that uses it."""
    if not isinstance(carrier_stmt, (ast.Assign, ast.AnnAssign)):
        return None
    statements = _simple_statements(scope)
    derived = {canonical(t) for t in targets_of(carrier_stmt)}
    chain = [carrier_stmt]
    for stmt in statements:
        if carrier_stmt.lineno < stmt.lineno < after_row and isinstance(stmt, (ast.Assign, ast.AnnAssign)) \
                and _reads_any(stmt.value, derived):
            chain.append(stmt)
            derived |= {canonical(t) for t in targets_of(stmt)}
    insertion = next((s for s in statements
                      if after_row < s.lineno <= failing_stmt.lineno and _reads_any(s, derived)), None)
    if insertion is None:
        return None
    needed = set()
    for stmt in statements:
        if insertion.lineno <= stmt.lineno <= failing_stmt.lineno:
            needed |= names_read(stmt) | {canonical(n) for n in ast.walk(stmt) if isinstance(n, (ast.Attribute, ast.Subscript))}
    kept = []
    for stmt in reversed(chain):
        if stmt is carrier_stmt or any(canonical(t) in needed for t in targets_of(stmt)):
            kept.append(stmt)
            needed |= names_read(stmt.value)
    kept.reverse()
    lines = [line for stmt in kept for line in statement_text(source, stmt)]
    return Fix(why, (insert_lines_before(source, insertion, lines),))
