"""second-backward: a backward reaches history that an earlier backward freed (state carried
across iterations, a tensor made once before the loop, a graph shared by two backward calls)."""
from __future__ import annotations

import ast
import os

import torch

from ...fixes import (
    accumulate_item,
    constant_data,
    detach_carried,
    detach_for_first_consumer,
    detach_peer_reads,
    empty_container,
    graph_options,
    move_into_loop,
    recompute_forward,
    remove_statement,
    sum_losses,
)
from ...fixes.edits import node_start
from ...model import Culprit, Finding, Fix, Location
from ...reading import source as src
from ...reading.dataflow import ancestors
from .. import graph
from ..records import BackwardCall
from .advice import RETAIN_GRAPH_AFTER_STEP, RETAIN_GRAPH_GROWS
from .context import Candidate, Located, _call_in, _shares_history


def explain_second_backward(ctx) -> Finding | None:
    previous = ctx.previous
    roots = ctx.root_nodes()
    if not roots:
        return None
    if previous is None:
        return _unrecorded_second_backward(ctx, roots)
    if set(ctx.call.root_ids) == set(previous.root_ids) and all(r._sequence_nr() < previous.mark for r in roots):
        finding = _same_tensor_twice(ctx, previous)
        if finding is not None:
            return finding
    mark = previous.mark
    current = graph.walk(roots, expand=lambda seq: seq >= mark)
    if all(current.seq[id(r)] >= mark for r in roots):
        targets = set(graph.stale_boundary(current, mark))
        if not targets and not current.complete:
            return _unrecorded_second_backward(ctx, roots, current)
    else:
        current, targets = _shared_with_previous(ctx, roots, previous)
        mark = min(current.seq[id(r)] for r in roots)
    if previous.api == "grad" and not previous.retain_graph:
        finding = _freed_by_grad(ctx, current, targets, previous)
        if finding is not None:
            return finding
    candidates = ctx.carriers(current, targets, mark)
    if not candidates:
        return _generic_second_backward(ctx, previous)
    return _second_backward_finding(ctx, candidates[0], previous, current, candidates[1:])


