"""What a value was made from, followed back through names, the items of a dict or list filled
one by one, and the returns of the user's functions and methods it called (with the runtime
objects their `self` and the failing frame's names are), nearest first."""
from __future__ import annotations

import ast
import sys
import types
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from ...reading import source as src
from ...reading.training import helper_called
from .. import naming
from ..records import is_library_file
from .locate import source_of_class

# Expressions followed back from the loss: a training step is a few dozen assignments deep.
_MAX_TRACED = 96


@dataclass(frozen=True)
class Scope:
    """A function (or module) a value is followed through: its source, the runtime object its
    `self` is when known, and its frame's values (known only for the live frame the walk starts
    in; a function the value was returned from has run and left no frame)."""

    source: src.Source
    node: ast.AST
    owner: object | None = None
    values: dict = field(default_factory=dict, compare=False, hash=False)
    # Where a parameter's value came from: the scope that called this one, with its call (a
    # function the value was returned from), or a function of the parameter's name giving
    # (scope, expression, row) in the caller's live frame (see `live_scope`).
    called_from: tuple | None = field(default=None, compare=False, hash=False)
    caller: object = field(default=None, compare=False, hash=False)
    # The values of a closure's free variables (`self` and `outputs_losses` in deepxde's
    # `outputs_losses_train`, made in `Model.compile`): known even when it has run.
    closure: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def runs(self) -> bool:
        """Whether this is a live frame, whose values are known."""
        return bool(self.values)


def made_from(start: Scope, expression: str, before: int, follow=None, through_parameters: bool = False,
              through_appends: bool = False):
    """(scope, assignment) for every assignment the value of `expression` (read on line `before`)
    was made from, nearest first: through names, the items of a dict or list filled one by one,
    and the returns of the user's functions and methods it called. In the live frame, a name
    is followed when `follow(value)` says so (by default: a tensor without a graph, or a
    container, as a loss without history comes from). `through_parameters`: a parameter is
    followed to what its caller passed, and an item or attribute nothing assigns to its
    container (`state["output"]` to `state = make_state(batch, output)`). `through_appends`: a
    list made empty is followed to what is appended to it (`losses.append(losses_i)`), each
    append given as an assignment whose target is the append's call."""
    pending = deque([(start, expression, before)])
    seen = set()
    while pending and len(seen) < _MAX_TRACED:
        where, expression, before = pending.popleft()
        key = (id(where.node), expression, before)
        if key in seen:
            continue
        seen.add(key)
        found = _assignments_of(where, expression, before, through_appends)
        for assignment in found:
            yield where, assignment
            pending.extend(_inputs(where, assignment, follow or _may_carry))
        if through_parameters and not found:
            base = _base_name(expression)
            if base is not None and base != expression:
                pending.append((where, base, before))
            elif base is not None:
                passed = _passed_as(where, base)
                if passed is not None:
                    pending.append(passed)


def made_by_calling(start: Scope, expression: str, before: int, accepts):
    """(scope, assignment): the nearest assignment the value of `expression` was made from (any
    value followed) by calling an object that `accepts(called)` says is the one wanted (a model
    holding a parameter, a model of some class), or None."""
    for where, assignment in made_from(start, expression, before, follow=lambda value: True):
        call = src.value_of(assignment.stmt)
        # `imag_reward = model.reward_model(imag_feat).mean`: the call whose result it reads.
        while isinstance(call, (ast.Attribute, ast.Subscript)):
            call = call.value
        if isinstance(call, ast.Call) and accepts(runtime_value(where, call.func)):
            return where, assignment
    return None


def _base_name(expression: str) -> str | None:
    """`state` for `state["output"]` or `state.output`; the name itself for a name."""
    try:
        node = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) and node.id != "self" else None


def _passed_as(where: Scope, name: str) -> tuple | None:
    """(scope, expression, row) of the argument the caller passed for the parameter `name` of
    `where`'s function, or None when `name` is not one of its parameters."""
    if where.called_from is not None:
        passed = _argument_passed(where, name)
        return (passed[0], src.canonical(passed[1]), where.called_from[1].lineno) if passed is not None else None
    if where.caller is not None:
        return where.caller(name)
    return None


