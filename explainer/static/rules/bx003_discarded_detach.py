"""BX003 discarded-detach: the result of `.detach()` is thrown away.

## What it does
Flags, inside a loop that calls `backward()`, `h.detach()` used as a statement, and
`h = h.detach()` where `h` is only the loop variable of `for h in hidden:`. (Outside training
loops `.detach()` is often a stream's or socket's, whose result may be dropped on purpose.)

## Why is this bad?
`detach()` returns a new tensor; it does not change `h`. The state keeps its autograd history, so
the next backward reaches into the previous iteration's freed graph ("Trying to backward through
the graph a second time"), or the graph grows without bound.

## Example
```python
for x, y in batches:
    hidden.detach()
    out, hidden = model(x, hidden)
```

## Use instead
```python
for x, y in batches:
    hidden = hidden.detach()
    out, hidden = model(x, hidden)
```
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes.edits import replace
from ...model import Fix
from ...reading import source as src
from ...reading.training import training_loops
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX003"
NAME = "discarded-detach"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    seen: set[int] = set()
    for training in training_loops(module.tree):
        for node in src.own_nodes(training.loop):
            if id(node) not in seen:
                seen.add(id(node))
                yield from _discarded(module, node)


def _discarded(module: CheckedModule, node: ast.AST) -> Iterator[Diagnostic]:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "detach" \
            and not node.value.args:
        receiver = module.source.segment(node.value.func.value)
        fix = Fix(f"Assign the detached tensor back: `{receiver} = {receiver}.detach()`",
                  (replace(module.source, node, f"{receiver} = {receiver}.detach()"),))
        yield module.diagnostic(CODE, node, f"`{module.source.segment(node.value)}` returns a new tensor "
                                f"that is thrown away: `{receiver}` keeps its history", fix)
    elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name):
        name = node.target.id
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == name \
                    and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
                    and stmt.value.func.attr == "detach":
                yield module.diagnostic(
                    CODE, stmt, f"`{name} = {name}.detach()` only re-binds the loop variable: "
                    f"`{module.source.segment(node.iter)}` still holds the tensors with history")
