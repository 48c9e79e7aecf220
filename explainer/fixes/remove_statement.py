"""Remove a call that should not be there (a second backward of the same loss)."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, enclosing_block
from .edits import delete_lines, replace


def remove_call(source: Source, stmt: ast.stmt, receiver: ast.expr) -> Fix | None:
    """Delete `stmt` when it is only the call (`loss.backward()`); `pass` if it was the block's
    only statement."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    code = source.segment(stmt)
    why = (f"Remove `{code}`: `{source.segment(receiver)}` was already back-propagated, and a second "
           f"pass would add its gradients again")
    if len(enclosing_block(stmt)) == 1:
        return Fix(why, (replace(source, stmt, "pass"),))
    return Fix(why, (delete_lines(source, stmt),))
