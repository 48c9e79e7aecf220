"""Explain an error after the fact (`%explain` after the error, `explainer.explain(err)`): no
backward was recorded then, so read what the traceback's frames and the graph still show, and
rebuild from the source the calls the hooks would have recorded where the source says them."""
from __future__ import annotations

import ast
import inspect
import weakref
from dataclasses import replace

import torch

from ..model import Finding
from ..reading import source as src
from ..reading.training import helper_called
from . import analysis, graph, journal, naming, records
from .analysis import locate
from .errors import kind_of
from .records import BackwardCall, StepCall


def explain(error: BaseException) -> Finding | None:
    known = journal.finding_for(error)
    if known is not None or kind_of(error) is None:
        return known
    frames = _callers_frames(error.__traceback__)
    try:
        if not frames:
            return None
        innermost = frames[0]
        filename, row = innermost.f_code.co_filename, innermost.f_lineno
        roots = _roots_from_torch(error.__traceback__) or _roots_from_source(innermost, filename, row)
        calls, steps = _earlier_calls(frames, roots)
        calls = calls or _earlier_in_its_loop(innermost, roots) or _earlier_in_its_comprehension(frames, roots)
        call = BackwardCall(len(calls) + len(steps) + 1, 0, tuple(id(r) for r in roots), filename, row, False,
                            False, "backward")
        finding = None
        if not calls:
            last_pass, steps_after = _last_pass(frames, call, roots)
            if last_pass:
                after = call._replace(tick=len(last_pass) + len(steps_after) + 1)
                finding = analysis.explain(error, after, roots, frames, last_pass, steps_after)
                if finding is not None and finding.code == "BX012":
                    finding = None  # the estimated split named nothing: let the source rank the suspects
        if finding is None:
            finding = analysis.explain(error, call, roots, frames, calls, steps)
        if finding is not None:
            if finding.confidence == "certain":  # nothing recorded the calls: read, not seen
                finding = replace(finding, confidence="likely")
            journal.record_error(error, finding)
        return finding
    finally:
        frames.clear()


def _earlier_calls(frames, roots) -> tuple[tuple[BackwardCall, ...], tuple[StepCall, ...]]:
    """The backward and `autograd.grad` calls, and the optimizer steps after them, that the
    source runs before the failing statement in the same pass (the same loop body, or the same
    function where no loop holds it), on tensors the frame still holds, as the hooks would have
    recorded them: the discriminator's `d_loss.backward()` before the generator's,
    `loss1.backward()` before `loss2.backward()`, the caller's `lossG.backward()` before the
    helper it calls backs up a penalty. Read in the innermost frame whose function shows one.
    A call's mark is its roots' sequence number: nodes made before those roots are older than it.
    Where the failing call back-propagates the same tensor, grown in place since (`loss +=
    loss_t` after `loss.backward()`), it is the first node that the statements after the call
    made, where they made one."""
    for frame in frames:
        source, scope, failing = _frame_statement(frame)
        if failing is None:
            continue
        loops = src.loops_around(failing)
        calls, steps = [], []
        for stmt in _statements_in(loops[0] if loops else scope):
            if stmt.end_lineno >= failing.lineno:
                break
            for call in src.calls_named(stmt, "backward", "manual_backward", "grad"):
                called_on = _called_on(call, frame)
                mark = max((r.grad_fn._sequence_nr() for r in called_on), default=0) + 1
                if {id(r) for r in called_on} & {id(r) for r in roots}:
                    mark = _first_node_made({id(v): v for v in _assigned_this_pass(frame, stmt.end_lineno)},
                                            frames, roots) or mark
                if called_on:
                    calls.append(_recorded_call(call, called_on, mark, len(calls) + len(steps) + 1, source.filename))
            if calls:
                steps.extend(_steps_in(stmt, frame, source.filename, calls[-1].mark, len(calls) + len(steps) + 1))
            for inner, value in _in_helpers(stmt, frame, scope):
                # `update_params(self.q1_optim, self.critic.Q1, q1_loss)`: the helper's own
                # `loss.backward()` and `optim.step()`, on what this call passed it.
                if isinstance(value, torch.Tensor):
                    mark = value.grad_fn._sequence_nr() + 1
                    calls.append(_recorded_call(inner, [value], mark, len(calls) + len(steps) + 1, source.filename))
                elif calls:
                    steps.append(StepCall(len(calls) + len(steps) + 1, max(calls[-1].mark, _made_before(frame, stmt)),
                                          weakref.ref(value), source.filename, inner.lineno, inner.col_offset))
        if calls:
            return tuple(calls), tuple(steps)
    return (), ()


