"""BX010 grad-frees-graph: `torch.autograd.grad` frees a graph that a later backward needs.

## What it does
Flags `torch.autograd.grad(outputs, inputs)` called without `create_graph=True` or
`retain_graph=True` when a later `backward()` in the same pass goes through the same graph, for
example a gradient penalty added to the loss it was computed from.

## Why is this bad?
`autograd.grad` frees the graph it went through, as `backward()` does. The later backward
raises "Trying to backward through the graph a second time". And when the gradient feeds the
loss (a gradient penalty, WGAN-GP, input-gradient regularization), it was computed without a
graph of its own, so the penalty would not be trained even if the error went away.

## Example
```python
loss = mse_loss(model(inputs), targets)
grads = torch.autograd.grad(loss, inputs)
penalty = grads[0].pow(2).sum(1).mean()
(loss + 0.1 * penalty).backward()
```

## Use instead
```python
loss = mse_loss(model(inputs), targets)
grads = torch.autograd.grad(loss, inputs, create_graph=True)
penalty = grads[0].pow(2).sum(1).mean()
(loss + 0.1 * penalty).backward()
```
"""
from __future__ import annotations

from collections.abc import Iterator

from ...fixes import graph_options
from ...reading import source as src
from ...reading.dataflow import ancestors, backward_calls, same_pass, shared_ancestor
from ...reading.training import scopes
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX010"
NAME = "grad-frees-graph"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    source = module.source
    for scope in scopes(module.tree):
        calls = backward_calls(scope)
        for index, grad in enumerate(calls):
            if grad.api != "grad" or not grad.frees_graph():
                continue
            later = next((c for c in calls[index + 1:] if same_pass(grad.call, c.call)
                          and shared_ancestor(grad, c, scope) is not None), None)
            if later is None:
                continue
            results = {src.canonical(t) for t in src.targets_of(grad.statement)}
            feeds_loss = any(a.expression in results for a in ancestors(later.root, scope, later.line))
            if feeds_loss:
                fix = graph_options.add_create_graph(source, grad.call)
            else:
                fix = graph_options.add_retain_graph(
                    source, grad.call, "Keep the graph for the later backward with `retain_graph=True`")
            shared = shared_ancestor(grad, later, scope)
            message = (f"`{source.segment(grad.call)}` frees the graph of `{source.segment(shared.target)}`, "
                       f"and `{source.segment(later.call)}` (line {later.line}) goes through it again: "
                       f"'backward through the graph a second time'"
                       + ("; its result feeds that loss, so it also needs a graph of its own" if feeds_loss else ""))
            yield module.diagnostic(CODE, grad.call, message, fix)
