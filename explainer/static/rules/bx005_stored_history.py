"""BX005 stored-history, found in source: the cause and its docs are explainer/causes/bx005_stored_history.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx005_stored_history import CAUSE
from ...fixes import detach_carried, empty_container
from ...model import Finding
from ...reading import source as src
from ...reading.training import (
    backward_calls,
    backward_inputs,
    cuts_history,
    flows_into_backward,
    has_history,
    operand_reads,
    training_loops,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code
_STORES = ("append", "extend", "insert", "appendleft")
_LOOKUPS = ("get", "pop", "values", "items")


def check(module: CheckedModule) -> Iterator[Finding]:
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
            yield module.finding(CODE, "stored", statement, fix, carrier=module.source.segment(container),
                                 made_at=statement, value=module.source.segment(value))


def _backward_fed_only_through(loop, container: str, value) -> ast.stmt | None:
    """The statement of a backward whose loss reaches the stored tensors through `container`
    alone (`torch.stack(losses).mean().backward()`), never through the stored name itself."""
    stored = src.canonical(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
    for backward in backward_calls(loop):
        call, root = backward.call, backward.root
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


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("every loss so far kept in a list and back-propagated whole", """
        model = nn.Linear(3, 1)
        losses = []
        for x, y in batches:
            loss = mse_loss(model(x), y)
            losses.append(loss)
            torch.stack(losses).mean().backward()
            optimizer.step()
    """),
]
VALID: list[Valid] = [
    Valid("losses kept in a list for logging", """
        encoder = nn.Linear(4, 4)
        losses = []
        for x, y in batches:
            loss = loss_fn(encoder(x), y)
            loss.backward()
            losses.append(loss)
        print(sum(losses))
    """),
    Valid("states stored detached", """
        encoder = nn.Linear(4, 4)
        memory, cache = [], {}
        for x, y in batches:
            h = encoder(x)
            if memory:
                h = h + torch.stack(memory).mean(0) + cache.get("prev", 0)
            memory.append(h.detach())
            cache["prev"] = h.detach()
            loss_fn(h, y).backward()
    """),
    Valid("buffer emptied every iteration", """
        encoder = nn.Linear(4, 4)
        steps = []
        for x, y in batches:
            steps.clear()
            for t in range(3):
                steps.append(encoder(x[t]))
            loss_fn(torch.stack(steps), y).backward()
    """),
]
