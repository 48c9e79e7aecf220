"""Undo what cut the graph before a backward: `.detach()`, `torch.no_grad()`."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading.source import Source, assignments, canonical, enclosing_function, parent
from .edits import delete_lines, imports_torch, insert_lines_before, node_end, replace, statement_text
from .graph_options import insert_keyword
from .recompute_forward import last_step_before, zero_grad_again


def recompute_instead_of_detach(source: Source, scope: ast.AST, stmt: ast.stmt, name: str) -> Fix | None:
    """`output = output.detach()` after a backward: run the forward again instead."""
    earlier = [a for a in assignments(scope, name) if a.stmt.lineno < stmt.lineno
               and "detach" not in ast.unparse(a.stmt)]
    if not earlier or not isinstance(earlier[-1].stmt, ast.Assign):
        return None
    previous = earlier[-1].stmt
    indent = source.indent_of(stmt.lineno)
    step_row = last_step_before(scope, stmt.lineno)
    zeroing = zero_grad_again(scope, step_row, stmt.lineno, stmt) if step_row and step_row > previous.lineno else []
    text = ("\n" + indent).join([*zeroing, *statement_text(source, previous)])
    return Fix(f"Recompute `{name}` with a fresh forward instead of detaching it: the detached "
               f"value has no graph for the next backward", (replace(source, stmt, text),))


def remove_detach(source: Source, call: ast.Call) -> Fix | None:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr in ("detach", "item", "numpy")):
        return None
    inner = source.segment(call.func.value)
    return Fix(f"Remove `.{call.func.attr}()`: it cuts the graph the backward needs",
               (replace(source, call, inner),))


def keep_compared(source: Source, compare: ast.Compare) -> Fix | None:
    """`(torch.softmax(logits, 1) > 0.5).float()` -> `(torch.softmax(logits, 1)).float()`: the
    values compared, not the 0/1 mask (clDice's maintainer: "you should not convert the output to
    a binary mask"). Safe where the mask is made a float at once, so what reads it gets a tensor
    of the same shape and type; unsafe where the mask is read as booleans."""
    if len(compare.comparators) != 1 or not isinstance(compare.comparators[0], (ast.Constant, ast.UnaryOp)):
        return None
    holder = parent(compare)
    call = parent(holder) if holder is not None else None
    made_float = isinstance(holder, ast.Attribute) and holder.attr in ("float", "double", "half") \
        and isinstance(call, ast.Call) and call.func is holder and not call.args
    kept = source.segment(compare.left)
    threshold = ast.unparse(compare).removeprefix(ast.unparse(compare.left)).strip()
    return Fix(f"Train on `{kept}` itself, not on the 0/1 mask that `{threshold}` makes of it: a comparison "
               f"has no gradient", (replace(source, compare, kept),), "safe" if made_float else "unsafe")


def keep_past_helper(source: Source, call: ast.Call, key: object) -> Fix | None:
    """ride's `return detach_to_cpu({"loss": metrics[loss_key], **metrics, ...})`, with the caller
    reading `["loss"]`: `{**detach_to_cpu({...}), "loss": metrics[loss_key]}`, every value cut as
    before but the one the backward reads, given back as it was (in its place: a key that is
    there already keeps its position in the dict). Offered only where that value is a plain read
    (a name, attribute or subscript), so reading it twice changes nothing."""
    argument = call.args[0] if len(call.args) == 1 and not call.keywords else None
    if key is None or not isinstance(argument, ast.Dict):
        return None
    item = next(((k, v) for k, v in zip(argument.keys, argument.values)
                 if isinstance(k, ast.Constant) and k.value == key), None)
    if item is None or any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr, ast.Yield)) for n in ast.walk(item[1])):
        return None
    written, value = source.segment(item[0]), source.segment(item[1])
    return Fix(f"Give {written} back uncut after `{canonical(call.func)}()`: it cuts every value of the dict from "
               f"the graph, the loss the backward needs included",
               (replace(source, call, f"{{**{source.segment(call)}, {written}: {value}}}"),))


def use_the_output(source: Source, stmt: ast.Assign, output: str) -> Fix | None:
    """`loss = F.mse_loss(data.x, data.x)` where `out = model(data)` is never read: the model's
    output in place of the loss's first argument, the prediction by the convention of torch's
    losses. Unsafe: what the output should be compared with is the user's to say (PyG's
    maintainer compared it with `data.y`)."""
    call = stmt.value
    if not isinstance(call, ast.Call) or not call.args or isinstance(call.args[0], ast.Starred):
        return None
    first = source.segment(call.args[0])
    return Fix(f"Compute the loss from `{output}`, the model's output that nothing reads, in place of `{first}`, "
               f"and check what it should be compared with", (replace(source, call.args[0], output),), "unsafe")


def constants_require_grad(source: Source, factories: list[ast.Call]) -> Fix | None:
    """`torch.tensor(0, dtype=torch.float32)` -> `torch.tensor(0, dtype=torch.float32,
    requires_grad=True)` for each constant a loss can be made of alone (nanodet's maintainer):
    a leaf the backward can start from, which gives no parameter a gradient."""
    if not factories:
        return None
    edits = tuple(replace(source, call, f"{source.segment(call)[:-1].rstrip()}, requires_grad=True)")
                  for call in factories)
    return Fix("Make the constant loss terms require grad (`requires_grad=True`): a loss made only of them then "
               "back-propagates, and no parameter gets a gradient from it", edits)


def stack_instead_of_rewrap(source: Source, calls: list[ast.Call]) -> Fix | None:
    """`torch.tensor([0, grad.amplitude], device=DEVICE)` -> `torch.stack([torch.as_tensor(0,
    device=DEVICE), torch.as_tensor(grad.amplitude, device=DEVICE)])`, for each call: the same
    values, and those that are tensors keep their graph (pulseq-zero's `join`). Unsafe where a
    call names no device: its numbers would then be made on the CPU beside a tensor that may be
    elsewhere. None where a call has another form than one list or tuple and keywords
    `as_tensor` takes."""
    edits = []
    for call in calls:
        elements = call.args[0].elts if len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple)) else None
        if not elements or any(isinstance(e, ast.Starred) for e in elements) \
                or any(k.arg not in ("dtype", "device") for k in call.keywords):
            return None
        keywords = "".join(f", {source.segment(k)}" for k in call.keywords)
        parts = ", ".join(f"torch.as_tensor({source.segment(e)}{keywords})" for e in elements)
        edits.append(replace(source, call, f"torch.stack([{parts}])"))
    return Fix("Stack the values with `torch.stack([torch.as_tensor(...), ...])` instead of copying them with "
               "`torch.tensor([...])`: the copy has no graph, so what trains never gets a gradient from them",
               tuple(edits), "safe" if all(any(k.arg == "device" for k in c.keywords) for c in calls) else "unsafe") \
        if edits else None


def stack_instead_of_copy(source: Source, call: ast.Call, copied: ast.expr, scalars: bool) -> Fix | None:
    """`bkd.as_tensor(l)` -> `torch.stack(l)`: the same values, one tensor, with their graph
    (deepxde's maintainers: `bkd.stack(loss, 0)`). Safe where every item is known to be a loss
    reduced to one number (`scalars`); otherwise an item may be a number or a one-element tensor
    of another shape, which the copy takes and `stack` does not. None where the file does not
    import torch."""
    if not imports_torch(source):
        return None
    return Fix(f"Stack the values with `torch.stack` instead of copying them with `{source.segment(call.func)}`: "
               f"the copy has no graph, so what trains never gets a gradient from them",
               (replace(source, call, f"torch.stack({source.segment(copied)})"),), "safe" if scalars else "unsafe")


def remove_data(source: Source, attribute: ast.Attribute) -> Fix:
    """`torch.stack(logits, 1).data` -> `torch.stack(logits, 1)`."""
    return Fix("Remove `.data`: it returns the tensor without its graph, which the backward needs",
               (replace(source, attribute, source.segment(attribute.value)),))


def run_before_block(source: Source, with_stmt: ast.With, statements: list[ast.stmt]) -> Fix | None:
    """Move the statements of a `with torch.no_grad():` block that the loss comes from before the
    block, in their order; the rest (metrics) stays without a graph."""
    moved = sorted(statements, key=lambda s: s.lineno)
    if not all(any(s is b for b in with_stmt.body) for s in moved):
        return None
    lines = [line for stmt in moved for line in statement_text(source, stmt)]
    names = ", ".join(f"`{source.segment(s.targets[0] if isinstance(s, ast.Assign) else s.target)}`"
                      for s in moved if isinstance(s, (ast.Assign, ast.AugAssign)))
    return Fix(f"Compute {names} before `with torch.no_grad():`, with autograd on: the loss needs "
               f"their graph, and the block's other statements still record none",
               (insert_lines_before(source, with_stmt, lines), *(delete_lines(source, s) for s in moved)))


def enable_grad_around(source: Source, stmt: ast.stmt) -> Fix:
    """`loss = closure()` in an optimizer's `@torch.no_grad()` step: run it with autograd on, as
    torch.optim's own optimizers do."""
    indent = source.indent_of(stmt.lineno)
    body = ("\n" + indent + "    ").join(statement_text(source, stmt))
    return Fix(f"Run `{source.segment(stmt)}` under `torch.enable_grad()`: it computes the loss, and "
               f"autograd is off around it", (replace(source, stmt, f"with torch.enable_grad():\n{indent}    {body}"),))


def differentiate_with_grad_on(source: Source, statements: list[ast.stmt], inputs: list[str]) -> Fix:
    """torchdiffeq's `ODEFunc.forward` takes `autograd.grad(y, x, create_graph=True)` of its own
    output, and the adjoint solves the ODE inside an `autograd.Function`'s forward, which runs
    without a graph by design: the function turns autograd on for itself, around the statements from its output's
    making to the gradient, as torchdiffeq's author advised (rtqichen/torchdiffeq#154). The
    `inputs` given without a graph are first made a copy that requires grad, so the gradient is
    taken for what the caller passed. The values computed are the same: safe."""
    first, last = statements[0], statements[-1]
    indent = source.indent_of(first.lineno)
    body = [f"{indent}    {name} = {name}.clone().requires_grad_(True)\n" for name in inputs]
    body += [f"    {source.line(row)}\n" if source.line(row).strip() else "\n"
             for row in range(first.lineno, last.end_lineno + 1)]
    names = ", ".join(f"`{source.segment(s.targets[0])}`" for s in statements if isinstance(s, ast.Assign))
    return Fix(f"Turn autograd on for {names} inside `{enclosing_function(first).name}` "
               f"(`with torch.enable_grad():`): it differentiates its own output, and its caller runs it with "
               f"autograd off", (Edit(source.filename, f"{indent}with torch.enable_grad():\n" + "".join(body),
                                      Location(first.lineno, 1), Location(last.end_lineno + 1, 1)),))


def evaluate_without_inference_mode(source: Source, call: ast.Call, keyword: str, name: str, on: str,
                                    forward: tuple[Source, ast.stmt] | None, applicability: str) -> Fix:
    """Build the object whose evaluation runs under `torch.inference_mode()` with `keyword=False`
    (Lightning's `Trainer(inference_mode=False)`, the fix pinns-torch's thread settled on): it
    then evaluates under `torch.no_grad()`, which `on` (`torch.enable_grad()`) inside turns back
    on. `forward`: the statement to run under `torch.enable_grad()` too, where nothing inside
    turns autograd back on."""
    given = next((k for k in call.keywords if k.arg == keyword), None)
    edits = [replace(source, given.value, "False") if given is not None else insert_keyword(source, call, f"{keyword}=False")]
    if forward is not None:
        edits.append(enable_grad_around(*forward).edits[0])
    return Fix(f"Build `{name}` with `{keyword}=False`: it then evaluates under `torch.no_grad()`, which "
               f"`{on}` turns back on, instead of `torch.inference_mode()`, which nothing inside it can leave",
               tuple(edits), applicability)


def no_grad_for_inference_mode(source: Source, call: ast.Call, on: str, forward: tuple[Source, ast.stmt] | None) -> Fix:
    """`torch.inference_mode()` -> `torch.no_grad()` where the evaluation that needs a graph
    enters it; `forward` as for `evaluate_without_inference_mode`."""
    edits = [replace(source, call, source.segment(call.func).rsplit(".", 1)[0] + ".no_grad()"
                     if isinstance(call.func, ast.Attribute) else "torch.no_grad()")]
    if forward is not None:
        edits.append(enable_grad_around(*forward).edits[0])
    return Fix(f"Evaluate under `torch.no_grad()` instead of `torch.inference_mode()`: `{on}` turns autograd back "
               f"on under the first, and nothing inside the second can leave it", tuple(edits))


def leave_no_grad(source: Source, with_stmt: ast.With) -> Fix | None:
    if len(with_stmt.items) != 1 or "no_grad" not in canonical(with_stmt.items[0].context_expr) \
            and "inference_mode" not in canonical(with_stmt.items[0].context_expr):
        return None
    indent = source.indent_of(with_stmt.lineno)
    body_lines = []
    for stmt in with_stmt.body:
        body_lines.extend(statement_text(source, stmt))
    text = ("\n" + indent).join(body_lines)
    return Fix("Run this forward with autograd on: under `torch.no_grad()` it records no graph",
               (replace(source, with_stmt, text),))


def remove_decorator(source: Source, function: ast.AST, decorator: ast.expr) -> Fix:
    """Drop `@torch.no_grad()` from a function the training step calls. Unsafe: its other
    callers (evaluation) then build graphs too, and `.numpy()` on their results fails."""
    return Fix(f"Remove `@{source.segment(decorator)}` from `{function.name}` (line {decorator.lineno}): "
               f"every call of it, this training one included, records no graph; where a caller "
               f"wants none, wrap that call in `with torch.no_grad():`",
               (delete_lines(source, decorator),), "unsafe")


def scope_the_switch(source: Source, function: ast.AST, stmt: ast.stmt, call: ast.Call) -> Fix | None:
    """`torch.set_grad_enabled(False)` opening an evaluation helper (`check_accuracy`): run the
    helper under `@torch.no_grad()` instead, which turns autograd back on when it returns. Only
    where the switch comes first (the decorator would also cover what ran before it) and the
    helper does more than switch (a helper that only switches means to)."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if len(body) < 2 or body[0] is not stmt:
        return None
    if isinstance(call.func, ast.Attribute):
        torch = canonical(call.func.value).split(".")[0]  # `torch`, or the name it is imported as
    elif imports_torch(source):
        torch = "torch"
    else:
        return None
    return Fix(f"Run `{function.name}` under `@{torch}.no_grad()` instead of `{source.segment(stmt)}`: the "
               f"decorator turns autograd back on when `{function.name}` returns",
               (insert_lines_before(source, function, [f"@{torch}.no_grad()"]), delete_lines(source, stmt)))


def enable_grad_before(source: Source, stmt: ast.stmt, switch: str, on: str) -> Fix:
    """Turn autograd back on before the forward with `on`, the call that turned it off given True
    (the maintainers' fix of tbd-nets' `check_accuracy`, at the start of `train_epoch`)."""
    return Fix(f"Turn autograd back on with `{on}` before this forward: `{switch}` left it off",
               (insert_lines_before(source, stmt, [on]),))


def remove_cuts(source: Source, cuts: list) -> Fix | None:
    """Pass the arguments with their graph: `f(y_pred.detach(), y.detach())` -> `f(y_pred, y)`.
    Unsafe: whatever keeps `f`'s result now keeps its graph too."""
    if not cuts:
        return None
    written = " and ".join(f"`{source.segment(c)}`" for c in cuts)
    return Fix(f"Pass {written} without the cut: the function they are passed to differentiates them",
               tuple(replace(source, c, source.segment(c.func.value if isinstance(c, ast.Call) else c.value))
                     for c in cuts), "unsafe")


def keep_returned(source: Source, function: ast.AST, cuts: list, passed_once: bool) -> Fix | None:
    """`return ut.detach(), div.detach()` in a function passed to a solver: return the values
    with their graph, and keep it in what they are added up from (`div += g.detach()`). Safe
    only where the function is passed to that one call (`passed_once`): its results then go
    only where the loss is made; otherwise whatever else keeps them now keeps their graph too."""
    if not cuts:
        return None
    return Fix(f"Return what `{function.name}()` computes with its graph: the loss is made of it",
               tuple(replace(source, c, source.segment(c.func.value if isinstance(c, ast.Call) else c.value))
                     for c in cuts), "safe" if passed_once else "unsafe")


def detach_the_result_instead(source: Source, stmt: ast.stmt, cuts: list, callee: ast.AST | None) -> Fix | None:
    """`average_loss = self._loss_fn(y_pred.detach(), y.detach())`, where `_loss_fn` is a gradient
    penalty that differentiates its arguments: cut its result instead, `self._loss_fn(y_pred,
    y).detach()` (ignite's own fix). What the statement keeps has no graph, as before, and the
    function gets the graph it needs. Only where every cut is an argument of the one call the
    statement assigns, and the cuts are `.detach()` (`.data` shares no such result). Unsafe unless
    `callee`, the function the call runs, returns a tensor on every path (`.detach()` of anything
    else fails)."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, ast.Assign) or not isinstance(value, ast.Call) \
            or not all(isinstance(c, ast.Call) and any(c is a for a in [*value.args, *(k.value for k in value.keywords)])
                       for c in cuts):
        return None
    at_end = node_end(source, value)
    return Fix(f"Detach the result of `{source.segment(value.func)}(...)` instead of its arguments: it "
               f"differentiates them, and `{source.segment(stmt.targets[0])}` is still kept without a graph",
               tuple(replace(source, c, source.segment(c.func.value)) for c in cuts)
               + (Edit(source.filename, ".detach()", at_end, at_end),),
               "safe" if callee is not None and _returns_a_tensor(callee) else "unsafe")


# Tensor methods and torch functions whose result is a tensor (`((norm - 1) ** 2).mean()`).
_TENSOR_RESULTS = frozenset({"mean", "sum", "div", "mul", "add", "sub", "pow", "norm", "abs", "sqrt", "exp", "log",
                             "clamp", "view", "reshape", "squeeze", "unsqueeze", "flatten"})


def _returns_a_tensor(function: ast.AST) -> bool:
    """Every `return` of `function` (its own, not a nested def's) gives a tensor, as far as its
    text shows: a tensor method or a `torch.` / `F.` call, or arithmetic on one."""
    def tensor(node) -> bool:
        if isinstance(node, ast.BinOp):
            return tensor(node.left) or tensor(node.right)
        if isinstance(node, ast.UnaryOp):
            return tensor(node.operand)
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            return False
        return node.func.attr in _TENSOR_RESULTS or canonical(node.func.value).split(".")[0] in ("torch", "F")
    returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and enclosing_function(n) is function]
    return bool(returns) and all(r.value is not None and tensor(r.value) for r in returns)


def keep_trainable(source: Source, freeze: ast.stmt, module: str, applicability: str) -> Fix:
    """Drop the statement that froze `module` before a forward whose output a later loss trains
    it with (SRGAN-PyTorch's discriminator step freezing the generator that makes `sr`), as the
    maintainers' rewrite did. Safe where, until the module is trainable again, its output is
    only read detached: nothing else back-propagates into it meanwhile."""
    return Fix(f"Keep `{module}` trainable here: drop `{source.segment(freeze).splitlines()[0].strip()}` "
               f"(line {freeze.lineno}), which freezes its parameters before it makes what a later loss "
               f"trains it with", (delete_lines(source, freeze),), applicability)