def _shared_with_previous(ctx, roots, previous) -> tuple[graph.Walk, set[int]]:
    """Both losses were built before the first backward (one trunk, two heads): where
    this graph meets the one the previous backward went through."""
    previous_roots = [b.value.grad_fn for b in ctx.bindings()
                      if id(b.value) in previous.root_ids and b.value.grad_fn is not None
                      and b.value.grad_fn._sequence_nr() < previous.mark]
    full = graph.walk(roots, reserve=graph.WRAP_BUDGET // 5 if previous_roots else 0)
    if not previous_roots:
        return full, {id(r) for r in roots}
    before = graph.walk(previous_roots)
    return full, set(graph.shared_top(full, before)) or {id(r) for r in roots}


def _second_backward_finding(ctx, candidate: Candidate, previous: BackwardCall, current,
                             others: list[Candidate] = ()) -> Finding:
    located = candidate.located
    name = candidate.name
    source, scope, failing = ctx.failing_statement()
    backward_site = ctx.call_site(ctx.call.filename, ctx.call.row)
    freed_site = ctx.call_site(previous.filename, previous.row)
    between = ctx.steps_between(previous.tick, ctx.call.tick)
    where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
    fixes: list[Fix] = []
    advice = RETAIN_GRAPH_GROWS

    if candidate.relation == "direct" and _fed_back_in_a_loop(located):
        candidate.relation = "carried"
    if candidate.relation == "carried":
        role = "carried across iterations"
        summary = f"`{name}` carries the graph of the previous iteration into this backward."
        detail = (f"`{name}`, re-assigned at {where}, still carries the autograd graph of the "
                  f"previous iteration. {ctx.freed_by(previous)} that graph, "
                  f"and this backward (line {ctx.call.row}) tries to go through it again.")
        fixes += carried_fixes(ctx, candidate, failing)
    elif candidate.relation == "stored" and (loop := _loop_past_the_fill(located, failing, source)) is not None:
        # Mutual learning: `outputs` is filled once, then each pass of the loop trains one model
        # on all of them. Emptying it would break the next pass; the peers' items need detaching.
        role = "filled before the loop whose every pass back-propagates through it"
        summary = f"`{name}` is filled before the loop, and each pass's backward goes through all of it."
        detail = (f"`{name}` (filled at {where}) holds tensors made before the loop at line {loop.lineno}. "
                  f"{ctx.freed_by(previous, 'pass')} the graphs of every item its "
                  f"loss read, and this backward (line {ctx.call.row}) needs some of them again.")
        if between:
            advice = RETAIN_GRAPH_AFTER_STEP
        own = detach_peer_reads.own_index(failing, loop)
        if own is not None:
            fixes.append(detach_peer_reads.detach_peer_items(source, loop, name, own, failing.lineno))
    elif candidate.relation == "stored":
        role = "stores tensors that keep earlier graphs"
        summary = f"`{name}` keeps tensors whose graphs an earlier backward already freed."
        detail = (f"`{name}` (filled at {where}) holds tensors with the graphs of earlier steps. "
                  f"{ctx.freed_by(previous)} those graphs, and this "
                  f"backward (line {ctx.call.row}) reaches them through `{name}`.")
        if located is not None and failing is not None and _trains_only_through(ctx, candidate, current):
            # Detaching at the store would leave this loss with nothing to train.
            if src.reads(scope, name):
                fixes.append(empty_container.empty_after_backward(source, failing, name))
        elif located is not None:
            fixes.append(detach_carried.detach_stored_value(located.source, located.store, name))
    else:
        role, summary, detail, more_fixes, advice = _direct(ctx, candidate, previous, between, failing, source,
                                                            scope, others)
        fixes += more_fixes
    fixes = [f for f in fixes if f is not None]
    if fixes:
        detail += f" Fix: {fixes[0].message}."
    culprits = [ctx.culprit(candidate, role)]
    return Finding(
        kind="second-backward", severity="error", summary=summary, message=detail,
        culprits=culprits, fixes=fixes, backward=backward_site, freed_by=freed_site,
        steps=[ctx.call_site(s.filename, s.row) for s in between], retain_graph_advice=advice,
        confidence="certain" if located is not None else "likely",
    )


def _loop_past_the_fill(located: Located | None, failing, source) -> ast.stmt | None:
    """The innermost loop around the failing backward, when the container was filled (in the
    same file) outside it."""
    loops = src.loops_around(failing) if failing is not None else []
    if located is None or not loops or located.source.filename != source.filename \
            or src.inside(located.store, loops[0]):
        return None
    return loops[0]


def carried_fixes(ctx, candidate: Candidate, failing) -> list[Fix | None]:
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
        return detach_carried.fixes_for_module_state(source, located.assignment, name, is_tuple,
                                                     located.class_node)
    if isinstance(stmt, (ast.Assign, ast.AugAssign)) and receiver is not None \
            and src.canonical(receiver) == src.canonical(name):
        fixes.append(accumulate_item.accumulate_with_item(source, name, located.assignment, receiver))
    # The loop may be in a caller: `state = train_step(model, state)` around a helper's backward.
    loops = ctx.backward_loops(source, located.scope) or src.loops_around(stmt)
    loop = loops[-1] if loops else None
    for candidate_loop in loops:
        if any(s is stmt for s in candidate_loop.body):
            loop = candidate_loop
    if loop is not None and isinstance(located.target, ast.Subscript) and not any(s is stmt for s in loop.body):
        # An element re-assigned in an inner loop (`for i, cell in enumerate(cells)`): its index
        # means nothing at the outer loop's entry, so detach the whole container there.
        container = src.canonical(located.target.value)
        made = src.last_assignment(located.scope, container, loop.lineno)
        fixes.append(detach_carried.detach_elements_at_loop_entry(
            source, container, loop, made.value if made is not None else None))
        return fixes
    if loop is not None:
        may_be_none = detach_carried.starts_as_none(located.scope, name, loop)
        fixes.append(detach_carried.keep_discarded_detach(source, name, loop, is_tuple))
        if failing is not None and stmt.lineno > failing.end_lineno and src.inside(failing, loop):
            fixes.append(detach_carried.keep_detached(source, name, stmt, is_tuple))
        if any(s is stmt for s in loop.body) and not may_be_none:
            fixes.append(detach_carried.detach_where_read(source, name, located.assignment, is_tuple))
        fixes.append(detach_carried.detach_at_loop_entry(source, name, loop, is_tuple, may_be_none))
    return fixes


def _trains_only_through(ctx, candidate: Candidate, current: graph.Walk) -> bool:
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


def _fed_back_in_a_loop(located: Located | None) -> bool:
    """The stale value itself is bound to a name that a loop re-assigns from its old value:
    `state = train_step(x, state)` while the helper's backward runs, or `h = out` after it."""
    return (located is not None and located.carried and isinstance(located.store, ast.stmt)
            and bool(src.loops_around(located.store)))


def _direct(ctx, candidate, previous, between, failing, source, scope, others=()):
    """A tensor made once and used by two backward calls: which of the shared-graph
    families is this, and its fixes."""
    located, name = candidate.located, candidate.name
    where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
    freed_code = ctx.call_site(previous.filename, previous.row).code
    fixes: list[Fix | None] = []
    # Made before the loop (or closure) that repeats the backward, or once in __init__.
    if located is not None and located.in_init and located.class_node is not None:
        attribute = located.target_text
        fixes.append(move_into_loop.inline_attribute(located.source, located.class_node, located.store, attribute))
        role = "computed once in __init__"
        summary = f"`{name}` was computed once, in `__init__`, and every call reuses its graph."
        detail = (f"`{name}` is computed once at {where} from parameters, so every forward reuses "
                  f"the same graph. {ctx.freed_by(previous)} it, and this backward "
                  f"(line {ctx.call.row}) needs it again.")
        return role, summary, detail, fixes, RETAIN_GRAPH_GROWS
    owner = _repeating_owner(ctx, located, failing, source)
    if owner is not None:
        untrained = _untrained_leaves(ctx, candidate)
        model = None if untrained else _called_again_in(ctx, located, owner)
        if untrained:
            fixes.append(constant_data.detach_data(located.source, located.store, name, untrained))
        if model is not None:
            # Recomputing it in the loop would make it equal to the fresh output (PPO's ratio 1).
            fixes.append(constant_data.detach_snapshot(located.source, located.store, name, model))
        else:
            fixes.append(move_into_loop.move_into_body(located.source, located.store, owner, name))
        kind = "closure" if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) else "loop"
        role = f"computed once before the {kind}"
        summary = f"`{name}` is computed once, before the {kind}, and every backward reuses its graph."
        detail = (f"`{name}` is computed once at {where}, before the {kind} that calls backward. "
                  f"{ctx.freed_by(previous)} its graph, and this backward "
                  f"(line {ctx.call.row}) goes through it again.")
        return role, summary, detail, fixes, RETAIN_GRAPH_GROWS
    # Used by two backward calls of one iteration.
    role = "shared by two backward calls"
    detail = (f"`{name}` (made at {where}) is part of the graphs of two backward calls. "
              f"`{freed_code}` (line {previous.row}) went through it first and freed its graph; "
              f"this backward (line {ctx.call.row}) needs it again.")
    summary = f"`{name}` is shared by two backward calls, and the first one freed its graph."
    _, _, previous_stmt = ctx.site_statement(previous.filename, previous.row)
    advice = RETAIN_GRAPH_AFTER_STEP
    if located is None or failing is None:
        return role, summary, detail, fixes, advice
    if between:
        last_step = max(between, key=lambda s: s.tick)
        # A few more tensors shared the same way (peers' outputs); each costs a walk of its graph.
        shared = [candidate] + [c for c in others if c.relation == "direct" and c.located is not None
                                and c.located.source is located.source
                                and c.located.scope is located.scope][:_MORE_SHARED]
        detach, first_update = _detach_for_each_update(ctx, shared, previous, between, last_step, failing, source)
        if detach is not None:
            fixes.append(detach)
        if first_update:
            advice = ("retain_graph=True would make this run, but the first loss would still "
                      "back-propagate into the model that produced "
                      f"`{name}`: detach it for that update instead.")
        fixes.append(recompute_forward.recompute_before_use(
            located.source, located.scope, located.store, last_step.row, failing,
            f"Recompute `{name}` after `{ctx.call_site(last_step.filename, last_step.row).code}`"
            f" (line {last_step.row}): the step changed the weights its graph was built with",
            upstream=ctx.made_history))
    else:
        fixes.append(sum_losses.sum_and_backward_once(source, previous_stmt, failing) if previous_stmt is not None else None)
        call = _call_in(previous_stmt, "backward") if previous_stmt is not None else None
        if call is not None:
            fixes.append(graph_options.add_retain_graph(
                source, call, "Keep the shared graph for the second backward with "
                "`retain_graph=True` on the first one (correct here: no step in between)"))
        advice = ("retain_graph=True on the first backward is correct here (no optimizer step "
                  "between the two backward calls), but summing the losses and calling "
                  "backward once is faster and frees the graph.")
    return role, summary, detail, fixes, advice


