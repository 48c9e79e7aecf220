"""BX007 step-before-backward: `optimizer.step()` between a graph's forward and a backward through it.

## What it does
Flags a tensor computed by a module whose parameters an optimizer updates, when that
optimizer's `step()` runs after the tensor was computed and before a later `backward()` that
goes through it, in the same pass. Usually the first backward kept the graph with
`retain_graph=True`.

## Why is this bad?
`step()` updates the parameters in place. The graph saved their old values for the backward
pass, so the later backward raises "one of the variables needed for gradient computation has
been modified by an inplace operation ... is at version 2". Adding `retain_graph=True`, the hint
of the first error, is how most code gets here. Even when no error is raised (the optimizer had
no gradients yet), the gradient would be computed with weights that no longer exist.

## Example
```python
q = critic(torch.cat([state, actor(state)], 1))
critic_loss = mse_loss(q, target_q)
actor_loss = -q.mean()
critic_loss.backward(retain_graph=True)
critic_opt.step()
actor_loss.backward()
```

## Use instead
```python
q = critic(torch.cat([state, actor(state)], 1))
critic_loss = mse_loss(q, target_q)
critic_loss.backward()
critic_opt.step()
q = critic(torch.cat([state, actor(state)], 1))
actor_loss = -q.mean()
actor_loss.backward()
```
"""
from __future__ import annotations

from collections.abc import Iterator

from ...fixes import graph_options, recompute_forward
from ...model import Fix
from ...reading.dataflow import (
    RETAIN_KEYWORDS,
    Ancestor,
    Backward,
    Step,
    ancestors,
    backward_calls,
    carries_history,
    modules_called,
    same_pass,
    steps,
)
from ...reading.training import scopes
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX007"
NAME = "step-before-backward"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for scope in scopes(module.tree):
        calls = backward_calls(scope)
        stepped = steps(scope)
        flagged: set[int] = set()
        for backward in calls:
            for step in stepped:
                if not same_pass(step.call, backward.call):
                    continue
                stale = _built_before(backward, step, scope)
                if stale is None or id(stale.stmt) in flagged or _freed_earlier(stale, backward, calls, scope):
                    continue
                flagged.add(id(stale.stmt))
                yield _diagnostic(module, scope, stale, step, backward, calls)
                break


def _built_before(backward: Backward, step: Step, scope) -> Ancestor | None:
    """The latest tensor in `backward`'s graph computed, before `step`, by a module that `step`
    updates (any module, when the optimizer's parameters are not visible)."""
    found = []
    for ancestor in ancestors(backward.root, scope, backward.line):
        if not same_pass(ancestor.stmt, step.call) or ancestor.value is None:
            continue
        producers = modules_called(ancestor.value, scope, ancestor.line)
        if not producers or not carries_history(ancestor, scope):
            continue
        if step.modules is None or producers & step.modules:
            found.append(ancestor)
    return max(found, key=lambda a: (a.line, a.stmt.col_offset)) if found else None


def _freed_earlier(stale: Ancestor, backward: Backward, calls: list[Backward], scope) -> bool:
    """An earlier backward without retain_graph already went through `stale`: the graph is
    freed before the step matters (BX006's case)."""
    key = (id(stale.stmt), stale.expression)
    return any(same_pass(stale.stmt, earlier.call) and same_pass(earlier.call, backward.call)
               and earlier.frees_graph()
               and key in {(id(a.stmt), a.expression) for a in ancestors(earlier.root, scope, earlier.line)}
               for earlier in calls)


def _diagnostic(module, scope, stale: Ancestor, step: Step, backward: Backward, calls) -> Diagnostic:
    source = module.source
    name = source.segment(stale.target)
    step_code = source.segment(step.call)
    message = (f"`{step_code}` (line {step.line}) updates in place the weights that computed `{name}`, "
               f"and `{source.segment(backward.call)}` (line {backward.line}) back-propagates through "
               f"`{name}`'s graph afterwards: 'modified by an inplace operation'")
    fix = recompute_forward.recompute_before_use(
        source, scope, stale.stmt, step.line, backward.statement,
        f"Recompute `{name}` after `{step_code}` (line {step.line}), so the backward goes through "
        f"a graph built with the updated weights")
    retaining = [c for c in calls if c.line < step.line and same_pass(stale.stmt, c.call) and c.retains_graph()]
    if fix is not None and retaining:
        keyword = next((k.arg for k in retaining[-1].call.keywords if k.arg in RETAIN_KEYWORDS), "retain_graph")
        drop = graph_options.drop_keyword(source, retaining[-1].call, keyword)
        if drop is not None:
            fix = Fix(fix.message + f", without {keyword}=True", fix.edits + (drop,))
    return module.diagnostic(CODE, stale.target, message, fix)
