"""BX002 running-total, found in source: the cause and its docs are explainer/causes/bx002_running_total.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx002_running_total import CAUSE
from ...fixes import accumulate_item
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import ancestors, dependencies, steps
from ...reading.training import (
    backward_calls,
    cuts_history,
    flows_into_backward,
    has_history,
    instance_class,
    is_backward_call,
    last_reset,
    live_reads,
    reset_before,
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
            if reset_before(training.loop, stmt, total):
                # `loss = actor_loss`, then `loss += critic_loss`: a sum within one pass, unless
                # a backward of the total in between freed what it holds.
                yield from _added_after_its_backward(module, training, stmt, total, term)
                continue
            if not has_history(term, training.scope, stmt.lineno, ignore=total):
                continue
            if not _strong_evidence(term, training, stmt.lineno, total):
                continue
            if _summed_for_one_backward(stmt, total, training.scope) or _summed_in_one_forward(training, total):
                continue
            receiver = _backward_receiver(training.loop, total)
            assignment = src.Assignment(stmt, src.targets_of(stmt)[0])
            if receiver is None and _read_as_a_tensor(training.scope, total):
                # `train_loss.item()` when logging (ML2021's HW7): a number would fail there.
                fix = accumulate_item.add_detached(module.source, total, assignment)
            else:
                fix = accumulate_item.accumulate_with_item(module.source, total, assignment, receiver)
            if fix is not None and not has_history(term, training.scope, stmt.lineno, strict=True, ignore=total) \
                    and not _back_propagated(training.loop, term):
                fix = fix.unproven()  # `.item()` on a term the source does not show to be a tensor
            target = src.targets_of(stmt)[0]
            yield module.finding(CODE, "total", target, fix, carrier=module.source.segment(target), made_at=stmt,
                                 term=module.source.segment(term), backpropagated=receiver is not None)
        yield from _kept_by_trackers(module, training)


def _added_after_its_backward(module, training, stmt, total: str, term) -> Iterator[Finding]:
    """SAM's two forward-backward passes: `loss = 0` at the top of the pass, the first pass's
    terms added up and `loss.backward()`, then the second pass's terms added to the same `loss`
    and back-propagated again, through the graphs the first backward freed."""
    reset = last_reset(training.loop, stmt, total)
    calls = [b for b in backward_calls(training.loop) if src.canonical(b.root) == total]
    freeing = next((b for b in reversed(calls) if reset.lineno < b.line < stmt.lineno and b.frees_graph()), None)
    if freeing is None or not any(b.line > stmt.end_lineno for b in calls):
        return
    target = src.targets_of(stmt)[0]
    fix = accumulate_item.reset_after_backward(module.source, total, reset, freeing.statement)
    yield module.finding(CODE, "total-freed", target, fix, carrier=module.source.segment(target), made_at=stmt,
                         freed_by=freeing.call, term=module.source.segment(term))


# Methods only a tensor has, not the number `.item()` would leave.
_TENSOR_METHODS = frozenset({"item", "cpu", "cuda", "to", "detach", "numpy", "tolist", "clone"})


def _read_as_a_tensor(scope: ast.AST, total: str) -> bool:
    """Whether `scope` calls a tensor's method on `total` (`train_loss.item()`), or returns what
    it is made of, for a caller that may (text-summarizer's `train_epoch` returns
    `epoch_loss_train / len(train_iter)`, and `train` logs it with `.item()`)."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in _TENSOR_METHODS and src.canonical(node.func.value) == total
               or isinstance(node, ast.Return) and node.value is not None and src.reads(node.value, total)
               for node in ast.walk(scope))


