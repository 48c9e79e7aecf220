"""Where the tensors bound in the user's frames were made, and which of them carries the stale
history into the failing backward (best first)."""
from __future__ import annotations

import ast
from dataclasses import dataclass

import torch

from ...model import Location
from ...reading import source as src
from ...reading.dataflow import ancestors
from ...reading.training import cuts_history, helper_called, reset_before
from .. import graph, naming
from .context import Context
from .keyed import appended_under_key


@dataclass
class Located:
    """The statement that made a binding's current value, as the user wrote it."""

    source: src.Source
    scope: ast.AST
    store: ast.AST  # an assignment statement or a `container.append(...)` call
    target: ast.AST  # the assigned expression (or the append call): where the culprit points
    target_text: str
    carried: bool
    in_init: bool = False
    class_node: ast.ClassDef | None = None

    @property
    def row(self) -> int:
        return self.store.lineno

    @property
    def location(self) -> Location:
        return Location(self.target.lineno, self.source.column(self.target.lineno, self.target.col_offset))

    @property
    def assignment(self) -> src.Assignment:
        return src.Assignment(self.store, self.target)


@dataclass
class Candidate:
    binding: naming.Binding
    relation: str  # "direct" | "stored" | "carried"
    located: Located | None = None
    name: str = ""
    # Its value is part of the failing backward's graph, updated more than once since the last
    # backward: cutting it where it is made would cut this pass's gradients too.
    used_now: bool = False
    # The user's call, in the loop around the backward, that stored it on an object of theirs
    # (`replay_buffer.add(samples)`, which extends `self.log_probs` two methods down).
    via: Located | None = None
    kept: str = ""  # how `via`'s object reaches the state: `replay_buffer.training_objects.log_probs`


def locate(ctx: Context, binding: naming.Binding, before_row: int | None = None,
           from_last_iteration: bool = False) -> Located | None:
    """The statement that made `binding`'s value: preferably one before `before_row`, or,
    `from_last_iteration`, anywhere in the loop around the backward (the value was made in the
    previous pass, possibly after the backward's line: `h = out` at the loop's end)."""
    frame = ctx.frames[binding.frame_index]
    source, scope = ctx.frame_source(frame)
    if source is None:
        return None
    if binding.in_sequence:
        container = binding.container_expression
        items = src.item_assignments(scope, container)
        if items:  # `states[i] = cell(x, states[i])`: the element is what is re-assigned
            return _pick(ctx, source, scope, items, src.canonical(items[-1].target), before_row, from_last_iteration)
        whole = src.assignments(scope, container)
        if whole and not src.appends(scope, container):
            return _pick(ctx, source, scope, whole, container, before_row, from_last_iteration)
        stored = _locate_stored(ctx, binding, source, scope)
        attribute = _container_attribute(binding)
        if stored is None and attribute is not None and binding.owner is not None:
            # `model.hidden[0]`: an LSTM's (h, c) kept on the module, set in its forward.
            return _locate_attribute(binding.owner, attribute, items=_items_with_history(ctx, binding))
        return stored or _filed_under_key(frame, source, binding)
    expression = binding.expression
    assigned = src.assignments(scope, expression)
    if assigned and all(_cuts(a) for a in assigned) and getattr(binding.value, "grad_fn", None) is not None:
        # Every assignment here cuts what the value still has: a helper handed its holder set it.
        found = _set_by_a_helper(ctx, binding, all_cut=True)
        if found is not None:
            return found
    written = _written_by_index(binding, scope)
    if written:
        # cleanrl's PPO: `values = torch.zeros(n)`, then `values[step] = vf.forward(obs)` for each
        # step of the rollout. The graph the tensor holds was written into it by index.
        best = _pick(ctx, source, scope, written, src.canonical(written[-1].target), before_row, from_last_iteration)
        return Located(source, scope, best.store, best.target, expression, False)
    found = _pick(ctx, source, scope, _could_have_made(binding, src.assignments(scope, expression)), expression,
                  before_row, from_last_iteration)
    if found is None and scope is not source.tree:
        found = _pick(ctx, source, source.tree, _could_have_made(binding, src.assignments(source.tree, expression)),
                      expression, None)
    in_class = src.enclosing_class(scope) if expression.startswith("self.") else None
    if found is None and in_class is not None:
        # `self.net.latent_avg = decoder.mean_latent(n)` in `Coach.__init__`, read by a method of
        # Coach's: the class of the running method made it, not the class of its holder.
        made = _made_in(in_class, expression)
        found = _best_in_class(source, in_class, expression, made) if made else None
    if found is None and binding.steps and binding.steps[-1][0] == "attr" and binding.owner is not None:
        found = _locate_attribute(binding.owner, binding.steps[-1][1])
        if found is not None and found.in_init:
            found = _built_by_its_holder(ctx, binding) or found
    if found is None:
        found = _set_by_a_helper(ctx, binding)
    key = binding.steps[-1][1] if binding.steps and binding.steps[-1][0] == "item" else None
    if found is None and isinstance(key, str):
        # `total_loss[loss_name] += loss_val * batch_size` (YOLO's epoch totals): a dict filled
        # under the key its loop gives, by one statement.
        container = naming.Binding(binding.frame_index, binding.base, binding.steps[:-1], None, None).expression
        items = src.item_assignments(scope, container)
        if len({id(a.stmt) for a in items}) == 1:
            found = _pick(ctx, source, scope, items, src.canonical(items[0].target), before_row, from_last_iteration)
    if found is None and isinstance(key, str) and key.isidentifier() and binding.owner is not None:
        # `model[3]._memories['v']`, kept by a module whose `__setattr__` files `self.v = ...`
        # under its name (spikingjelly's MemoryModule): the class's own `self.v`.
        found = _locate_attribute(binding.owner, key, must_assign=True)
    attribute = _container_attribute(binding)
    if found is None and attribute is not None and binding.owner is not None:
        found = _locate_attribute(binding.owner, attribute)  # `self.cache[key] = feat`
    if found is None and binding.steps and all(kind == "item" for kind, _ in binding.steps):
        # titans-pytorch's `NeuralMemState`, a tuple of dicts of tensors: no statement writes the
        # item, and `logits, mem_state = model(x, mem_state)` hands the whole state back each step.
        carried = [a for a in src.assignments(scope, binding.base) if self_referencing(a, binding.base)]
        found = _pick(ctx, source, scope, carried, binding.base, before_row, from_last_iteration)
    return found


