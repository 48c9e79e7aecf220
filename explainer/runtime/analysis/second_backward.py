"""second-backward: a backward reaches history that an earlier backward freed. Split the graph
at the previous backward's mark, find the tensor that carries stale history into this one, and
hand it to its cause's family: carried (BX001/BX002), stored (BX005, kept by hooks since removed
among them), made once (BX004), shared (BX006), freed by autograd.grad (BX010), or unnamed (BX012)."""
from __future__ import annotations

import ast

from ...fixes import stop_caching
from ...model import Finding
from ...reading import source as src
from .. import graph, naming
from ..records import BackwardCall
from .carried import explain_carried
from .closed_hooks import explain_closed_hooks
from .context import Context
from .grad_frees import explain_freed_by_grad
from .locate import Candidate, Located, carriers, held
from .made_once import explain_made_once, filled_before_the_loop, loop_past_the_fill
from .shared import explain_shared, same_tensor_twice, shared_by_a_loop
from .stored import explain_stored
from .unnamed import unnamed, unrecorded


def explain_second_backward(ctx: Context) -> Finding | None:
    previous = ctx.freeing
    roots = ctx.root_nodes()
    if not roots:
        return None
    if previous is None:
        return unrecorded(ctx, roots)
    if set(ctx.call.root_ids) == set(previous.root_ids) and all(r._sequence_nr() < previous.mark for r in roots):
        found = same_tensor_twice(ctx, previous)
        if found is not None:
            return found
    mark = previous.mark
    current = graph.walk(roots, expand=lambda seq: seq >= mark)
    if all(current.seq[id(r)] >= mark for r in roots):
        targets = set(graph.stale_boundary(current, mark))
        if not targets and not current.complete:
            return unrecorded(ctx, roots, _resumed_from_names(ctx, roots, mark), previous)
    else:
        current, targets = _shared_with_previous(ctx, roots, previous)
        mark = min(current.seq[id(r)] for r in roots)
    targets = _freed_only(current, targets)
    if previous.api == "grad" and not previous.retain_graph:
        found = explain_freed_by_grad(ctx, previous)
        if found is not None:
            return found
    candidates = carriers(ctx, current, targets, mark)
    if not candidates:
        return shared_by_a_loop(ctx, previous, current, mark) or unnamed(ctx, previous)
    return _by_relation(ctx, candidates[0], previous, current, candidates[1:])


