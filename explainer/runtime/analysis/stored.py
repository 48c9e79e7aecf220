"""Tensors with history kept in a container that outlives the iteration (BX005): a later
backward reaches the graphs an earlier one freed through the container."""
from __future__ import annotations

from ...fixes import detach_carried, empty_container
from ...model import Finding, Fix
from ...reading import source as src
from .. import graph
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, finding, freed_graph
from .locate import Candidate


def explain_stored(ctx: Context, candidate: Candidate, previous: BackwardCall, current: graph.Walk, failing, source,
            scope) -> Finding:
    located, name = candidate.located, candidate.name
    fixes = []
    if located is not None and failing is not None and _trains_only_through(ctx, candidate, current):
        # Detaching at the store would leave this loss with nothing to train.
        if src.reads(scope, name):
            fixes.append(empty_container.empty_after_backward(source, failing, name))
    elif located is not None:
        steps = candidate.binding.steps
        # Kept by a call that names the attribute (`self.register_buffer("cached", freqs)`).
        cache = located.target is not located.store and steps and steps[-1][0] == "attr"
        fix = detach_carried.detach_stored_value(located.source, located.store, f"self.{steps[-1][1]}" if cache else name)
        # A module's cache is read again within the step that fills it (every layer asks it for
        # the same frequencies): detaching it changes that step's gradients too.
        fixes.append(Fix(fix.message, fix.edits, "unsafe") if fix is not None and cache else fix)
    return finding("BX005", "run-stored", "second-backward", freed_graph(ctx, name, located, previous, "grows"),
                   [culprit(ctx, candidate)], fixes, "certain" if located is not None else "likely")


def _trains_only_through(ctx: Context, candidate: Candidate, current: graph.Walk) -> bool:
    """Whether every path from this backward's roots to a parameter passes through a tensor
    held in the candidate's container (`torch.stack(losses).mean().backward()`)."""
    held = ctx.tensors_in_container(candidate.binding)
    blocked = {id(t.grad_fn) for t in held if t.grad_fn is not None}
    if not blocked:
        return False
    children: dict[int, list[int]] = {}
    for child, consumers in current.consumers.items():
        for consumer in consumers:
            children.setdefault(consumer, []).append(child)
    pending = [id(r) for r in ctx.root_nodes() if id(r) not in blocked]
    seen = set(pending)
    while pending:
        key = pending.pop()
        if current.seq.get(key) == graph.LEAF_SEQ:
            return False
        for child in children.get(key, ()):
            if child not in seen and child not in blocked:
                seen.add(child)
                pending.append(child)
    return True