def _set_by_a_helper(ctx: Context, binding: naming.Binding, all_cut: bool = False) -> Located | None:
    """`batch.state`, read where `batch` was passed in, set by a function of the file that a
    caller handed the same object to before the call that is running now: Pearl's `learn` runs
    `batch = self.preprocess_batch(batch)`, whose `batch.state = self._history_summarization_module(
    batch.state)` made the graph both the critic's and the actor's backward run through. The
    nearest such call, frame by frame outward; None where no caller hands it to such a function.
    Where the frame's own assignments all cut the history the value has (`all_cut`: DVRL's
    `current_memory['states'] = current_memory['states'].detach()`), the frame's own earlier
    calls are searched first (`run_model(current_memory=current_memory)`, which sets it)."""
    frame = ctx.frames[binding.frame_index]
    if not binding.steps or any(kind != "attr" and not isinstance(key, str) for kind, key in binding.steps) \
            or binding.base in ("self", "cls"):
        return None
    own_frame_too = not naming.is_argument(frame, binding.base)
    if own_frame_too and not all_cut:
        return None
    holder = frame.f_locals.get(binding.base)
    if holder is None:
        return None
    first = binding.frame_index if own_frame_too else binding.frame_index + 1
    for index in range(first, len(ctx.frames)):
        outer = ctx.frames[index]
        source, scope = ctx.frame_source(outer)
        names = {name for name, value in list(outer.f_locals.items()) if value is holder}
        if source is None or not names:
            continue
        calls = sorted((node for node in src.own_nodes(scope) if isinstance(node, ast.Call)
                        and node.lineno < outer.f_lineno), key=lambda node: (node.lineno, node.col_offset))
        for call in reversed(calls):
            helper = helper_called(call, scope)
            for parameter in sorted(src.parameter_names(helper)) if helper is not None else ():
                argument = src.argument_for(helper, call, parameter)
                set_there = src.assignments(helper, naming.Binding(index, parameter, binding.steps, None, None).expression)
                if isinstance(argument, ast.Name) and argument.id in names and set_there:
                    store = set_there[-1]
                    # Made from what the helper read of the same holder first (DVRL's
                    # `actor_critic(current_memory=current_memory)`), the frame's own holder
                    # carries it from one call to the next.
                    carried = own_frame_too and any(src.reads(stmt, parameter) for stmt in helper.body
                                                    if stmt.lineno < store.stmt.lineno)
                    return Located(source, helper, store.stmt, store.target, source.segment(store.target), carried)
        if not any(naming.is_argument(outer, name) for name in names):
            return None  # made here, under a name of this frame's: no caller handed it down
    return None


_NO_GRAPH = ("detach", "item", "tolist", "numpy")


def _written_by_index(binding: naming.Binding, scope: ast.AST) -> list[src.Assignment]:
    """The assignments into an element of the tensor bound (`values[step] = ...`), where its
    graph ends in what they wrote (`CopySlices`) and no assignment of the whole gave it a graph."""
    grad_fn = getattr(binding.value, "grad_fn", None)
    if type(grad_fn).__name__ != "CopySlices":
        return []
    whole = src.assignments(scope, binding.expression)
    if any(a.value is None or not cuts_history(a.value) for a in whole):
        return []
    return src.item_assignments(scope, binding.expression)


def _could_have_made(binding: naming.Binding, found: list[src.Assignment]) -> list[src.Assignment]:
    """The assignments that could have made the value bound now: where it has a graph, not one
    that cuts it (3FabRec's `if not train_encoder: z_sample = z_sample.detach()`, a branch that
    did not run), unless every assignment does."""
    if getattr(binding.value, "grad_fn", None) is None:
        return found

    return [a for a in found if not _cuts(a)] or found


def _cuts(assignment: src.Assignment) -> bool:
    """`x = x.detach()`, `x = y.data`: the value assigned has no graph."""
    value = src.value_of(assignment.stmt)
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _NO_GRAPH \
        or isinstance(value, ast.Attribute) and value.attr == "data"


def _pick(ctx, source, scope, found, expression, before_row, from_last_iteration=False) -> Located | None:
    if not found:
        return None
    loops = ctx.backward_loops(source, scope)

    def score(assignment: src.Assignment):
        stmt = assignment.stmt
        # The loops around the backward that hold it too: brax's `total_loss += loss` in the
        # minibatch loop, not the `total_loss = total_loss / n` after the epochs.
        shared = sum(loop.lineno <= stmt.lineno <= loop.end_lineno for loop in loops)
        before = before_row is None or stmt.lineno <= before_row or (from_last_iteration and shared > 0)
        return (before, self_referencing(assignment, expression), shared, stmt.lineno)

    best = max(found, key=score)
    return Located(source, scope, best.stmt, best.target, source.segment(best.target), _carried(best, expression))


