"""BX001 carried-state: state re-assigned from itself with history, never detached.

## What it does
Flags a tensor that is re-assigned from its own previous value by something with autograd history
(`out, hidden = model(x, hidden)`, `Yest = Yest + w * X`, `self.hidden = ...self.hidden...` in a
module) inside a loop that calls `backward()` (or in a module method), when nothing detaches it.
Also flags the same state kept through another name: `new_h = cell(x, h)` ... `h = new_h`, and
a value with history kept for the next iteration's loss: `prev_loss = loss` after the backward,
read by the next iteration's objective. A value re-assigned after the backward
(`history = torch.cat([history, pred])`) is fixed by detaching the whole new value. Only state
that the loop's backward goes through counts: a copy kept for display or evaluation outputs are
left alone, and so is a name the pass re-binds (`output = model(data)`) before reading it.
`h = h.data` detaches, like `h = h.detach()`.

## Why is this bad?
The new value's history includes the old one, so each iteration's graph is linked to the previous
iteration's. The first `backward()` frees the old graph and the next one raises "Trying to
backward through the graph a second time". `retain_graph=True` only hides it: every backward then
goes through all earlier iterations (time and memory grow), and after `optimizer.step()` it fails
with "modified by an inplace operation".

## Example
```python
hidden = torch.zeros(1, 4, 8)
for x, y in batches:
    out, hidden = model(x, hidden)
    loss_fn(out, y).backward()
```

## Use instead
```python
hidden = torch.zeros(1, 4, 8)
for x, y in batches:
    out, hidden = model(x, hidden.detach())
    loss_fn(out, y).backward()
```
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes import detach_carried
from ...reading import dataflow
from ...reading import source as src
from ...reading.training import (
    backward_roots,
    carried_across_passes,
    detached_in,
    flows_into_backward,
    has_history,
    live_reads,
    operand_reads,
    reset_before,
    sees_previous_pass,
    training_loops,
    under_no_grad,
)
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX001"
NAME = "carried-state"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    seen: set[int] = set()
    # Innermost loops first: a statement is judged by the loop that repeats it most directly.
    loops = sorted(training_loops(module.tree), key=lambda t: -sum(1 for _ in src.ancestors(t.loop)))
    for training in loops:
        for node in src.own_nodes(training.loop):
            if isinstance(node, (ast.Assign, ast.AugAssign)) and id(node) not in seen:
                seen.add(id(node))
                yield from _carried(module, node, training.scope, training.loop)
    for method in _module_methods(module.tree):
        for node in src.own_nodes(method):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                yield from _carried(module, node, method, None, attributes_only=True)


def _carried(module, stmt, scope, loop, attributes_only=False) -> Iterator[Diagnostic]:
    for target in src.targets_of(stmt):
        expression = src.canonical(target)
        if attributes_only and not expression.startswith("self."):
            continue
        if not carried_across_passes(stmt, target, scope, loop if loop is not None else scope):
            if loop is not None:
                yield from _carried_through_a_name(module, stmt, target, expression, scope, loop)
            continue
        if loop is not None and not _reaches_a_later_backward(loop, expression):
            continue
        if loop is not None and _is_running_total(stmt, expression):
            continue  # BX002's business
        text = module.source.segment(target)
        fix = _fix(module, stmt, target, expression, scope, loop)
        yield module.diagnostic(
            CODE, target,
            f"`{text}` is re-assigned from itself with autograd history and never detached: each "
            f"backward reaches into the previous iteration's freed graph", fix)


def _carried_through_a_name(module, stmt, target, expression, scope, loop) -> Iterator[Diagnostic]:
    """`new_h = cell(x, h)` ... `h = new_h`: the loop keeps a value made from the old state."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or under_no_grad(stmt):
        return
    if not any(read.lineno < stmt.lineno for read in src.reads(loop, expression)):
        return  # nothing in the loop reads the old value before it is replaced
    made_from_old = next((a for a in dataflow.ancestors(stmt.value, scope, stmt.lineno)
                          if a.value is not None and a.stmt is not stmt and src.inside(a.stmt, loop)
                          and live_reads(a.value, expression)), None)
    if made_from_old is None:
        yield from _kept_for_the_next_pass(module, stmt, target, expression, scope, loop)
        return
    if not has_history(made_from_old.value, scope, made_from_old.line, ignore=expression):
        return
    if not _reaches_a_later_backward(loop, expression):
        return
    if detached_in(loop, expression) or reset_before(loop, made_from_old.stmt, expression):
        return
    text = module.source.segment(target)
    is_tuple = _initial_is_tuple(scope, expression, stmt.lineno)
    yield module.diagnostic(
        CODE, target,
        f"`{text}` is re-assigned from `{module.source.segment(stmt.value)}`, made from `{text}` at "
        f"line {made_from_old.line} with autograd history, and never detached: each backward "
        f"reaches into the previous iteration's freed graph",
        detach_carried.keep_detached(module.source, expression, stmt, is_tuple))


