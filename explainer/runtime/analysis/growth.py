"""graph-growth (BX008): retain_graph=True keeps alive a graph whose history reaches into
earlier iterations, so every backward goes through all of them."""
from __future__ import annotations

from ...fixes import detach_carried, graph_options
from ...fixes.edits import overlapping
from ...model import Evidence, Finding, Fix
from ...reading import source as src
from .. import graph
from .carried import carried_fixes
from .context import Context
from .evidence import culprit, finding, made_at
from .locate import carriers, self_referencing_carrier


def _with_every_carrier(ctx: Context, first: Fix, candidate, others, failing) -> Fix:
    """`first` and the matching fix of each other state that is re-assigned from itself (a
    different name, its own statement); unsafe when one of them has no such fix."""
    edits, names = list(first.edits), [candidate.name]
    for other in others:
        if other.relation != "carried" or other.name in names or not self_referencing_carrier(other):
            continue
        same = [f for f in carried_fixes(ctx, other, failing) if f is not None]
        if not same or overlapping(edits, same[0].edits):
            return Fix(first.message, first.edits, "unsafe")
        edits.extend(same[0].edits)
        names.append(other.name)
    if len(names) == 1:
        return first
    more = names[1:]
    listed = ", ".join(f"`{n}`" for n in more[:-1]) + (" and " if len(more) > 1 else "") + f"`{more[-1]}`"
    return Fix(f"{first.message} (and the same for {listed}, which carr{'y' if len(more) > 1 else 'ies'} "
               f"history too)", tuple(edits), first.applicability)


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
    if not targets or graph.freed_below([current.node(t) for t in targets]):
        # A backward already freed that history: this graph does not keep it alive, and the
        # backward will fail on it (explained then), not grow.
        return None
    candidates = carriers(ctx, current, targets, mark)
    if not candidates or candidates[0].relation == "direct":
        # A tensor made before the previous backward of this pass and used again (two critics'
        # losses on one forward, with retain_graph=True on the first) is shared, not grown:
        # growth needs a value carried or stored from one iteration into the next.
        return None
    candidate = candidates[0]
    located = candidate.located
    _, _, failing = ctx.failing_statement()
    fixes = [f for f in carried_fixes(ctx, candidate, failing) if f is not None] if candidate.relation == "carried" else []
    if fixes and candidate.relation == "carried":
        # Dropping retain_graph is only right once every carried state is cut (Infini-attention
        # keeps `self.memory` and `self.norm_term`): one fix for each, made as the first one is.
        fixes = [_with_every_carrier(ctx, fixes[0], candidate, candidates[1:], failing)] + fixes[1:]
    if candidate.relation == "stored" and located is not None:
        fixes = [f for f in [detach_carried.detach_stored_value(located.source, located.store, candidate.name)] if f]
    call = src.call_named(failing, "backward")
    drop = graph_options.drop_keyword(located.source, call, "retain_graph") if (call is not None and located) else None
    if drop is not None:
        fixes = [Fix(f.message + ", and drop `retain_graph=True`", f.edits + (drop,), f.applicability) for f in fixes]
    evidence = Evidence(candidate.name, made_at(ctx, located), ctx.backward_site(), advice="grows")
    return finding("BX008", "run-growth", "graph-growth", evidence, [culprit(ctx, candidate)], fixes)