def _made_before(frame, stmt) -> int:
    """One more than the newest node of the tensors the frame binds to names that the pass's
    statements above `stmt` assigned and nothing re-assigned since: a step in `stmt` ran after
    them (`policy_loss, entropies = self.calc_policy_loss(...)` before `update_params(...)`)."""
    _, scope, current = _frame_statement(frame)
    if current is None:
        return 0
    loops = src.loops_around(current)
    statements = _statements_in(loops[0] if loops else scope)
    later = {name for s in statements if stmt.lineno <= s.lineno <= current.lineno for name in _names_bound(s)}
    earlier = {name for s in statements if s.lineno < stmt.lineno for name in _names_bound(s)} - later
    values = [frame.f_locals.get(name) for name in earlier]
    return max((v.grad_fn._sequence_nr() + 1 for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None),
               default=0)


def _names_bound(stmt) -> set[str]:
    """The plain names `stmt` assigns (both of `a, b = f()`)."""
    return {n.id for t in src.targets_of(stmt) for n in ast.walk(t) if isinstance(n, ast.Name)}


def _in_helpers(stmt, frame, scope) -> list:
    """(call, value) for each `<parameter>.backward(...)` and `<parameter>.step()` in the body of
    a function of the file that `stmt` calls (so in the frame's own file), in the helper's order,
    with the tensor (with history) or optimizer the call passed for that parameter."""
    found = []
    for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
        helper = helper_called(call, scope)
        if helper is None:
            found.extend(_returned_after_backward(stmt, call, frame))
            continue
        for inner in sorted(src.calls_named(helper, "backward", "step"), key=lambda c: (c.lineno, c.col_offset)):
            receiver = inner.func.value if isinstance(inner.func, ast.Attribute) else None
            argument = src.argument_for(helper, call, receiver.id) if isinstance(receiver, ast.Name) else None
            value = _lookup(argument, frame) if argument is not None else None
            if inner.func.attr == "backward" and isinstance(value, torch.Tensor) and value.grad_fn is not None \
                    or inner.func.attr == "step" and hasattr(value, "param_groups"):
                found.append((inner, value))
    return found


def _returned_after_backward(stmt, call: ast.Call, frame) -> list:
    """(call, tensor) where `call` runs a method of an object of the user's, in this file, that
    back-propagates a loss of its own and returns it (R-Drop's `loss, size, log =
    criterion.forward_reg(model, sample, optimizer, ...)`, whose `optimizer.backward(loss)` ran
    before it returned `loss, ...`): the tensor `stmt` bound from it."""
    func = call.func
    owner = frame.f_locals.get(func.value.id) if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        else None
    if owner is None or not naming.is_user_object(owner):
        return []
    source, class_node = locate.source_of_class(type(owner))
    method = next((m for m in class_node.body if isinstance(m, ast.FunctionDef) and m.name == func.attr), None) \
        if class_node is not None and source.filename == frame.f_code.co_filename else None
    if method is None or src.value_of(stmt) is not call:
        return []
    found = []
    for inner in src.calls_named(method, "backward"):
        loss = inner.func.value if isinstance(inner.func, ast.Attribute) and not inner.args else \
            inner.args[0] if len(inner.args) == 1 else None
        if not isinstance(loss, ast.Name):
            continue
        for returned in (n for n in ast.walk(method) if isinstance(n, ast.Return) and n.value is not None):
            values = returned.value.elts if isinstance(returned.value, ast.Tuple) else [returned.value]
            index = next((i for i, v in enumerate(values) if isinstance(v, ast.Name) and v.id == loss.id), None)
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            if isinstance(target, ast.Tuple) and index is not None and index < len(target.elts):
                target = target.elts[index]
            elif isinstance(returned.value, ast.Tuple):
                target = None
            value = frame.f_locals.get(target.id) if index is not None and isinstance(target, ast.Name) else None
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                found.append((inner, value))
                break
    return found


