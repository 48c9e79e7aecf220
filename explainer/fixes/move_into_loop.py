"""Compute a parameter-derived value where it is used, not once before the loop."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, ancestors, parent, reads
from .edits import delete_lines, insert_lines_before, replace, statement_text


def move_into_body(source: Source, stmt: ast.stmt, owner: ast.AST, carrier: str) -> Fix | None:
    """Move `stmt` from before `owner` (a loop, or a closure def) to the top of its body."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.lineno >= owner.lineno:
        return None
    if _scope(stmt) is not _scope(owner):
        return None  # made in a helper called once before the loop: its line can't just move
    first = owner.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        first = owner.body[1] if len(owner.body) > 1 else first
    return Fix(f"Compute `{carrier}` inside the {repeater(owner)}, so each backward gets a fresh graph",
               (delete_lines(source, stmt), insert_lines_before(source, first, statement_text(source, stmt))))


def repeater(owner: ast.AST) -> str:
    """How the messages name `owner`, what repeats the backward: the loop; the closure (a def
    nested in a function, or one handed to a call such as LBFGS's `optimizer.step(closure)`);
    else the method or function by its name (TimeGAN's `train_embedder`, called once per batch)."""
    if not isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "loop"
    scope = _scope(owner)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or _handed_on(owner, scope):
        return "closure"
    return f"{'method' if isinstance(scope, ast.ClassDef) else 'function'} `{owner.name}`"


def _handed_on(owner: ast.FunctionDef | ast.AsyncFunctionDef, scope: ast.AST | None) -> bool:
    return scope is not None and any(
        isinstance(call, ast.Call) and any(isinstance(a, ast.Name) and a.id == owner.name
                                           for a in (*call.args, *(k.value for k in call.keywords)))
        for call in ast.walk(scope))


def inline_attribute(source: Source, class_node: ast.ClassDef, stmt: ast.stmt, attribute: str) -> Fix | None:
    """`self.scale = torch.exp(self.log_scale)` in __init__: compute it where it is used."""
    value = getattr(stmt, "value", None)
    if value is None:
        return None
    text = source.segment(value)
    if not isinstance(value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
        text = f"({text})"
    edits = []
    for method in class_node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for use in reads(method, attribute):
            if use.lineno >= stmt.lineno and use.end_lineno <= stmt.end_lineno:
                continue
            edits.append(replace(source, use, text))
    if not edits:
        return None
    edits.append(delete_lines(source, stmt))
    init = parent(stmt)
    name = getattr(init, "name", "__init__")
    return Fix(f"Compute `{text}` in each forward instead of once in `{name}`: a value computed "
               f"once keeps the graph of the first call", tuple(edits))


def _scope(node: ast.AST) -> ast.AST | None:
    return next((a for a in ancestors(node)
                 if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))), None)