def _carried(assignment: src.Assignment, expression: str) -> bool:
    """Re-assigned from itself, or read earlier in the loop body that re-assigns it, before
    anything there gives it this pass's value (`logits = model(x)`, read, then `logits = ...`
    again under no_grad reads nothing of the last pass)."""
    if self_referencing(assignment, expression):
        return True
    for loop in src.loops_around(assignment.stmt):
        for stmt in loop.body:
            if stmt.lineno >= assignment.stmt.lineno or src.inside(assignment.stmt, stmt):
                break  # an inner loop holding the assignment reads it after, not before
            if src.reads(stmt, expression):
                return True
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) \
                    and any(src.canonical(t) == src.canonical(expression) for t in src.targets_of(stmt)):
                break  # given this pass's value before any read (a branch's assignment may not run)
    return False


def _locate_attribute(owner, attribute: str, must_assign: bool = False,
                      items: frozenset[int] = frozenset()) -> Located | None:
    """Where `owner`'s class assigns `self.<attribute>` (preferably from itself, outside
    `__init__`); where it assigns none, where it stores it by name, unless `must_assign`.
    `items`: the indices of the attribute's list whose values hold history, where one of them
    is what is looked for."""
    source, class_node = class_source(owner)
    if class_node is None:
        return None
    expression = f"self.{attribute}"
    found = _covering(_made_in(class_node, expression), items)
    if all(cuts_history(a.value) for a in found if a.value is not None):
        # `self.v = self.v.detach()` carries nothing: the state is made where a base class
        # assigns it (spikingjelly's OTTTLIFNode cuts `v`, LIFNode's `neuronal_reset` makes it).
        inherited = _assigned_by_a_base(owner, expression)
        if inherited is not None:
            source, class_node, found = inherited
    if not found:
        return None if must_assign else \
            _written_in_place(source, class_node, expression) or _stored_by_name(source, class_node, attribute)
    return _best_in_class(source, class_node, expression, found)


def _built_by_its_holder(ctx, binding: naming.Binding) -> Located | None:
    """torch-pme's `self._MI = MeshInterpolator(cell, ns, ...)` in `PMEPotential._compute_lr`:
    the tensor (`inverse_cell`) is made in the `__init__` of a plain object of the user's, which
    the object holding it builds anew, outside its own `__init__`. That statement made it; the
    object is named as the holder's class writes it."""
    steps = binding.steps
    if len(steps) < 2 or steps[-2][0] != "attr" or isinstance(binding.owner, torch.nn.Module):
        return None
    holder = ctx.reach(binding, steps[:-2])
    source, class_node = class_source(holder) if holder is not None else (None, None)
    if class_node is None:
        return None
    built = [a for a in _made_in(class_node, f"self.{steps[-2][1]}") if isinstance(a.value, ast.Call)
             and isinstance(a.value.func, (ast.Name, ast.Attribute))
             and src.canonical(a.value.func).split(".")[-1] == type(binding.owner).__name__
             and getattr(src.enclosing_function(a.stmt), "name", "") != "__init__"]
    if len(built) != 1:
        return None
    store = built[0]
    return Located(source, src.enclosing_function(store.stmt), store.stmt, store.target, source.segment(store.target),
                   False, class_node=class_node)


def _written_in_place(source, class_node: ast.ClassDef, expression: str) -> Located | None:
    """nflows' BatchNorm registers `running_mean` in `__init__` and, in its forward, writes it in
    place with what the batch made: `self.running_mean.mul_(1 - m).add_(mean * m)`. The write,
    outside `__init__`, is where its graph comes from."""
    for node in ast.walk(class_node):
        receiver = _in_place_receiver(node.value) if isinstance(node, ast.Expr) else None
        method = src.enclosing_function(node)
        if receiver is not None and src.canonical(receiver) == expression and getattr(method, "name", "") != "__init__":
            return Located(source, method or class_node, node, receiver, source.segment(receiver), True,
                           class_node=class_node)
    return None


def _in_place_receiver(expression: ast.expr) -> ast.expr | None:
    """`self.running_mean` in `self.running_mean.mul_(a).add_(b)`: the tensor a chain of in-place
    methods writes (`x.data.add_(b)` writes `x.data`, which has no graph)."""
    if not (isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute)):
        return None
    method = expression.func.attr
    if not method.endswith("_") or method.startswith("_"):
        return None
    inner = expression.func.value
    return _in_place_receiver(inner) if isinstance(inner, ast.Call) else inner


def _items_with_history(ctx: Context, binding: naming.Binding) -> frozenset[int]:
    """The indices of the list `binding` is an item of whose values hold history."""
    container = ctx.reach(binding, binding.steps[:-1]) if binding.steps and binding.steps[-1][0] == "item" else None
    if not isinstance(container, (list, tuple)) or len(container) > naming.MAX_ITEMS:
        return frozenset()
    return frozenset(i for i, value in enumerate(container) if getattr(value, "grad_fn", None) is not None)


def _covering(found: list[src.Assignment], items: frozenset[int]) -> list[src.Assignment]:
    """Of `found`, the assignments that can have made every one of `items` (two or more): SpareNet's meter
    keeps a loss in each item of `self._sum`, which `self._sum[idx] += v` fills in its loop; the
    `self._sum[0] += values` of the `else:` beside it can only have made the first. All of
    `found` where none can."""
    def index(assignment) -> int | None:
        target = assignment.target
        if not isinstance(target, ast.Subscript):
            return None
        key = target.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, int) else None

    covering = [a for a in found if index(a) is None] if len(items) > 1 else []
    return covering or found


def _made_in(class_node: ast.ClassDef, expression: str) -> list[src.Assignment]:
    """The assignments in `class_node`'s methods that can give `expression` a tensor: not
    `self.latent_avg = None`, which only declares it."""
    found = src.assignments(class_node, expression, deep=True) + src.item_assignments(class_node, expression, deep=True)
    return [a for a in found if not isinstance(a.value, ast.Constant)]


