"""BX003 discarded-detach, found in source: the cause and its docs are explainer/causes/bx003_discarded_detach.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx003_discarded_detach import CAUSE
from ...fixes import detach_carried
from ...fixes.edits import replace
from ...model import Finding, Fix
from ...reading import source as src
from ...reading.training import training_loops
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    seen: set[int] = set()
    for training in training_loops(module.tree):
        for node in src.own_nodes(training.loop):
            if id(node) not in seen:
                seen.add(id(node))
                yield from _discarded(module, node)


def _discarded(module: CheckedModule, node: ast.AST) -> Iterator[Finding]:
    if detach_carried.discarded_per_element(node):
        # Whether the state is a tuple or a list, the source does not say: the fix is unproven.
        fix = Fix(f"Assign `{module.source.segment(node.iter)}` its elements detached",
                  (detach_carried.assign_detached_elements(module.source, node, is_tuple=True),), "unsafe")
        yield module.finding(CODE, "per-element", node, fix, carrier=module.source.segment(node.iter), made_at=node,
                             call=module.source.segment(node.body[0].value))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "detach" \
            and not node.value.args and not detach_carried.discarded_per_element(src.parent(node)):
        receiver = module.source.segment(node.value.func.value)
        fix = Fix(f"Assign the detached tensor back: `{receiver} = {receiver}.detach()`",
                  (replace(module.source, node, f"{receiver} = {receiver}.detach()"),))
        yield module.finding(CODE, "discarded", node, fix, carrier=receiver, made_at=node,
                             call=module.source.segment(node.value))
    elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name):
        name = node.target.id
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == name \
                    and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
                    and stmt.value.func.attr == "detach":
                yield module.finding(CODE, "loop-variable", stmt, carrier=name, made_at=stmt,
                                     iterable=module.source.segment(node.iter))


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("an LSTM's (h, c) detached out of place by a loop over it (d2l's train_epoch_ch8, PR #1410)", """
import torch

lstm = torch.nn.LSTM(3, 4)
opt = torch.optim.SGD(lstm.parameters(), lr=0.1)
state = None
for x in torch.randn(3, 5, 2, 3):
    if state is not None:
        for s in state:
            s.detach()
    y, state = lstm(x, state)
    opt.zero_grad()
    y.pow(2).mean().backward()
    opt.step()
"""),
]
VALID: list[Valid] = [
    Valid("the same loop detaching each element in place, as d2l does", """
import torch

lstm = torch.nn.LSTM(3, 4)
opt = torch.optim.SGD(lstm.parameters(), lr=0.1)
state = None
for x in torch.randn(3, 5, 2, 3):
    if state is not None:
        for s in state:
            s.detach_()
    y, state = lstm(x, state)
    opt.zero_grad()
    y.pow(2).mean().backward()
    opt.step()
"""),
]
