"""When the graph does not name the carrier: no variable holds the link (BX012), or no earlier
backward was recorded and the graph was too large to split, so the source ranks the suspects
(a carried state, a container, a value made once: likely, not certain)."""
from __future__ import annotations

import ast

from ...fixes import detach_carried, move_into_loop
from ...model import Evidence, Finding
from .. import graph
from ..records import BackwardCall
from .carried import carried_fixes
from .context import Context
from .evidence import culprit, finding, freed_graph, made_at
from .locate import Candidate, locate, read_again_in_its_loop, self_referencing_carrier, shares_history
from .made_once import repeating_owner


def unnamed(ctx: Context, previous: BackwardCall | None) -> Finding:
    """A graph an earlier backward freed, linked by a tensor no variable in the frames holds."""
    evidence = Evidence(backward=ctx.backward_site(),
                        freed_by=ctx.call_site(previous.filename, previous.row, previous.column) if previous else None, advice="grows")
    return finding("BX012", "run-unnamed", "second-backward", evidence, confidence="guess")


def unrecorded(ctx: Context, roots, walked: graph.Walk | None = None,
               previous: BackwardCall | None = None) -> Finding | None:
    """No mark splits the graph: no earlier backward was recorded (installed late, or
    post-mortem), or the graph is larger than one explanation may walk (`walked`, with the
    `previous` call whose mark it could not reach). Rank the tensors related to this graph by
    what the source says about them (carried from itself, stored in a container, made before the
    loop)."""
    full = walked if walked is not None else graph.walk(roots)
    root_keys = {id(r) for r in roots}
    source, _, failing = ctx.failing_statement()
    best, best_score = None, 0
    for binding in ctx.bindings():
        grad_fn = binding.value.grad_fn
        if grad_fn is None or id(grad_fn) in root_keys:
            continue
        if id(grad_fn) not in full.nodes and (not graph.budget_left() or not shares_history(grad_fn, full)):
            continue
        candidate = Candidate(binding, "direct")
        candidate.located = located = locate(ctx, binding, ctx.call.row if ctx.call else None)
        if located is None:
            continue
        if isinstance(located.store, ast.Call):
            candidate.relation, score = "stored", 3
        elif located.carried:
            # `h = cell(x, h)` outranks a value merely read from a carried one
            candidate.relation, score = "carried", 4 if self_referencing_carrier(candidate) else 3
        elif located.in_init or repeating_owner(ctx, located, failing, source) is not None:
            score = 2
        else:
            continue
        if score > best_score:
            best, best_score = candidate, score
    if best is None:
        return None
    located = best.located
    best.name = located.target_text
    if best.relation == "carried":
        code, variant = "BX001", "likely-carried"
        # Without a mark, only the source can tell a module's state updated within the pass;
        # where it does not, a cut of that state is not proven to leave this pass alone.
        best.used_now = read_again_in_its_loop(located)
        fixes = carried_fixes(ctx, best, failing)
        if located.class_node is not None and not best.used_now:
            fixes = [fix.unproven() if fix is not None else None for fix in fixes]
    elif best.relation == "stored":
        code, variant = "BX005", "likely-stored"
        fixes = [detach_carried.detach_stored_value(located.source, located.store, best.name)]
    elif located.in_init and located.class_node is not None:
        code, variant = "BX004", "likely-init"
        fixes = [move_into_loop.inline_attribute(located.source, located.class_node, located.store,
                                                 located.target_text)]
    else:
        code, variant = "BX004", "likely-before"
        owner = repeating_owner(ctx, located, failing, source)
        fixes = [move_into_loop.move_into_body(located.source, located.store, owner, best.name)]
    facts = {"graph_nodes": len(full.nodes)} if walked is not None else {}
    if previous is not None:
        # The walk did not reach the mark, but the call that set it was recorded: it is the one
        # that freed the graph, with the steps after it.
        evidence = freed_graph(ctx, best.name, located, previous, "grows", **facts)
    else:
        evidence = Evidence(best.name, made_at(ctx, located), ctx.backward_site(), advice="grows",
                            facts=tuple(facts.items()))
    return finding(code, variant, "second-backward", evidence, [culprit(ctx, best)], fixes, "likely")
