"""Where a value kept in a container was made: the user's statement that named the output of
the module its history starts from (`emb = self.text_embedder(texts)`, the embedder calling
`self.embedding(idx)`), found through the objects that hold that module."""
from __future__ import annotations

import ast
from collections import deque

import torch

from ...reading import source as src
from .. import naming
from .context import Context
from .locate import Located, class_source

# Objects looked through for the module's holders: a dataset holds a mapper holds an embedder.
_DEPTH = 4
_VISITED = 5_000


def named_where_made(ctx: Context, parameter) -> tuple[Located, str] | None:
    """The assignment, in the user's classes, of the first name given to the output of the
    module that owns `parameter`, followed up through the methods that return it; and how the
    frames reach the parameter (`dataset.text_mapper.text_embedder.embedding.weight`)."""
    chain, expression = _holders(ctx, parameter)
    method = None
    for holder, attribute in reversed(chain):
        found = _call_in_class(holder, attribute, method)
        if found is None:
            return None
        source, function, stmt = found
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target = stmt.targets[0]
            located = Located(source, function, stmt, target, target.id, False, class_node=src.enclosing_class(stmt))
            return located, expression
        if not isinstance(stmt, ast.Return):
            return None
        method = function.name  # returned: look for who calls this method, one holder up
    return None


def _holders(ctx: Context, parameter) -> tuple[list[tuple[object, str]], str]:
    """[(holder, attribute)] from a variable in the frames down to the module that owns
    `parameter` itself (not a submodule's), and the parameter's expression from that variable:
    `dataset.text_mapper.text_embedder.embedding.weight`."""
    pending = deque((value, [], name) for _, name, value in naming.variables(ctx.frames))
    seen: set[int] = set()
    while pending and len(seen) < _VISITED:
        value, path, expression = pending.popleft()
        if id(value) in seen or len(path) > _DEPTH:
            continue
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            owned = next((n for n, p in value.named_parameters(recurse=False) if p is parameter), None)
            if owned is not None:
                return path, f"{expression}.{owned}"
            children = list(value._modules.items())
        elif naming.is_user_object(value) and not isinstance(value, type):
            children = [(k, v) for k, v in vars(value).items() if not k.startswith("__")]
        else:
            continue
        for attribute, child in children:
            if child is not None:
                pending.append((child, path + [(value, attribute)], f"{expression}.{attribute}"))
    return [], ""


def _call_in_class(holder, attribute: str, method: str | None):
    """(source, function, statement) where `holder`'s class calls `self.<attribute>(...)`, or,
    for `method`, `self.<attribute>.<method>(...)` (`self.<attribute>(...)` for `__call__` and
    `forward`)."""
    source, class_node = class_source(holder)
    if class_node is None:
        return None
    wanted = {f"self.{attribute}"} if method in (None, "__call__", "forward") else set()
    if method is not None:
        wanted.add(f"self.{attribute}.{method}")
    for function in class_node.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and src.canonical(node.func) in wanted:
                stmt = src.innermost_statement(function, node.lineno)
                if stmt is not None:
                    return source, function, stmt
    return None
