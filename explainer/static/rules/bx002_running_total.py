"""BX002 running-total: a running total of losses kept as a tensor.

## What it does
Flags `total = total + loss` (or `total += loss`) inside a loop that calls `backward()`, where
`loss` carries autograd history and is not converted with `.item()`.

## Why is this bad?
`total` keeps the graph of every iteration alive: memory grows each step. If `total` is itself
back-propagated, the second backward goes through the first iteration's freed graph and raises
"Trying to backward through the graph a second time". The PyTorch FAQ names this pattern.

## Example
```python
total = 0
for x, y in batches:
    loss = loss_fn(model(x), y)
    total = total + loss
    total.backward()
```

## Use instead
```python
total = 0
for x, y in batches:
    loss = loss_fn(model(x), y)
    total = total + loss.item()
    loss.backward()
```
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes import accumulate_item
from ...reading import source as src
from ...reading.training import cuts_history, has_history, is_backward_call, training_loops, under_no_grad
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX002"
NAME = "running-total"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for training in training_loops(module.tree):
        for stmt in src.own_nodes(training.loop):
            term = _added_term(stmt)
            # A total adds up named values (`loss`); `y = y + w * x` is a recurrence: BX001.
            if not isinstance(term, (ast.Name, ast.Attribute)) or under_no_grad(stmt) or cuts_history(term):
                continue
            total = src.canonical(src.targets_of(stmt)[0])
            if not has_history(term, training.scope, stmt.lineno, ignore=total):
                continue
            receiver = _backward_receiver(training.loop, total)
            fix = accumulate_item.accumulate_with_item(
                module.source, total, src.Assignment(stmt, src.targets_of(stmt)[0]), receiver)
            target = src.targets_of(stmt)[0]
            yield module.diagnostic(
                CODE, target,
                f"`{module.source.segment(target)}` adds up `{module.source.segment(term)}` with its "
                f"autograd history: every iteration's graph stays alive"
                + (", and back-propagating the total goes through freed graphs" if receiver is not None else ""),
                fix)


def _added_term(stmt):
    """`loss` in `total = total + loss` / `total += loss`."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, (ast.Name, ast.Attribute)):
        return stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.BinOp) \
            and isinstance(stmt.value.op, ast.Add) and src.canonical(stmt.value.left) == src.canonical(stmt.targets[0]):
        return stmt.value.right
    return None


def _backward_receiver(loop, total):
    for node in src.own_nodes(loop):
        if is_backward_call(node) and isinstance(node.func, ast.Attribute) and src.canonical(node.func.value) == total:
            return node.func.value
    return None