def _assignments_of(where: Scope, expression: str, before: int, through_appends: bool) -> list[src.Assignment]:
    found = src.last_assignment(where.node, expression, before)
    if found is None and expression.endswith("]"):
        # `losses_q[-1]`: the item it is at run time, as its own assignments name it.
        found = _item_assignment(where, expression, before)
    if found is None:
        return []
    if isinstance(found.value, ast.Dict) and not found.value.keys \
            or isinstance(found.value, ast.List) and not found.value.elts:
        # `losses = {}`, then `losses["ingr"] = ...`: what the items were given.
        items = [a for a in src.item_assignments(where.node, expression) if a.stmt.lineno < before]
        appended = [src.Assignment(src.statement_of(call), call) for call in src.appends(where.node, expression)
                    if found.stmt.lineno < call.lineno < before] if through_appends else []
        return items + appended
    return [found]


def _item_assignment(where: Scope, expression: str, before: int) -> src.Assignment | None:
    try:
        node = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Constant, ast.UnaryOp))):
        return None
    container = where.values.get(src.canonical(node.value))
    try:
        index = ast.literal_eval(node.slice)
    except ValueError:
        return None
    if not isinstance(container, (list, tuple)) or not isinstance(index, int) or not -len(container) <= index < len(container):
        return None
    return src.last_assignment(where.node, f"{src.canonical(node.value)}[{index % len(container)}]", before)


def _inputs(where: Scope, assignment: src.Assignment, follow):
    """What the assigned value was made from: the returns of the user's function it is the
    result of, else the names it reads."""
    value = src.value_of(assignment.stmt)
    if value is None and isinstance(assignment.target, ast.Call):  # `losses.append(losses_i)`
        for name in sorted({n for argument in assignment.target.args for n in src.names_read(argument)} - {"self"}):
            yield where, name, assignment.target.lineno
        return
    if value is None and isinstance(assignment.stmt, (ast.For, ast.AsyncFor)):
        value = assignment.stmt.iter  # `for output, target in zip(outputs, targets):`
    if value is None:
        return
    # `x = self.combined()[self.position]`: an element of what the call returns.
    call = value.value if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call) else value
    if isinstance(call, ast.Call):
        callee = callee_of(where, call)
        if callee is not None:
            element = _element(assignment) if call is value else _index(value)
            yield from _returned(callee, element, _RETURNS_FOLLOWED)
            return
    for node in ast.walk(value):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and isinstance(node.slice, (ast.Constant, ast.UnaryOp)):
            yield where, src.canonical(node), assignment.stmt.lineno  # `losses_q[-1]`, `out["loss"]`
    names = src.names_read(value)
    if isinstance(assignment.stmt, ast.AugAssign) and isinstance(assignment.stmt.target, ast.Name):
        names = names | {assignment.stmt.target.id}  # `loss += penalty` reads `loss` too
    for name in sorted(names - {"self"}):
        known = where.values.get(name, None) if where.runs else None
        if not where.runs or name not in where.values or follow(known):
            yield where, name, assignment.stmt.lineno


# Returns of returns followed (`return outputs_losses(True, ..., self.data.losses_train)`).
_RETURNS_FOLLOWED = 4


def _returned(callee: Scope, element: int | None, depth: int):
    """(scope, name, row) for what `callee`'s returns read (item `element` of a returned tuple
    when given); a return that calls another function of the user's is followed into its returns,
    up to `depth` calls."""
    for returned in returns(callee):
        result = returned.value
        if element is not None and isinstance(result, ast.Tuple) and element < len(result.elts):
            result = result.elts[element]
        inner = callee_of(callee, result) if isinstance(result, ast.Call) and depth > 1 else None
        if inner is not None:
            yield from _returned(inner, element, depth - 1)
            continue
        # `return self.enriched_representations`: what the object keeps is followed too.
        kept = {src.canonical(n) for n in ast.walk(result) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id == "self"}
        for name in sorted(src.names_read(result)) + sorted(kept):
            yield callee, name, returned.lineno + 1


