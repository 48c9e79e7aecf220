"""graph-growth: retain_graph=True keeps alive a graph whose history reaches into earlier
iterations, so every backward goes through all of them."""
from __future__ import annotations

import os

from ...fixes import detach_carried, graph_options
from ...model import Finding, Fix
from .. import graph
from .advice import RETAIN_GRAPH_GROWS
from .context import _call_in
from .second_backward import carried_fixes


def explain_graph_growth(ctx) -> Finding | None:
    retained = [c for c in ctx.calls if c.retain_graph]
    if not retained:
        return None
    previous = ctx.previous
    roots = ctx.root_nodes()
    if not roots or previous is None:
        return None
    mark = previous.mark
    current = graph.walk(roots, expand=lambda seq: seq >= mark)
    if not all(current.seq[id(r)] >= mark for r in roots):
        return None
    targets = set(graph.stale_boundary(current, mark))
    if not targets:
        return None
    candidates = ctx.carriers(current, targets, mark)
    if not candidates or candidates[0].relation == "direct" and not candidates[0].located:
        return None
    candidate = candidates[0]
    located = candidate.located
    _, _, failing = ctx.failing_statement()
    fixes = [f for f in carried_fixes(ctx, candidate, failing) if f is not None] if candidate.relation == "carried" else []
    if candidate.relation == "stored" and located is not None:
        fixes = [f for f in [detach_carried.detach_stored_value(located.source, located.store, candidate.name)] if f]
    call = _call_in(failing, "backward") if failing is not None else None
    drop = graph_options.drop_keyword(located.source, call, "retain_graph") if (call is not None and located) else None
    if drop is not None:
        fixes = [Fix(f.message + ", and drop `retain_graph=True`", f.edits + (drop,), f.applicability) for f in fixes]
    where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
    name = candidate.name
    return Finding(
        kind="graph-growth", severity="warning",
        summary=f"`{name}` links each iteration's graph to the previous one; retain_graph=True keeps them all.",
        message=(f"`{name}` (re-assigned at {where}) carries autograd history from earlier "
                 f"iterations, and retain_graph=True at line {ctx.call.row} keeps that history "
                 f"alive: every backward goes through all earlier iterations, so each step gets "
                 f"slower and memory grows." + (f" Fix: {fixes[0].message}." if fixes else "")),
        culprits=[ctx.culprit(candidate, "carried across iterations")], fixes=fixes,
        backward=ctx.call_site(ctx.call.filename, ctx.call.row),
        retain_graph_advice=RETAIN_GRAPH_GROWS,
    )
