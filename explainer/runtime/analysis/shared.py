"""A graph shared by two backward calls of one pass (BX006): a GAN's `fake`, two heads on one
trunk, an actor's advantage; or the same loss back-propagated twice."""
from __future__ import annotations

import ast
import dataclasses

import torch

from ...fixes import (
    detach_every_read,
    detach_for_first_consumer,
    graph_options,
    own_value,
    recompute_forward,
    remove_statement,
    sum_losses,
)
from ...fixes.edits import node_start, overlapping
from ...model import Finding, Fix
from ...reading import source as src
from ...reading.training import next_in_its_loop
from .. import graph, naming
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, culprit_at, finding, freed_graph
from .locate import Candidate, Located, class_source, source_of_class, step_row_in
from .made_from import live_scope, made_from
from .trained import left_unused, optimizer_parameters, parameters_under, trained_by

# A few more tensors shared the same way (peers' outputs); each costs a walk of its graph.
_MORE_SHARED = 3


def explain_shared(ctx: Context, candidate: Candidate, previous: BackwardCall, failing, source,
            others: list[Candidate] = ()) -> Finding:
    """Used by two backward calls of one iteration: detach it for the update that must not
    train what made it, recompute it after the step, or sum the losses."""
    if candidate.located is None:
        # Bound here only where it cannot be changed (a helper's parameter, its shards): name it
        # where it was made from the value the two graphs share.
        meet = where_they_meet(ctx, candidate, previous)
        if meet is not None:
            candidate.located, candidate.name = meet, meet.target_text
    located, name = candidate.located, candidate.name
    between = ctx.steps_between(previous.tick, ctx.call.tick)
    _, _, previous_stmt = ctx.site_statement(previous.filename, previous.row)
    fixes: list[Fix | None] = []
    advice = "after-step"
    function = src.enclosing_function(failing) if failing is not None else None
    if located is not None:
        fixes.append(_detach_where_not_training(ctx, candidate, previous))
    if located is not None and function is not None and located.scope is located.source.tree \
            and isinstance(located.store, ast.stmt) and located.source is source:
        # A module-level tensor read inside the training function, which makes its own.
        fixes.append(own_value.read_own_value(source, function, located.store, name))
    if located is not None and failing is not None and isinstance(located.store, ast.Assign) \
            and located.source is source:
        fixes.append(own_value.read_unused_value(source, located.scope, located.store, name, failing))
    if located is not None and failing is not None and between:
        last_step = max(between, key=lambda s: s.tick)
        shared = [candidate] + [c for c in others if c.relation == "direct" and c.located is not None
                                and c.located.source is located.source
                                and c.located.scope is located.scope][:_MORE_SHARED]
        detach, first_update = _detach_for_each_update(ctx, shared, previous, between, last_step, failing, source)
        fixes.append(detach)
        if first_update:
            advice = "first-update"
        if step_row_in(located, last_step, None) is not None:
            fixes.append(recompute_forward.recompute_before_use(
                located.source, located.scope, located.store, last_step.row, failing,
                f"Recompute `{name}` after `{ctx.call_site(last_step.filename, last_step.row, last_step.column).code}`"
                f" (line {last_step.row}): the step changed the weights its graph was built with",
                upstream=ctx.made_history))
    elif located is not None and failing is not None and previous_stmt is not None \
            and (changed := _optimizer_call_between(ctx, source, previous_stmt, failing)) is not None:
        fixes.append(recompute_forward.recompute_before_use(
            located.source, located.scope, located.store, changed.lineno, failing,
            f"Recompute `{name}` after `{source.segment(changed).strip()}` (line {changed.lineno}): it "
            f"changed the weights its graph was built with", upstream=ctx.made_history))
    elif located is not None and failing is not None:
        fixes.append(sum_losses.sum_and_backward_once(source, previous_stmt, failing) if previous_stmt is not None
                     else None)
        call = src.call_named(previous_stmt, "backward")
        if call is not None:
            fixes.append(graph_options.add_retain_graph(
                source, call, "Keep the shared graph for the second backward with "
                "`retain_graph=True` on the first one (correct here: no step in between)"))
        advice = "sum-losses"
    return finding("BX006", "run-shared", "second-backward", freed_graph(ctx, name, located, previous, advice),
                   [culprit(ctx, candidate)], fixes, "certain" if located is not None else "likely")