def _earlier_in_its_loop(frame, roots) -> tuple[BackwardCall, ...]:
    """The failing call one iteration earlier, in `for loss in losses: loss.backward()`, where
    the frame holds the losses (`self.state.loss`, read through `ensure_tuple(...)` or
    `enumerate(...)`): the call back-propagated the loss before this one in that sequence, after
    the whole sequence was made."""
    source, _, failing = _frame_statement(frame)
    loops = src.loops_around(failing) if failing is not None else []
    loop = loops[0] if loops else None
    if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
        return ()
    call = next((c for c in src.calls_named(failing, "backward") if isinstance(c.func, ast.Attribute)
                 and isinstance(c.func.value, ast.Name) and c.func.value.id == loop.target.id), None)
    if call is None or len(roots) != 1:
        return ()
    for expression in ast.walk(loop.iter):
        held = _lookup(expression, frame) if isinstance(expression, (ast.Name, ast.Attribute)) else None
        if not isinstance(held, (list, tuple)):
            continue
        position = next((i for i, value in enumerate(held) if value is roots[0]), None)
        before = held[position - 1] if position else None
        if isinstance(before, torch.Tensor) and before.grad_fn is not None:
            # every loss in the sequence was made before the loop's first backward
            mark = max(v.grad_fn._sequence_nr() for v in held if isinstance(v, torch.Tensor) and v.grad_fn) + 1
            return (_recorded_call(call, [before], mark, 1, source.filename),)
    return ()


def _earlier_in_its_comprehension(frames, roots) -> tuple[BackwardCall, ...]:
    """The failing call one item earlier, in `[torch.autograd.grad(selected, x) for x in X]`
    (shap's DeepExplainer, one gradient per input): its roots read nothing the comprehension
    binds, so each item's call went through the same graph, and the item now is not the first.
    The earlier call ran after the roots were made."""
    source, _, failing = _frame_statement(frames[0])
    if failing is None or not roots:
        return ()
    for comprehension in (n for n in ast.walk(failing) if isinstance(n, (ast.ListComp, ast.GeneratorExp))):
        generators = comprehension.generators
        if len(generators) != 1 or not isinstance(generators[0].target, ast.Name):
            continue
        target = generators[0].target.id
        call = next(iter(src.calls_named(comprehension.elt, "backward", "grad")), None)
        if call is None or not isinstance(call.func, ast.Attribute):
            continue
        differentiated = call.args[0] if call.func.attr == "grad" and call.args else call.func.value
        if src.reads(differentiated, target):
            continue
        # The comprehension's own frame (before Python 3.12) binds the item; its iterable is
        # the enclosing function's.
        item = next((f.f_locals[target] for f in frames[:2] if target in f.f_locals), None)
        sequence = next((held for f in frames[:2] for held in [_lookup(generators[0].iter, f)]
                         if isinstance(held, (list, tuple))), None)
        if item is None or sequence is None or not any(value is item for value in sequence[1:]):
            continue
        mark = max((r.grad_fn._sequence_nr() for r in roots if r.grad_fn is not None), default=0) + 1
        return (_recorded_call(call, roots, mark, 1, source.filename),)
    return ()


def _last_pass(frames, call: BackwardCall, roots) -> tuple[tuple[BackwardCall, ...], tuple[StepCall, ...]]:
    """The failing call itself one pass earlier, for a backward in a loop (or in a helper that a
    loop calls) with no other backward before it in the pass: its mark is estimated from what
    this pass made (`_made_this_pass`); the optimizer steps after it in the source ran after it."""
    in_this_pass = frames[:_looping_frame(frames) + 1]
    mark = _made_this_pass(in_this_pass, frames, roots)
    if mark is None:
        return (), ()
    previous = call._replace(tick=1, mark=mark, root_ids=())
    steps = []
    for frame in in_this_pass:
        source, scope, current = _frame_statement(frame)
        if current is None:
            continue
        loops = src.loops_around(current)
        for stmt in _statements_in(loops[0] if loops else scope):
            if stmt.lineno > current.end_lineno:
                steps.extend(_steps_in(stmt, frame, source.filename, mark, 2 + len(steps)))
    # An optimizer that keeps state from its first step on and holds none never stepped: this is
    # the first pass (VG-HuBERT's in-place error, in its first backward), whatever the source says.
    return (previous,), tuple(s for s in steps if _may_have_stepped(s.optimizer()))