def _index(value: ast.expr) -> int | None:
    """1 for `step(...)[1]`."""
    index = value.slice if isinstance(value, ast.Subscript) else None
    return index.value if isinstance(index, ast.Constant) and isinstance(index.value, int) else None


def _may_carry(value) -> bool:
    """A value the loss may have been made from: a tensor without a graph, or a container."""
    if isinstance(value, torch.Tensor):
        return not value.requires_grad
    return isinstance(value, (list, tuple, dict))


def _element(assignment: src.Assignment) -> int | None:
    """1 for `ids, logits = ...` when the target is `logits`."""
    stmt = assignment.stmt
    targets = getattr(stmt, "targets", [getattr(stmt, "target", None)])
    for target in targets:
        if isinstance(target, ast.Tuple):
            for i, element in enumerate(target.elts):
                if element is assignment.target:
                    return i
    return None


def callee_of(where: Scope, call: ast.Call) -> Scope | None:
    """The scope of the user's function or method that `call` runs, called from `where`: a
    function of the file, `self.f(...)`, `obj.method(...)` or `model(...)` (its `forward`) on an
    object of the user's classes, the method looked up as Python does (`model.training_step`
    defined by a mixin the model's class derives from)."""
    helper = helper_called(call, where.node)
    # A function of the file, or `self.f(...)` (whose object is this scope's); another object's
    # method is found through that object's value below.
    if helper is not None and (isinstance(call.func, ast.Name) or src.canonical(call.func.value) == "self"):
        return Scope(where.source, helper, where.owner if isinstance(call.func, ast.Attribute) else None,
                     called_from=(where, call))
    func = call.func
    function = _function_of_user(runtime_value(where, func))
    if function is not None:
        return replace(function, called_from=(where, call)) if function.node is not None else None
    obj, method = runtime_value(where, func), "forward"
    if not isinstance(obj, torch.nn.Module) and isinstance(func, ast.Attribute):
        obj, method = runtime_value(where, func.value), func.attr
    if obj is None or isinstance(obj, (int, float, str, list, tuple, dict, torch.Tensor)):
        return None
    defining = next((k for k in type(obj).__mro__ if method in vars(k)), None)
    source, class_node = source_of_class(defining) if defining is not None else (None, None)
    if class_node is None:
        return None
    function = next((m for m in class_node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and m.name == method), None)
    return Scope(source, function, obj, called_from=(where, call)) if function is not None else None


def _function_of_user(value) -> Scope | None:
    """The scope of a function (or bound method) of the user's files that `value` is, with its
    closure's values and its object; a Scope with no node where it is another kind of function
    (a library's), None where `value` is no function."""
    function = value.__func__ if isinstance(value, types.MethodType) else value
    if not isinstance(function, types.FunctionType):
        return None
    code = function.__code__
    source = None if is_library_file(code.co_filename) else src.load(code.co_filename)
    node = src.function_for_code(source, code.co_name, code.co_firstlineno) if source is not None else None
    if node is None or node is source.tree:
        return Scope(source, None)
    cells = {}
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
    return Scope(source, node, getattr(value, "__self__", None), closure=cells)


def returns(scope: Scope) -> list[ast.Return]:
    """The `return` statements with a value of the scope's own function (not of those it nests)."""
    return [n for n in src.own_nodes(scope.node) if isinstance(n, ast.Return) and n.value is not None]