def _resumed_from_names(ctx: Context, roots, mark: int) -> graph.Walk:
    """The walk from the roots stopped short: walk again from the roots and from every tensor the
    frames hold that was made since `mark`, for the source to rank those it reaches. A node too
    wide to open (`torch.stack(states)` of a long unroll) has its inputs held in the user's
    list."""
    held = [binding.value.grad_fn for binding in ctx.bindings() if binding.value.grad_fn is not None]
    held = [node for node in held if node._sequence_nr() >= mark]
    return graph.walk([*roots, *held], expand=lambda seq: seq >= mark, reserve=graph.WRAP_BUDGET // 5)


def _freed_only(current: graph.Walk, targets: set[int]) -> set[int]:
    """The entry points of old history whose graph a backward really freed: a GAN's `fake` made
    before the discriminator's backward is old too, but that backward went through
    `fake.detach()` and freed nothing of it. All of them when none can tell."""
    freed = {t for t in targets if graph.freed_below([current.node(t)]) is not False}
    return freed or targets


def _shared_with_previous(ctx: Context, roots, previous: BackwardCall) -> tuple[graph.Walk, set[int]]:
    """Both losses were built before the first backward (one trunk, two heads): where this
    graph meets the one the previous backward went through."""
    previous_roots = [b.value.grad_fn for b in ctx.bound_roots(previous)]
    full = graph.walk(roots, reserve=graph.WRAP_BUDGET // 5 if previous_roots else 0)
    if not previous_roots:
        return full, {id(r) for r in roots}
    before = graph.walk(previous_roots)
    return full, set(graph.shared_top(full, before)) or {id(r) for r in roots}


def _by_relation(ctx: Context, candidate: Candidate, previous: BackwardCall, current: graph.Walk,
                 others: list[Candidate]) -> Finding:
    source, scope, failing = ctx.failing_statement()
    closed = explain_closed_hooks(ctx, candidate, others, previous)
    if closed is not None:
        return closed
    if candidate.relation == "direct" and _fed_back_in_a_loop(candidate.located):
        candidate.relation = "carried"
    elif candidate.relation == "direct" and (_memo(candidate.located) or _read_then_replaced(candidate.located)
                                             or stop_caching.keyed_cache(candidate.located) is not None):
        candidate.relation = "stored"  # kept between calls, and read back where it is set
    if candidate.relation == "direct":
        candidate = _items_it_was_made_from(ctx, candidate, previous) or candidate
    if candidate.relation == "carried":
        return explain_carried(ctx, candidate, previous, failing, others)
    if candidate.relation == "stored":
        loop = loop_past_the_fill(candidate.located, failing, source)
        if loop is not None:
            return filled_before_the_loop(ctx, candidate, previous, loop, failing, source)
        return explain_stored(ctx, candidate, previous, current, failing, source, scope)
    return explain_made_once(ctx, candidate, previous, failing, source) \
        or explain_shared(ctx, candidate, previous, failing, source, others)


def _items_it_was_made_from(ctx: Context, candidate: Candidate, previous: BackwardCall) -> Candidate | None:
    """The list whose items `candidate`'s statement was made from, where those items' own graphs
    are older than the backward that freed them: RLSolver's `theta_tensor = th.stack(
    self.theta_list)` before its fit loop, each theta appended with the learned optimizer's
    graph. Made again in the loop, the stack would still reach those graphs: the list is what
    carries them. None where no item read there holds such history."""
    located, index_of_frame = candidate.located, candidate.binding.frame_index
    value = src.value_of(located.store) if located is not None and isinstance(located.store, ast.stmt) else None
    # The names its statement reads are read in the frame that runs it.
    if value is None or ctx.frame_source(ctx.frames[index_of_frame])[1] is not located.scope:
        return None
    below = None  # the candidate's graph, walked once the first older item needs it
    for node in ast.walk(value):
        parts = src.canonical(node).split(".") if isinstance(node, (ast.Name, ast.Attribute)) else []
        if not parts or not all(part.isidentifier() for part in parts):
            continue
        # A list, filled one by one (a tuple, as nerfacc's `rays`, is made whole: what made it is
        # named as it is). Read from the frame, every item: one still bound to another name
        # (`theta`, just appended) is not among the bindings of the list's items.
        base, steps = naming.Binding(index_of_frame, parts[0], (), None, None), tuple(("attr", p) for p in parts[1:])
        container = ctx.reach(base, steps)
        items = container if isinstance(container, list) and len(container) <= naming.MAX_ITEMS else ()
        for index, item in enumerate(items):
            grad_fn = getattr(item, "grad_fn", None)
            if grad_fn is None or graph.sequence(grad_fn) >= previous.mark:
                continue
            if below is None:
                below = graph.walk([candidate.binding.value.grad_fn], expand=lambda seq: True)
            if id(grad_fn) in below.nodes:
                owner = ctx.reach(base, steps[:-1]) if steps else None
                return held(ctx, naming.Binding(index_of_frame, parts[0], (*steps, ("item", index)), item, owner))
    return None


def _memo(located: Located | None) -> bool:
    """`self.cached = out` in a method that returns `self.cached` where it is not None."""
    return located is not None and located.class_node is not None and isinstance(located.store, ast.Assign) \
        and stop_caching.stop_caching(located.source, located.class_node, located.store, located.target_text) is not None


def _read_then_replaced(located: Located | None) -> bool:
    """`self.mean_cache` handed to a helper as `precomputed_cache=self.mean_cache`, then
    `self.mean_cache = mean_cache` in the same method (not `__init__`): state the object keeps
    from one call to the next, read back by the method that replaces it."""
    if located is None or located.class_node is None or not isinstance(located.store, ast.Assign) \
            or not located.target_text.startswith("self."):
        return False
    method = src.enclosing_function(located.store)
    if method is None or method.name == "__init__":
        return False
    # A read after an assignment in the same call reads that call's value (ShiftNet's
    # `self.pred_fake = self.netD(...)`, then `torch.mean(self.pred_fake)`), not the last call's.
    first_set = min((a.stmt.lineno for a in src.assignments(method, located.target_text)), default=None)
    return any(read.lineno < located.store.lineno and (first_set is None or read.lineno <= first_set)
               for read in src.reads(method, located.target_text))


def _fed_back_in_a_loop(located: Located | None) -> bool:
    """The stale value itself is bound to a name that a loop re-assigns from its old value:
    `state = train_step(x, state)` while the helper's backward runs, or `h = out` after it."""
    return (located is not None and located.carried and isinstance(located.store, ast.stmt)
            and bool(src.loops_around(located.store)))