_MORE_SHARED = 3


def _detach_for_each_update(ctx, shared: list[Candidate], previous, between, last_step, failing, source):
    """Detach each shared tensor where a loss reads it whose optimizer does not train the model
    that produced it: for the update between the two backward calls (a GAN's discriminator on
    `fake`), or for the one after this backward (peers learning from each other's outputs).
    Returns (the fix, whether `shared[0]` is detached for the first update)."""
    stepped = _optimizer_parameters(between)
    follower = _step_after(ctx, source, failing)
    follower_trains = _trained_by(follower[1]) if follower is not None else set()
    edits, parts, first_update = [], [], False
    for index, candidate in enumerate(shared):
        located, name = candidate.located, candidate.name
        produced_by = _parameters_under(candidate.binding.value.grad_fn)
        if not produced_by:
            continue
        if stepped and not (stepped & produced_by):
            fix = detach_for_first_consumer.detach_before(
                located.source, located.scope, name, located.store.end_lineno, previous.row)
            part = f"`{name}` for the `{ctx.call_site(last_step.filename, last_step.row).code}` update"
            first_update = first_update or (fix is not None and index == 0)
        elif follower is not None and not (follower_trains & produced_by):
            fix = detach_for_first_consumer.detach_before(
                located.source, located.scope, name, last_step.row, failing.lineno,
                detach_for_first_consumer.LATER_UPDATE.format(step=f"{follower[0]}.step()", carrier="{carrier}"))
            part = f"`{name}` for the `{follower[0]}.step()` update"
        else:
            continue
        if fix is not None and not _overlaps(edits, fix.edits):
            edits.extend(fix.edits)
            parts.append((part, fix))
    if not parts:
        return None, False
    if len(parts) == 1:
        return parts[0][1], first_update
    listed = " and ".join(part for part, _ in parts)
    return Fix(f"Detach {listed}: neither optimizer trains the model that produced the tensor "
               f"it is given, so each loss needs it only as a value", tuple(edits)), first_update


