"""BX002 running-total, found in source: the cause and its docs are explainer/causes/bx002_running_total.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx002_running_total import CAUSE
from ...fixes import accumulate_item
from ...model import Finding
from ...reading import source as src
from ...reading.training import (
    cuts_history,
    has_history,
    is_backward_call,
    running_total,
    training_loops,
    under_no_grad,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    for training in training_loops(module.tree):
        for stmt in src.own_nodes(training.loop):
            term = running_total(stmt)
            if term is None or under_no_grad(stmt) or cuts_history(term):
                continue
            total = src.canonical(src.targets_of(stmt)[0])
            if not has_history(term, training.scope, stmt.lineno, ignore=total):
                continue
            receiver = _backward_receiver(training.loop, total)
            fix = accumulate_item.accumulate_with_item(
                module.source, total, src.Assignment(stmt, src.targets_of(stmt)[0]), receiver)
            target = src.targets_of(stmt)[0]
            yield module.finding(CODE, "total", target, fix, carrier=module.source.segment(target), made_at=stmt,
                                 term=module.source.segment(term), backpropagated=receiver is not None)


def _backward_receiver(loop, total):
    for node in src.own_nodes(loop):
        if is_backward_call(node) and isinstance(node.func, ast.Attribute) and src.canonical(node.func.value) == total:
            return node.func.value
    return None


# A running total, not a carried state: BX002 alone (tests/test_check.py), where BX001 once
# flagged the same span with a conflicting fix.
TOTAL_OF_AN_ATTRIBUTE = """
    class Trainer:
        def __init__(self):
            self.model = nn.Linear(4, 1)

        def fit(self, batches):
            total = 0
            for x in batches:
                self.loss = self.model(x).pow(2).mean()
                total = total + self.loss
                total.backward()
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("a total of a loss kept on the trainer", TOTAL_OF_AN_ATTRIBUTE),
]
VALID: list[Valid] = [
    Valid("running loss with item", """
        running_loss = 0.0
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            running_loss += loss.item()
            running_loss = running_loss + loss.item()
    """),
    Valid("a helper's loss returned as a number, summed for printing", """
        rnn = RNN(57, 128, 18)

        def train(category_tensor, line_tensor):
            output = rnn(line_tensor)
            loss = criterion(output, category_tensor)
            loss.backward()
            optimizer.step()
            return output, loss.item()

        current_loss = 0
        for epoch in range(1, 1000):
            output, loss = train(*random_training_pair())
            current_loss += loss
    """),
    Valid("rewards summed from an environment fed a detached action", """
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 1)

            def forward(self, x):
                return torch.tanh(self.fc(x))

            def get_action(self, state):
                return self.forward(torch.FloatTensor(state)).detach().numpy()

        class Noise:
            def __call__(self):
                return np.random.normal(size=1)

        policy, noise = Policy(), Noise()
        for episode in range(100):
            state, score = env.reset(), 0.0
            for t in range(200):
                action = policy.get_action(state) + noise()
                state, reward, done, _ = env.step(action)
                score += reward
            loss = -policy(torch.FloatTensor(state)).mean()
            loss.backward()
    """),
]
