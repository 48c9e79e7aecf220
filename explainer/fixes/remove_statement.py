"""Remove a call that should not be there (a second backward of the same loss)."""
from __future__ import annotations

import ast

from ..model import Edit, Fix
from ..reading.source import Source, enclosing_block, parent
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


def without(source: Source, statements: list[ast.stmt]) -> tuple[Edit, ...]:
    """The edits that remove `statements`: an `if flag:` left with nothing goes with them (its
    test only reads names: `self.training and self.cache`), and a block left empty otherwise
    keeps a `pass`."""
    edits, gone = [], {id(s) for s in statements}
    for stmt in statements:
        block = enclosing_block(stmt)
        if any(id(s) not in gone for s in block):
            edits.append(delete_lines(source, stmt))
            continue
        owner = parent(stmt)
        if isinstance(owner, ast.If) and not owner.orelse and _only_reads(owner.test) \
                and len(enclosing_block(owner)) > 1:
            if block[0] is stmt:
                edits.append(delete_lines(source, owner))
        elif block[0] is stmt:
            edits.append(replace(source, stmt, "pass"))
        else:
            edits.append(delete_lines(source, stmt))
    return tuple(edits)


def _only_reads(test: ast.expr) -> bool:
    """A test that calls nothing: names, attributes, constants, `and`/`or`/`not`, comparisons."""
    allowed = (ast.Name, ast.Attribute, ast.Constant, ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Load,
               ast.boolop, ast.unaryop, ast.cmpop)
    return all(isinstance(node, allowed) for node in ast.walk(test))