def _kept_by_trackers(module, training) -> Iterator[Finding]:
    """`meter.update(loss)`, where the tracker's method adds its parameter up in an attribute
    (`self.sum += val * n`): the total is kept out of sight, in the tracker (LIC-HPCM's issue #4,
    pytracking's PR #313, NVIDIA DeepLearningExamples' issue #1102)."""
    for call in src.own_nodes(training.loop):
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) or under_no_grad(call):
            continue
        tracker = instance_class(call.func.value, call)
        method = next((m for m in tracker.body if isinstance(m, ast.FunctionDef) and m.name == call.func.attr),
                      None) if tracker is not None else None
        if method is None:
            continue
        for parameter, argument in _bound(method, call):
            total = _adds_up(method, parameter)
            if total is None or cuts_history(argument):
                continue
            if not (has_history(argument, training.scope, call.lineno, strict=True)
                    or _back_propagated(training.loop, argument)):
                continue
            receiver = src.canonical(call.func.value)
            fix = accumulate_item.pass_detached(module.source, argument, src.canonical(call.func))
            yield module.finding(CODE, "tracker", argument, fix, carrier=f"{receiver}.{total[len('self.'):]}",
                                 term=module.source.segment(argument), method=src.canonical(call.func))


def _bound(method: ast.FunctionDef, call: ast.Call) -> list[tuple[str, ast.expr]]:
    """(parameter, argument) pairs of a method call (`self` left out)."""
    parameters = [a.arg for a in (*method.args.posonlyargs, *method.args.args)][1:]
    bound = [(name, value) for name, value in zip(parameters, call.args) if not isinstance(value, ast.Starred)]
    return bound + [(k.arg, k.value) for k in call.keywords if k.arg in parameters]


def _adds_up(method: ast.FunctionDef, parameter: str) -> str | None:
    """The attribute (`self.sum`) that `method` adds `parameter` up in, as it was given: not
    re-assigned in the method first (`val = val.item()`), not cut where it is added."""
    if src.assignments(method, parameter):
        return None
    for stmt in src.own_nodes(method):
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
            target, term = stmt.target, stmt.value
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.BinOp) \
                and isinstance(stmt.value.op, ast.Add) \
                and src.canonical(stmt.value.left) == src.canonical(stmt.targets[0]):
            target, term = stmt.targets[0], stmt.value.right
        else:
            continue
        total = src.canonical(target)
        if total.startswith("self.") and total.count(".") == 1 and not cuts_history(term) \
                and live_reads(term, parameter):  # not `hvd.allreduce(val.detach().cpu())`, horovod's fix
            return total
    return None


def _strong_evidence(term, training, line: int, total: str) -> bool:
    """`total += x` is everywhere, so the term must be known to carry history: made by a module or
    from parameters as far as the file shows, or back-propagated in the loop itself. What the
    file cannot see into (`o, r, d, _ = env.step(a)`) is not enough."""
    return has_history(term, training.scope, line, strict=True, ignore=total) \
        or _back_propagated(training.loop, term) \
        or any(flows_into_backward(training.loop, src.canonical(read)) for read in dependencies(term))


def _back_propagated(loop, term) -> bool:
    """`loss.backward()` in the loop: the term is a tensor, whatever made it."""
    return any(src.canonical(b.root) == src.canonical(term) for b in backward_calls(loop))


def _summed_for_one_backward(stmt, total: str, scope) -> bool:
    """The loop adding up the total ends before a backward that goes through the total, and each
    pass of the loop around it starts the total afresh: a loss summed over a rollout, then
    back-propagated once (`total_loss += loss` over forecast steps, `total_loss.backward()` after)."""
    inner = next((a for a in src.ancestors(stmt) if isinstance(a, (ast.For, ast.AsyncFor, ast.While))), None)
    if inner is None:
        return False
    after = [b for b in backward_calls(scope) if b.line > inner.end_lineno and not src.inside(b.call, inner)
             and (src.reads(b.root, total) or any(a.expression == total for a in ancestors(b.root, scope, b.line)))]
    if not after:
        return False
    # The loop around the summing one, within this scope: each of its passes must start afresh.
    outer = next((a for a in src.ancestors(inner) if a is scope or isinstance(a, (ast.For, ast.AsyncFor, ast.While))),
                 scope)
    if outer is scope:
        return True
    return all(src.inside(b.call, outer) for b in after) and reset_before(outer, inner, total)


