"""`torch.autograd.grad` without `create_graph`/`retain_graph` freed the graph a later backward
needs (BX010): a gradient penalty computed without a graph, or two gradient passes."""
from __future__ import annotations

import ast

from ...fixes import graph_options
from ...fixes.edits import node_start
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import ancestors
from .. import graph
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, culprit_at, finding, freed_graph
from .locate import Candidate, held


def explain_freed_by_grad(ctx: Context, previous: BackwardCall) -> Finding | None:
    _, _, grad_stmt = ctx.site_statement(previous.filename, previous.row)
    source, scope, failing = ctx.failing_statement()
    if grad_stmt is None or source is None:
        return None
    call = src.call_named(grad_stmt, "grad")
    if call is None:
        return None
    freed = call.args[0] if call.args else None
    graph_of = source.segment(freed) if freed is not None else "outputs"
    if not _feeds(grad_stmt, failing, scope):
        return _two_gradient_passes(ctx, source, call, graph_of, previous, failing)
    targets = src.targets_of(grad_stmt)
    result = source.segment(targets[0]) if targets else source.segment(call)
    anchor = targets[0] if targets else call
    evidence = freed_graph(ctx, result, None, previous, "create-graph", graph=graph_of, grad_call=source.segment(call))
    return finding("BX010", "run-feeds", "second-backward", evidence,
                   [culprit_at(result, source, node_start(source, anchor))],
                   [graph_options.add_create_graph(source, call)])


def _feeds(grad_stmt: ast.stmt, failing: ast.stmt, scope) -> bool:
    """Whether the failing call's inputs are computed from what `grad_stmt` assigned."""
    produced = {src.canonical(t) for t in src.targets_of(grad_stmt)}
    if not produced or failing is None:
        return True  # `(loss + penalty(torch.autograd.grad(...))).backward()`: read in place
    value = src.value_of(failing) if src.value_of(failing) is not None else failing
    if any(src.reads(value, name) for name in produced):
        return True
    return any(a.stmt is grad_stmt for a in ancestors(value, scope, failing.lineno))


def _two_gradient_passes(ctx: Context, source, call: ast.Call, name: str, previous: BackwardCall, failing) -> Finding:
    """Two gradient computations over one graph, the first without `retain_graph`; the second
    does not use the first's result."""
    grad_code = source.segment(call)
    between = ctx.steps_between(previous.tick, ctx.call.tick)
    shared = _where_the_passes_meet(ctx, previous)
    if shared is not None:
        name = shared.name
    fixes = []
    if not between:
        fixes.append(graph_options.add_retain_graph(
            source, call, f"Keep `{name}`'s graph for the second pass with `retain_graph=True` on "
            f"`{grad_code}` (correct here: no optimizer step in between)"))
    evidence = freed_graph(ctx, name, None, previous, "after-step" if between else "two-passes", grad_call=grad_code,
                           api="grad" if src.call_named(failing, "grad") is not None else "backward")
    return finding("BX010", "run-two-passes", "second-backward", evidence,
                   [culprit(ctx, shared) if shared is not None else culprit_at(name, source, node_start(source, call))],
                   fixes)


def _where_the_passes_meet(ctx: Context, previous: BackwardCall) -> Candidate | None:
    """The tensor bound in the user's frames whose graph both gradient passes went through, as
    the user made it: pi-lnn's `uvp`, sliced into `u` and `v`, each handed to the helper whose
    `autograd.grad(y, ...)` takes it; the latest made where several are. None where the earlier
    pass's roots are not bound any more, where this pass goes through one of them (that root is
    what the earlier call was given: atomistic-attacks' `energy`, read again by the loss), or
    where no bound tensor tops what the two graphs share."""
    theirs = [b.value.grad_fn for b in ctx.bound_roots(previous)]
    ours = ctx.root_nodes()
    if not theirs or not ours:
        return None
    current = graph.walk(ours)
    if any(id(root) in current.nodes for root in theirs):
        return None
    tops = set(graph.shared_top(current, graph.walk(theirs)))
    shared = [b for b in ctx.bindings() if b.value.grad_fn is not None and id(b.value.grad_fn) in tops]
    return held(ctx, max(shared, key=lambda b: graph.sequence(b.value.grad_fn))) if shared else None
