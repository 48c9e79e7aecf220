"""BX004 made-once, found in source: the cause and its docs are explainer/causes/bx004_made_once.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx004_made_once import CAUSE
from ...fixes import constant_data, detach_peer_reads, move_into_loop
from ...model import Finding
from ...reading import dataflow
from ...reading import source as src
from ...reading.training import (
    backward_calls,
    defines_forward,
    flows_into_backward,
    has_history,
    is_backward_call,
    is_leaf_like,
    is_module,
    made_as_leaf,
    operand_reads,
    training_loops,
    under_no_grad,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    yield from _before_loops(module)
    yield from _outside_closures(module)
    yield from _in_init(module)


def _made_before(module, block, scope, owner, kind) -> Iterator[Finding]:
    """Names assigned in `block` (part of `scope`) before `owner` (a training loop or a
    closure) that `owner` back-propagates through without re-assigning them."""
    for stmt in src.own_nodes(block):
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.lineno >= owner.lineno or under_no_grad(stmt):
            continue
        if stmt.value is None or not _within_same_block(stmt, owner):
            continue
        if kind == "loop" and _empty_list(stmt.value):
            yield from _filled_before(module, stmt, scope, owner)
            continue
        for target in src.targets_of(stmt):
            if not isinstance(target, ast.Name):
                continue
            name = target.id
            # A backward that keeps the graph frees nothing for the next to need (FewRel's MetaNet
            # takes each support example's gradient with retain_graph=True).
            if src.assignments(owner, name, deep=True) or not flows_into_backward(owner, name, freeing=True):
                continue
            if _later_assigned(scope, name, stmt, owner) or made_as_leaf(src.Assignment(stmt, target), scope) \
                    or not has_history(target, scope, stmt.end_lineno + 1, strict=True):
                continue
            model = _called_again(stmt, scope, owner)
            if model is not None:
                # PPO's `old_log_probs`: recomputing it in the loop would equal the fresh output.
                fix = constant_data.detach_snapshot(module.source, stmt, name, model)
            else:
                fix = move_into_loop.move_into_body(module.source, stmt, owner, name)
            yield module.finding(CODE, "before", target, fix, carrier=name, made_at=stmt, owner=kind)


def _empty_list(value) -> bool:
    """`[]`, `list()`, and likewise an empty dict: a container filled later, not a value made here."""
    return isinstance(value, ast.List) and not value.elts or isinstance(value, ast.Dict) and not value.keys \
        or isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "dict") \
        and not value.args and not value.keywords


def _filled_before(module, stmt, scope, owner) -> Iterator[Finding]:
    """`outputs = []`, filled with module outputs before the loop (`outputs.append(model(x))`),
    then read by every pass's backward: deep mutual learning's peers."""
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
    if not isinstance(target, ast.Name):
        return
    name = target.id
    fills = [c for c in src.appends(scope, name) if stmt.lineno < c.lineno < owner.lineno and c.args
             and (has_history(c.args[0], scope, c.lineno, strict=True) or _output_of_listed_module(c.args[0], scope))]
    if not fills or src.appends(owner, name) or src.assignments(owner, name, deep=True) \
            or _later_assigned(scope, name, stmt, owner) or not flows_into_backward(owner, name):
        return
    backward = next((b.call for b in backward_calls(owner)), None)
    statement = src.statement_of(backward) if backward is not None else None
    own = detach_peer_reads.own_index(statement, owner) if statement is not None else None
    fix = None
    if own is not None:
        if not detach_peer_reads.peer_items(owner, name, own, statement.lineno):
            return  # each pass reads only its own item (or the others detached): one backward each
        fix = detach_peer_reads.detach_peer_items(module.source, owner, name, own, statement.lineno)
    yield module.finding(CODE, "filled", fills[-1].func.value, fix, carrier=name, made_at=src.statement_of(fills[-1]))


def _output_of_listed_module(value, scope) -> bool:
    """`model(images)` inside `for model in self.models:`, where the list holds modules (built
    by a comprehension of them, or by appending them)."""
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return False
    loop = next((a for a in src.ancestors(value) if isinstance(a, (ast.For, ast.AsyncFor))
                 and isinstance(a.target, ast.Name) and a.target.id == value.func.id), None)
    if loop is None:
        return False
    listed = src.canonical(loop.iter)
    owner = src.enclosing_class(scope) if listed.startswith("self.") else None
    where = owner if owner is not None else scope
    for assignment in src.assignments(where, listed, deep=owner is not None):
        made = assignment.value
        method = src.enclosing_function(assignment.stmt) or where
        if isinstance(made, ast.ListComp) and is_module(made.elt, method, assignment.stmt.lineno + 1) \
                or isinstance(made, ast.List) and any(is_module(e, method, assignment.stmt.lineno + 1) for e in made.elts):
            return True
    return any(call.args and is_module(call.args[0], src.enclosing_function(call) or where, call.lineno)
               for call in src.appends(where, listed, deep=owner is not None))


def _called_again(stmt, scope, owner) -> str | None:
    """A module that made `stmt`'s value (there or in what it was computed from) and that
    `owner` calls again."""
    made_by = [stmt.value] + [a.value for a in dataflow.ancestors(stmt.value, scope, stmt.lineno)
                              if a.value is not None and a.line < owner.lineno]
    before = [name for value in made_by for name in sorted(dataflow.modules_called(value, scope, stmt.lineno))]
    again = {name for node in owner.body for name in dataflow.modules_called(node, scope, owner.end_lineno)}
    return next((name for name in before if name in again), None)


def _before_loops(module) -> Iterator[Finding]:
    for training in training_loops(module.tree):
        yield from _made_before(module, training.scope, training.scope, training.loop, "loop")


def _outside_closures(module) -> Iterator[Finding]:
    """Closures handed to `optimizer.step(closure)` (LBFGS) re-run their backward."""
    for scope in [module.tree, *src.nodes_of(module.tree, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for node in _closures_passed_to_step(scope):
            block = _innermost_block_owner(node, scope)
            yield from _made_before(module, block, scope, node, "closure")


def _closures_passed_to_step(scope) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, ...]:
    return src.cached(scope, "_closures_passed_to_step", lambda: tuple(
        node for node in src.own_nodes(scope) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _calls_backward(node) and _passed_to_step(scope, node.name)), subtree_only=True)


def _passed_to_step(scope, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
               and any(isinstance(a, ast.Name) and a.id == name for a in n.args)
               for n in src.own_nodes(scope))


def _in_init(module) -> Iterator[Finding]:
    for cls in src.nodes_of(module.tree, (ast.ClassDef,)):
        methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
        init, forward = methods.get("__init__"), defines_forward(cls)
        if init is None or forward is None:
            continue
        for stmt in src.own_nodes(init):
            if not isinstance(stmt, ast.Assign) or under_no_grad(stmt):
                continue
            for target in src.targets_of(stmt):
                expression = src.canonical(target)
                # Cheapest first: most of `__init__` makes submodules (`self.fc = nn.Linear(...)`),
                # which compute nothing.
                if not expression.startswith("self.") or not _derived_from_parameters(stmt.value, init, stmt.lineno):
                    continue
                if not operand_reads(forward, expression) or src.assignments(forward, expression):
                    continue
                fix = move_into_loop.inline_attribute(module.source, cls, stmt, expression)
                yield module.finding(CODE, "init", target, fix, carrier=expression, made_at=stmt)


def _derived_from_parameters(value, scope, before) -> bool:
    """Computed (not created) from parameters or modules, as far as `scope` shows."""
    return not is_leaf_like(value) and has_history(value, scope, before, strict=True)


def _calls_backward(function) -> bool:
    return any(is_backward_call(n) for n in src.own_nodes(function))


def _innermost_block_owner(node, scope):
    """The loop (or the scope) whose body holds `node`: names assigned there before `node`."""
    for ancestor in src.ancestors(node):
        if ancestor is scope or isinstance(ancestor, (ast.For, ast.AsyncFor, ast.While)):
            return ancestor
    return scope


def _within_same_block(stmt, owner) -> bool:
    """`stmt` runs before `owner` on the same path (not inside an `if` that `owner` is not in)."""
    owner_chain = set(map(id, src.ancestors(owner)))
    return all(id(a) in owner_chain or isinstance(a, (ast.With, ast.AsyncWith)) for a in src.ancestors(stmt)
               if not isinstance(a, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)))


def _later_assigned(scope, name, stmt, owner) -> bool:
    """Re-assigned between `stmt` and `owner`: that later value is the one used."""
    return any(stmt.lineno < a.stmt.lineno < owner.lineno for a in src.assignments(scope, name))


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).

# Deep mutual learning: each model's loss also reads the others' outputs, `{peer}`.
MUTUAL_LEARNING = """
        class Trainer:
            def __init__(self):
                self.models = [nn.Linear(8, 4) for _ in range(2)]
                self.optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in self.models]

            def train(self):
                for images, labels in self.loader:
                    outputs = []
                    for model in self.models:
                        outputs.append(model(images))
                    for i in range(2):
                        kl_loss = 0
                        for j in range(2):
                            if i != j:
                                kl_loss += kl(F.log_softmax(outputs[i], dim=1), F.softmax({peer}, dim=1))
                        loss = F.cross_entropy(outputs[i], labels) + kl_loss
                        self.optimizers[i].zero_grad()
                        loss.backward()
                        self.optimizers[i].step()