def _overlaps(edits, more) -> bool:
    spans = [(e.location.row, e.location.column, e.end_location.row, e.end_location.column) for e in edits]
    for e in more:
        start, end = (e.location.row, e.location.column), (e.end_location.row, e.end_location.column)
        if any(start < (r2, c2) and (r1, c1) < end for r1, c1, r2, c2 in spans):
            return True
    return False


def _step_after(ctx, source, failing) -> tuple[str, object] | None:
    """The optimizer whose `step()` follows the failing backward in the same block: the update
    this backward's gradients are for."""
    body = src.enclosing_block(failing)
    after = next((i + 1 for i, s in enumerate(body) if s is failing), len(body))
    for stmt in body[after:]:
        receiver = src.call_receiver(stmt, "step")
        if receiver is None:
            continue
        name = src.canonical(receiver)
        optimizer = ctx.lookup(name, source.filename)
        if optimizer is None or not hasattr(optimizer, "param_groups"):
            return None
        return name, optimizer
    return None


def _repeating_owner(ctx, located: Located | None, failing, source) -> ast.AST | None:
    """The loop or closure that repeats the failing backward while `located` is outside it."""
    if located is None or failing is None or source is None or located.source.filename != source.filename:
        return None
    store = located.store
    for ancestor in src.ancestors(failing):
        if isinstance(ancestor, (ast.For, ast.AsyncFor, ast.While)):
            if not (ancestor.lineno <= store.lineno <= ancestor.end_lineno) and store.lineno < ancestor.lineno:
                return ancestor
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if store.lineno < ancestor.lineno and located.scope is not ancestor:
                return ancestor
            break
    return None