def _may_have_stepped(optimizer) -> bool:
    """False only for an optimizer that would hold state had it ever stepped (every one of
    torch's but plain SGD without momentum) and holds none."""
    if optimizer is None or len(getattr(optimizer, "state", ())) > 0:
        return True
    plain_sgd = isinstance(optimizer, torch.optim.SGD) and all(g.get("momentum", 0) == 0
                                                               for g in optimizer.param_groups)
    return plain_sgd or not isinstance(optimizer, torch.optim.Optimizer)


def _steps_in(stmt, frame, filename: str, mark: int, tick: int) -> list[StepCall]:
    """The `optimizer.step()` calls in `stmt` whose receiver the frame holds as an optimizer, as
    the hooks record them, ticked from `tick` on."""
    steps = []
    for call in src.calls_named(stmt, "step"):
        optimizer = _lookup(call.func.value, frame) if isinstance(call.func, ast.Attribute) else None
        if hasattr(optimizer, "param_groups"):
            steps.append(StepCall(tick + len(steps), mark, weakref.ref(optimizer), filename, call.lineno,
                                  call.col_offset))
    return steps


def _looping_frame(frames) -> int:
    """The index of the innermost frame whose current statement is inside a loop (the last frame
    when none is): the frames up to it ran their code in this pass only."""
    for index, frame in enumerate(frames):
        _, _, current = _frame_statement(frame)
        if current is not None and src.loops_around(current):
            return index
    return len(frames) - 1


def _frame_statement(frame):
    """(source, scope, the statement running now) for a user's frame; Nones where unreadable."""
    source = src.load(frame.f_code.co_filename)
    scope = src.function_for_code(source, frame.f_code.co_name, frame.f_code.co_firstlineno) \
        if source is not None else None
    current = src.innermost_statement(scope, frame.f_lineno) if scope is not None else None
    return source, scope, current


# How many nodes the estimate of this pass's first node may walk: the rest of the budget stays
# for the explanation itself.
_PASS_WALK = 3_000


def _made_this_pass(in_this_pass, frames, roots) -> int | None:
    """The sequence number of the first node this pass made, estimated without any record: walk
    down from the tensors that statements of this pass made (`out = model(x)`, `h = a + b`,
    still bound to the names they assigned), stopping at tensors bound in the frames some other
    way (the `state` passed in, the list of past encodings): what that walk reaches was made in
    this pass. None where no statement shows, or the walk does not end within its share.
    `in_this_pass`: the frames whose statements ran in this pass only."""
    fresh = {}
    for frame in in_this_pass:
        fresh.update((id(v), v) for v in _assigned_this_pass(frame))
    return _first_node_made(fresh, frames, roots)


def _first_node_made(fresh: dict, frames, roots) -> int | None:
    if not fresh:
        return None
    held = {id(b.value.grad_fn) for b in naming.bindings(frames)
            if id(b.value) not in fresh and b.value.grad_fn is not None}
    queue = [t.grad_fn for t in fresh.values()] + [r.grad_fn for r in roots if r.grad_fn is not None]
    seen, lowest = set(), None
    while queue:
        node = queue.pop()
        if node is None or id(node) in seen or id(node) in held or graph.is_leaf(node):
            continue
        seen.add(id(node))
        if len(seen) > _PASS_WALK:
            return None
        sequence = node._sequence_nr()
        lowest = sequence if lowest is None else min(lowest, sequence)
        queue.extend(child for child, _ in graph.children(node))
    return lowest


def _assigned_this_pass(frame, after: int = 0):
    """The tensors with history bound to plain names that the frame's statements of this pass
    (its loop's body, or its function's, up to the running statement; those after the row
    `after`) last assigned with an expression that makes a node: an operator, a module's
    forward, a torch function, a tensor method. A container's `get`, or a name copied, may hand
    back an older tensor."""
    source, scope, current = _frame_statement(frame)
    if current is None:
        return
    loops = src.loops_around(current)
    last = {}
    for stmt in _statements_in(loops[0] if loops else scope):
        if stmt is current or stmt.lineno > current.lineno:
            break  # what the running statement assigns, it has not assigned yet
        if stmt.lineno <= after:
            continue
        value = src.value_of(stmt)
        for target in src.targets_of(stmt):
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            for name in names:
                if isinstance(name, ast.Name):
                    # `total = total + loss` reads the value an earlier pass made: not this pass's
                    last[name.id] = not isinstance(stmt, ast.AugAssign) and _makes_a_node(value, frame) \
                        and name.id not in src.names_read(value)
    for name, makes in last.items():
        value = frame.f_locals.get(name)
        if makes and isinstance(value, torch.Tensor) and value.grad_fn is not None:
            yield value