def _detach_where_not_training(ctx: Context, candidate: Candidate, previous: BackwardCall) -> Fix | None:
    """A model in eval mode whose `forward` predicts, in its `else:` of `if self.training:`, from
    tensors its last training pass kept on it (BoTorch's PairwiseGP, fitted, then asked for the
    gradient of its posterior mean): detach every such read there. Offered only where these cuts
    stop this backward from reaching any history older than the last backward; unsafe where a
    detached value also carries this pass's own path to a weight."""
    binding, mark = candidate.binding, previous.mark
    owner = binding.owner
    if not isinstance(owner, torch.nn.Module) or owner.training or not binding.steps \
            or binding.steps[-1][0] != "attr":
        return None
    kept = {name: value for name, value in {**vars(owner), **owner._buffers}.items()
            if isinstance(value, torch.Tensor) and value.grad_fn is not None}
    for cls in type(owner).__mro__:
        if cls.__module__.startswith("torch"):
            break
        source, class_node = source_of_class(cls)
        for method in getattr(class_node, "body", []):
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            reads = [node for stmt in src.outside_training(method) for node in ast.walk(stmt)
                     if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                     and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in kept
                     and not _detached(node)]
            stale = {node.attr for node in reads if _reaches_older(kept[node.attr].grad_fn, mark)}
            if not stale:
                continue
            cut = {id(kept[name].grad_fn) for name in stale}
            if _stale_around(ctx.root_nodes(), cut, mark):
                continue
            for name in sorted(stale):
                # Made this pass from what the others cut (`self.mixed = self.fitted * self.scale`):
                # left whole, it keeps the gradient its own weights get now.
                own = id(kept[name].grad_fn)
                if not _stale_around([kept[name].grad_fn], cut - {own}, mark):
                    stale.discard(name)
                    cut.discard(own)
            fix = detach_every_read.detach_reads_outside_training(
                source, method, [node for node in reads if node.attr in stale])
            current = any(_trains_now(kept[name].grad_fn, mark) for name in stale)
            return fix.unproven() if current else fix
    return None


def _detached(node: ast.expr) -> bool:
    parent = src.parent(node)
    return isinstance(parent, ast.Attribute) and parent.attr == "detach"


def _reaches_older(grad_fn, mark: int) -> bool:
    """Whether the graph below `grad_fn` holds history made before `mark`."""
    return grad_fn._sequence_nr() < mark or bool(graph.stale_boundary(graph.walk([grad_fn], expand=lambda seq: seq >= mark), mark))


def _trains_now(grad_fn, mark: int) -> bool:
    """Whether a weight gets a gradient from `grad_fn` through history made since `mark`."""
    walk = graph.walk([grad_fn], expand=lambda seq: seq >= mark)
    return any(graph.is_leaf(node) and any(walk.seq[c] >= mark for c in walk.consumers[key])
               for key, node in walk.nodes.items())


def _stale_around(roots, cut: set[int], mark: int) -> bool:
    """Whether history made before `mark` is reached from `roots` other than through `cut`."""
    seen, queue = set(), [r for r in roots if r is not None]
    while queue:
        node = queue.pop()
        if id(node) in seen or id(node) in cut:
            continue
        seen.add(id(node))
        seq = graph.sequence(node)
        if seq < mark:
            return True
        if seq != graph.LEAF_SEQ:
            queue.extend(child for child, _ in graph.children(node) if child is not None)
    return False


def where_they_meet(ctx: Context, candidate: Candidate, previous: BackwardCall) -> Located | None:
    """The assignment that both this backward's carrier and the previous call's loss were made
    from, nearest to this backward, followed through the user's functions and the frames that
    passed them down: `memory_bank`, made in a model's `forward` that returned both the decoder's
    output and the classifier's logits, when only that output's shards are bound here."""
    losses = [b for b in ctx.bound_roots(previous) if not b.steps]
    if not losses:
        return None

    def origins(binding):
        scope = live_scope(ctx, binding.frame_index)
        if scope is None:
            return []
        row = ctx.frames[binding.frame_index].f_lineno
        return list(made_from(scope, src.canonical(binding.expression), row, follow=lambda value: True,
                              through_parameters=True))

    def without_history(where, assignment) -> bool:
        # Where the frame still runs its value tells: the batch both losses read is no graph.
        value = where.values.get(src.canonical(assignment.target), None) if where.runs else None
        return where.runs and not (isinstance(value, torch.Tensor) and value.grad_fn is not None)

    theirs = {(id(a.stmt), id(a.target)) for _, a in origins(losses[0])}
    for where, assignment in origins(candidate.binding):
        if (id(assignment.stmt), id(assignment.target)) in theirs and not without_history(where, assignment):
            return Located(where.source, where.node, assignment.stmt, assignment.target,
                           where.source.segment(assignment.target), False)
    return None


