"""Keyword fixes on backward / autograd.grad calls: `create_graph=True`, `retain_graph=True`,
`inputs=` (a backward kept to one optimizer's parameters)."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading.source import Source
from .edits import node_end, node_start


def insert_keyword(source: Source, call: ast.Call, keyword: str) -> Edit:
    end = node_end(source, call)
    at = Location(end.row, end.column - 1)
    # After a trailing comma (`allow_unused=True,` then `)` on its own line), no other.
    trailing = source.segment(call)[:-1].rstrip().endswith(",")
    separator = ", " if (call.args or call.keywords) and not trailing else ""
    return Edit(source.filename, f"{separator}{keyword}", at, at)


def add_create_graph(source: Source, call: ast.Call) -> Fix | None:
    if any(k.arg == "create_graph" for k in call.keywords):
        return None
    return Fix("Pass `create_graph=True` to `autograd.grad`: its result feeds a loss, so the "
               "gradient itself must be differentiable and the graph kept for the final backward",
               (insert_keyword(source, call, "create_graph=True"),))


def gradients_with_graph(source: Source, call: ast.Call, differentiated_at: int) -> Fix | None:
    """`loss.backward(create_graph=True)` where what it leaves in `.grad` is differentiated again
    (a Hessian-vector product, SophiaH's or AdaHessian's step): the gradients are the same numbers,
    with a graph of their own. Safe: no gradient of this step changes."""
    if any(k.arg == "create_graph" for k in call.keywords):
        return None
    return Fix(f"Pass `create_graph=True` to `{source.segment(call)}`: the gradients it leaves in `.grad` are "
               f"differentiated again at line {differentiated_at}, so they need a graph of their own",
               (insert_keyword(source, call, "create_graph=True"),))


def add_retain_graph(source: Source, call: ast.Call, reason: str) -> Fix | None:
    if any(k.arg == "retain_graph" for k in call.keywords):
        return None
    return Fix(reason, (insert_keyword(source, call, "retain_graph=True"),))


def optimizers_inputs(optimizer: str) -> str:
    """`inputs=` for the parameters `optimizer` (its source text) steps."""
    return f"inputs=[p for group in {optimizer}.param_groups for p in group['params']]"


def drop_keyword(source: Source, call: ast.Call, name: str) -> Edit | None:
    """Delete `name=...` with its separating comma."""
    arguments = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    for index, node in enumerate(arguments):
        if isinstance(node, ast.keyword) and node.arg == name:
            if index > 0:
                start = node_end(source, arguments[index - 1])
                end = node_end(source, node)
            elif len(arguments) > 1:
                start = node_start(source, node)
                end = node_start(source, arguments[1])
            else:
                start, end = node_start(source, node), node_end(source, node)
            return Edit(source.filename, "", start, end)
    return None