def _best_in_class(source, class_node: ast.ClassDef, expression: str, found: list[src.Assignment]) -> Located:
    """Of the assignments to `expression` in `class_node`, the one that carries it (made from
    its old value) or else the last outside `__init__`."""
    def carried(assignment) -> bool:
        method = src.enclosing_function(assignment.stmt)
        if from_old_value(assignment, src.canonical(assignment.target), method or class_node):
            return True
        # `self.cache[key] = feat` after `feat = feat + self.cache[key]`: read, then replaced.
        return isinstance(assignment.target, ast.Subscript) and method is not None and any(
            read.lineno < assignment.stmt.lineno for read in src.reads(method, expression))

    def score(assignment):
        method = src.enclosing_function(assignment.stmt)
        return (carried(assignment), getattr(method, "name", "") != "__init__", assignment.stmt.lineno)

    best = max(found, key=score)
    method = src.enclosing_function(best.stmt)
    return Located(source, method or class_node, best.stmt, best.target, source.segment(best.target),
                   carried(best), in_init=getattr(method, "name", "") == "__init__", class_node=class_node)


def _assigned_by_a_base(owner, expression: str):
    """(source, class, assignments) of the nearest base class of `owner`'s that assigns
    `expression` other than by cutting it."""
    for base in type(owner).__mro__[1:]:
        if base.__module__.startswith("torch"):
            return None
        source, class_node = source_of_class(base)
        if class_node is None:
            continue
        found = src.assignments(class_node, expression, deep=True)
        if any(a.value is not None and not cuts_history(a.value) for a in found):
            return source, class_node, found
    return None


def _stored_by_name(source, class_node: ast.ClassDef, attribute: str) -> Located | None:
    """`self.register_buffer("cached", freqs)`, `setattr(self, "cached", freqs)` or a helper of
    the same shape (`self.tmp_store("cached_freqs", freqs)`): the attribute is named by a string
    and its value is the call's last argument, which is what the culprit points at."""
    for node in ast.walk(class_node):
        if isinstance(node, ast.Call) and len(node.args) >= 2 \
                and any(isinstance(a, ast.Constant) and a.value == attribute for a in node.args[:-1]) \
                and not (isinstance(node.args[-1], ast.Constant) and node.args[-1].value is None):
            helper = helper_called(node, node) if src.canonical(node.func).startswith("self.") else None
            if helper is not None:
                found = _stored_by_helper(source, class_node, helper, node, attribute)
                if found is not None:
                    return found
                continue
            value = node.args[-1]
            method = src.enclosing_function(node)
            return Located(source, method or class_node, node, value, source.segment(value), True,
                           class_node=class_node)
    return None


def _stored_by_helper(source, class_node: ast.ClassDef, helper: ast.AST, call: ast.Call, attribute: str):
    """Where a method of the class, called with the attribute's name (`self.update_with_decay(
    'batch_mean', data.mean(...), decay)`, vector-quantize-pytorch), stores under the parameter
    that name is passed as (`self.register_buffer(buffer_name, value)`): the value it stores,
    made in the method (`value = old_value * decay + ...`, the last such store), or, where it
    stores a parameter as given (`tmp_store(key, value)`), the caller's argument for it. None
    where it stores nothing under that parameter: the name is passed for something else."""
    index = next(i for i, a in enumerate(call.args) if isinstance(a, ast.Constant) and a.value == attribute)
    parameters = [a.arg for a in helper.args.posonlyargs + helper.args.args][1:]
    if index >= len(parameters):
        return None
    name = parameters[index]
    stores = [node for node in src.own_nodes(helper) if isinstance(node, ast.Call) and len(node.args) >= 2
              and src.canonical(node.func) in ("self.register_buffer", "setattr", "self.__setattr__")
              and isinstance(node.args[-2], ast.Name) and node.args[-2].id == name]
    if not stores:
        return None
    store = max(stores, key=lambda node: (node.lineno, node.col_offset))
    value = store.args[-1]
    if isinstance(value, ast.Name) and value.id in parameters:
        argument = src.argument_for(helper, call, value.id)
        method = src.enclosing_function(call)
        return Located(source, method or class_node, call, argument, source.segment(argument), True,
                       class_node=class_node) if argument is not None else None
    made = src.last_assignment(helper, value.id, store.lineno) if isinstance(value, ast.Name) else None
    target = made.target if made is not None else value
    return Located(source, helper, store, target, source.segment(target), True, class_node=class_node)


def _locate_stored(ctx: Context, binding, source, scope) -> Located | None:
    """The append that filled the list: the last one, or, for an item made before any recorded
    backward ran, the last outside the loops around the backward (torch-dreams' static targets,
    appended once before the loop, where the loop's own append runs only when they are not
    static)."""
    container = binding.container_expression
    calls = src.appends(scope, container) or src.appends(source.tree, container, deep=True)
    if not calls:
        return None
    first_mark = min((call.mark for call in ctx.calls), default=None)
    grad_fn = getattr(binding.value, "grad_fn", None)
    if grad_fn is not None and first_mark is not None and graph.sequence(grad_fn) < first_mark:
        loops = ctx.backward_loops(source, scope)
        before = [call for call in calls if not any(loop.lineno <= call.lineno <= loop.end_lineno for loop in loops)]
        calls = before or calls
    return Located(source, scope, calls[-1], calls[-1], container, True)