def same_tensor_twice(ctx: Context, previous: BackwardCall) -> Finding | None:
    """The same loss back-propagated twice (`loss.backward()` in a helper, then again by its
    caller): the second call is the bug, not the freed graph."""
    source, scope, failing = ctx.failing_statement()
    receiver = src.call_receiver(failing, "backward") if failing is not None else None
    if receiver is None:
        return None
    source, scope, failing, receiver = _callers_call(ctx, source, scope, failing, receiver)
    name = source.segment(receiver)
    # Where the name got the tensor: `loss *= 0` writes into it, it does not make it.
    made = next((a for a in reversed(src.assignments(scope, name)) if a.stmt.lineno < failing.lineno
                 and not isinstance(a.stmt, ast.AugAssign)), None) if isinstance(receiver, ast.Name) else None
    where = node_start(source, made.target if made is not None else failing)
    evidence = dataclasses.replace(freed_graph(ctx, name, None, previous, "twice"),
                                   backward=ctx.call_site(source.filename, failing.lineno))
    fix = remove_statement.remove_call(source, failing, receiver)
    return finding("BX006", "run-twice", "second-backward", evidence, [culprit_at(name, source, where)], [fix])


def _argument_of(function, parameter: str, stmt) -> ast.expr | None:
    """What `stmt`, when it is only a call of `function`, passes for `parameter`."""
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    called = call.func.attr if call is not None and isinstance(call.func, ast.Attribute) \
        else getattr(call.func, "id", None) if call is not None else None
    return src.argument_for(function, call, parameter) if called == function.name else None


def _callers_call(ctx: Context, source, scope, failing, receiver):
    """(source, scope, statement, receiver) of the call that back-propagates the tensor again,
    as the user's code says it: a wrapper's `loss.backward()` on its parameter `loss` (fairseq's
    `optimizer.backward(loss)`) is the caller's call, `optimizer.backward(loss)` with its
    argument, since every other caller of the wrapper needs its body."""
    frames = ctx.frames
    for index in range(len(frames) - 1):
        frame, outer = frames[index], frames[index + 1]
        function = scope if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if function is None or frame.f_code.co_filename != source.filename or not isinstance(receiver, ast.Name) \
                or frame.f_code.co_name != function.name:
            break
        outer_source, outer_scope = ctx.frame_source(outer)
        outer_stmt = src.innermost_statement(outer_scope, outer.f_lineno) if outer_source is not None else None
        argument = _argument_of(function, receiver.id, outer_stmt)
        if argument is None:
            break
        source, scope, failing, receiver = outer_source, outer_scope, outer_stmt, argument
    return source, scope, failing, receiver


def _detach_for_each_update(ctx: Context, shared: list[Candidate], previous, between, last_step, failing, source):
    """Detach each shared tensor where a loss reads it whose optimizer does not train the model
    that produced it: for the update between the two backward calls (a GAN's discriminator on
    `fake`), or for the one after this backward (peers learning from each other's outputs).
    Returns (the fix, whether `shared[0]` is detached for the first update)."""
    stepped = optimizer_parameters(between)
    follower = _step_after(ctx, source, failing)
    follower_trains = trained_by(follower[1]) if follower is not None else set()
    edits, parts, first_update = [], [], False
    for index, candidate in enumerate(shared):
        located, name = candidate.located, candidate.name
        produced_by = parameters_under(candidate.binding.value.grad_fn)
        if not produced_by:
            continue
        if stepped and not (stepped & produced_by):
            fix = detach_for_first_consumer.detach_before(
                located.source, located.scope, name, located.store.end_lineno, previous.row)
            part = f"`{name}` for the `{ctx.call_site(last_step.filename, last_step.row, last_step.column).code}` update"
            first_update = first_update or (fix is not None and index == 0)
        elif follower is not None and not (follower_trains & produced_by):
            fix = detach_for_first_consumer.detach_before(
                located.source, located.scope, name, last_step.row, failing.lineno,
                detach_for_first_consumer.LATER_UPDATE.format(step=f"{follower[0]}.step()", carrier="{carrier}")) \
                or _detach_in_this_loss(ctx, located, name, previous, failing, follower[0], produced_by, source)
            part = f"`{name}` for the `{follower[0]}.step()` update"
        else:
            continue
        if fix is not None and not overlapping(edits, fix.edits):
            edits.extend(fix.edits)
            parts.append((part, fix))
    if not parts:
        return None, False
    if len(parts) == 1:
        return parts[0][1], first_update
    listed = " and ".join(part for part, _ in parts)
    return Fix(f"Detach {listed}: neither optimizer trains the model that produced the tensor "
               f"it is given, so each loss needs it only as a value", tuple(edits)), first_update