def _freed_by_grad(ctx, current, targets, previous) -> Finding | None:
    _, _, grad_stmt = ctx.site_statement(previous.filename, previous.row)
    source, scope, failing = ctx.failing_statement()
    if grad_stmt is None or source is None:
        return None
    call = _call_in(grad_stmt, "grad")
    if call is None:
        return None
    freed = call.args[0] if call.args else None
    name = source.segment(freed) if freed is not None else "the graph"
    if not _feeds(grad_stmt, failing, scope):
        return _two_gradient_passes(ctx, source, call, name, previous, failing)
    fix = graph_options.add_create_graph(source, call)
    grad_code = source.segment(call)
    message = (f"`{grad_code}` at line {previous.row} back-propagated through `{name}`'s graph and "
               f"freed it (no create_graph/retain_graph), and this backward (line {ctx.call.row}) "
               f"goes through `{name}` again. Its result feeds a loss, so it must build a graph "
               f"itself.")
    if fix is not None:
        message += f" Fix: {fix.message}."
    row = grad_stmt.lineno
    targets = src.targets_of(grad_stmt)
    anchor = targets[0] if targets else call
    result = source.segment(targets[0]) if targets else grad_code
    culprit = Culprit(result, source.filename, Location(anchor.lineno, source.column(anchor.lineno, anchor.col_offset)),
                      f"computed without a graph; `{name}`'s graph was freed by it", source.line(row).strip())
    return Finding(
        kind="second-backward", severity="error",
        summary=f"`autograd.grad` freed `{name}`'s graph, and the final backward needs it.",
        message=message, culprits=[culprit], fixes=[fix] if fix else [],
        backward=ctx.call_site(ctx.call.filename, ctx.call.row),
        freed_by=ctx.call_site(previous.filename, previous.row),
        retain_graph_advice="retain_graph=True alone would run, but the penalty would have no "
                            "gradient: create_graph=True is what makes the gradient differentiable.",
    )


def _feeds(grad_stmt: ast.stmt, failing: ast.stmt, scope) -> bool:
    """Whether the failing call's inputs are computed from what `grad_stmt` assigned."""
    produced = {src.canonical(t) for t in src.targets_of(grad_stmt)}
    if not produced or failing is None:
        return True  # `(loss + penalty(torch.autograd.grad(...))).backward()`: read in place
    value = src.value_of(failing) if src.value_of(failing) is not None else failing
    if any(src.reads(value, name) for name in produced):
        return True
    return any(a.stmt is grad_stmt for a in ancestors(value, scope, failing.lineno))


def _two_gradient_passes(ctx, source, call: ast.Call, name: str, previous: BackwardCall, failing) -> Finding:
    """Two gradient computations over one graph, the first without `retain_graph`; the second
    does not use the first's result."""
    grad_code = source.segment(call)
    this_call = "this `autograd.grad` call" if _call_in(failing, "grad") is not None else "this backward"
    between = ctx.steps_between(previous.tick, ctx.call.tick)
    fixes: list[Fix | None] = []
    if not between:
        fixes.append(graph_options.add_retain_graph(
            source, call, f"Keep `{name}`'s graph for the second pass with `retain_graph=True` on "
            f"`{grad_code}` (correct here: no optimizer step in between)"))
    fixes = [f for f in fixes if f is not None]
    message = (f"`{grad_code}` at line {previous.row} back-propagated through `{name}`'s graph and "
               f"freed it, and {this_call} (line {ctx.call.row}) goes through `{name}` again.")
    if fixes:
        message += f" Fix: {fixes[0].message}."
    culprit = Culprit(name, source.filename, node_start(source, call),
                      "its graph freed by the first gradient computation", source.line(call.lineno).strip())
    advice = (RETAIN_GRAPH_AFTER_STEP if between else
              "retain_graph=True on the first call is correct here (no optimizer step between the "
              "two); asking for all the gradients in one call is faster and frees the graph once.")
    return Finding(
        kind="second-backward", severity="error",
        summary=f"Two gradient computations go through `{name}`'s graph, and the first freed it.",
        message=message, culprits=[culprit], fixes=fixes,
        backward=ctx.call_site(ctx.call.filename, ctx.call.row),
        freed_by=ctx.call_site(previous.filename, previous.row), retain_graph_advice=advice,
    )


