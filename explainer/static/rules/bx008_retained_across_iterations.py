"""BX008 retained-across-iterations, found in source: the cause and its docs are explainer/causes/bx008_retained_across_iterations.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx008_retained_across_iterations import CAUSE
from ...fixes import detach_carried, graph_options, move_into_loop
from ...model import Finding, Fix
from ...reading import source as src
from ...reading.dataflow import Ancestor, ancestors, carries_history, steps
from ...reading.training import backward_calls, carried_across_passes, training_loops
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
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
    # Made once, the graph does not grow: kept, it only goes stale once the loop steps the
    # weights it saved (FewRel's MetaNet takes gradients over it and steps nothing).
    if ancestor.line < loop.lineno and isinstance(ancestor.target, ast.Name) and carries_history(ancestor, scope) \
            and not src.assignments(loop, ancestor.expression, deep=True) and steps(loop):
        return "made before the loop"
    return None


def _diagnostic(module, backward, keyword: ast.keyword, ancestor: Ancestor, spanning: str, loop) -> Finding:
    source = module.source
    name = source.segment(ancestor.target)
    if spanning == "carried":
        cure = detach_carried.detach_at_loop_entry(
            source, ancestor.expression, loop, isinstance(ancestor.value, ast.Tuple))
    else:
        cure = move_into_loop.move_into_body(source, ancestor.stmt, loop, ancestor.expression)
    drop = graph_options.drop_keyword(source, backward.call, "retain_graph")
    fix = None
    if cure is not None and drop is not None:
        fix = Fix(f"{cure.message}, and drop `retain_graph=True`: each backward then frees its own graph",
                  cure.edits + (drop,))
    return module.finding(CODE, "carried" if spanning == "carried" else "before", keyword, fix, carrier=name,
                          made_at=ancestor.stmt, backward=backward.call)


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("retain_graph=True over a tensor made before the loop", """
        w = torch.randn(3, requires_grad=True)
        w_hat = w / w.norm()
        for x, y in batches:
            loss = ((x @ w_hat - y) ** 2).mean()
            loss.backward(retain_graph=True)
            optimizer.step()
    """),
]
VALID: list[Valid] = [
    Valid("retain_graph=True over a tensor made before a loop that steps nothing (FewRel's MetaNet)", """
        w = torch.randn(3, requires_grad=True)
        w_hat = w / w.norm()
        grads = []
        for x, y in batches:
            w.grad = None
            loss = ((x @ w_hat - y) ** 2).mean()
            loss.backward(retain_graph=True)
            grads.append(w.grad.clone())
    """),
]
