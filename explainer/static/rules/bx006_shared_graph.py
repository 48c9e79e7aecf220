"""BX006 shared-graph: two backward calls in one pass on losses that share an un-detached tensor.

## What it does
Flags a tensor with autograd history (`fake = generator(z)`, `features = trunk(x)`) that feeds
two losses back-propagated one after the other, when the first `backward()` does not keep the
graph (`retain_graph`).

## Why is this bad?
The first `backward()` frees the graph behind the shared tensor. The second one reaches that
freed graph and raises "Trying to backward through the graph a second time". The error's hint,
`retain_graph=True`, is only right when no optimizer step runs between the two calls; after a
step it gives "modified by an inplace operation" instead.

## Example
```python
fake = generator(z)
d_loss = bce(discriminator(real), ones) + bce(discriminator(fake), zeros)
d_loss.backward()
opt_d.step()
g_loss = bce(discriminator(fake), ones)
g_loss.backward()
```

## Use instead
```python
fake = generator(z)
d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
d_loss.backward()
opt_d.step()
g_loss = bce(discriminator(fake), ones)
g_loss.backward()
```
The same holds for the update after the second backward: an actor's loss needs the critic's
`advantage` only as a value (`advantage.detach()`), because `actor_opt` does not train the critic.
For two losses on one trunk with no step between them, back-propagate their sum once:
`(loss1 + loss2).backward()`. The same loss back-propagated twice is a duplicate call: remove the
second one (with `retain_graph=True` it would count every gradient twice).
"""
from __future__ import annotations

from collections.abc import Iterator

from ...fixes import detach_for_first_consumer, graph_options, recompute_forward, remove_statement, sum_losses
from ...reading import source as src
from ...reading.dataflow import (
    Ancestor,
    Backward,
    ancestor_keys,
    ancestors,
    backward_calls,
    modules_called,
    same_pass,
    shared_ancestor,
    steps,
)
from ...reading.training import has_history, scopes
from ..diagnostic import Diagnostic
from ..module import CheckedModule

CODE = "BX006"
NAME = "shared-graph"


def check(module: CheckedModule) -> Iterator[Diagnostic]:
    for scope in scopes(module.tree):
        calls = backward_calls(scope)
        flagged: set[int] = set()
        # Which calls each ancestor feeds: a second call shares nothing with the first unless it
        # is listed under one of the first's ancestors, so only those pairs are looked at (all
        # pairs made a file with hundreds of backward calls quadratic, then cubic).
        feeds: dict[tuple[int, str], list[int]] = {}
        for index, call in enumerate(calls):
            for key in ancestor_keys(call, scope):
                feeds.setdefault(key, []).append(index)
        for index, first in enumerate(calls):
            if first.api != "backward" or not first.frees_graph():
                continue
            candidates = sorted({i for key in ancestor_keys(first, scope) for i in feeds[key] if i > index})
            for second in (calls[i] for i in candidates):
                if not same_pass(first.call, second.call):
                    continue
                shared = shared_ancestor(first, second, scope)
                if shared is None or id(shared.stmt) in flagged:
                    continue
                flagged.add(id(shared.stmt))
                yield _diagnostic(module, scope, shared, first, second)
                break


def _diagnostic(module: CheckedModule, scope, shared: Ancestor, first: Backward, second: Backward) -> Diagnostic:
    source = module.source
    if _same_tensor(first, second, scope):
        name = source.segment(second.root)
        return module.diagnostic(
            CODE, second.call,
            f"`{name}` is back-propagated twice: `{source.segment(first.call)}` (line {first.line}) "
            f"already did it, and its graph is freed, so this call raises 'backward through the "
            f"graph a second time'", remove_statement.remove_call(source, second.statement, second.root))
    between = [s for s in steps(scope) if same_pass(first.call, s.call) and same_pass(s.call, second.call)]
    name = source.segment(shared.target)
    message = (f"`{name}` feeds both `{source.segment(first.call)}` (line {first.line}) and "
               f"`{source.segment(second.call)}` (line {second.line}): the first backward frees the "
               f"graph that made `{name}`, so the second raises 'backward through the graph a second time'")
    fix = None
    if between:
        step = between[-1]
        producers = _producers(shared, scope)
        follower = next((s for s in steps(scope) if same_pass(second.call, s.call) and s.line > second.line), None)
        if step.modules is not None and producers and not (producers & step.modules):
            fix = detach_for_first_consumer.detach_before(source, scope, shared.expression,
                                                          shared.stmt.end_lineno, first.line)
        elif follower is not None and follower.modules is not None and producers \
                and not (producers & follower.modules):
            fix = detach_for_first_consumer.detach_before(
                source, scope, shared.expression, step.line, second.line,
                detach_for_first_consumer.LATER_UPDATE.format(step=source.segment(follower.call), carrier="{carrier}"))
        if fix is None:
            fix = recompute_forward.recompute_before_use(
                source, scope, shared.stmt, step.line, second.statement,
                f"Recompute `{name}` after `{source.segment(step.call)}` (line {step.line}): the step "
                f"changed the weights its graph was built with",
                upstream=lambda stmt: has_history(src.value_of(stmt), scope, stmt.lineno))
    else:
        fix = sum_losses.sum_and_backward_once(source, first.statement, second.statement) \
            or graph_options.add_retain_graph(source, first.call, "Keep the shared graph for the second "
                                              "backward with `retain_graph=True` (no step in between)")
    return module.diagnostic(CODE, shared.target, message, fix)



def _producers(shared: Ancestor, scope) -> set[str]:
    """The modules called in the shared value or in what it was computed from (`advantage =
    returns - value`, `value = critic(s)`: the critic)."""
    if shared.value is None:
        return set()
    found = modules_called(shared.value, scope, shared.line)
    for ancestor in ancestors(shared.value, scope, shared.line):
        if ancestor.value is not None:
            found |= modules_called(ancestor.value, scope, ancestor.line)
    return found


def _same_tensor(first: Backward, second: Backward, scope) -> bool:
    """Both calls back-propagate the same expression, not re-assigned between them."""
    name = src.canonical(first.root)
    if first.api != "backward" or second.api != "backward" or src.canonical(second.root) != name:
        return False
    return not any(first.line < a.stmt.lineno <= second.line for a in src.assignments(scope, name))
