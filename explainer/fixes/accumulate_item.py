"""Accumulate a running total with `.item()` and back-propagate the per-step loss."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Assignment, Source, canonical
from .edits import replace


def accumulate_with_item(source: Source, carrier: str, assignment: Assignment,
                         backward_receiver: ast.expr | None) -> Fix | None:
    stmt = assignment.stmt
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        term = stmt.value
    elif (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.BinOp)
          and isinstance(stmt.value.op, ast.Add)):
        left, right = stmt.value.left, stmt.value.right
        if canonical(left) == canonical(carrier):
            term = right
        elif canonical(right) == canonical(carrier):
            term = left
        else:
            return None
    else:
        return None
    term_text = source.segment(term)
    edits = [replace(source, term, f"{term_text}.item()" if isinstance(term, (ast.Name, ast.Attribute, ast.Subscript)) else f"({term_text}).item()")]
    if backward_receiver is not None and canonical(backward_receiver) == canonical(carrier):
        edits.append(replace(source, backward_receiver, term_text if isinstance(term, (ast.Name, ast.Attribute, ast.Subscript)) else f"({term_text})"))
    return Fix(f"Back-propagate each step's `{term_text}` and keep the running total as a Python "
               f"number with `.item()`", tuple(edits))
