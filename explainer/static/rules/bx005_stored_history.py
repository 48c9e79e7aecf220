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
    helper_called,
    instance_class,
    loops,
    operand_reads,
    scopes,
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
    yield from _kept_by_objects(module)


def _kept_by_objects(module) -> Iterator[Finding]:
    """`policy.saved_log_probs.append(m.log_prob(action))` in `select_action`, into a list the
    class makes empty in `__init__`; `finish_episode`, called again and again, back-propagates
    through the list; nothing ever empties it. Its second call goes back through the first call's
    freed graphs (pytorch/examples' reinforce.py without its `del policy.saved_log_probs[:]`; its
    issue #151 meets the same error calling `finish_episode` twice)."""
    emptied: set[str] | None = None
    seen: set[tuple[int, str]] = set()
    for scope in scopes(module.tree)[1:]:
        for node in _appends_to_attributes(scope):
            container, value = node.func.value, node.args[-1]
            owner = _class_of(container.value, node)
            if owner is None or (id(owner), container.attr) in seen or not _made_empty(owner, container.attr):
                continue
            if cuts_history(value) or not has_history(value, scope, node.lineno, strict=True):
                continue
            emptied = _emptied_attributes(module.tree) if emptied is None else emptied
            if container.attr in emptied:
                continue
            consumer = _consumer(module.tree, owner, container.attr)
            if consumer is None:
                continue
            seen.add((id(owner), container.attr))
            lists = _lists_read(consumer, owner, emptied)
            fix = empty_container.empty_after_each_call(module.source, consumer, lists)
            statement = src.statement_of(node)
            yield module.finding(CODE, "kept-by-object", statement, fix, carrier=src.canonical(container),
                                 made_at=statement, value=module.source.segment(value), consumer=consumer.name)


def _appends_to_attributes(scope) -> tuple[ast.Call, ...]:
    """`x.items.append(v)` (or extend, insert...) in `scope`: the stores `_kept_by_objects`
    reads further (found once per function: most have none)."""
    return src.cached(scope, "_appends_to_attributes", lambda: tuple(
        n for n in src.own_nodes(scope) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr in _STORES and n.args and isinstance(n.func.value, ast.Attribute)), subtree_only=True)


def _class_of(receiver, at) -> ast.ClassDef | None:
    """The class of `self` (the enclosing one) or of an object made from a class (`policy`)."""
    if isinstance(receiver, ast.Name) and receiver.id == "self":
        return src.enclosing_class(at)
    return instance_class(receiver, at)


def _made_empty(owner: ast.ClassDef, attribute: str) -> bool:
    """`self.<attribute> = []` in the class's `__init__`: a list the object keeps."""
    init = src.method_of(owner, "__init__")
    return init is not None and any(
        isinstance(a.value, ast.List) and not a.value.elts for a in src.assignments(init, f"self.{attribute}"))


def _emptied_attributes(tree) -> set[str]:
    """Attribute names some statement of the file empties or re-binds outside `__init__`:
    `del x.a[:]`, `x.a.clear()` (or pop, remove), `x.a = ...`, `x.a[:] = ...`. Any of them
    might empty the list, whoever owns it."""
    found = set()
    for node in src.all_nodes(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("clear", "pop", "popleft", "remove") and isinstance(node.func.value, ast.Attribute):
            found.add(node.func.value.attr)
        elif isinstance(node, (ast.Delete, ast.Assign, ast.AugAssign, ast.AnnAssign)):
            if isinstance(node, ast.Assign) and getattr(src.enclosing_function(node), "name", None) == "__init__":
                continue
            for target in node.targets if isinstance(node, (ast.Delete, ast.Assign)) else [node.target]:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute):
                        found.add(part.attr)
    return found


