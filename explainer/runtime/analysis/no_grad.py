"""no-grad (BX009): the loss has no graph; find the `.detach()`, `.item()`, `torch.no_grad()`
block or `@torch.no_grad()` helper that cut it."""
from __future__ import annotations

import ast

import torch

from ...fixes import undo_cut
from ...fixes.edits import node_start
from ...model import CallSite, Evidence, Finding, Fix
from ...reading import source as src
from ...reading.training import called_without_graph, no_grad_block
from .context import Context
from .evidence import culprit_at, finding


def explain_no_grad(ctx: Context) -> Finding | None:
    source, scope, failing = ctx.failing_statement()
    if failing is None:
        return None
    receiver = src.call_receiver(failing, "backward")
    if receiver is None:
        call = src.call_named(failing, "grad") or src.call_named(failing, "backward")
        receiver = call.args[0] if call is not None and call.args else None
    if receiver is None:
        return None
    frame = next((f for f in ctx.frames if f.f_code.co_filename == source.filename), None)
    values = dict(frame.f_globals) if frame is not None else {}
    if frame is not None:
        values.update(frame.f_locals)
    pending = [(src.canonical(receiver), ctx.call.row)]
    seen = set()
    while pending:
        expression, before = pending.pop(0)
        if expression in seen or len(seen) > 24:
            continue
        seen.add(expression)
        assignment = src.last_assignment(scope, expression, before)
        if assignment is None:
            continue
        cut = _cut_in(assignment.stmt)
        if cut is not None:
            return _cut(ctx, source, scope, assignment, cut)
        value = src.value_of(assignment.stmt)
        decorated = called_without_graph(value, scope) if value is not None else None
        if decorated is not None:
            return _decorated(ctx, source, assignment, *decorated)
        for name in sorted(src.names_read(value) if value is not None else []):
            found = values.get(name)
            if isinstance(found, torch.Tensor) and not found.requires_grad:
                pending.append((name, assignment.stmt.lineno))
    return None


def _cut(ctx: Context, source, scope, assignment, cut) -> Finding:
    name = source.segment(assignment.target)
    stmt = assignment.stmt
    fixes: list[Fix | None] = []
    if isinstance(cut, (ast.With, ast.AsyncWith)):
        how = "`torch.no_grad()`"
        fixes.append(undo_cut.leave_no_grad(source, cut) if isinstance(cut, ast.With) else None)
    else:
        how = f"`.{cut.func.attr}()`" if isinstance(cut.func, ast.Attribute) else f"`{src.canonical(cut.func)}()`"
        recompute = None
        if isinstance(cut.func, ast.Attribute) and cut.func.attr == "detach":
            if src.canonical(cut.func.value) == src.canonical(assignment.target):
                recompute = undo_cut.recompute_instead_of_detach(source, scope, stmt, name)
        fixes.append(recompute)
        remove = undo_cut.remove_detach(source, cut)
        # `output = output.detach()` after a backward: the value it detached may hang on the graph
        # that backward freed, so keeping it is not proven to run.
        fixes.append(Fix(remove.message, remove.edits, "unsafe") if remove is not None and recompute is not None
                     else remove)
    evidence = Evidence(name, _site(source, stmt), ctx.backward_site(), advice="no-graph", facts=(("cut", how),))
    return finding("BX009", "run-cut", "no-grad", evidence, [_assigned(source, assignment)], fixes)


def _decorated(ctx: Context, source, assignment, function: ast.FunctionDef, decorator: ast.expr) -> Finding:
    name = source.segment(assignment.target)
    evidence = Evidence(name, _site(source, assignment.stmt), ctx.backward_site(), advice="no-graph",
                        facts=(("function", function.name), ("decorator", source.segment(decorator)),
                               ("decorator_row", decorator.lineno)))
    return finding("BX009", "run-decorated", "no-grad", evidence, [_assigned(source, assignment)],
                   [undo_cut.remove_decorator(source, function, decorator)])


def _site(source, stmt: ast.stmt) -> CallSite:
    return CallSite(source.filename, stmt.lineno, source.segment(stmt))


def _assigned(source, assignment):
    return culprit_at(source.segment(assignment.target), source, node_start(source, assignment.target))


def _cut_in(stmt: ast.stmt):
    """What cut the graph in this assignment: a `.detach()`-like call, or an enclosing
    `with torch.no_grad()`."""
    value = src.value_of(stmt)
    if value is not None:
        calls = src.calls_named(value, "detach", "item", "numpy", "tolist", "float")
        if calls:
            return calls[0]
    return no_grad_block(stmt)