def runtime_value(where: Scope, expression: ast.AST):
    """The object `model` or `self.layer` is, when the scope's values or its `self` tell."""
    steps = []
    while isinstance(expression, ast.Attribute):
        steps.append(expression.attr)
        expression = expression.value
    if not isinstance(expression, ast.Name):
        return None
    if expression.id == "self" and where.owner is not None:
        obj = where.owner
    elif where.runs:
        obj = where.values.get(expression.id)
    elif expression.id in where.closure:
        obj = where.closure[expression.id]
    elif (passed := _argument_passed(where, expression.id)) is not None:
        # `losses_fn(...)`, a parameter: what the caller passed (`self.data.losses_train`).
        obj = runtime_value(*passed)
    elif not src.is_local(where.node, expression.id) and expression.id in (module := _module_values(where.source)):
        obj = module[expression.id]  # `bkd`, a class of the file
    else:
        # A function that has run: `model = self.agent.model` at its top names what `model` is.
        alias = src.last_assignment(where.node, expression.id, expression.lineno)
        value = alias.value if alias is not None and isinstance(alias.stmt, ast.Assign) else None
        if not (isinstance(value, ast.Attribute) and src.canonical(value).startswith("self.")):
            return None
        obj = runtime_value(where, value)
    for attribute in reversed(steps):
        try:
            obj = getattr(obj, attribute, None)
        except Exception:  # a user's property may raise anything
            return None
    return obj


def _module_values(source: src.Source) -> dict:
    """The globals of the loaded module whose file `source` is (`__main__` for the script), or
    an empty dict."""
    known = _module_names.get(source.filename)
    if known is None or known and getattr(sys.modules.get(known), "__file__", None) != source.filename:
        _module_names[source.filename] = next(
            (n for n, m in list(sys.modules.items())
             if isinstance(getattr(m, "__file__", None), str) and m.__file__ == source.filename), "")
    module = sys.modules.get(_module_names[source.filename])
    return vars(module) if module is not None else {}


# filename -> module name ("" where no module has that file), found by a scan of sys.modules.
_module_names: dict[str, str] = {}


def _argument_passed(where: Scope, name: str) -> tuple[Scope, ast.expr] | None:
    """(the calling scope, the argument) its caller passed for the parameter `name` of a function
    the value was returned from, or None."""
    if where.called_from is None or name not in src.parameter_names(where.node):
        return None
    scope, call = where.called_from
    argument = src.argument_for(where.node, call, name)
    return (scope, argument) if argument is not None else None


def live_scope(ctx, index: int) -> Scope | None:
    """The scope of the user's frame `index`, with its values, whose parameters lead to what the
    next frame out passed for them (`shards(shard_state, shard_size)` for `state`)."""
    frame = ctx.frames[index]
    source, node = ctx.frame_source(frame)
    if source is None:
        return None
    values = {**frame.f_globals, **frame.f_locals}

    def caller(name: str) -> tuple | None:
        passed = passed_in(ctx, index, name)
        if passed is None:
            return None
        outer, argument, stmt = passed
        return outer, src.canonical(argument), stmt.lineno

    return Scope(source, node, values.get("self"), values, caller=caller)


def passed_in(ctx, index: int, name: str) -> tuple | None:
    """(the caller's scope, the argument it passed, the statement of the call) for the parameter
    `name` of the user's frame `index`, read in the next frame out; None when `name` is not a
    parameter or the call is not found."""
    frame = ctx.frames[index]
    code = frame.f_code
    if not naming.is_argument(frame, name) or index + 1 >= len(ctx.frames):
        return None
    _, node = ctx.frame_source(frame)
    outer = live_scope(ctx, index + 1)
    stmt = src.innermost_statement(outer.node, ctx.frames[index + 1].f_lineno) if outer is not None else None
    if stmt is None or not hasattr(node, "args"):
        return None
    for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
        if _runs(outer, call, code):
            argument = src.argument_for(node, call, name)
            return (outer, argument, stmt) if argument is not None else None
    return None


def _runs(where: Scope, call: ast.Call, code) -> bool:
    """Whether `call` runs the function whose code is `code`: the function, the method, or the
    `__call__` / `forward` of the object it names."""
    value = runtime_value(where, call.func)
    if value is None:
        return False
    kind = type(value)
    candidates = (value, getattr(value, "__func__", None), getattr(kind, "__call__", None), getattr(kind, "forward", None))
    return any(getattr(c, "__code__", None) is code for c in candidates)