def _same_tensor_twice(ctx, previous: BackwardCall) -> Finding | None:
    """The same loss back-propagated twice (`loss.backward()` in a helper, then again by its
    caller): the second call is the bug, not the freed graph."""
    source, _, failing = ctx.failing_statement()
    receiver = src.call_receiver(failing, "backward") if failing is not None else None
    if receiver is None:
        return None
    name = source.segment(receiver)
    freed = ctx.call_site(previous.filename, previous.row)
    where = (f"line {previous.row}" if previous.filename == source.filename
             else f"{os.path.basename(previous.filename)}:{previous.row}")
    fix = remove_statement.remove_call(source, failing, receiver)
    message = (f"`{freed.code}` ({where}) already back-propagated `{name}`, and this call (line "
               f"{ctx.call.row}) back-propagates the same tensor again.")
    if fix is not None:
        message += f" Fix: {fix.message}."
    culprit = Culprit(name, source.filename, node_start(source, failing), "back-propagated a second time",
                      source.line(failing.lineno).strip())
    return Finding(
        kind="second-backward", severity="error",
        summary=f"`{name}` is back-propagated twice: `{freed.code}` ({where}) already did it.",
        message=message, culprits=[culprit], fixes=[fix] if fix else [],
        backward=ctx.call_site(ctx.call.filename, ctx.call.row), freed_by=freed,
        retain_graph_advice="retain_graph=True on the first call would make this run, but every "
                            "gradient would be counted twice (and after an optimizer step it fails "
                            "with 'modified by an inplace operation').",
    )


def _generic_second_backward(ctx, previous: BackwardCall | None) -> Finding:
    freed = ctx.call_site(previous.filename, previous.row) if previous else None
    message = ("This backward goes through a graph that an earlier backward already freed"
               + (f" (`{freed.code}`, line {freed.row})" if freed else "")
               + ", but no variable in your frames holds the tensor that links them.")
    return Finding(kind="second-backward", severity="error",
                   summary="This backward reaches a graph an earlier backward freed.",
                   message=message, backward=ctx.call_site(ctx.call.filename, ctx.call.row) if ctx.call else None,
                   freed_by=freed, retain_graph_advice=RETAIN_GRAPH_GROWS, confidence="guess")


def _unrecorded_second_backward(ctx, roots, walked: graph.Walk | None = None) -> Finding | None:
    """No mark splits the graph: no earlier backward was recorded (installed late, or
    post-mortem), or the graph is larger than one explanation may walk (`walked`). Rank the
    tensors related to this graph by what the source says about them (carried from itself,
    stored in a container, made before the loop)."""
    full = walked if walked is not None else graph.walk(roots)
    root_keys = {id(r) for r in roots}
    source, _, failing = ctx.failing_statement()
    best, best_score = None, 0
    for binding in ctx.bindings():
        grad_fn = binding.value.grad_fn
        if grad_fn is None or id(grad_fn) in root_keys:
            continue
        if id(grad_fn) not in full.nodes and (not graph.budget_left() or not _shares_history(grad_fn, full)):
            continue
        candidate = Candidate(binding, "direct")
        candidate.located = located = ctx.locate(binding, ctx.call.row if ctx.call else None)
        if located is None:
            continue
        if isinstance(located.store, ast.Call):
            candidate.relation, score = "stored", 3
        elif located.carried:
            candidate.relation, score = "carried", 3
        elif located.in_init or _repeating_owner(ctx, located, failing, source) is not None:
            score = 2
        else:
            continue
        if score > best_score:
            best, best_score = candidate, score
    if best is None:
        return None
    located = best.located
    best.name = located.target_text
    where = f"{os.path.basename(located.source.filename)}:{located.row}"
    if best.relation == "carried":
        fixes = carried_fixes(ctx, best, failing)
        how = f"is re-assigned from itself at {where}, so it carries the graph of the previous iteration"
    elif best.relation == "stored":
        fixes = [detach_carried.detach_stored_value(located.source, located.store, best.name)]
        how = f"is filled at {where} with tensors that keep the graphs of earlier steps"
    elif located.in_init and located.class_node is not None:
        fixes = [move_into_loop.inline_attribute(located.source, located.class_node, located.store, located.target_text)]
        how = f"is computed once at {where}, in `__init__`, so every call reuses its graph"
    else:
        owner = _repeating_owner(ctx, located, failing, source)
        fixes = [move_into_loop.move_into_body(located.source, located.store, owner, best.name)]
        how = f"is computed once at {where}, before the loop, so every backward reuses its graph"
    fixes = [f for f in fixes if f is not None]
    why = (f"The graph is larger than one explanation walks ({len(full.nodes):,} nodes seen)"
           if walked is not None else
           "No earlier backward was recorded (the explainer was not installed yet)")
    message = (f"`{best.name}` {how}; an earlier backward freed that graph and this backward "
               f"goes through it again. {why}, so this is read from the source and from what "
               f"the graph shows: likely, not certain.")
    if fixes:
        message += f" Fix: {fixes[0].message}."
    return Finding(
        kind="second-backward", severity="error",
        summary=f"`{best.name}` most likely carries a graph that an earlier backward freed.",
        message=message, culprits=[ctx.culprit(best, "likely carrier of the freed graph")],
        fixes=fixes, backward=ctx.call_site(ctx.call.filename, ctx.call.row) if ctx.call else None,
        retain_graph_advice=RETAIN_GRAPH_GROWS, confidence="likely",
    )


