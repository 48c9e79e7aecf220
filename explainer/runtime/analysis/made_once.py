"""A tensor with history made once and back-propagated again and again (BX004): in `__init__`,
before the loop or the closure that repeats the backward, or a list filled before the loop
whose every pass reads it (deep mutual learning)."""
from __future__ import annotations

import ast

import torch

from ...fixes import (
    constant_data,
    detach_carried,
    detach_every_read,
    detach_peer_reads,
    move_into_loop,
    own_value,
    rerun_forward,
)
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import ancestors
from ...reading.training import helper_called
from .. import graph
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, culprit_at, finding, freed_graph
from .locate import Candidate, Located
from .origin import named_where_made
from .trained import every_optimizer_parameter, leaves_under


def explain_made_once(ctx: Context, candidate: Candidate, previous: BackwardCall, failing, source) -> Finding | None:
    """The finding when the candidate was made once, in `__init__` or before the loop or
    closure that repeats the failing backward; else None."""
    located, name = candidate.located, candidate.name
    if located is not None and located.in_init and located.class_node is not None \
            and isinstance(candidate.binding.owner, torch.nn.Module):
        # Made from weights no optimizer trains (`latent_avg` from a frozen decoder): a constant,
        # which recomputing in each forward would only make slower (and, drawn at random, different).
        untrained = _untrained_leaves(ctx, candidate)
        fixes = [constant_data.parameter_outside(located.source, located.store, name),
                 constant_data.detach_data(located.source, located.store, name, untrained)] if untrained else []
        fixes.append(move_into_loop.inline_attribute(located.source, located.class_node, located.store,
                                                     located.target_text))
        return finding("BX004", "run-init", "second-backward", freed_graph(ctx, name, located, previous, "grows"),
                       [culprit(ctx, candidate)], fixes)
    owner = repeating_owner(ctx, located, failing, source)
    if owner is None:
        return None
    partly = _partly_detached(ctx, candidate, previous, failing, source)
    if partly is not None:
        return partly
    # Only a tensor reached as itself can be detached where it is made: not one found inside a
    # dict or list that the statement stores.
    whole = not any(kind == "item" for kind, _ in candidate.binding.steps)
    if not whole:
        made = _made_untrained_elsewhere(ctx, candidate, previous)
        if made is not None:
            return made
    untrained = _untrained_leaves(ctx, candidate) if whole else None
    model = None if untrained or not whole else _called_again_in(ctx, located, owner)
    fixes = []
    function = src.enclosing_function(failing)
    if function is not None and located.source is source and isinstance(located.store, ast.stmt):
        # The failing function scores it afresh itself (`pred_fake = self.netD(fake_AB)`).
        fixes.append(own_value.read_own_value(source, function, located.store, name))
    if untrained:
        fixes.append(constant_data.detach_data(located.source, located.store, name, untrained))
    if model is not None:
        # Recomputing it in the loop would make it equal to the fresh output (PPO's ratio 1). Not
        # where the loss has no other way to the weights (ark-nlp's PGD recomputes its loss from
        # `outputs` alone): detached, there would be nothing to back-propagate.
        if graph.trains_without(ctx.root_nodes(), getattr(candidate.binding.value, "grad_fn", None)):
            fixes.append(constant_data.detach_snapshot(located.source, located.store, name, model))
    else:
        fixes.append(move_into_loop.move_into_body(located.source, located.store, owner, name))
        fixes.append(_rerun_elsewhere(ctx, candidate, owner))
    return finding("BX004", "run-before", "second-backward", freed_graph(ctx, name, located, previous, "grows",
                                                                         owner=move_into_loop.repeater(owner)),
                   [culprit(ctx, candidate)], fixes)


