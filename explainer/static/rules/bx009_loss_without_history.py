"""BX009 loss-without-history: a loss computed only from detached values is back-propagated.

## What it does
Flags the value that cut a loss off its graph (a forward under `torch.no_grad()`, a call to a
helper decorated with `@torch.no_grad()`, or `x = x.detach()`) when `backward()` is then called
on a loss computed only from such values and data.

## Why is this bad?
The loss has no `grad_fn`, so `backward()` raises "element 0 of tensors does not require grad
and does not have a grad_fn". The usual quick fix, `loss.requires_grad = True`, silences the
error but trains nothing: the gradient stops at the loss and never reaches the model.

## Example
```python
with torch.no_grad():
    out = model(x)
loss = mse_loss(out, y)
loss.backward()
```

## Use instead
```python
out = model(x)
loss = mse_loss(out, y)
loss.backward()
```
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes import undo_cut
from ...reading import source as src
from ...reading.dataflow import Ancestor, ancestors, backward_calls
from ...reading.training import called_without_graph, cuts_history, has_history, scopes, under_no_grad
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX009"
NAME = "loss-without-history"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for scope in scopes(module.tree):
        for backward in backward_calls(scope):
            if backward.api != "backward" or under_no_grad(backward.call):
                continue
            if has_history(backward.root, scope, backward.line):
                continue  # the lenient form: any call the file can't see into may be a model
            cut = _cut(backward, scope)
            if cut is not None:
                yield _diagnostic(module, scope, backward, *cut)


def _cut(backward, scope) -> tuple[Ancestor, str] | None:
    """The assignment that removed the history the loss would otherwise have: nearest first."""
    for ancestor in ancestors(backward.root, scope, backward.line):
        value = ancestor.value
        if value is None:
            continue
        if under_no_grad(ancestor.stmt) and has_history(value, scope, ancestor.line, ignore=""):
            return ancestor, "no_grad"
        if cuts_history(value) and _cut_receiver_has_history(value, scope, ancestor.line):
            return ancestor, "detach"
        if called_without_graph(value, scope) is not None:
            return ancestor, "decorated"
    return None


def _cut_receiver_has_history(value: ast.expr, scope, line: int) -> bool:
    """`out.detach()` of an `out` with history (not `torch.zeros(...)`)."""
    node = value
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr in ("detach", "item", "tolist", "numpy") \
        and has_history(node.func.value, scope, line)


def _diagnostic(module, scope, backward, ancestor: Ancestor, how: str) -> Diagnostic:
    source = module.source
    name = source.segment(ancestor.target)
    loss = source.segment(backward.root)
    if how == "no_grad":
        cause = f"`{name}` is computed under `torch.no_grad()` (line {ancestor.line})"
    elif how == "decorated":
        function, decorator = called_without_graph(ancestor.value, scope)
        cause = (f"`{name}` (line {ancestor.line}) comes from `{function.name}()`, which runs under "
                 f"`@{source.segment(decorator)}` (line {decorator.lineno})")
    else:
        cause = f"`{name}` is detached at line {ancestor.line}"
    message = (f"{cause}, and `{loss}` is computed only from it and data: `{source.segment(backward.call)}` "
               f"(line {backward.line}) has no graph to go through ('does not require grad')")
    return module.diagnostic(CODE, ancestor.target, message, _fix(source, scope, ancestor, how))


def _fix(source, scope, ancestor: Ancestor, how: str):
    """The runtime's fixes for the same cut: leave the `no_grad` block, or recompute / keep the
    value instead of detaching it."""
    if how == "no_grad":
        block = next((a for a in src.ancestors(ancestor.stmt) if isinstance(a, (ast.With, ast.AsyncWith))
                      and any("no_grad" in src.canonical(i.context_expr) or "inference_mode" in src.canonical(i.context_expr)
                              for i in a.items)), None)
        return undo_cut.leave_no_grad(source, block) if isinstance(block, ast.With) else None
    if how == "decorated":
        return undo_cut.remove_decorator(source, *called_without_graph(ancestor.value, scope))
    call = ancestor.value
    while isinstance(call, ast.Subscript):
        call = call.value
    if src.canonical(call.func.value) == ancestor.expression:
        recomputed = undo_cut.recompute_instead_of_detach(source, scope, ancestor.stmt, ancestor.expression)
        if recomputed is not None:
            return recomputed
    return undo_cut.remove_detach(source, call)
