"""Undo what cut the graph before a backward: `.detach()`, `torch.no_grad()`."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, assignments, canonical
from .edits import delete_lines, insert_lines_before, replace, statement_text
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


def remove_data(source: Source, attribute: ast.Attribute) -> Fix:
    """`torch.stack(logits, 1).data` -> `torch.stack(logits, 1)`."""
    return Fix("Remove `.data`: it returns the tensor without its graph, which the backward needs",
               (replace(source, attribute, source.segment(attribute.value)),))


def run_before_block(source: Source, with_stmt: ast.With, statements: list[ast.stmt]) -> Fix | None:
    """Move the statements of a `with torch.no_grad():` block that the loss comes from before the
    block, in their order; the rest (metrics) stays without a graph."""
    moved = sorted(statements, key=lambda s: s.lineno)
    if not all(any(s is b for b in with_stmt.body) for s in moved):
        return None
    lines = [line for stmt in moved for line in statement_text(source, stmt)]
    names = ", ".join(f"`{source.segment(s.targets[0] if isinstance(s, ast.Assign) else s.target)}`"
                      for s in moved if isinstance(s, (ast.Assign, ast.AugAssign)))
    return Fix(f"Compute {names} before `with torch.no_grad():`, with autograd on: the loss needs "
               f"their graph, and the block's other statements still record none",
               (insert_lines_before(source, with_stmt, lines), *(delete_lines(source, s) for s in moved)))


def enable_grad_around(source: Source, stmt: ast.stmt) -> Fix:
    """`loss = closure()` in an optimizer's `@torch.no_grad()` step: run it with autograd on, as
    torch.optim's own optimizers do."""
    indent = source.indent_of(stmt.lineno)
    body = ("\n" + indent + "    ").join(statement_text(source, stmt))
    return Fix(f"Run `{source.segment(stmt)}` under `torch.enable_grad()`: it computes the loss, and "
               f"autograd is off around it", (replace(source, stmt, f"with torch.enable_grad():\n{indent}    {body}"),))


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
