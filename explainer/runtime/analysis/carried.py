"""A state carried across iterations (BX001), or a running total back-propagated (BX002): the
value re-enters the next step with the graph the previous backward freed."""
from __future__ import annotations

import ast

import torch

from ...fixes import accumulate_item, detach_carried, reset_state
from ...fixes.edits import overlapping
from ...model import Finding, Fix
from ...reading import source as src
from ...reading.training import last_reset, running_total
from .. import naming
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, culprit_at, finding, freed_graph
from .locate import Candidate


def explain_carried(ctx: Context, candidate: Candidate, previous: BackwardCall, failing,
                    others: list[Candidate] = ()) -> Finding:
    located = candidate.located
    receiver = src.call_receiver(failing, "backward") if failing is not None else None
    total = (located is not None and receiver is not None and running_total(located.store) is not None
             and src.canonical(receiver) == src.canonical(candidate.name))
    via = candidate.via
    if via is not None and not total:
        # The loop's own name for it, and the call that stored it, first: the user's line.
        evidence = freed_graph(ctx, via.target_text, located, previous, "grows",
                               kept=candidate.kept, via=via.source.segment(via.store),
                               via_row=via.row)
        culprits = [culprit_at(via.target_text, via.source, via.location), culprit(ctx, candidate)]
        return finding("BX001", "run-kept", "second-backward", evidence, culprits,
                       carried_fixes(ctx, candidate, failing))
    evidence = freed_graph(ctx, candidate.name, located, previous, "grows")
    code, variant = ("BX002", "run-total") if total else ("BX001", "run-carried")
    fixes = carried_fixes(ctx, candidate, failing)
    if not total:
        fixes = _with_peers(ctx, candidate, others, failing, fixes)
    return finding(code, variant, "second-backward", evidence, [culprit(ctx, candidate)],
                   fixes, "certain" if located is not None else "likely")


def _with_peers(ctx: Context, candidate: Candidate, others: list[Candidate], failing, fixes: list) -> list:
    """`self.cache_k[...] = xk` and `self.cache_v[...] = xv`, one after the other in the same
    method: both carry the previous step's graph, and a fix of one alone leaves the next backward
    failing on the other. The first fix also fixes each such peer, its own first fix's way."""
    located = candidate.located
    first = next((f for f in fixes if f is not None), None)
    if located is None or first is None:
        return fixes
    peers = [o for o in others if o.relation == "carried" and o.located is not None and o.name != candidate.name
             and o.located.scope is located.scope and o.located.store is not located.store
             and o.located.class_node is located.class_node]
    edits, names = list(first.edits), [candidate.name]
    first_of_each: dict[str, Candidate] = {}
    for peer in peers:  # the same statement reached through each layer's module: the first counts
        first_of_each.setdefault(peer.name, peer)
    for peer in first_of_each.values():
        theirs = next((f for f in carried_fixes(ctx, peer, failing) if f is not None), None)
        if theirs is None or theirs.applicability != first.applicability or overlapping(edits, theirs.edits):
            continue
        edits.extend(theirs.edits)
        names.append(peer.name)
    if len(names) == 1:
        return fixes
    merged = Fix(f"{first.message} (and the same for {', '.join(f'`{n}`' for n in names[1:])}, which carries "
                 f"it too)", tuple(edits), first.applicability)
    return [merged if f is first else f for f in fixes]