def _filed_under_key(frame, source: src.Source, binding: naming.Binding) -> Located | None:
    """`hidden_states['input'][0]`, filed by `hidden_states[layer_name].append(hh)` in a method
    no frame runs any more: where the value appended was made (`features, hh = layer(x, hh)`),
    else the append."""
    steps = binding.steps
    while steps and steps[-1][0] == "item" and isinstance(steps[-1][1], int):
        steps = steps[:-1]
    if not steps or steps[-1][0] != "item":
        return None
    call = appended_under_key(frame, source, binding.container_expression, steps[-1][1])
    if call is None or not call.args:
        return None
    method = src.enclosing_function(call) or source.tree
    value = call.args[-1]
    made = src.last_assignment(method, value.id, call.lineno) if isinstance(value, ast.Name) else None
    target = made.target if made is not None else value
    return Located(source, method, call, target, source.segment(target), True)


def carriers(ctx: Context, current: graph.Walk, targets: set[int], mark: int) -> list[Candidate]:
    """Bindings that hold stale history (direct), hold it in a container (stored), or are
    current values re-assigned from themselves that reach it (carried), best first."""
    reaching_targets = reaching(current, targets)
    direct, stored, carried = [], [], []
    for binding in ctx.bindings():
        grad_fn = binding.value.grad_fn
        if grad_fn is None:
            continue
        key = id(grad_fn)
        if key in targets:
            if binding.in_sequence:
                stored.append(Candidate(binding, "stored"))
            else:
                direct.append(Candidate(binding, "direct"))
        elif key in current.nodes:
            if key in reaching_targets and current.seq[key] >= mark:
                carried.append(Candidate(binding, "carried",
                                         used_now=_updated_again_this_pass(current, key, reaching_targets, mark)))
            elif _replaced_this_pass(binding, current, key, targets, mark):
                carried.append(Candidate(binding, "carried"))
        elif grad_fn._sequence_nr() >= mark and graph.reaches(grad_fn, targets, mark):
            # e.g. an RNN's final hidden state: made by this step, not used by its loss.
            carried.append(Candidate(binding, "carried"))
    ranked = []
    before_row, same_site = _where_made(ctx)
    for candidate in direct + stored:
        _place_held(ctx, candidate)
        ranked.append(candidate)
    carried_located, kept_state = [], []
    for candidate in carried:
        candidate.located = locate(ctx, candidate.binding, before_row, from_last_iteration=same_site)
        located = candidate.located
        if located is None or _fresh_each_pass(ctx, located):
            continue
        if candidate.used_now and _updated_within_one_call(located):
            candidate.used_now = False
        elif not candidate.used_now and read_again_in_its_loop(located):
            candidate.used_now = True
        if isinstance(located.store, ast.Call):
            candidate.relation = "stored"  # kept by a call (`append`), as a direct value's is
        if located.carried:
            carried_located.append(candidate)
        elif located.class_node is not None and not candidate.used_now:
            # State a module keeps for the next call, made from values read some other way
            # (`self.v_mem = state["v_mem"]` after `lif_forward(state=dict(self.named_buffers()))`).
            kept_state.append(candidate)
    # A carried state re-assigned from itself beats one merely derived from it.
    carried_located.sort(key=lambda c: not self_referencing_carrier(c))
    kept_state.sort(key=lambda c: not _read_back(c))
    ranked.extend(carried_located + kept_state)
    for candidate in ranked:
        _name(ctx, candidate)
    for candidate in ranked:
        if candidate.via is None and candidate.located is not None:
            # `training_objects.log_probs`, a sample of what `replay_buffer.training_objects`
            # keeps: the same store, reached by the loop's call on the buffer.
            other = next((other for other in ranked if other.via is not None
                          and other.located.store is candidate.located.store), None)
            if other is not None:
                candidate.via, candidate.kept = other.via, other.kept
    return ranked


def held(ctx: Context, binding: naming.Binding) -> Candidate:
    """A binding whose own value holds old history (not reached through this backward's graph),
    named as the user wrote it and placed where it was made, as `carriers` places its direct and
    stored candidates."""
    candidate = Candidate(binding, "stored" if binding.in_sequence else "direct")
    _place_held(ctx, candidate)
    _name(ctx, candidate)
    return candidate


def _where_made(ctx: Context) -> tuple[int | None, bool]:
    """The row a value's statement should come before (the backward's), and whether the previous
    backward ran from the same line (then the statement may be anywhere in its loop: made in the
    previous pass, after the backward's line)."""
    previous = ctx.previous
    same_site = (ctx.call is not None and previous is not None
                 and (previous.filename, previous.row) == (ctx.call.filename, ctx.call.row))
    return (ctx.call.row if ctx.call else None), same_site


def _place_held(ctx: Context, candidate: Candidate) -> None:
    before_row, same_site = _where_made(ctx)
    candidate.binding = element_of_iterated(ctx, callers_name(ctx, candidate.binding))
    candidate.located = locate(ctx, candidate.binding, before_row, from_last_iteration=same_site)
    _follow_container_alias(candidate)
    if candidate.located is not None and isinstance(candidate.located.store, ast.Call):
        candidate.relation = "stored"  # kept by a call (`append`, `register_buffer`)


def _name(ctx: Context, candidate: Candidate) -> None:
    candidate.name = name_of(candidate)
    candidate.via = _stored_by_call(ctx, candidate)
    candidate.kept = candidate.binding.expression if candidate.via is not None else ""


def _replaced_this_pass(binding: naming.Binding, current: graph.Walk, key: int, targets: set[int], mark: int) -> bool:
    """An attribute of an object given a new value in this pass after the loss read the old one
    (`loss = loss + (summary - self.previous) ** 2; self.previous = summary`): the old value is
    bound nowhere now, but a stale target made by the same operation as the new value is most
    likely the attribute's value from the last pass."""
    if not binding.steps or binding.steps[-1][0] != "attr" or binding.owner is None or current.seq[key] < mark:
        return False
    made_by = type(current.node(key)).__name__
    return any(type(current.node(target)).__name__ == made_by for target in targets)


