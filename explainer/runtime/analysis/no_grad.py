"""no-grad: the loss has no graph; find the `.detach()`, `.item()` or `torch.no_grad()` that cut
it."""
from __future__ import annotations

import ast
import os

import torch

from ...fixes import undo_cut
from ...fixes.edits import node_start
from ...model import Culprit, Finding, Fix
from ...reading import source as src
from ...reading.training import called_without_graph
from .context import _call_in


def explain_no_grad(ctx) -> Finding | None:
    source, scope, failing = ctx.failing_statement()
    if failing is None:
        return None
    receiver = src.call_receiver(failing, "backward")
    if receiver is None:
        call = _call_in(failing, "grad") or _call_in(failing, "backward")
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
            return _no_grad_finding(ctx, source, scope, assignment, cut)
        value = src.value_of(assignment.stmt)
        decorated = called_without_graph(value, scope) if value is not None else None
        if decorated is not None:
            return _no_grad_function_finding(ctx, source, assignment, *decorated)
        for name in sorted(src.names_read(assignment.stmt.value) if src.value_of(assignment.stmt) is not None else []):
            value = values.get(name)
            if isinstance(value, torch.Tensor) and not value.requires_grad:
                pending.append((name, assignment.stmt.lineno))
    return None


def _no_grad_finding(ctx, source, scope, assignment, cut) -> Finding:
    name = source.segment(assignment.target)
    stmt = assignment.stmt
    fixes: list[Fix | None] = []
    if isinstance(cut, ast.With):
        how = "`torch.no_grad()`"
        fixes.append(undo_cut.leave_no_grad(source, cut))
    else:
        how = f"`.{cut.func.attr}()`" if isinstance(cut.func, ast.Attribute) else f"`{src.canonical(cut.func)}()`"
        if isinstance(cut.func, ast.Attribute) and cut.func.attr == "detach":
            if src.canonical(cut.func.value) == src.canonical(assignment.target):
                fixes.append(undo_cut.recompute_instead_of_detach(source, scope, stmt, name))
        fixes.append(undo_cut.remove_detach(source, cut))
    fixes = [f for f in fixes if f is not None]
    row = stmt.lineno
    message = (f"`{name}` was cut from the graph by {how} at "
               f"{os.path.basename(source.filename)}:{row}, so the loss built from it has no "
               f"grad_fn and there is nothing to back-propagate (line {ctx.call.row}).")
    if fixes:
        message += f" Fix: {fixes[0].message}."
    return Finding(
        kind="no-grad", severity="error",
        summary=f"`{name}` was detached from the graph before the loss was built.",
        message=message, culprits=[_assignment_culprit(source, assignment, f"cut from the graph by {how}")],
        fixes=fixes, backward=ctx.call_site(ctx.call.filename, ctx.call.row),
        retain_graph_advice="retain_graph has nothing to do with this error: the loss has no graph at all.",
    )


def _no_grad_function_finding(ctx, source, assignment, function: ast.FunctionDef, decorator: ast.expr) -> Finding:
    name = source.segment(assignment.target)
    fix = undo_cut.remove_decorator(source, function, decorator)
    decorated = f"`@{source.segment(decorator)}`"
    message = (f"`{name}` (line {assignment.stmt.lineno}) comes from `{function.name}()`, which "
               f"runs under {decorated} (line {decorator.lineno}), so it has no grad_fn and there "
               f"is nothing to back-propagate (line {ctx.call.row}). Fix: {fix.message}.")
    how = f"{decorated} on `{function.name}`"
    return Finding(
        kind="no-grad", severity="error",
        summary=f"`{name}` was computed by `{function.name}()`, which records no graph.",
        message=message, culprits=[_assignment_culprit(source, assignment, f"computed without a graph by {how}")],
        fixes=[fix], backward=ctx.call_site(ctx.call.filename, ctx.call.row),
        retain_graph_advice="retain_graph has nothing to do with this error: the loss has no graph at all.",
    )


def _assignment_culprit(source, assignment, role: str) -> Culprit:
    return Culprit(source.segment(assignment.target), source.filename, node_start(source, assignment.target),
                   role, source.line(assignment.stmt.lineno).strip())


def _cut_in(stmt: ast.stmt):
    """What cut the graph in this assignment: a `.detach()`-like call, or an enclosing
    `with torch.no_grad()`."""
    value = src.value_of(stmt)
    if value is not None:
        calls = src.calls_named(value, "detach", "item", "numpy", "tolist", "float")
        if calls:
            return calls[0]
    for ancestor in src.ancestors(stmt):
        if isinstance(ancestor, ast.With) and any(
            "no_grad" in src.canonical(item.context_expr) or "inference_mode" in src.canonical(item.context_expr)
            for item in ancestor.items
        ):
            return ancestor
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
    return None