def carried_fixes(ctx: Context, candidate: Candidate, failing) -> list[Fix | None]:
    """Detach the carried state, best first: where it re-enters, at the loop's entry, or keep it
    detached after the backward; for a running total, accumulate `.item()`."""
    located = candidate.located
    if located is None:
        return []
    source, name = located.source, candidate.name
    is_tuple = False
    stmt = located.store
    fixes: list[Fix | None] = []
    # An LSTM state is a tuple (h, c): the binding found is one element of it.
    if candidate.binding.in_sequence and not isinstance(located.target, ast.Subscript):
        container = candidate.binding.container_expression
        if src.assignments(located.scope, container):
            name, is_tuple = container, True
        elif located.class_node is not None:
            is_tuple = True  # `self.hidden`, found through `model.hidden[0]`
    receiver = src.call_receiver(failing, "backward") if failing is not None else None
    if located.class_node is not None:
        fixes = detach_carried.fixes_for_module_state(source, located.assignment, name, is_tuple, located.class_node,
                                                      candidate.used_now)
        if candidate.used_now:
            # Updated within the pass: cutting it would cut this pass too. Start each pass
            # afresh with the class's own reset, else from its value, cut after the backward.
            fixes[:0] = [_reset_each_pass(ctx, candidate, failing), _detach_after_backward(ctx, candidate, failing,
                                                                                           is_tuple)]
        return fixes
    reset = _reset_before_freeing(ctx, located, name, failing)
    if reset is not None:
        # Both backward calls are in one pass: there is no older pass's history to detach.
        return [accumulate_item.reset_after_backward(source, name, *reset)]
    if isinstance(stmt, (ast.Assign, ast.AugAssign)) and receiver is not None \
            and src.canonical(receiver) == src.canonical(name):
        fixes.append(accumulate_item.accumulate_with_item(source, name, located.assignment, receiver, failing))
    # The loop may be in a caller: `state = train_step(model, state)` around a helper's backward.
    loops = ctx.backward_loops(source, located.scope) or src.loops_around(stmt)
    loop = loops[-1] if loops else None
    for candidate_loop in loops:
        if any(s is stmt for s in candidate_loop.body):
            loop = candidate_loop
    frame_source, frame_scope = ctx.frame_source(ctx.frames[candidate.binding.frame_index]) if loop is None \
        else (None, None)
    if frame_scope is not None and frame_scope is not located.scope:
        # Set by a helper that the loop around the backward hands its holder to (DVRL's
        # `run_model(current_memory=current_memory)`): cut where each pass of that loop starts.
        outer = ctx.backward_loops(frame_source, frame_scope)
        if outer:
            fixes.append(detach_carried.detach_at_loop_entry(frame_source, candidate.binding.expression, outer[0],
                                                             is_tuple, holder=candidate.binding.base))
        return fixes
    if loop is not None and isinstance(located.target, ast.Subscript) and not any(s is stmt for s in loop.body):
        # An element re-assigned in an inner loop (`for i, cell in enumerate(cells)`): its index
        # means nothing at the outer loop's entry, so detach the whole container there.
        container = src.canonical(located.target.value)
        made = src.last_assignment(located.scope, container, loop.lineno)
        fixes.append(detach_carried.detach_elements_at_loop_entry(
            source, container, loop, made.value if made is not None else None))
        return fixes
    if _a_structure(ctx, candidate, name):
        # A tuple of dicts of tensors has no `.detach()`, nor does each of its items.
        return fixes + [detach_carried.detach_tree_at_loop_entry(source, name, loop)] if loop is not None else fixes
    if loop is not None:
        from_weights = _first_made_from_weights(ctx, candidate, name, loop)
        fixes.append(detach_carried.restart_each_pass(source, name, stmt, loop, located.scope, from_weights))
        may_be_none = detach_carried.starts_as_none(located.scope, name, loop)
        cuts = [detach_carried.keep_discarded_detach(source, name, loop, is_tuple)]
        if failing is not None and stmt.lineno > failing.end_lineno and src.inside(failing, loop):
            cuts.append(detach_carried.keep_detached(source, name, stmt, is_tuple))
        if any(s is stmt for s in loop.body) and not may_be_none:
            cuts.append(detach_carried.detach_where_read(source, name, located.assignment, is_tuple))
        if not detach_carried.starts_as_number(located.scope, name, loop):
            cuts.append(detach_carried.detach_at_loop_entry(source, name, loop, is_tuple, may_be_none))
        # A detach of a state made from the weights cuts their gradient through it, this step's too.
        fixes.extend(cut.unproven() if from_weights and cut is not None else cut for cut in cuts)
    return fixes


def _a_structure(ctx: Context, candidate: Candidate, name: str) -> bool:
    """Whether the state named `name` (the binding's own variable) holds its tensors nested, or
    beside values that are not tensors: a tuple or list of dicts, ints or tuples, or a dict."""
    if name != candidate.binding.base:
        return False
    value = ctx.reach(candidate.binding, ())
    if isinstance(value, dict):
        return True
    return isinstance(value, (tuple, list)) and not all(isinstance(item, torch.Tensor) for item in value)


