"""BX008 retained-across-iterations: `retain_graph=True` in a loop whose graph spans iterations.

## What it does
Flags `backward(retain_graph=True)` inside a training loop when the loss depends on a tensor
whose history reaches into earlier iterations: a state re-assigned from itself without
`.detach()`, or a tensor with history computed before the loop.

## Why is this bad?
Without `retain_graph=True` the second iteration raises "Trying to backward through the graph a
second time". With it, nothing is ever freed: every iteration's graph stays chained to the next,
each backward goes through all earlier iterations, and time and memory grow until training
crawls. After an `optimizer.step()` the old graph also holds stale weights, which ends in
"modified by an inplace operation".

## Example
```python
for step in range(steps):
    for t in range(horizon):
        estimate = estimate + w * x
    loss = ((y - estimate) ** 2).mean()
    loss.backward(retain_graph=True)
    optimizer.step()
```

## Use instead
```python
for step in range(steps):
    estimate = estimate.detach()
    for t in range(horizon):
        estimate = estimate + w * x
    loss = ((y - estimate) ** 2).mean()
    loss.backward()
    optimizer.step()
```
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes import detach_carried, graph_options, move_into_loop
from ...model import Fix
from ...reading import source as src
from ...reading.dataflow import Ancestor, ancestors, backward_calls, carries_history
from ...reading.training import carried_across_passes, training_loops
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX008"
NAME = "retained-across-iterations"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for training in training_loops(module.tree):
        for backward in backward_calls(training.loop):
            keyword = backward.keyword("retain_graph")
            if keyword is None or not backward.retains_graph():
                continue
            for ancestor in ancestors(backward.root, training.scope, backward.line):
                spanning = _spans_iterations(ancestor, training.scope, training.loop)
                if spanning is not None:
                    yield _diagnostic(module, backward, keyword, ancestor, spanning, training.loop)
                    break


def _spans_iterations(ancestor: Ancestor, scope, loop) -> str | None:
    """"carried" or "made before the loop" when `ancestor`'s history outlives one iteration."""
    inside = loop.lineno <= ancestor.line <= loop.end_lineno
    if inside:
        if carried_across_passes(ancestor.stmt, ancestor.target, scope, loop):
            return "carried"
        return None
    if ancestor.line < loop.lineno and isinstance(ancestor.target, ast.Name) and carries_history(ancestor, scope) \
            and not src.assignments(loop, ancestor.expression, deep=True):
        return "made before the loop"
    return None


def _diagnostic(module, backward, keyword: ast.keyword, ancestor: Ancestor, spanning: str, loop) -> Diagnostic:
    source = module.source
    name = source.segment(ancestor.target)
    if spanning == "carried":
        cause = f"`{name}` (line {ancestor.line}) is carried from one iteration to the next without `.detach()`"
        cure = detach_carried.detach_at_loop_entry(
            source, ancestor.expression, loop, isinstance(ancestor.value, ast.Tuple))
    else:
        cause = f"`{name}` (line {ancestor.line}) is computed once, before the loop"
        cure = move_into_loop.move_into_body(source, ancestor.stmt, loop, ancestor.expression)
    drop = graph_options.drop_keyword(source, backward.call, "retain_graph")
    fix = None
    if cure is not None and drop is not None:
        fix = Fix(f"{cure.message}, and drop `retain_graph=True`: each backward then frees its own graph",
                  cure.edits + (drop,))
    message = (f"`retain_graph=True` keeps every iteration's graph alive: {cause}, so each backward "
               f"goes through all earlier iterations and time and memory grow")
    return module.diagnostic(CODE, keyword, message, fix)