def _makes_a_node(value, frame) -> bool:
    """Whether an assigned expression surely makes a new tensor: an operator, a module's
    forward, a torch function, a tensor's method. A helper of the user's may hand back a tensor
    it keeps, as a container's `get` does."""
    if isinstance(value, (ast.BinOp, ast.UnaryOp)):
        return True
    if isinstance(value, ast.Subscript):
        # `inputs = theta_tensor[indices]`: indexing a tensor makes a node (a view's or a
        # copy's); indexing a list or a dict hands back a tensor it holds.
        return isinstance(_lookup(value.value, frame), torch.Tensor)
    if not isinstance(value, ast.Call):
        return False
    callee = _lookup(value.func, frame)
    if isinstance(callee, torch.nn.Module) or str(getattr(callee, "__module__", None) or "").startswith("torch"):
        return True
    if isinstance(value.func, ast.Name) and callee is not None:
        # `loss = loss_fn(batch)`: a function of the user's, or an object of theirs called
        return _returns_new(callee, None) if inspect.isfunction(callee) else _method_makes_a_node(callee, "__call__")
    if isinstance(value.func, ast.Attribute):
        owner = _lookup(value.func.value, frame)
        return isinstance(owner, (torch.Tensor, torch.nn.Module)) or getattr(owner, "__name__", "") in (
            "torch", "torch.nn.functional") or _method_makes_a_node(owner, value.func.attr)
    return False


def _method_makes_a_node(owner, name: str) -> bool:
    """`logits = self._get_logits(x)`: a method of the user's whose every `return` makes a node
    as written (`return self.attacked_model(...)`, `return F.cross_entropy(...)`, `return a + b`,
    or a name it assigned so): unlike a container's `get`, it hands back nothing it keeps."""
    if owner is None or isinstance(owner, type) or type(owner).__module__.startswith(("torch", "builtins")):
        return False
    try:
        function = inspect.getattr_static(owner, name)
    except AttributeError:
        return False
    return _returns_new(function, owner)


def _returns_new(function, owner) -> bool:
    """Whether every `return` of `function` (a method of `owner`'s, or a plain function) makes a
    node as written."""
    code = getattr(function, "__code__", None)
    source = src.load(code.co_filename) if code is not None else None
    scope = src.function_for_code(source, code.co_name, code.co_firstlineno) if source is not None else None
    if scope is None or scope is getattr(source, "tree", None):
        return False
    returns = [n.value for n in src.own_nodes(scope) if isinstance(n, ast.Return)]
    return bool(returns) and all(r is not None and _new_as_written(r, owner, scope, 2) for r in returns)


def _new_as_written(expr: ast.expr, owner, scope: ast.AST, depth: int) -> bool:
    """An expression that makes a new tensor by its form: an operator, a torch function
    (`torch.`, `F.`), the call of a module the method's `self` holds; a name it last assigned
    one of those."""
    if isinstance(expr, (ast.BinOp, ast.UnaryOp)):
        return True
    if isinstance(expr, ast.Name) and depth > 0:
        made = src.last_assignment(scope, expr.id, expr.lineno)
        return made is not None and made.value is not None and _new_as_written(made.value, owner, scope, depth - 1)
    if not isinstance(expr, ast.Call):
        return False
    root = expr.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id in ("torch", "F"):
        return True
    func = expr.func
    if isinstance(func, ast.Attribute) and _new_as_written(func.value, owner, scope, depth):
        return True  # a method of a new tensor: `(scores + log_z).pow(2).mean()`
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
        and isinstance(naming.stored_attribute(owner, func.attr), torch.nn.Module)