def _first_made_from_weights(ctx: Context, candidate: Candidate, name: str, loop: ast.stmt) -> bool:
    """Whether `name`'s value before the loop is made from tensors that train (MAML's fast weights,
    `fast = [w.clone() for w in model.parameters()]`): names it reads hold a tensor that requires
    grad, a module with such parameters, or a list of such tensors."""
    start = src.last_assignment(candidate.located.scope, name, loop.lineno)
    if start is None:
        return False
    frame = ctx.frames[candidate.binding.frame_index]
    for read in src.names_read(start.value) if start.value is not None else ():
        value = frame.f_locals.get(read, frame.f_globals.get(read))
        if isinstance(value, torch.nn.Module):
            value = next(value.parameters(), None)
        elif isinstance(value, (list, tuple)):
            value = next((v for v in value[:8] if isinstance(v, torch.Tensor) and v.requires_grad), None)
        if isinstance(value, torch.Tensor) and value.requires_grad:
            return True
    return False


def _reset_before_freeing(ctx: Context, located, name: str, failing):
    """(the reset, the freeing backward's statement) when the pass gives `name` a fresh value
    before the backward that freed the graph, and the failing backward comes later in the same
    pass: the total still holds what that backward went through."""
    freeing = ctx.freeing
    if failing is None or freeing is None or freeing.filename != located.source.filename \
            or not isinstance(located.store, ast.stmt) or not freeing.row < located.store.lineno:
        return None
    _, _, freeing_stmt = ctx.site_statement(freeing.filename, freeing.row)
    for loop in src.loops_around(located.store):
        if src.inside(failing, loop) and freeing_stmt is not None and src.inside(freeing_stmt, loop):
            reset = last_reset(loop, located.store, src.canonical(name))
            if reset is not None and reset.lineno < freeing.row:
                return reset, freeing_stmt
    return None


def _reset_each_pass(ctx: Context, candidate: Candidate, failing) -> Fix | None:
    """Reset the module's state with its class's own reset method, before the forward of the
    loop that runs the failing backward, for every such module of the model bound there."""
    located, owner = candidate.located, candidate.binding.owner
    attribute = candidate.binding.steps[-1][1] if candidate.binding.steps else None
    found = reset_state.reset_method(located.class_node, attribute) if attribute and owner is not None else None
    source, _, _ = ctx.failing_statement()
    if found is None or failing is None or source is None \
            or not any(isinstance(n, ast.ClassDef) and n.name == located.class_node.name for n in source.tree.body):
        return None
    loops = src.loops_around(failing)
    if not loops:
        return None
    roots = [expression for expression, module, index in naming.module_bindings(ctx.frames)
             if expression.isidentifier() and ctx.frames[index].f_code.co_filename == source.filename
             and any(m is owner for m in module.modules())]
    before = next((stmt for stmt in loops[0].body for root in roots if src.reads(stmt, root)), None)
    if before is None:
        return None
    root = next(root for root in roots if src.reads(before, root))
    method, stmt = found
    return reset_state.reset_each_pass(source, before, root, located.class_node.name, method.name,
                                       reset_state.same_as_initial(located.class_node, attribute, stmt))


def _detach_after_backward(ctx: Context, candidate: Candidate, failing, is_tuple: bool) -> Fix | None:
    """The state as the backward's own frame reaches it (`model.recurrent.weight`), detached
    right after the backward."""
    source, scope, _ = ctx.failing_statement()
    binding = candidate.binding
    frame = ctx.frames[binding.frame_index]
    if failing is None or source is None or frame.f_code.co_filename != source.filename \
            or ctx.frame_source(frame)[1] is not scope or any(kind != "attr" for kind, _ in binding.steps):
        return None
    root = frame.f_locals.get(binding.base, frame.f_globals.get(binding.base))
    owner = binding.owner
    if isinstance(root, torch.nn.Module) and owner is not None \
            and sum(type(m) is type(owner) for m in root.modules()) > 1:
        # Every such module of the model carries its own state (each neuron layer's `v`).
        class_name = type(owner).__name__
        if not any(isinstance(n, ast.ClassDef) and n.name == class_name for n in source.tree.body):
            return None
        return detach_carried.detach_every_module_after_backward(source, binding.base, class_name,
                                                                 binding.steps[-1][1], failing)
    return detach_carried.detach_after_backward(source, binding.expression, failing, is_tuple)