def callers_name(ctx: Context, binding: naming.Binding) -> naming.Binding:
    """A parameter of a helper (`phiReal` in `GDPPLoss(phiFake, phiReal)`) is the caller's
    variable, passed down (`GDPPLoss(phiDReal, phiGFake)`): the nearest caller's frame that binds
    the same tensor (or the same list, for an element of one) to a name of its own gives the
    name the user made it under."""
    frame = ctx.frames[binding.frame_index]
    # A closure's free variable (AIJack's LBFGS `closure()` reading `received_gradients`) was
    # handed down too: to the function that made the closure, whose callers are still running.
    handed_down = naming.is_argument(frame, binding.base) or binding.base in frame.f_code.co_freevars
    if not handed_down \
            or binding.steps and not binding.in_sequence or binding.base in ("self", "cls"):
        return binding
    # `losses[1]`, an element of the list the caller passed (`self._optimize_step(losses, ...)`).
    passed = frame.f_locals.get(binding.base) if binding.steps else binding.value
    nearest = binding
    for index in range(binding.frame_index + 1, len(ctx.frames)):
        for name, value in list(ctx.frames[index].f_locals.items()):
            if value is passed:
                found = naming.Binding(index, name, binding.steps, binding.value, None)
                if not naming.is_argument(ctx.frames[index], name):
                    return found
                # Passed down again (SAC-Discrete's `learn` hands `policy_loss` to
                # `update_all_parameters(..., actor_loss, ...)`, which hands it to the helper
                # that steps): the name it was made under is further up.
                nearest = found if nearest is binding else nearest
                break
    return nearest


def element_of_iterated(ctx: Context, binding: naming.Binding) -> naming.Binding:
    """`s` of `for s in state: s.detach()` names an element of `state`, the LSTM's (h, c) the loop
    carries: the element of the container the frame also holds it in (`state[1]`), or, where
    `state` has been given a new value since, the element the loop left `s` at (its last). An
    item of `s` is an item of that element: `scale[-1]` of `for scale in d_fake` is
    `d_fake[2][-1]` (a multi-scale discriminator's outputs, AGAIN-MelGAN)."""
    frame = ctx.frames[binding.frame_index]
    _, scope = ctx.frame_source(frame)
    if scope is None or binding.steps and binding.steps[0][0] != "item":
        return binding
    element = frame.f_locals.get(binding.base, frame.f_globals.get(binding.base)) if binding.steps else binding.value
    for node in src.own_nodes(scope):
        iterated = src.iterated_by(node.target, node.iter, binding.base) if isinstance(node, ast.For) else None
        if iterated is not None:
            held = frame.f_locals.get(iterated.id, frame.f_globals.get(iterated.id))
            if not isinstance(held, (list, tuple)) or not held:
                continue
            index = next((i for i, item in enumerate(held) if item is element), None)
            if index is None and not binding.steps \
                    and any(a.stmt.lineno > node.end_lineno for a in src.assignments(scope, iterated.id)):
                index = len(held) - 1  # re-bound after the loop (`y_hat, state = net(X, state)`)
            if index is not None:
                return naming.Binding(binding.frame_index, iterated.id, (("item", index), *binding.steps),
                                      binding.value, None)
    return binding


# Method calls followed down from the user's call to the method that stores the state.
_CALL_DEPTH = 3


def _stored_by_call(ctx: Context, candidate: Candidate) -> Located | None:
    """`replay_buffer.add(samples)` in the loop around the backward, when the state is an
    attribute of an object held by `replay_buffer` (not `replay_buffer`'s own) and that call leads,
    through the methods it calls, to the method that stores the state."""
    located, binding = candidate.located, candidate.binding
    if located is None or located.class_node is None or len(binding.steps) < 2 \
            or not all(kind == "attr" for kind, _ in binding.steps):
        return None
    frame = ctx.frames[binding.frame_index]
    holder = frame.f_locals.get(binding.base, frame.f_globals.get(binding.base))
    if holder is None or holder is binding.owner:
        return None
    source, scope = ctx.frame_source(frame)
    if source is None:
        return None
    storing = src.enclosing_function(located.store)
    for loop in ctx.backward_loops(source, scope)[:1]:
        for node in ast.walk(loop):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and src.canonical(node.func.value) == binding.base \
                    and _leads_to(holder, node.func.attr, storing, _CALL_DEPTH):
                stmt = src.innermost_statement(scope, node.lineno)
                return Located(source, scope, stmt, node.func.value, binding.base, True)
    return None


def _leads_to(obj, method_name: str, target: ast.AST | None, depth: int) -> bool:
    """Whether `obj.method_name()` is, or calls (`self.f()`, `self.attr.g()`), the def `target`."""
    if target is None or depth < 0:
        return False
    _, class_node = class_source(obj)
    method = next((m for m in getattr(class_node, "body", []) if isinstance(m, ast.FunctionDef)
                   and m.name == method_name), None)
    if method is None:
        return False
    if method is target:
        return True
    for node in ast.walk(method):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        callee_owner = node.func.value
        if isinstance(callee_owner, ast.Name) and callee_owner.id == "self":
            inner = obj
        elif isinstance(callee_owner, ast.Attribute) and isinstance(callee_owner.value, ast.Name) \
                and callee_owner.value.id == "self":
            inner = getattr(obj, callee_owner.attr, None)
        else:
            continue
        if inner is not None and _leads_to(inner, node.func.attr, target, depth - 1):
            return True
    return False


# Nodes looked at for an earlier update of a state in this pass: one update is a handful of
# nodes, and a 10^6-node pass must not be walked once per candidate.
_UPDATE_SEARCH = 2_000