def _rerun_elsewhere(ctx: Context, candidate: Candidate, owner: ast.AST):
    """Made by one method of the object (`gen_batch`) and back-propagated by another (`owner`,
    `train_embedder`) that the caller runs after a backward freed it: run the forward again, in
    a method of its own, before the caller's call of `owner`."""
    located = candidate.located
    maker = located.scope
    if located.class_node is None or not isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            or not isinstance(maker, ast.FunctionDef) or maker is owner \
            or src.parent(maker) is not located.class_node or src.parent(owner) is not located.class_node:
        return None
    index = next((i for i, frame in enumerate(ctx.frames) if frame.f_code.co_name == owner.name
                  and frame.f_code.co_filename == located.source.filename), None)
    if index is None or index + 1 >= len(ctx.frames):
        return None
    caller_source, caller_scope = ctx.frame_source(ctx.frames[index + 1])
    if caller_source is None:
        return None
    caller = src.statement_at(caller_scope, ctx.frames[index + 1].f_lineno)
    call = next((c for c in ast.walk(caller) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and c.func.attr == owner.name), None) if caller is not None else None
    first = next((s for s in maker.body if s.lineno <= located.store.lineno and ctx.made_history(s)), None)
    if call is None or first is None:
        return None
    return rerun_forward.rerun_forward(located.source, maker, first, caller_source, caller,
                                       caller_source.segment(call.func.value), owner.name,
                                       not _drops_out(candidate.binding.owner))


def _drops_out(owner: object) -> bool:
    """Whether a module the object holds applies dropout in training mode: its forward, run
    again, would not give the values the first run gave."""
    modules = [v for v in getattr(owner, "__dict__", {}).values() if isinstance(v, torch.nn.Module)]
    if isinstance(owner, torch.nn.Module):
        modules.append(owner)
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0
               for module in modules for m in module.modules())


def _partly_detached(ctx: Context, candidate: Candidate, previous: BackwardCall, failing, source) -> Finding | None:
    """`fake_AB = torch.cat((real_A, self.fake_B), 1)` in the failing function, read as
    `fake_AB.detach()` by one term of the loss and plainly by another (a gradient penalty): the
    plain read goes back into the graph made once, and the user's own detach says it should not."""
    function = src.enclosing_function(failing)
    located = candidate.located
    if function is None or located is None or located.source.filename != source.filename:
        return None
    made = src.canonical(located.target_text)
    frame = ctx.frames[0]
    for stmt in src.own_nodes(function):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and stmt.lineno < failing.lineno and src.reads(stmt.value, made)):
            continue
        name = stmt.targets[0].id
        value = frame.f_locals.get(name)
        detached, plain = detach_every_read.reads(function, name)
        if not detached or not plain or not isinstance(value, torch.Tensor) or value.grad_fn is None:
            continue
        here = Located(source, function, stmt, stmt.targets[0], name, False)
        evidence = freed_graph(ctx, name, here, previous, "grows",
                               made=located.target_text, detached_row=detached[0].lineno,
                               plain_rows=", ".join(str(n.lineno) for n in plain))
        return finding("BX004", "run-partly-detached", "second-backward", evidence,
                       [culprit_at(name, source, here.location)],
                       [detach_every_read.detach_the_other_reads(source, name, plain, detached[0])])
    return None


def _made_untrained_elsewhere(ctx: Context, candidate: Candidate, previous: BackwardCall) -> Finding | None:
    """A value kept in a dict (`tf.feat_dict["embedding"]`), made once by a module no optimizer
    trains (a text embedder run when the dataset is built): name it where the user's code first
    named that module's output (`emb = self.text_embedder(texts)`) and make it data there."""
    untrained = _untrained_leaves(ctx, candidate)
    leaves = leaves_under(candidate.binding.value.grad_fn)
    if not untrained or not leaves:
        return None
    found = named_where_made(ctx, leaves[0])
    if found is None:
        return None
    located, parameter = found
    name = located.target_text
    if len(leaves) == 1:
        untrained = f"`{parameter}`"
    fix = constant_data.detach_data(located.source, located.store, name, untrained)
    return finding("BX004", "run-before", "second-backward", freed_graph(ctx, name, located, previous, "grows",
                                                                         owner="loop"),
                   [culprit_at(name, located.source, located.location)], [fix])


def loop_past_the_fill(located: Located | None, failing, source) -> ast.stmt | None:
    """The innermost loop around the failing backward, when the container was filled (in the
    same file) outside it."""
    loops = src.loops_around(failing) if failing is not None else []
    if located is None or not loops or located.source.filename != source.filename \
            or src.inside(located.store, loops[0]) or located.class_node is not None:
        return None  # (a module's method stores on every call, wherever it is written)
    storing = src.enclosing_function(located.store)
    if storing is not None and any(isinstance(node, ast.Call) and helper_called(node, node) is storing
                                   for node in ast.walk(loops[0])):
        return None  # filled by a helper the loop calls (`self._cells_forward_(x, states)`)
    return loops[0]