def _detach_in_this_loss(ctx: Context, located: Located, name: str, previous, failing, follower: str,
                         produced_by: set[int], source) -> Fix | None:
    """The Stack Overflow GAN: `fake = generator(z)`, `loss_g` and `loss_d` both read it, then
    `loss_g.backward(); optim_g.step()` and `loss_d.backward()` fails in the generator's graph.
    `fake` is detached where the statements that make this loss alone read it (`discriminator(
    fake.detach())`, as the accepted answer has it): the discriminator's gradient is the same,
    and the generator's, which this backward no longer leaves, was zeroed before its next step.
    None where what made it is trained by an optimizer of the loop that does not zero it first."""
    call, before = src.call_named(failing, "backward"), src.call_named(ctx.site_statement(
        previous.filename, previous.row)[2], "backward")
    after = next_in_its_loop(failing)
    if located.source is not source or call is None or before is None or after is None \
            or not isinstance(call.func, ast.Attribute) or not isinstance(before.func, ast.Attribute):
        return None
    if left_unused(ctx, after, source.filename, produced_by, follower) is None:
        return None
    return detach_for_first_consumer.detach_in_own_loss(
        source, located.scope, name, located.store.end_lineno, failing, src.canonical(call.func.value),
        src.canonical(before.func.value),
        detach_for_first_consumer.LATER_UPDATE.format(step=f"{follower}.step()", carrier="{carrier}"))


def _optimizer_call_between(ctx: Context, source, first, failing):
    """A statement between the two backward calls (same block) that calls an optimizer's own
    method, other than `zero_grad()`: SAM's `optimizer.first_step()` moves the weights as a step
    does, though it is not `step()`, so summing the losses or retaining the graph would be wrong."""
    body = src.enclosing_block(failing)
    position = {id(s): i for i, s in enumerate(body)}
    if id(first) not in position or id(failing) not in position:
        return None
    between = body[position[id(first)] + 1:position[id(failing)]]
    for stmt in between:
        for node in ast.walk(stmt):
            func = node.func if isinstance(node, ast.Call) else None
            if not isinstance(func, ast.Attribute) or func.attr in ("zero_grad", "state_dict"):
                continue
            if hasattr(ctx.lookup(src.canonical(func.value), source.filename), "param_groups"):
                return stmt
    return None


def _step_after(ctx: Context, source, failing) -> tuple[str, object] | None:
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


def shared_by_a_loop(ctx: Context, previous: BackwardCall, current, mark: int) -> Finding | None:
    """`for loss in model.loss(outputs): loss.backward()`: the losses of one forward, each
    back-propagated in turn, share the part of the graph before the heads, which the first
    backward frees. That part was made inside the model's forward: named from its returns."""
    source, scope, failing = ctx.failing_statement()
    if failing is None or (previous.filename, previous.row) != (ctx.call.filename, ctx.call.row):
        return None
    loop = src.loops_around(failing)[0] if src.loops_around(failing) else None
    fix = sum_losses.sum_the_loop(source, loop, failing) if loop is not None else None
    if fix is None:
        return None
    named = _named_in_forward(ctx, current, mark)
    if named is None:
        return None
    located, name = named
    evidence = freed_graph(ctx, name, located, previous, "sum-losses", repeat="pass")
    return finding("BX006", "run-shared", "second-backward", evidence,
                   [culprit_at(name, located.source, located.location)], [fix])


def _named_in_forward(ctx: Context, current, mark: int):
    """(where, name) of what a module's outputs share, made in its forward: the head outputs
    bound in the frames (`self.state.outputs[1]`) were made before the first backward by
    `model(batch)`, and the forward's return reads one name in all of them (`features`)."""
    for binding in ctx.bindings():
        grad_fn = binding.value.grad_fn
        if grad_fn is None or id(grad_fn) not in current.nodes or current.seq[id(grad_fn)] >= mark \
                or not binding.steps or binding.steps[-1][0] != "item":
            continue
        container = naming.Binding(binding.frame_index, binding.base, binding.steps[:-1], None, None)
        frame = ctx.frames[binding.frame_index]
        source, scope = ctx.frame_source(frame)
        made = src.assignments(scope, container.expression) if source is not None else []
        call = made[-1].value if made else None
        model = ctx.lookup(src.canonical(call.func), source.filename) if isinstance(call, ast.Call) else None
        if not isinstance(model, torch.nn.Module):
            continue
        model_source, class_node = class_source(model)
        forward = next((m for m in getattr(class_node, "body", []) if isinstance(m, ast.FunctionDef)
                        and m.name == "forward"), None)
        returns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None] \
            if forward is not None else []
        if len(returns) != 1 or not isinstance(returns[0], ast.Tuple):
            continue
        read = [src.names_read(element) - {"self"} for element in returns[0].elts]
        common = set.intersection(*read) if read else set()
        for name in sorted(common):
            assignment = src.last_assignment(forward, name, returns[0].lineno + 1)
            if assignment is not None:
                return Located(model_source, forward, assignment.stmt, assignment.target, name, False), name
    return None
