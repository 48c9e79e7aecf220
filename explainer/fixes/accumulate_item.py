"""Accumulate a running total with `.item()` and back-propagate the per-step loss."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Assignment, Source, assignments, canonical, enclosing_function, loops_around
from .edits import insert_lines_after, replace, statement_text


def accumulate_with_item(source: Source, carrier: str, assignment: Assignment,
                         backward_receiver: ast.expr | None, backward_stmt: ast.stmt | None = None) -> Fix | None:
    """None when the total gathers several terms per backward (an inner loop over tasks or time
    steps that the backward is not in): back-propagating the last term alone would drop the
    others from training."""
    stmt = assignment.stmt
    if backward_stmt is not None and any(backward_stmt.lineno < loop.lineno or backward_stmt.lineno > loop.end_lineno
                                         for loop in loops_around(stmt)):
        return None
    term = _term(stmt, carrier)
    if term is None:
        return None
    term_text = source.segment(term)
    edits = [replace(source, term, f"{term_text}.item()" if isinstance(term, (ast.Name, ast.Attribute, ast.Subscript)) else f"({term_text}).item()")]
    if backward_receiver is not None and canonical(backward_receiver) == canonical(carrier):
        edits.append(replace(source, backward_receiver, term_text if isinstance(term, (ast.Name, ast.Attribute, ast.Subscript)) else f"({term_text})"))
    return Fix(f"Back-propagate each step's `{term_text}` and keep the running total as a Python "
               f"number with `.item()`", tuple(edits))


def add_detached(source: Source, carrier: str, assignment: Assignment) -> Fix | None:
    """`running_loss += loss.detach()`: the total adds up the value without the graph that made it.
    `.detach()` keeps the type the total had, so code that reads it (`running_loss.item()`, a
    division, a log line) runs as before; None where the statement does not add a term to
    `carrier`."""
    term = _term(assignment.stmt, carrier)
    if term is None:
        return None
    text = source.segment(term)
    simple = isinstance(term, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    detached = f"{text}.detach()" if simple else f"({text}).detach()"
    starts = _started_with(assignment.stmt, carrier, term)
    also = f" (and start it with `{detached}` at line {starts[0].lineno})" if starts else ""
    return Fix(f"Add up `{text}` detached{also}, so `{carrier}` keeps the value and not the graph that made it",
               (replace(source, term, detached), *(replace(source, first, detached) for first in starts)))


def _started_with(stmt: ast.stmt, carrier: str, term: ast.expr) -> list[ast.expr]:
    """Where the same function starts the total with the term itself (GroMo's `TensorStatistic`:
    `self._tensor = update` the first time, `self._tensor += update` after): left with its graph,
    the total would still require grad, and each `+=` adds a node to it."""
    scope = enclosing_function(stmt)
    return [a.value for a in assignments(scope, carrier) if a.stmt is not stmt and isinstance(a.stmt, ast.Assign)
            and a.value is not None and canonical(a.value) == canonical(term)] if scope is not None else []


def _term(stmt: ast.stmt, carrier: str) -> ast.expr | None:
    """`loss` in `total += loss` or `total = total + loss` (`loss + total`)."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        return stmt.value
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add):
        left, right = stmt.value.left, stmt.value.right
        if canonical(left) == canonical(carrier):
            return right
        if canonical(right) == canonical(carrier):
            return left
    return None


def reset_after_backward(source: Source, carrier: str, reset: ast.stmt, backward_stmt: ast.stmt) -> Fix:
    """The pass resets the total (`loss = 0`) before its first backward, then adds the second
    pass's terms to it (SAM's two forward-backward passes): reset it again after that backward."""
    return Fix(f"Start `{carrier}` again after `{source.segment(backward_stmt).strip()}` (line "
               f"{backward_stmt.lineno}), as at the top of the pass: the total still holds the terms that "
               f"backward freed", (insert_lines_after(source, backward_stmt, statement_text(source, reset)),))


def pass_detached(source: Source, argument: ast.expr, method: str) -> Fix:
    """`meter.update(loss.detach())`: the tracker adds up the value without the graph. `.item()`
    would do as well where the tracker only ever does arithmetic on it; `.detach()` keeps the
    type it was given, so nothing that reads the tracker changes (NVIDIA's BERT fix did this)."""
    text = source.segment(argument)
    simple = isinstance(argument, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    return Fix(f"Pass `{text}` to `{method}` detached, so it adds up the value and not the graph that made it",
               (replace(source, argument, f"{text}.detach()" if simple else f"({text}).detach()"),))
