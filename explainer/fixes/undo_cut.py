"""Undo what cut the graph before a backward: `.detach()`, `torch.no_grad()`."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, assignments, canonical
from .edits import delete_lines, replace, statement_text
from .recompute_forward import last_step_before, zero_grad_again


def recompute_instead_of_detach(source: Source, scope: ast.AST, stmt: ast.stmt, name: str) -> Fix | None:
    """`output = output.detach()` after a backward: run the forward again instead."""
    earlier = [a for a in assignments(scope, name) if a.stmt.lineno < stmt.lineno
               and "detach" not in ast.unparse(a.stmt)]
    if not earlier or not isinstance(earlier[-1].stmt, ast.Assign):
        return None
    previous = earlier[-1].stmt
    indent = source.indent_of(stmt.lineno)
    step_row = last_step_before(scope, stmt.lineno)
    zeroing = zero_grad_again(scope, step_row, stmt.lineno, stmt) if step_row and step_row > previous.lineno else []
    text = ("\n" + indent).join([*zeroing, *statement_text(source, previous)])
    return Fix(f"Recompute `{name}` with a fresh forward instead of detaching it: the detached "
               f"value has no graph for the next backward", (replace(source, stmt, text),))


def remove_detach(source: Source, call: ast.Call) -> Fix | None:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr in ("detach", "item", "numpy")):
        return None
    inner = source.segment(call.func.value)
    return Fix(f"Remove `.{call.func.attr}()`: it cuts the graph the backward needs",
               (replace(source, call, inner),))


def leave_no_grad(source: Source, with_stmt: ast.With) -> Fix | None:
    if len(with_stmt.items) != 1 or "no_grad" not in canonical(with_stmt.items[0].context_expr) \
            and "inference_mode" not in canonical(with_stmt.items[0].context_expr):
        return None
    indent = source.indent_of(with_stmt.lineno)
    body_lines = []
    for stmt in with_stmt.body:
        body_lines.extend(statement_text(source, stmt))
    text = ("\n" + indent).join(body_lines)
    return Fix("Run this forward with autograd on: under `torch.no_grad()` it records no graph",
               (replace(source, with_stmt, text),))


def remove_decorator(source: Source, function: ast.AST, decorator: ast.expr) -> Fix:
    """Drop `@torch.no_grad()` from a function the training step calls. Unsafe: its other
    callers (evaluation) then build graphs too, and `.numpy()` on their results fails."""
    return Fix(f"Remove `@{source.segment(decorator)}` from `{function.name}` (line {decorator.lineno}): "
               f"every call of it, this training one included, records no graph; where a caller "
               f"wants none, wrap that call in `with torch.no_grad():`",
               (delete_lines(source, decorator),), "unsafe")