def _kept_for_the_next_pass(module, stmt, target, expression, scope, loop) -> Iterator[Diagnostic]:
    """`prev_loss = loss` (or `self.last_output = out`) while this pass's backward reads the
    previous pass's `prev_loss`: the kept value's graph is freed before the next pass uses it."""
    if not has_history(stmt.value, scope, stmt.lineno, strict=True):
        return
    if not backward_roots(loop) or not _reaches_a_later_backward(loop, expression):
        return
    if detached_in(loop, expression) or reset_before(loop, stmt, expression):
        return
    text, kept = module.source.segment(target), module.source.segment(stmt.value)
    yield module.diagnostic(
        CODE, target,
        f"`{text}` keeps `{kept}`, which has autograd history, for the next iteration, and the "
        f"next iteration's backward goes through it: this iteration's backward has freed that graph",
        detach_carried.keep_detached(module.source, expression, stmt, False))


def _reaches_a_later_backward(loop, expression) -> bool:
    """Whether a backward of `loop` goes through the value `expression` kept from the previous
    pass (read as an operand, not cut, before the pass re-binds it). A loop whose backward runs
    in a helper shows no roots here and is given the benefit of the doubt."""
    if not backward_roots(loop):
        return True

    def carried_reads(node, name):
        live = {id(read) for read in live_reads(node, name)}
        return [read for read in operand_reads(node, name)
                if id(read) in live and sees_previous_pass(read, name, loop)]

    return flows_into_backward(loop, expression, reads=carried_reads)


def _is_running_total(stmt, expression) -> bool:
    """`total = total + loss` or `total += loss`."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.op, ast.Add) and isinstance(stmt.value, (ast.Name, ast.Attribute))
    value = stmt.value
    return isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and src.canonical(value.left) == expression \
        and isinstance(value.right, ast.Name)


def _fix(module, stmt, target, expression, scope, loop):
    is_tuple = _initial_is_tuple(scope, expression, stmt.lineno)
    if loop is None:
        class_node = src.parent(scope)
        found = detach_carried.fixes_for_module_state(
            module.source, src.Assignment(stmt, target), expression, is_tuple,
            class_node if isinstance(class_node, ast.ClassDef) else None)
        return next((f for f in found if f is not None), None)
    may_be_none = detach_carried.starts_as_none(scope, expression, loop)
    # A state that starts as None shows no shape; an LSTM's is an (h, c) tuple.
    is_tuple = is_tuple or (may_be_none and detach_carried.makes_lstm(module.tree))
    if any(call.lineno < stmt.lineno for call, _ in backward_roots(loop)):
        # Re-assigned after this pass's backward (`history = torch.cat([history, pred])`): the
        # whole new value goes to the next pass without history, not only the old part of it.
        fix = detach_carried.keep_detached(module.source, expression, stmt, is_tuple)
        if fix is not None:
            return fix
    if isinstance(stmt.value, ast.Call) and not may_be_none:
        fix = detach_carried.detach_where_read(module.source, expression, src.Assignment(stmt, target), is_tuple)
        if fix is not None:
            return fix
    return detach_carried.detach_at_loop_entry(module.source, expression, loop, is_tuple, may_be_none)


def _initial_is_tuple(scope, expression, before) -> bool:
    earlier = [a for a in src.assignments(scope, expression) if a.stmt.lineno < before]
    return bool(earlier) and isinstance(src.value_of(earlier[0].stmt), ast.Tuple)


def _module_methods(tree):
    """`forward` of classes that define one: state re-assigned there lives across calls."""
    for node in src.all_nodes(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(m, ast.FunctionDef) and m.name == "forward" for m in node.body
        ):
            yield from (m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "forward")
