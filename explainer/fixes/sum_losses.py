"""Sum losses that share a graph and back-propagate once."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, call_receiver
from .edits import delete_lines, replace


def sum_and_backward_once(source: Source, first: ast.stmt, second: ast.stmt) -> Fix | None:
    first_loss, second_loss = call_receiver(first, "backward"), call_receiver(second, "backward")
    if not (isinstance(first, ast.Expr) and isinstance(second, ast.Expr)) or first_loss is None or second_loss is None:
        return None
    if first.value.args or first.value.keywords and any(k.arg != "retain_graph" for k in first.value.keywords):
        return None
    a, b = source.segment(first_loss), source.segment(second_loss)
    return Fix(f"Back-propagate `{a} + {b}` once: one pass through the shared graph, and no "
               f"graph kept alive", (delete_lines(source, first), replace(source, second.value, f"({a} + {b}).backward()")))