def _summed_in_one_forward(training, total: str) -> bool:
    """A loop that only differentiates (`torch.autograd.grad`, a meta-learner's inner steps on
    fast weights) and steps nothing, in a function that returns the total after it: the total is
    that call's output (E3BM's `total_logits` over the adaptation steps), not kept across steps."""
    loop, scope = training.loop, training.scope
    calls = backward_calls(loop)
    if not calls or any(b.api != "grad" for b in calls) or steps(loop) or scope is src.module_of(scope):
        return False
    return any(isinstance(r, ast.Return) and r.value is not None and src.reads(r.value, total)
               and r.lineno > loop.end_lineno for r in src.own_nodes(scope))


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

# Sharpness-aware minimisation, two forward-backward passes of one step (the SAM case of the
# real-world corpus, samples/real/sam_tasks_loss_not_reset.py).
SAM_TWO_PASSES = """
        for x, y in batches:
            loss = 0
            for head in heads:
                loss_t = loss_fn(head(model(x)), y)
                loss += loss_t
            loss.backward()
            optimizer.first_step()
            for head in heads:
                loss_t = loss_fn(head(model(x)), y)
                loss += loss_t
            loss.backward()
            optimizer.second_step()
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
# A tracker that adds up what it is given (LIC-HPCM's issue #4: `loss = AverageMeter()` made once
# an epoch, `loss.update(out_criterion["loss"])` each step, VRAM growing until cuDNN fails).
AVERAGE_METER = """
    class AverageMeter:
        def __init__(self):
            self.val = 0
            self.sum = 0
            self.count = 0

        def update(self, val, n=1):
            self.val = val
            self.sum += val * n
            self.count += n
            self.avg = self.sum / self.count

    def train_one_epoch(model, criterion, train_dataloader, optimizer):
        loss = AverageMeter()
        for d in train_dataloader:
            optimizer.zero_grad()
            out_criterion = criterion(model(d), d)
            out_criterion["loss"].backward()
            optimizer.step()
            loss.update(out_criterion["loss"])