def filled_before_the_loop(ctx: Context, candidate: Candidate, previous: BackwardCall, loop: ast.stmt, failing,
                           source) -> Finding:
    """Mutual learning: `outputs` is filled once, then each pass of the loop trains one model on
    all of them. Emptying it would break the next pass; the peers' items need detaching."""
    located, name = candidate.located, candidate.name
    between = ctx.steps_between(previous.tick, ctx.call.tick)
    own = detach_peer_reads.own_index(failing, loop)
    fix = detach_peer_reads.detach_peer_items(source, loop, name, own, failing.lineno) if own is not None else None
    if fix is None and located is not None and isinstance(located.store, ast.Call) and _untrained_leaves(ctx, candidate):
        # Targets made from weights no optimizer trains (torch-dreams' static layer outputs of
        # the input image): stored detached, every pass still compares with the same values.
        fix = detach_carried.detach_stored_value(located.source, located.store, name, False)
    evidence = freed_graph(ctx, name, located, previous, "after-step" if between else "grows", loop_row=loop.lineno,
                           repeat="pass")
    return finding("BX004", "run-filled", "second-backward", evidence, [culprit(ctx, candidate)], [fix],
                   "certain" if located is not None else "likely")


def repeating_owner(ctx: Context, located: Located | None, failing, source) -> ast.AST | None:
    """The loop or closure that repeats the failing backward while `located` is outside it."""
    if located is None or failing is None or source is None or located.source.filename != source.filename:
        return None
    store = located.store
    for ancestor in src.ancestors(failing):
        if isinstance(ancestor, (ast.For, ast.AsyncFor, ast.While)):
            if not (ancestor.lineno <= store.lineno <= ancestor.end_lineno) and store.lineno < ancestor.lineno:
                return ancestor
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if store.lineno < ancestor.lineno and located.scope is not ancestor \
                    and not _handed_in(located, ancestor):
                return ancestor
            if located.scope is not ancestor and _made_before_the_call(ctx, located):
                return next((loop for loop in src.ancestors(failing) if src.inside(loop, ancestor)
                             and isinstance(loop, (ast.For, ast.AsyncFor, ast.While))), None)
            break
    return None


def _made_before_the_call(ctx: Context, located: Located) -> bool:
    """Whether `located` was made in a frame that still runs, a caller of the failing function,
    before the line that frame runs now: the devgem post's `X_train_encoded`, made at the top
    of the script after `train` was defined, then handed to `train(...)`, whose loop
    back-propagates a slice of it at every batch. Made once before the loop, though the
    function comes first in the file."""
    store = located.store
    if not isinstance(store, ast.stmt):
        return False
    for frame in ctx.frames[1:]:
        source, scope = ctx.frame_source(frame) if frame.f_lineno > store.end_lineno else (None, None)
        if source is located.source and scope is located.scope:
            return True
    return False


def _handed_in(located: Located, function: ast.AST) -> bool:
    """Made by another function, outside the scopes that enclose `function`, on an object other
    than `self`: a value its caller handed in (Pearl's `batch.state`, set by `preprocess_batch`
    for each batch, then passed to `_actor_learn_batch`), made afresh as often as its caller
    calls, not once before it."""
    return isinstance(located.scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
        and not located.target_text.startswith("self.") \
        and not any(scope is located.scope for scope in src.ancestors(function))


def _called_again_in(ctx: Context, located: Located, owner: ast.AST) -> str | None:
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


def _untrained_leaves(ctx: Context, candidate: Candidate) -> str | None:
    """How to name the leaves `candidate` was made from, when the recorded optimizers train none
    of them (`Y = X @ true_W` with `true_W.requires_grad=True`: a target, not a model output)."""
    trained = every_optimizer_parameter(ctx.steps, ctx.frames)
    grad_fn = candidate.binding.value.grad_fn
    if not trained or grad_fn is None:
        return None
    leaves = leaves_under(grad_fn)
    if not leaves or any(id(leaf) in trained for leaf in leaves):
        return None
    names = {id(b.value): b.expression for b in ctx.bindings()}
    named = [f"`{names[id(leaf)]}`" for leaf in leaves if id(leaf) in names]
    if len(named) == len(leaves) and len(named) <= 3:
        return " and ".join(named)
    return f"{len(leaves)} tensor{'s' if len(leaves) > 1 else ''}"