def _updated_again_this_pass(current: graph.Walk, key: int, reaching_targets: set[int], mark: int) -> bool:
    """Whether the state made by node `key` was updated more than once since the last backward:
    more nodes of its own kind lie on its way down to the old history (a spiking neuron's
    membrane, updated at every time step of one pass). Cutting such a state where it is stored
    would cut this pass's own history; a state updated once per pass (a running mean) is cut
    only from the next pass."""
    kind = type(current.node(key)).__name__
    seen, pending = {key}, [key]
    while pending and len(seen) < _UPDATE_SEARCH:
        node = current.node(pending.pop())
        for child, _ in graph.children(node):
            child_key = id(child) if child is not None else None
            if child_key is None or child_key in seen or child_key not in reaching_targets \
                    or current.seq.get(child_key, -1) < mark:
                continue
            if type(child).__name__ == kind:
                return True
            seen.add(child_key)
            pending.append(child_key)
    return False


def _updated_within_one_call(located: Located) -> bool:
    """Whether the many updates of a module's state in one pass are a loop of its own code over a
    local (`for t in ...: state = gate[:, t] * state + x[:, t]` in a scan the forward calls),
    stored once at the end (`self.recurrent_states = state`): the stored value is read only by
    the next call, so cutting it there leaves this pass alone. A state stored inside a loop, or
    re-read by each of several calls in a pass (a neuron stepped by its caller), is not."""
    store = located.store
    if located.class_node is None or not isinstance(store, ast.stmt) or src.loops_around(store) \
            or not isinstance(located.target, ast.Attribute):
        return False
    value = src.value_of(store)
    if value is None or src.reads(value, src.canonical(located.target)):
        return False
    names = src.names_read(value)
    made = [a.stmt for a in ancestors(value, located.scope, store.lineno)]
    functions = [located.scope] + [helper for stmt in made for node in ast.walk(stmt) if isinstance(node, ast.Call)
                                   for helper in [helper_called(node, located.scope)] if helper is not None]
    for function in functions:
        loops = [n for n in ast.walk(function) if isinstance(n, (ast.For, ast.While))]
        for stmt in (n for loop in loops for n in ast.walk(loop) if isinstance(n, (ast.Assign, ast.AugAssign))):
            for target in src.targets_of(stmt):
                name = src.canonical(target)
                # A helper's local (what the scan returns), or, in the method, what the store reads.
                if name.isidentifier() and (function is not located.scope or name in names) \
                        and self_referencing(src.Assignment(stmt, target), name):
                    return True
    return False


def read_again_in_its_loop(located: Located) -> bool:
    """`for t in ...: h = self.v + x[t]; self.v = f(h)` in a method: the state stored at one
    time step is read at the next, within the same pass."""
    if located.class_node is None or not isinstance(located.store, ast.stmt):
        return False
    expression = src.canonical(located.target_text)
    return any(read is not located.target for loop in src.loops_around(located.store)
               for read in src.reads(loop, expression))


def _read_back(candidate: Candidate) -> bool:
    """Whether the module reads the state it keeps: a registered buffer (read through
    `named_buffers()` as well), or an attribute its class reads somewhere (`self.v_mem`), unlike
    a statistic kept only for logging (`self.firing_rate`)."""
    owner, attribute = candidate.binding.owner, _container_attribute(candidate.binding)
    if owner is None or attribute is None:
        return False
    if attribute in getattr(owner, "_buffers", {}):
        return True
    class_node = candidate.located.class_node
    expression = f"self.{attribute}"
    return any(node is not candidate.located.target for node in src.reads(class_node, expression))


def _fresh_each_pass(ctx: Context, located: Located) -> bool:
    """`loss_val = torch.zeros(1)` at the top of the pass that back-propagates it, then
    `loss_val += ...` in an inner loop: re-assigned from itself, but made afresh every pass, so it
    carries nothing from the previous one."""
    source, _, failing = ctx.failing_statement()
    if failing is None or source is None or source.filename != located.source.filename \
            or not isinstance(located.store, ast.stmt):
        return False
    expression = src.canonical(located.target_text)
    freeing = ctx.freeing
    # The reset has to come after the backward that freed the graph: one at the top of the
    # pass does not help when both backward calls are in it (SAM's two passes on one `loss`).
    after = freeing.row if freeing is not None and freeing.filename == source.filename \
        and freeing.row < located.store.lineno else 0
    # Only the innermost loop that runs the backward counts: a reset once per epoch around an
    # inner loop of segments (`memory = None`, then one backward per segment) still lets every
    # segment carry the previous one's history.
    loop = next((loop for loop in src.loops_around(located.store) if src.inside(failing, loop)), None)
    return loop is not None and reset_before(loop, located.store, expression, after)


def name_of(candidate: Candidate) -> str:
    """The carrier as the user wrote it: where it was made, else how the frames reach it."""
    located, binding = candidate.located, candidate.binding
    if located is not None:
        if isinstance(located.target, ast.Subscript) and binding.steps and binding.steps[-1][0] == "attr":
            # `self.cache_k[:bsz, start:end] = xk` writes into the tensor the binding holds whole.
            return located.source.segment(located.target.value)
        return located.target_text
    return binding.container_expression if candidate.relation == "stored" else binding.expression


def through_plain_alias(ctx: Context, located: Located | None) -> Located | None:
    """`old_state = state` only names the tensor again: where `state` was made, in the previous
    pass of the loop when it is made later in the body (option-critic's `state =
    option_critic.get_state(next_obs)`, after the line that keeps the old one)."""
    value = src.value_of(located.store) if located is not None and isinstance(located.store, ast.Assign) else None
    if not isinstance(value, (ast.Name, ast.Attribute)) or len(located.store.targets) != 1:
        return located
    expression = src.canonical(value)
    made = _pick(ctx, located.source, located.scope, src.assignments(located.scope, expression), expression,
                 located.store.lineno, from_last_iteration=True)
    return made if made is not None and made.store is not located.store else located