"""

INVALID: list[Invalid] = [
    Invalid("a total of a loss kept on the trainer", TOTAL_OF_AN_ATTRIBUTE),
    Invalid("a loss added up by a tracker object (LIC-HPCM)", AVERAGE_METER),
    Invalid("a tracker held by the trainer, fed a module's loss", """
        class Meter:
            def __init__(self):
                self.total = 0.0

            def add(self, value):
                self.total = self.total + value

        class Trainer:
            def __init__(self):
                self.model = nn.Linear(4, 1)
                self.meter = Meter()

            def fit(self, batches, opt):
                for x in batches:
                    loss = self.model(x).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    self.meter.add(loss)
    """),
    # ML2021's HW7 (pai4451/ML2021#2): the total is logged with `.item()`, so it is added up
    # detached; `.item()` would leave a number that the log line fails on.
    Invalid("a total logged with .item() (ML2021)", """
        train_loss = 0
        for step, batch in enumerate(batches):
            output = model(batch)
            output.loss.backward()
            optimizer.step()
            train_loss += output.loss
            if step % 4 == 0:
                print(train_loss.item() / 4)
                train_loss = 0
    """),
    # labelmodels (BatsResearch/labelmodels#4): the loss gets a regulariser added in place, and
    # keeps the history it had.
    Invalid("a loss given a regulariser in place, then added up (labelmodels)", """
        class LabelModel(nn.Module):
            def _get_regularization_loss(self):
                return 0.0

            def fit(self, batches, optimizer):
                running_loss = 0.0
                for inputs in batches:
                    optimizer.zero_grad()
                    loss = -1 * torch.mean(self(*inputs))
                    loss += self._get_regularization_loss()
                    loss.backward()
                    optimizer.step()
                    running_loss += loss
    """),
    Invalid("SAM's second pass adding its losses onto the total the first backward freed", SAM_TWO_PASSES),
]
VALID: list[Valid] = [
    Valid("SAM's second pass starting its total again",
          SAM_TWO_PASSES.replace("            optimizer.first_step()\n",
                                 "            optimizer.first_step()\n            loss = 0\n")),
    Valid("a tracker given the loss as a number (LIC-HPCM, fixed)",
          AVERAGE_METER.replace('loss.update(out_criterion["loss"])', 'loss.update(out_criterion["loss"].item())')),
    Valid("a tracker that takes the number out of a tensor itself (pytracking's AverageMeter after PR #313)",
          AVERAGE_METER.replace("            self.val = val\n",
                                "            if torch.is_tensor(val):\n                val = val.item()\n"
                                "            self.val = val\n")),
    Valid("the logits of every adaptation step summed by a meta-learner's forward and returned (E3BM)", """
        class BaseLearner(nn.Module):
            def __init__(self):
                super().__init__()
                self.vars = nn.ParameterList([nn.Parameter(torch.randn(3, 4))])

            def forward(self, x, the_vars):
                return F.linear(x, the_vars[0])

        class MtlLearner(nn.Module):
            def __init__(self):
                super().__init__()
                self.base_learner = BaseLearner()

            def preval_forward(self, shot, query, label):
                fast_weights = self.base_learner.vars
                total_logits = 0.0 * self.base_learner(query, fast_weights)
                for k in range(5):
                    loss = F.cross_entropy(self.base_learner(shot, fast_weights), label)
                    grad = torch.autograd.grad(loss, fast_weights)
                    fast_weights = [w - 0.1 * g for g, w in zip(grad, fast_weights)]
                    logits_q = self.base_learner(query, fast_weights)
                    total_logits += logits_q
                return total_logits
    """),
    Valid("a tracker that adds up a detached copy of what it is given (horovod's Metric after 6bac3dd)",
          AVERAGE_METER.replace("self.sum += val * n", "self.sum += reduce(val.detach().cpu()) * n")),
    Valid("a tracker that keeps only the last value", """
        class Last:
            def update(self, val):
                self.val = val

        last = Last()
        for x in batches:
            loss = model(x).sum()
            loss.backward()
            last.update(loss)
    """),
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
    Valid("episode return summed from an environment's rewards (firedup)", """
        main = actor_critic(obs_dim, act_dim)
        o, ep_ret = env.reset(), 0
        for t in range(total_steps):
            a = get_action(o, act_noise)
            o2, r, d, _ = env.step(a)
            ep_ret += r
            if d:
                o, ep_ret = env.reset(), 0
            loss = compute_loss(main, buffer.sample())
            loss.backward()
            optimizer.step()
    """),
    Valid('a loss summed over a rollout, back-propagated once after it (miles-credit)', """
        model = nn.Linear(3, 3)
        for batch in loader:
            total_loss = 0
            x = batch["x"]
            for step in range(4):
                y_pred = model(x)
                loss = criterion(batch["y"][step], y_pred).mean()
                total_loss += loss
                x = y_pred
            optimizer.zero_grad()
            (total_loss / 4).backward()
            optimizer.step()
    """),
    Valid('two losses summed within one pass, the first assigned fresh (option-critic)', """
        model = nn.Linear(4, 2)
        while not done:
            if len(buffer) > batch_size:
                actor_loss = model(obs).sum()
                loss = actor_loss
                if steps % update_frequency == 0:
                    critic_loss = model(buffer.sample()).pow(2).mean()
                    loss += critic_loss
                optim.zero_grad()
                loss.backward()
                optim.step()
    """),
]
