"""A value made once from tensors that no optimizer trains is data: keep it without history."""
from __future__ import annotations

import ast

from ..model import Fix
from ..source import Source
from .edits import replace


def detach_data(source: Source, stmt: ast.stmt, name: str, leaves: str) -> Fix | None:
    """`Y = X @ true_W + b` -> `Y = (X @ true_W + b).detach()`: made once, used as a target."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or value is None:
        return None
    text = source.segment(value)
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"
    return Fix(f"Make `{name}` without history: it comes from {leaves}, which no optimizer trains, "
               f"so it is data, and every backward only needs its value",
               (replace(source, value, f"{text}.detach()"),))
