"""BX005 stored-history: tensors with history kept in a container that outlives the iteration.

## What it does
Flags `memory.append(h)` / `cache["prev"] = out` inside a loop that calls `backward()`, when the
container was made before the loop, the stored value has autograd history, and later forwards in
the loop read the container.

## Why is this bad?
Each stored tensor keeps the graph of the step that made it. The first `backward()` frees that
graph; the next step reads the stored tensor and back-propagates into it: "Trying to backward
through the graph a second time". With `retain_graph=True` it runs, but every step goes back
through all earlier ones, and memory grows with the container.

## Example
```python
memory = []
for x, y in batches:
    h = encoder(x)
    if memory:
        h = h + torch.stack(memory).mean(0)
    memory.append(h)
    loss_fn(head(h), y).backward()
```

## Use instead
```python
memory = []
for x, y in batches:
    h = encoder(x)
    if memory:
        h = h + torch.stack(memory).mean(0)
    memory.append(h.detach())
    loss_fn(head(h), y).backward()
```

When the loss reaches the stored tensors only through the container (REINFORCE's
`-torch.stack(log_probs).sum() * episode_return`), detaching them would leave it nothing to
train: the fix empties the container after the backward that consumed it
(`log_probs.clear()`).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...fixes import detach_carried, empty_container
from ...reading import source as src
from ...reading.training import (
    backward_inputs,
    backward_roots,
    cuts_history,
    flows_into_backward,
    has_history,
    operand_reads,
    training_loops,
)
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX005"
NAME = "stored-history"
_STORES = ("append", "extend", "insert", "appendleft")
_LOOKUPS = ("get", "pop", "values", "items")


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for training in training_loops(module.tree):
        loop, scope = training.loop, training.scope
        for node in src.own_nodes(loop):
            store = _store(node)
            if store is None:
                continue
            container, value = store
            name = src.canonical(container)
            if not isinstance(container, ast.Name) or cuts_history(value) \
                    or not _made_before(scope, name, loop) or _reset_in(loop, name):
                continue
            if not has_history(value, scope, node.lineno, strict=True) \
                    or not flows_into_backward(loop, name, reads=_container_reads):
                continue
            statement = node if isinstance(node, ast.stmt) else src.statement_of(node)
            consumer = _backward_fed_only_through(loop, name, value)
            if consumer is not None:
                # Detaching at the store would leave that loss nothing to train.
                fix = empty_container.empty_after_backward(module.source, consumer, module.source.segment(container))
            else:
                fix = detach_carried.detach_stored_value(module.source, node, module.source.segment(container))
            yield module.diagnostic(
                CODE, statement,
                f"`{module.source.segment(container)}` keeps `{module.source.segment(value)}` with its "
                f"autograd history across iterations, and a later step back-propagates into it", fix)


def _backward_fed_only_through(loop, container: str, value) -> ast.stmt | None:
    """The statement of a backward whose loss reaches the stored tensors through `container`
    alone (`torch.stack(losses).mean().backward()`), never through the stored name itself."""
    stored = src.canonical(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
    for call, root in backward_roots(loop):
        inputs = list(backward_inputs(loop, call, root))
        directly = stored is not None and any(operand_reads(node, stored) for node in inputs)
        if not directly and any(_container_reads(node, container) for node in inputs):
            return src.statement_of(call)
    return None


def _store(node):
    """(container, stored value) for `c.append(v)` and `c[k] = v`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORES and node.args:
        return node.func.value, node.args[-1]
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
        return node.targets[0].value, node.value
    return None


def _made_before(scope, name, loop) -> bool:
    return any(a.stmt.lineno < loop.lineno for a in src.assignments(scope, name))


def _reset_in(loop, name) -> bool:
    """Emptied or re-made every iteration: `memory = []`, `memory.clear()`."""
    for node in src.own_nodes(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "clear" \
                and src.canonical(node.func.value) == name:
            return True
    return bool(src.assignments(loop, name))


def _container_reads(node, name) -> list:
    found = list(operand_reads(node, name))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _LOOKUPS \
                and src.canonical(sub.func.value) == name:
            found.append(sub)
    return found