def _recorded_call(call: ast.Call, roots, mark: int, tick: int, filename: str) -> BackwardCall:
    retain = any(k.arg in ("retain_graph", "create_graph") and isinstance(k.value, ast.Constant)
                 and k.value.value is True for k in call.keywords)
    api = "grad" if src.call_named(call, "grad") is call else "backward"
    return BackwardCall(tick, mark, tuple(id(r) for r in roots), filename, call.lineno, retain, False, api,
                        call.col_offset)


def _statements_in(scope):
    """The simple statements of `scope` in source order, not those of a nested def or class."""
    simple = [n for n in src.own_nodes(scope) if isinstance(n, ast.stmt) and not hasattr(n, "body")]
    return sorted(simple, key=lambda n: (n.lineno, n.col_offset))


def _called_on(call: ast.Call, frame) -> list:
    """The tensors with history a backward call's source names, as the frame holds them now:
    `loss` of `loss.backward()`, `d_loss` of `accelerator.backward(d_loss)`, the outputs of
    `torch.autograd.grad(loss, inputs)`."""
    func = call.func
    name = src.called_name(call)
    if name == "backward" and isinstance(func, ast.Attribute) \
            and (not call.args or isinstance(_lookup(func.value, frame), torch.Tensor)):
        candidate = func.value  # `fake_validity.backward(fake)`: `fake` is the gradient, not a root
    elif call.args:
        candidate = call.args[0]
    else:
        candidate = next((k.value for k in call.keywords if k.arg in ("tensors", "outputs", "loss")), None)
    if candidate is None:
        return []
    value = _lookup(candidate, frame)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None]


def _callers_frames(tb) -> list:
    """The user's frames of a traceback, innermost first, up to the one that called torch's
    `backward` or `grad`, as the hooks see them: a custom Function's `backward`, run by the
    engine inside the failing call, is not where the user called it."""
    frames, at = [], tb
    while at is not None:
        frame = at.tb_frame
        if _in_torch_backward(frame):
            break
        if records.is_user_frame(frame):
            frames.append(frame)
        at = at.tb_next
    frames.reverse()
    return frames or records.frames_of_traceback(tb)


def _in_torch_backward(frame) -> bool:
    return frame.f_code.co_filename.startswith(records.TORCH_DIR) and frame.f_code.co_name in ("backward", "grad")


def _roots_from_torch(tb) -> list:
    """The tensors the failing call back-propagated from, as torch's own `backward` or `grad`
    frame in the traceback holds them (`self`, `tensors`, `outputs`): exact, and there however
    the user's code reached it (`accelerator.backward(loss)`, Lightning's loops)."""
    while tb is not None:
        frame = tb.tb_frame
        if _in_torch_backward(frame):
            for name in ("self", "tensors", "outputs"):
                value = frame.f_locals.get(name)
                values = [value] if isinstance(value, torch.Tensor) else \
                    list(value) if isinstance(value, (list, tuple)) else []
                if values and all(isinstance(v, torch.Tensor) for v in values):
                    return values
        tb = tb.tb_next
    return []


def _roots_from_source(frame, filename: str, row: int) -> list:
    """The tensor the failing statement called backward on, looked up (never evaluated)."""
    source = src.load(filename)
    if source is None:
        return []
    stmt = src.innermost_statement(source.tree, row)
    if stmt is None:
        return []
    for call in src.calls_named(stmt, "backward", "manual_backward"):
        # `loss.backward()`; or a library's wrapper, whose frames are not the user's:
        # `accelerator.backward(loss)`, Lightning's `self.manual_backward(loss)`.
        candidates = [call.func.value] if isinstance(call.func, ast.Attribute) else []
        candidates += call.args[:1]
        for candidate in candidates:
            value = _lookup(candidate, frame)
            if isinstance(value, torch.Tensor):
                return [value]
    return []


def _lookup(node: ast.expr, frame):
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            return frame.f_locals[node.id]
        return frame.f_globals.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _lookup(node.value, frame)
        if owner is None:
            return None
        return naming.stored_attribute(owner, node.attr)  # `self.netD`: kept in `_modules`
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        owner = _lookup(node.value, frame)
        try:
            return owner[node.slice.value] if isinstance(owner, (list, tuple, dict)) else None
        except (KeyError, IndexError, TypeError):
            return None
    return None