def _consumer(tree, owner: ast.ClassDef, attribute: str) -> ast.FunctionDef | None:
    """A function that runs a backward, reads the object's list, and is called in a loop."""
    for function in scopes(tree)[1:]:
        if not backward_calls(function) or not any(
                isinstance(n, ast.Attribute) and n.attr == attribute and _class_of(n.value, n) is owner
                for n in src.own_nodes(function)):
            continue
        if _called_in_a_loop(tree, function):
            return function
    return None


def _called_in_a_loop(tree, function) -> bool:
    for scope in scopes(tree):
        for loop in loops(scope):
            for node in src.own_nodes(loop):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) \
                        == function.name and helper_called(node, scope) is function:
                    return True
    return False


def _lists_read(consumer, owner: ast.ClassDef, emptied: set[str]) -> list[str]:
    """The object's lists (made `[]` in `__init__`, never emptied) that `consumer` reads, as it
    spells them: the episode's rewards are emptied with its log-probabilities, as the expert does."""
    found: dict[str, None] = {}
    for node in src.own_nodes(consumer):
        if isinstance(node, ast.Attribute) and node.attr not in emptied and _made_empty(owner, node.attr) \
                and _class_of(node.value, node) is owner:
            found[src.canonical(node)] = None
    return sorted(found)


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
# pytorch/examples' reinforce.py, without the two `del` lines that end its `finish_episode`.
REINFORCE = """
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.affine = nn.Linear(4, 2)
            self.saved_log_probs = []
            self.rewards = []

        def forward(self, x):
            return F.softmax(self.affine(x), dim=1)

    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)

    def select_action(state):
        probs = policy(torch.from_numpy(state).float().unsqueeze(0))
        m = Categorical(probs)
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        returns = torch.tensor(discounted(policy.rewards))
        policy_loss = [-log_prob * R for log_prob, R in zip(policy.saved_log_probs, returns)]
        optimizer.zero_grad()
        torch.cat(policy_loss).sum().backward()
        optimizer.step()

    for episode in range(1000):
        state, done = env.reset(), False
        while not done:
            state, reward, done, _ = env.step(select_action(state))
            policy.rewards.append(reward)
        finish_episode()
"""

# An agent that keeps what select_action computes on itself, for learn.
AGENT = """
    class Agent:
        def __init__(self):
            self.actor = nn.Linear(4, 2)
            self.optimizer = torch.optim.Adam(self.actor.parameters())
            self.log_probs = []

        def select_action(self, state):
            dist = Categorical(logits=self.actor(state))
            action = dist.sample()
            self.log_probs.append(dist.log_prob(action))
            return action

        def learn(self, advantage):
            loss = -(torch.stack(self.log_probs) * advantage).sum()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    agent = Agent()
    for episode in range(100):
        for t in range(20):
            agent.select_action(torch.randn(4))
        agent.learn(1.0)
"""

INVALID: list[Invalid] = [
    Invalid("a graph stored on the policy by select_action, never emptied (pytorch/examples' reinforce.py)",
            REINFORCE),
    Invalid("an agent's select_action keeps its log-probabilities on self, learn never empties them", AGENT),
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
    Valid("pytorch/examples' reinforce.py: finish_episode empties both lists",
          REINFORCE.replace("        optimizer.step()\n",
                            "        optimizer.step()\n        del policy.rewards[:]\n        del policy.saved_log_probs[:]\n")),
    Valid("the agent starts its list afresh after each update",
          AGENT.replace("            self.optimizer.step()\n",
                        "            self.optimizer.step()\n            self.log_probs = []\n")),
    Valid("the values kept are numbers", """
        class Agent:
            def __init__(self):
                self.actor = nn.Linear(4, 2)
                self.entropies = []

            def select_action(self, state):
                dist = Categorical(logits=self.actor(state))
                self.entropies.append(dist.entropy().item())
                return dist.sample()

            def learn(self, loss):
                loss.backward()
                print(sum(self.entropies))

        agent = Agent()
        for episode in range(100):
            agent.select_action(torch.randn(4))
            agent.learn(agent.actor(torch.randn(4)).sum())
    """),
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
