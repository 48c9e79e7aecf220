"""BX009 loss-without-history, found in source: the cause and its docs are explainer/causes/bx009_loss_without_history.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx009_loss_without_history import CAUSE
from ...fixes import undo_cut
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import Ancestor, ancestors
from ...reading.training import (
    backward_calls,
    called_without_graph,
    cuts_history,
    forward_cuts,
    has_history,
    last_grad_switch,
    leaving_grad_off,
    local_forward,
    no_grad_block,
    scopes,
    switches_grad_off,
    turns_grad_on,
    under_no_grad,
    with_blocks,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    for scope in scopes(module.tree):
        for backward in backward_calls(scope):
            if backward.api != "backward" or under_no_grad(backward.call):
                continue
            switched = _switched_off(module, scope, backward)
            if switched is not None:
                yield switched
                continue
            if has_history(backward.root, scope, backward.line):
                continue  # the lenient form: any call the file can't see into may be a model
            cut = _cut(backward, scope)
            if cut is not None:
                yield _diagnostic(module, scope, backward, *cut)
                continue
            inside = _cut_in_forward(backward, scope)
            if inside is not None:
                call, forward, cut_node = inside
                fix = undo_cut.remove_data(module.source, cut_node) if isinstance(cut_node, ast.Attribute) \
                    else undo_cut.remove_detach(module.source, cut_node)  # none for argmax: the loss must change
                yield module.finding(CODE, "module-cut", cut_node, fix.unproven() if fix is not None else None,
                                     carrier=module.source.segment(call),
                                     made_at=cut_node, backward=backward.call, loss=module.source.segment(backward.root),
                                     cut=f"`{_cut_name(cut_node)}`", function=f"{src.enclosing_class(forward).name}.forward")


def _cut(backward, scope) -> tuple[Ancestor, str] | None:
    """The assignment that removed the history the loss would otherwise have: nearest first."""
    for ancestor in ancestors(backward.root, scope, backward.line):
        value = ancestor.value
        if value is None:
            continue
        if under_no_grad(ancestor.stmt) and has_history(value, scope, ancestor.line, ignore=""):
            return ancestor, "no_grad"
        if cuts_history(value) and _cut_receiver_has_history(value, scope, ancestor.line):
            return ancestor, "detach"
        if called_without_graph(value, scope) is not None:
            return ancestor, "decorated"
    return None


def _switched_off(module: CheckedModule, scope, backward) -> Finding | None:
    """The loss comes from a model of this file whose forward runs after a call that left
    autograd off for the whole process (`torch.set_grad_enabled(False)` as a statement, in a
    helper or in a function it calls): before it in the same scope, or later in the same loop,
    which runs before the forward of the next pass. Flagged at the forward, as the runtime does."""
    leaving = leaving_grad_off(module.tree)
    if not leaving and not any(switches_grad_off(n) for n in src.own_nodes(scope) if isinstance(n, ast.stmt)):
        return None
    forward = next((a for a in ancestors(backward.root, scope, backward.line) if a.value is not None and any(
        isinstance(c, ast.Call) and local_forward(c.func, scope, a.line, globals_too=True) is not None
        for c in ast.walk(a.value))), None)
    if forward is None or any(turns_grad_on(item.context_expr) for block in with_blocks(forward.stmt)
                              for item in block.items):
        return None
    last = last_grad_switch(scope, leaving, forward.stmt.lineno)
    loops = src.loops_around(forward.stmt, stop=scope)
    if (last is None or last[1] is None) and loops and (last is None or last[0].lineno < loops[-1].lineno):
        # Nothing in this pass before the forward switches: the end of the previous pass may.
        last = last_grad_switch(loops[-1], leaving, loops[-1].end_lineno + 1) or last
    if last is None and getattr(scope, "name", None) in leaving and _runs_again(module.tree, scope.name):
        # tbd-nets' `train_epoch` ends by calling `check_accuracy`, which leaves autograd off,
        # and the next epoch's call of it trains with autograd still off.
        last = (scope, leaving[scope.name])
    if last is None or last[1] is None:
        return None
    switch, call = last[1]
    source = module.source
    function = src.enclosing_function(switch)
    module_call = next(c for c in ast.walk(forward.value) if isinstance(c, ast.Call)
                       and local_forward(c.func, scope, forward.line, globals_too=True) is not None)
    scoped = undo_cut.scope_the_switch(source, function, switch, call) if function is not None else None
    fix = scoped or undo_cut.enable_grad_before(source, forward.stmt, source.segment(switch),
                                                f"{source.segment(call.func)}(True)")
    return module.finding(CODE, "switched-off", forward.target, fix, carrier=source.segment(forward.target),
                          made_at=forward.stmt, backward=backward.call, loss=source.segment(backward.root),
                          module=source.segment(module_call.func), switch=source.segment(switch),
                          switch_row=switch.lineno, switch_function=getattr(function, "name", ""))


def _runs_again(tree: ast.Module, name: str) -> bool:
    """Whether the function `name` is called from more than one place, or from inside a loop."""
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and src.called_name(c) == name]
    return len(calls) > 1 or any(src.loops_around(c) for c in calls)


def _cut_in_forward(backward, scope):
    """A model of this file whose `forward` returns only cut values (`self.fc(x).argmax(-1)`),
    called in the loss or what it is made from: (the call, that forward, the cut)."""
    values = [(backward.root, backward.line), *((a.value, a.line) for a in ancestors(backward.root, scope, backward.line)
                                                if a.value is not None)]
    for value, line in values:
        for call in (n for n in ast.walk(value) if isinstance(n, ast.Call)):
            forward = local_forward(call.func, scope, line)
            cuts = forward_cuts(forward) if forward is not None else None
            if cuts:
                return call, forward, cuts[-1]
    return None


def _cut_name(node) -> str:
    if isinstance(node, ast.Call):
        return f".{node.func.attr}()" if isinstance(node.func, ast.Attribute) else f"{src.canonical(node.func)}()"
    return f".{node.attr}"


def _cut_receiver_has_history(value: ast.expr, scope, line: int) -> bool:
    """`out.detach()` of an `out` with history (not `torch.zeros(...)`)."""
    node = value
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr in ("detach", "item", "tolist", "numpy") \
        and has_history(node.func.value, scope, line)


def _diagnostic(module, scope, backward, ancestor: Ancestor, how: str) -> Finding:
    source = module.source
    facts = {"loss": source.segment(backward.root)}
    if how == "decorated":
        function, decorator = called_without_graph(ancestor.value, scope)
        facts.update(function=function.name, decorator=source.segment(decorator), decorator_row=decorator.lineno)
    variant = {"no_grad": "no-grad", "decorated": "decorated"}.get(how, "detached")
    fix = _fix(source, scope, ancestor, how)
    # Removing a cut changes what trains, and the cut may be meant (A3C's detached bootstrap
    # value): applied only on request.
    return module.finding(CODE, variant, ancestor.target, fix.unproven() if fix is not None else None,
                          carrier=source.segment(ancestor.target), made_at=ancestor.stmt, backward=backward.call, **facts)


def _fix(source, scope, ancestor: Ancestor, how: str):
    """The runtime's fixes for the same cut: leave the `no_grad` block, or recompute / keep the
    value instead of detaching it."""
    if how == "no_grad":
        block = no_grad_block(ancestor.stmt)
        return undo_cut.leave_no_grad(source, block) if isinstance(block, ast.With) else None
    if how == "decorated":
        return undo_cut.remove_decorator(source, *called_without_graph(ancestor.value, scope))
    call = ancestor.value
    while isinstance(call, ast.Subscript):
        call = call.value
    if src.canonical(call.func.value) == ancestor.expression:
        recomputed = undo_cut.recompute_instead_of_detach(source, scope, ancestor.stmt, ancestor.expression)
        if recomputed is not None:
            return recomputed
    return undo_cut.remove_detach(source, call)


# The cut is inside the model the loss comes from.
CUT_IN_FORWARD = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return {returned}

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches:
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

# A helper of the data pipeline that leaves autograd off (`helper`), then the training.
SWITCHED_OFF = """
        class Regressor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)
{helper}
        model = Regressor()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for image in images:
            target = landmarks_of(image)
            {switch_on}
            pred = model(image.flatten()[:4])
            loss = (pred - target[:2]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""
SWITCHED_OFF_BY_EVALUATION = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x)

        net = Net()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

        def check_accuracy(loader):
            torch.set_grad_enabled(False)
            return sum((net(x).argmax(1) == y).sum().item() for x, y in loader)

        def train_epoch():
            {switch_on}
            for x, y in train_loader:
                outs = net(x)
                loss = F.cross_entropy(outs, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return check_accuracy(val_loader)

        for epoch in range(3):
            train_epoch()
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("the model's forward detaches what it returns", CUT_IN_FORWARD.format(returned="self.fc(x).detach()")),
    Invalid("the model's forward returns .data", CUT_IN_FORWARD.format(returned="torch.tanh(self.fc(x)).data")),
    Invalid("a forward helper decorated with no_grad", """
        from torch.nn.functional import mse_loss
        model = nn.Linear(3, 1)

        @torch.no_grad()
        def predict(x):
            return model(x)

        for x, y in batches:
            loss = mse_loss(predict(x), y)
            loss.backward()
    """),
    Invalid("a prediction detached where it is made", """
        from torch.nn.functional import mse_loss
        model = nn.Linear(3, 1)
        for x, y in batches:
            pred = model(x).detach()
            loss = mse_loss(pred, y)
            loss.backward()
    """),
    Invalid("a helper switches autograd off for the whole process before the training forward "
            "(1adrianb/face-alignment, api.py before ecb963e)", SWITCHED_OFF.format(helper="""
        def landmarks_of(image):
            torch.set_grad_enabled(False)
            return image.mean(0)
    """, switch_on="")),
    Invalid("an evaluation at the end of each epoch switches autograd off for the next one "
            "(ethanjperez/tbd-nets, train-model.py before 9de0235)", SWITCHED_OFF_BY_EVALUATION.format(switch_on="")),
]
VALID: list[Valid] = [
    Valid("a loss on a tensor that trains, kept by another object (gdrl's SAC temperature)", """
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 1)
                self.logalpha = torch.zeros(1, requires_grad=True)
                self.alpha_optimizer = torch.optim.Adam([self.logalpha], lr=0.1)

        class Agent:
            def __init__(self):
                self.policy_model = Policy()

            def optimize(self, states):
                logpi = self.policy_model.fc(states)
                target_alpha = (logpi - 1.0).detach()
                alpha_loss = -(self.policy_model.logalpha * target_alpha).mean()
                self.policy_model.alpha_optimizer.zero_grad()
                alpha_loss.backward()
                self.policy_model.alpha_optimizer.step()
    """),
    Valid("the helper turns autograd back on before it returns", SWITCHED_OFF.format(helper="""
        def landmarks_of(image):
            torch.set_grad_enabled(False)
            points = image.mean(0)
            torch.set_grad_enabled(True)
            return points
    """, switch_on="")),
    Valid("the helper evaluates under `@torch.no_grad()`, which turns autograd back on when it returns",
          SWITCHED_OFF.format(helper="""
        @torch.no_grad()
        def landmarks_of(image):
            return image.mean(0)
    """, switch_on="")),
    Valid("each epoch turns autograd back on first (tbd-nets' fix, 9de0235)",
          SWITCHED_OFF_BY_EVALUATION.format(switch_on="torch.set_grad_enabled(True)")),
    Valid("the model's forward returns what it computes", CUT_IN_FORWARD.format(returned="self.fc(x).float()")),
    Valid("TD3: the target under no_grad, the critic's loss summed over its Q values by a generator "
          "(DLR-RM/stable-baselines3, td3.py)", """
        def train(self, replay_buffer, gradient_steps):
            for _ in range(gradient_steps):
                replay_data = replay_buffer.sample()
                with th.no_grad():
                    next_actions = self.actor_target(replay_data.next_observations)
                    next_q_values = th.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
                    target_q_values = replay_data.rewards + self.gamma * next_q_values.min(dim=1, keepdim=True)[0]
                current_q_values = self.critic(replay_data.observations, replay_data.actions)
                critic_loss = sum(F.mse_loss(current_q, target_q_values) for current_q in current_q_values)
                self.critic.optimizer.zero_grad()
                critic_loss.backward()
                self.critic.optimizer.step()
    """),
    Valid("A3C: the bootstrap value detached, the losses made from values and log-probabilities kept in "
          "lists during the rollout (ikostrikov/pytorch-a3c, train.py)", """
        def train(model, optimizer, env, state, hx, cx):
            values, log_probs, rewards = [], [], []
            for step in range(20):
                value, logit, (hx, cx) = model((state.unsqueeze(0), (hx, cx)))
                state, reward, done, _ = env.step(logit.argmax().item())
                values.append(value)
                log_probs.append(logit.log_softmax(-1)[0, 0])
                rewards.append(reward)
            value, _, _ = model((state.unsqueeze(0), (hx, cx)))
            R = value.detach()
            policy_loss, value_loss = 0, 0
            for i in reversed(range(len(rewards))):
                R = 0.99 * R + rewards[i]
                value_loss = value_loss + 0.5 * (R - values[i]).pow(2)
                policy_loss = policy_loss - log_probs[i]
            optimizer.zero_grad()
            (policy_loss + 0.5 * value_loss).backward()
            optimizer.step()
    """),
    Valid("DDPG: the critic sees action.detach()", """
        actor, critic = Actor(), Critic()
        for state, target_q in replay:
            action = actor(state)
            critic_loss = mse_loss(critic(state, action.detach()), target_q)
            critic_loss.backward()
            critic_opt.step()
    """),
    Valid("DQN: the target computed under no_grad", """
        policy, target_net = DQN(), DQN()
        for state, action, reward, next_state in replay:
            q = policy(state).gather(1, action)
            with torch.no_grad():
                target = reward + 0.99 * target_net(next_state).max(1)[0]
            loss = F.smooth_l1_loss(q, target.unsqueeze(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """),
    Valid("a loss from a helper function whose inside the file can't show", """
        for batch in loader:
            with torch.no_grad():
                teacher_out = teacher(batch)
            loss = distillation_loss(student, batch, teacher_out)
            loss.backward()
    """),
    Valid("validation under no_grad, no backward", """
        model = nn.Linear(4, 1)
        with torch.no_grad():
            for x, y in val_loader:
                val_loss = mse_loss(model(x), y)
                total += val_loss.item()
    """),
    Valid("an actor's method output weighted by Q-values under no_grad", """
        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)

            def get_action(self, x):
                probs = torch.softmax(self(x), -1)
                return probs.argmax(-1), torch.log(probs), probs

        actor = Actor().to(device)
        for obs in batches:
            _, log_pi, action_probs = actor.get_action(obs)
            with torch.no_grad():
                q_values = qf(obs)
            actor_loss = (action_probs * (alpha * log_pi - q_values)).mean()
            actor_loss.backward()
            actor_optimizer.step()
    """),
    Valid("TD3: a detached target against a network the agent made elsewhere", """
        class TD3Agent:
            def __init__(self, config):
                self.network = config.network_fn()
                self.target_network = config.network_fn()

            def step(self):
                transitions = self.replay.sample()
                states, actions = tensor(transitions.state), tensor(transitions.action)
                next_states = tensor(transitions.next_state)
                a_next = self.target_network(next_states)
                q_1, q_2 = self.target_network.q(next_states, a_next)
                target = rewards + gamma * torch.min(q_1, q_2)
                target = target.detach()
                q_1, q_2 = self.network.q(states, actions)
                critic_loss = F.mse_loss(q_1, target) + F.mse_loss(q_2, target)
                critic_loss.backward()
                self.network.critic_opt.step()
    """),
    Valid("the loss is a method of a model a helper builds, fed samples drawn under no_grad (torchgfn)", """
        from gfn.gflownet import TBGFlowNet

        def init_gflownet(pf, pb):
            gflownet = TBGFlowNet(pf, pb)
            return gflownet

        gflownet = init_gflownet(pf, pb)
        sampler = nn.Linear(4, 4)
        for iteration in range(100):
            with torch.no_grad():
                samples = sampler(states)
            optimizer.zero_grad()
            loss = gflownet.loss(env, samples)
            loss.backward()
            optimizer.step()
    """),
]
