"""Sum losses that share a graph and back-propagate once."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, call_receiver, enclosing_function, loops_around
from .edits import delete_lines, replace


def sum_and_backward_once(source: Source, first: ast.stmt, second: ast.stmt) -> Fix | None:
    first_loss, second_loss = call_receiver(first, "backward"), call_receiver(second, "backward")
    if not (isinstance(first, ast.Expr) and isinstance(second, ast.Expr)) or first_loss is None or second_loss is None:
        return None
    if first.value.args or first.value.keywords and any(k.arg != "retain_graph" for k in first.value.keywords):
        return None
    # One backward of the sum replaces both only where both run once together: not across
    # functions, and not from inside a loop the first is outside of (the first loss would be
    # added, and back-propagated, once per pass).
    outer = {id(loop) for loop in loops_around(first)}
    if enclosing_function(first) is not enclosing_function(second) \
            or any(id(loop) not in outer for loop in loops_around(second)):
        return None
    a, b = source.segment(first_loss), source.segment(second_loss)
    return Fix(f"Back-propagate `{a} + {b}` once: one pass through the shared graph, and no "
               f"graph kept alive", (delete_lines(source, first), replace(source, second.value, f"({a} + {b}).backward()")))


def sum_the_loop(source: Source, loop: ast.For, failing: ast.stmt) -> Fix | None:
    """`for loss in losses: loss.backward(...)` over losses that share a graph ->
    `sum(losses).backward(...)`: the same gradients, one pass through the shared graph."""
    call = failing.value if isinstance(failing, ast.Expr) else None
    if not (isinstance(loop, ast.For) and loop.body == [failing] and not loop.orelse
            and isinstance(loop.target, ast.Name) and isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr == "backward"
            and isinstance(call.func.value, ast.Name) and call.func.value.id == loop.target.id):
        return None
    if any(isinstance(k.value, ast.Name) and k.value.id == loop.target.id for k in call.keywords) \
            or any(isinstance(n, ast.Name) and n.id == loop.target.id for a in call.args for n in ast.walk(a)):
        return None
    arguments = source.segment(call)[len(source.segment(call.func)):]
    iterable = source.segment(loop.iter)
    return Fix(f"Back-propagate `sum({iterable})` once instead of each loss in turn: the losses share a "
               f"graph, which the first backward frees", (replace(source, loop, f"sum({iterable}).backward{arguments}"),))