"""

INVALID: list[Invalid] = [
    Invalid("peers' outputs filled before the loop, each model learning from the others'",
            MUTUAL_LEARNING.format(peer="outputs[j]")),
    Invalid("PPO's old log-probabilities computed once, with history", """
        policy = nn.Linear(4, 3)
        dist = torch.distributions.Categorical(logits=policy(states))
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions)
        for epoch in range(4):
            new_log_probs = torch.distributions.Categorical(logits=policy(states)).log_prob(actions)
            ratio = torch.exp(new_log_probs - old_log_probs)
            (-(ratio * advantages).mean()).backward()
            optimizer.step()
    """),
]
VALID: list[Valid] = [
    Valid("a ParameterList of Parameters imported from torch.nn (titans-pytorch's MemoryMLP)", """
        from torch.nn import Module, Parameter, ParameterList

        class MemoryMLP(Module):
            def __init__(self, dims):
                super().__init__()
                self.weights = ParameterList([Parameter(torch.randn(a, b)) for a, b in zip(dims[:-1], dims[1:])])

            def forward(self, x):
                for weight in self.weights:
                    x = x @ weight
                return x
    """),
    Valid("E3BM's inner loop: features made once, gradients taken for the fast weights only", """
        class MtlLearner(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Linear(8, 4)
                self.base_learner = BaseLearner(4, 3)

            def preval_forward(self, data_shot, data_query):
                embedding_shot = self.encoder(data_shot)
                embedding_query = self.encoder(data_query)
                fast_weights = self.base_learner.vars
                for k in range(self.update_step):
                    loss = F.cross_entropy(self.base_learner(embedding_shot, fast_weights), self.label_shot)
                    grad = torch.autograd.grad(loss, fast_weights)
                    fast_weights = [w - 0.1 * g for g, w in zip(grad, fast_weights)]
                return self.base_learner(embedding_query, fast_weights)
    """),
    Valid("PPO: old log-probabilities kept detached, actions sampled once", """
        policy = nn.Linear(4, 3)
        dist = torch.distributions.Categorical(logits=policy(states))
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions).detach()
        for epoch in range(4):
            new_log_probs = torch.distributions.Categorical(logits=policy(states)).log_prob(actions)
            ratio = torch.exp(new_log_probs - old_log_probs)
            (-(ratio * advantages).mean()).backward()
            optimizer.step()
    """),
    Valid("leaf parameter made before the loop", """
        w = torch.randn(5, requires_grad=True)
        scale = nn.Parameter(torch.ones(1))
        for x, y in batches:
            loss = ((x @ w * scale - y) ** 2).mean()
            loss.backward()
    """),
    Valid("data prepared before the loop by an unknown function", """
        inputs = preprocess(raw)
        train_data = batchify(corpus.train, 20)
        for step in range(10):
            loss = loss_fn(model(inputs), targets)
            loss.backward()
    """),
    Valid("module-level train() reading global data (word_language_model)", """
        train_data = batchify(corpus.train, 20)
        model = nn.LSTM(4, 4)
        def train():
            output = model(train_data)
            criterion(output, targets).backward()
        for epoch in range(3):
            train()
    """),
    Valid("LBFGS with the forward inside the closure", """
        model = nn.Linear(3, 1)
        for epoch in range(3):
            def closure():
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
    """),
    Valid("parameters created in __init__", """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(3, 3))
                self.proj = nn.Linear(3, 3)
            def forward(self, x):
                return self.proj(x) @ self.weight
    """),
    Valid("input buffers made in __init__ from a tensor type kept on the model", """
        class ConditionalGAN(BaseModel):
            def __init__(self, opt):
                self.Tensor = torch.cuda.FloatTensor if opt.gpu_ids else torch.Tensor
                self.input_A = self.Tensor(opt.batchSize, 3, 256, 256)
                self.netG = define_G(opt)

            def forward(self):
                self.fake_B = self.netG(self.input_A)
    """),
    Valid("peers' outputs filled before the loop, the others' detached",
            MUTUAL_LEARNING.format(peer="outputs[j].detach()")),
    Valid("the optimized image, made once as a leaf and moved", """
        target = content.clone().requires_grad_(True).to(device)
        optimizer = torch.optim.Adam([target], lr=0.003)
        for step in range(100):
            features = get_features(target, vgg)
            loss = torch.mean((features - content_features) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """),
    Valid('module containers and an absent parameter made in __init__ (MAML-Pytorch, miles-credit)', """
        class Net(nn.Module):
            def __init__(self, beta):
                super().__init__()
                self.a = nn.ParameterList([nn.Parameter(torch.zeros(3, 4))])
                self.noise = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
                if beta:
                    self.lin_beta = nn.Linear(4, 1, bias=False)
                else:
                    self.lin_beta = self.register_parameter("lin_beta", None)

            def forward(self, x):
                out = self.noise[0](x @ self.a[0])
                return out if self.lin_beta is None else self.lin_beta(out)
    """),
    Valid("models and a leaf parameter returned by a set-up helper (torchgfn's tutorial)", """
        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(2, 1)

            def forward(self, x):
                return self.layer(x)

        def setup_experiment():
            forward_model, backward_model = MLP(), MLP()
            log_z = nn.Parameter(torch.tensor(0.0))
            optimizer = torch.optim.Adam([*forward_model.parameters(), log_z])
            return forward_model, backward_model, log_z, optimizer

        forward_model, backward_model, log_z, optimizer = setup_experiment()
        for it in range(100):
            optimizer.zero_grad()
            x = torch.rand(16, 2)
            loss = (log_z + forward_model(x) - backward_model(x)).pow(2).mean()
            loss.backward()
            optimizer.step()
    """),
]