def _called_again_in(ctx, located: Located, owner: ast.AST) -> str | None:
    """A model that made `located`'s value (in its statement or the ones it was computed from,
    before `owner`) and that `owner`, the loop, calls again: PPO's `old_log_probs` from
    `policy(states)`, with `policy(states)` again in the update loop."""
    if not isinstance(located.store, ast.stmt) or src.value_of(located.store) is None:
        return None
    made_by = [located.store] + [a.stmt for a in ancestors(src.value_of(located.store), located.scope,
                                                           located.store.lineno) if a.stmt.lineno < owner.lineno]
    filename = located.source.filename

    def models(nodes) -> list[str]:
        names = []
        for node in nodes:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute)):
                    name = src.canonical(call.func)
                    if name not in names and isinstance(ctx.lookup(name, filename), torch.nn.Module):
                        names.append(name)
        return names

    again = set(models(owner.body))
    return next((name for name in models(made_by) if name in again), None)


def _untrained_leaves(ctx, candidate: Candidate) -> str | None:
    """How to name the leaves `candidate` was made from, when the recorded optimizers train none
    of them (`Y = X @ true_W` with `true_W.requires_grad=True`: a target, not a model output)."""
    trained = _optimizer_parameters(ctx.steps)
    grad_fn = candidate.binding.value.grad_fn
    if not trained or grad_fn is None:
        return None
    leaves = _leaves_under(grad_fn)
    if not leaves or any(id(leaf) in trained for leaf in leaves):
        return None
    names = {id(b.value): b.expression for b in ctx.bindings()}
    named = [f"`{names[id(leaf)]}`" for leaf in leaves if id(leaf) in names]
    if len(named) == len(leaves) and len(named) <= 3:
        return " and ".join(named)
    return f"{len(leaves)} tensor{'s' if len(leaves) > 1 else ''}"


def _leaves_under(grad_fn) -> list:
    """The leaf tensors (parameters, inputs that require grad) a tensor's history reaches."""
    if grad_fn is None:
        return []
    return [graph.leaf_variable(n) for n in graph.walk([grad_fn]).nodes.values() if graph.is_leaf(n)]


def _parameters_under(grad_fn) -> set[int]:
    return {id(leaf) for leaf in _leaves_under(grad_fn)}


def _optimizer_parameters(steps) -> set[int]:
    ids = set()
    for step in steps:
        ids |= _trained_by(step.optimizer())
    return ids


def _trained_by(optimizer) -> set[int]:
    if optimizer is None:
        return set()
    return {id(p) for group in optimizer.param_groups for p in group["params"]}
