"""graph-growth (BX008): retain_graph=True keeps alive a graph whose history reaches into
earlier iterations, so every backward goes through all of them."""
from __future__ import annotations

from ...fixes import detach_carried, graph_options
from ...model import Evidence, Finding, Fix
from ...reading import source as src
from .. import graph
from .carried import carried_fixes
from .context import Context
from .evidence import culprit, finding, made_at
from .locate import carriers


def explain_graph_growth(ctx: Context) -> Finding | None:
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
    candidates = carriers(ctx, current, targets, mark)
    if not candidates or candidates[0].relation == "direct" and not candidates[0].located:
        return None
    candidate = candidates[0]
    located = candidate.located
    _, _, failing = ctx.failing_statement()
    fixes = [f for f in carried_fixes(ctx, candidate, failing) if f is not None] if candidate.relation == "carried" else []
    if candidate.relation == "stored" and located is not None:
        fixes = [f for f in [detach_carried.detach_stored_value(located.source, located.store, candidate.name)] if f]
    call = src.call_named(failing, "backward")
    drop = graph_options.drop_keyword(located.source, call, "retain_graph") if (call is not None and located) else None
    if drop is not None:
        fixes = [Fix(f.message + ", and drop `retain_graph=True`", f.edits + (drop,), f.applicability) for f in fixes]
    evidence = Evidence(candidate.name, made_at(ctx, located), ctx.backward_site(), advice="grows")
    return finding("BX008", "run-growth", "graph-growth", evidence, [culprit(ctx, candidate)], fixes)