def _follow_container_alias(candidate: Candidate) -> None:
    """`prev = cache.get("prev")`: the culprit is `cache["prev"] = ...`, where it is kept."""
    located = candidate.located
    value = src.value_of(located.store) if located is not None else None
    key = None
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
        container, key = value.value, value.slice
    elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
          and value.func.attr in ("get", "pop") and value.args and isinstance(value.args[0], ast.Constant)):
        container, key = value.func.value, value.args[0]
    if key is None:
        return
    expression = f"{src.canonical(container)}[{key.value!r}]"
    stores = src.assignments(located.scope, expression)
    if not stores:
        return
    store = stores[-1]
    alias = Located(located.source, located.scope, store.stmt, store.target, located.source.segment(store.target), True)
    candidate.located, candidate.relation = alias, "stored"


def _container_attribute(binding: naming.Binding) -> str | None:
    """`hidden` for `model.hidden[0]`: the attribute that holds the sequence."""
    steps = binding.steps
    while steps and steps[-1][0] == "item":
        steps = steps[:-1]
    return steps[-1][1] if steps and steps[-1][0] == "attr" else None


def self_referencing_carrier(candidate: Candidate) -> bool:
    """Re-assigned from its own old value, directly or through a local it was read into
    (`mem = self.mem.to(device)`, then `self.mem = beta * mem + x`), or appended to the container
    it was made from."""
    located = candidate.located
    if located is not None and _fed_back(located.store, located.scope):
        return True
    if located is None or not isinstance(located.store, ast.stmt):
        return False
    return from_old_value(located.assignment, src.canonical(located.target_text), located.scope)


def _fed_back(store: ast.AST, scope: ast.AST) -> bool:
    """`states[name].append(hh)` where `hh` was made from `states[name][-1]`: the container's old
    content makes what it keeps next (a window of this pass's outputs is only filled)."""
    if not (isinstance(store, ast.Call) and store.args and isinstance(store.func, ast.Attribute)):
        return False
    container, value = src.canonical(store.func.value), store.args[-1]
    return bool(src.reads(value, container)) or any(
        a.value is not None and src.reads(a.value, container) for a in ancestors(value, scope, store.lineno))


def from_old_value(assignment: src.Assignment, expression: str, scope: ast.AST) -> bool:
    """`x = f(x)` or `x += y`, or made from a local that read the old value first."""
    if self_referencing(assignment, expression):
        return True
    value = src.value_of(assignment.stmt)
    return value is not None and any(a.value is not None and src.reads(a.value, expression)
                                     for a in ancestors(value, scope, assignment.stmt.lineno))


def reaching(walk: graph.Walk, targets: set[int]) -> set[int]:
    """Nodes of `walk` from which one of `targets` can be reached (targets included)."""
    found = {t for t in targets if t in walk.nodes}
    stack = list(found)
    while stack:
        key = stack.pop()
        for consumer in walk.consumers.get(key, ()):
            if consumer not in found:
                found.add(consumer)
                stack.append(consumer)
    return found


def shares_history(grad_fn, other: graph.Walk) -> bool:
    """Whether `grad_fn`'s history meets a non-leaf node of `other`."""
    mine = graph.walk([grad_fn])
    return any(key in other.nodes for key, seq in mine.seq.items() if seq != graph.LEAF_SEQ)


def class_source(owner) -> tuple[src.Source | None, ast.ClassDef | None]:
    """The source file and class definition of a user object's class."""
    return source_of_class(type(owner))


def source_of_class(cls: type) -> tuple[src.Source | None, ast.ClassDef | None]:
    """The source file and definition of a user's class (a custom autograd Function's too)."""
    code = _method_code(cls)
    source = src.load(code.co_filename) if code is not None else None
    if source is None:
        return None, None
    return source, src.class_named(source, cls.__name__, code.co_firstlineno)


def _method_code(cls):
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch"):
            break
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)  # staticmethods too
            if code is not None:
                return code
    return None


def self_referencing(assignment: src.Assignment, expression: str) -> bool:
    """`x = f(x)` or `x += y`: the new value is made from the old one."""
    if isinstance(assignment.stmt, ast.AugAssign):
        return True
    value = src.value_of(assignment.stmt)
    return value is not None and bool(src.reads(value, expression))


def step_row_in(located: Located, step, failing: ast.stmt | None) -> int | None:
    """The row of `located`'s scope at which `step` changed the weights: the step's own where
    that scope runs it; else, where a wrapper of the user's stepped (StyleTTS2's
    `MultiOptimizer.step(key)` runs `self.optimizers[key].step()`), the one statement of the
    scope between the carrier's and the failing one that calls a `step`; None where no row of
    the scope tells (a helper that steps under another name: nf-soft-mining's
    `update_every_n_steps(...)`)."""
    scope = located.scope
    if step.filename != located.source.filename:
        return None
    if scope is located.source.tree:
        own = src.enclosing_function(src.innermost_statement(scope, step.row)) is None \
            and src.enclosing_class(src.innermost_statement(scope, step.row)) is None
    else:
        own = scope.lineno <= step.row <= scope.end_lineno
    if own:
        return step.row
    if failing is None or not src.inside(failing, scope) and failing is not scope:
        return None
    calls = {id(stmt): stmt for stmt in src.own_nodes(scope) if isinstance(stmt, ast.Expr)
             and located.store.lineno < stmt.lineno < failing.lineno and src.call_named(stmt, "step") is not None}
    return next(iter(calls.values())).lineno if len(calls) == 1 else None

