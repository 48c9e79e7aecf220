"""BX007 step-before-backward, found in source: the cause and its docs are explainer/causes/bx007_step_before_backward.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx007_step_before_backward import CAUSE
from ...fixes import graph_options, recompute_forward, reorder_updates
from ...model import Finding, Fix
from ...reading import source as src
from ...reading.dataflow import (
    Ancestor,
    Step,
    ancestors,
    carries_history,
    modules_called,
    same_pass,
    shared_ancestor,
    steps,
)
from ...reading.training import (
    RETAIN_KEYWORDS,
    Backward,
    backward_calls,
    defines_forward,
    has_history,
    helper_called,
    instance_class,
    local_forward,
    next_in_its_loop,
    scopes,
    step_after,
    update_moved_after,
    zeroed_before_use,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    for scope in scopes(module.tree):
        calls = backward_calls(scope)
        stepped = steps(scope)
        flagged: set[int] = set()
        for backward in calls:
            found = []
            for step in stepped:
                if not same_pass(step.call, backward.call) or _kept_to_others(backward, step, stepped, scope):
                    continue
                stale = _built_before(backward, step, scope)
                if stale is None or id(stale.stmt) in flagged or _freed_earlier(stale, backward, calls, scope):
                    continue
                found.append((step, stale))
            if not found:
                continue
            # rlkit's SAC: qf1 and qf2 both step before the policy's backward, which goes through
            # both. The last of them is told (torch names its weights first), and no update moved
            # alone after the backward would leave its graph as it was built.
            # Of tensors made by different statements, the one made last: the backward meets its
            # nodes first, and torch names its weights (tianshou's SAC: `current_q2a`, after
            # `current_q1a`, each stale after its own critic's step).
            step, stale = found[-1] if len({id(s.stmt) for _, s in found}) == 1 else \
                max(found, key=lambda pair: (pair[1].line, pair[1].stmt.col_offset))
            flagged.add(id(stale.stmt))
            yield _diagnostic(module, scope, stale, step, backward, calls, alone=len(found) == 1)


def _kept_to_others(backward: Backward, step: Step, stepped, scope) -> bool:
    """`d_loss.backward(inputs=[p for group in opt_d.param_groups for p in group['params']])`,
    or `inputs=list(D.parameters())`: the gradients are taken for another optimizer's (or
    another module's) parameters only, whose modules `step` does not update, so the backward
    stops at those modules and never needs the stepped weights upstream of them (the
    generator's, in a GAN's discriminator update moved after the generator's). Where the source
    does not show which modules the optimizers train, two optimizers are taken to train
    different ones."""
    keyword = backward.keyword("inputs")
    if keyword is None or src.reads(keyword.value, step.optimizer):
        return False
    owners = [other for other in stepped if other.optimizer != step.optimizer and src.reads(keyword.value, other.optimizer)]
    if owners:
        return not any(o.modules and step.modules and o.modules & step.modules for o in owners)
    # `info_loss.backward(inputs=list(D.parameters()))`: the modules are named themselves, and no
    # stepped one may be called on what they made.
    named = {src.canonical(c.func.value) for c in src.calls_named(keyword.value, "parameters", "named_parameters")
             if isinstance(c.func, ast.Attribute)}
    return bool(named) and step.modules is not None and not named & step.modules \
        and _reached_before_the_kept(backward, scope, step.modules, named) is not None


def _built_before(backward: Backward, step: Step, scope) -> Ancestor | None:
    """The latest tensor in `backward`'s graph computed, before `step`, by a module that `step`
    updates (any module, when the optimizer's parameters are not visible)."""
    found = []
    for ancestor in ancestors(backward.root, scope, backward.line):
        if not same_pass(ancestor.stmt, step.call) or ancestor.value is None:
            continue
        producers = modules_called(ancestor.value, scope, ancestor.line)
        if not producers or not carries_history(ancestor, scope) or _left_alone(ancestor, step, scope) \
                or _no_gradient_since_zeroed(producers, step, scope):
            continue
        if step.modules is None or producers & step.modules or _runs_a_stepped_part(producers, step.modules, scope,
                                                                                      ancestor.line):
            found.append(ancestor)
    return max(found, key=lambda a: (a.line, a.stmt.col_offset)) if found else None


def _left_alone(ancestor: Ancestor, step: Step, scope) -> bool:
    """pranz24's SAC: `qf1, qf2 = self.critic(state, action)`, whose forward computes each head
    with layers of its own, then `critic_optim.zero_grad()`, `qf1_loss.backward()`,
    `critic_optim.step()` before `qf2_loss.backward()`. The step changes only the weights that
    got a gradient since the zero_grad, which left the others' `None` for the optimizer to skip:
    the first head's. What the second head made is still as it was built."""
    unpacked = _unpacked(ancestor)
    heads = _heads(ancestor.stmt.value.func, ancestor.stmt) if unpacked is not None else None
    if heads is None or unpacked[1] >= len(heads):
        return False
    module, index = unpacked
    zeroed = _zeroed_to_none(step, scope)
    if zeroed is None:
        return False
    read = set()
    for backward in backward_calls(scope):
        if not (zeroed.lineno < backward.line < step.line and same_pass(backward.call, step.call)):
            continue
        if module in modules_called(backward.root, scope, backward.line):
            return False
        for other in ancestors(backward.root, scope, backward.line):
            if other.value is None or module not in modules_called(other.value, scope, other.line):
                continue
            head = _unpacked(other)
            if head is None or head[0] != module or head[1] >= len(heads):
                return False  # the whole output, or another call of the module: any weight may change
            read.add(head[1])
    return bool(read) and not any(heads[other] & heads[index] for other in read)


def _unpacked(ancestor: Ancestor) -> tuple[str, int] | None:
    """(`self.critic`, 1) for `qf2` in `qf1, qf2 = self.critic(state, action)`."""
    stmt = ancestor.stmt
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
            and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, (ast.Name, ast.Attribute))):
        return None
    index = next((i for i, element in enumerate(stmt.targets[0].elts) if element is ancestor.target), None)
    return (src.canonical(stmt.value.func), index) if index is not None else None


def _heads(func: ast.expr, at: ast.stmt) -> list[frozenset[str]] | None:
    """For each element of the tuple the module's forward returns, the submodules that compute
    it; None where the forward is not known, returns otherwise, or reads an attribute of its
    module other than to call a submodule (a parameter of its own could be in every head)."""
    cls = instance_class(func, at)
    forward = defines_forward(cls) if cls is not None else None
    if forward is None:
        return None
    returns = [node for node in src.own_nodes(forward) if isinstance(node, ast.Return)]
    if len(returns) != 1 or not isinstance(returns[0].value, ast.Tuple):
        return None
    for node in ast.walk(forward):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and not (isinstance(src.parent(node), ast.Call) and src.parent(node).func is node):
            return None
    line = returns[0].lineno
    return [frozenset(modules_called(element, forward, line)).union(
        *(modules_called(a.value, forward, a.line) for a in ancestors(element, forward, line) if a.value is not None))
        for element in returns[0].value.elts]


def _zeroed_to_none(step: Step, scope) -> ast.Call | None:
    """The last `<optimizer>.zero_grad()` of `step`'s optimizer before it in the same pass, where
    it sets the gradients to None (torch 2's default), not to zero: an optimizer skips a weight
    whose gradient is None, and steps one whose gradient is zero (momentum, weight decay)."""
    found = [node for node in src.own_nodes(scope) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "zero_grad" and src.canonical(node.func.value) == step.optimizer
             and node.lineno < step.line and same_pass(node, step.call)]
    if not found:
        return None
    last = max(found, key=lambda node: (node.lineno, node.col_offset))
    return last if _to_none(last) else None


def _to_none(zero_grad: ast.Call) -> bool:
    """Whether the `zero_grad()` call sets the gradients to None (torch 2's default)."""
    flags = [k.value for k in zero_grad.keywords if k.arg == "set_to_none"] + zero_grad.args[:1]
    return all(isinstance(f, ast.Constant) and f.value is True for f in flags)


def _no_gradient_since_zeroed(producers: set[str], step: Step, scope) -> bool:
    """FL-MRCM's domain classifier: `net.zero_grad(); net_fd.zero_grad()`, then `df_loss.backward()`
    on `net_fd(z.detach())` and `optimizer_fd.step()`, an optimizer passed in, whose parameters
    the source does not show. Whatever it holds, it steps only the weights that got a gradient
    since they were set to None: none of `net`'s, which no backward in between reaches, so what
    `net` made before is as it was built. Each of `producers` must be zeroed in the same pass
    (by the step's optimizer or by its own `zero_grad()`), and every backward in between must show
    all the modules it reaches: none that a helper of the file could call."""
    zeroed: dict[str, int] = {}
    for node in src.own_nodes(scope):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "zero_grad"
                and node.lineno < step.line and same_pass(node, step.call) and _to_none(node)):
            continue
        receiver = src.canonical(node.func.value)
        for producer in producers if receiver == step.optimizer else {receiver} & producers:
            zeroed[producer] = max(zeroed.get(producer, 0), node.lineno)
    if set(zeroed) != producers:
        return False
    since = min(zeroed.values())
    for backward in backward_calls(scope):
        if since < backward.line < step.line and same_pass(backward.call, step.call):
            reached = _modules_reached(backward, scope)
            if reached is None or reached & producers:
                return False
    return True


def _modules_reached(backward: Backward, scope) -> set[str] | None:
    """The modules called on the way to `backward`'s root, as the source shows them, through the
    iterables of the loops whose variables it reads (AGAIN-VC's `for scale in d_real:`); None
    where a function of the file is called on the way (it may run any module)."""
    loops = {name: node for node in src.own_nodes(scope) if isinstance(node, (ast.For, ast.AsyncFor))
             for name in src.names_bound([node])}
    values, pending, seen = [], [(backward.root, backward.line)], set()
    while pending:
        value, line = pending.pop()
        values.append(value)
        found = [(a.value, a.line) for a in ancestors(value, scope, line) if a.value is not None]
        read = {n for v, _ in [(value, line), *found] for n in src.names_read(v)}
        found += [(loops[n].iter, loops[n].lineno) for n in read if n in loops]
        for more in found:
            if id(more[0]) not in seen:
                seen.add(id(more[0]))
                pending.append(more)
    if any(isinstance(call, ast.Call) and helper_called(call, scope) is not None
           for value in values for call in ast.walk(value)):
        return None
    return set().union(*(modules_called(value, scope, backward.line) for value in values))


def _runs_a_stepped_part(producers: set[str], stepped: frozenset[str], scope, line: int) -> bool:
    """firedup's DDPG: `_, q, q_pi = main(obs1, acts)`, `q_optimizer` made from `main.q.parameters()`:
    the module called is a class of this file whose forward calls the stepped part (`self.q(...)`)."""
    for producer in producers:
        parts = {f"self.{m[len(producer) + 1:].split('.')[0]}" for m in stepped if m.startswith(producer + ".")}
        forward = local_forward(ast.Name(producer, ast.Load()), scope, line, globals_too=True) \
            if parts and producer.isidentifier() else None
        if forward is not None and any(src.canonical(c.func) in parts
                                       for c in src.own_nodes(forward) if isinstance(c, ast.Call)):
            return True
    return False


def _freed_earlier(stale: Ancestor, backward: Backward, calls: list[Backward], scope) -> bool:
    """An earlier backward without retain_graph already went through `stale`: the graph is
    freed before the step matters (BX006's case)."""
    key = (id(stale.stmt), stale.expression)
    return any(same_pass(stale.stmt, earlier.call) and same_pass(earlier.call, backward.call)
               and earlier.frees_graph()
               and key in {(id(a.stmt), a.expression) for a in ancestors(earlier.root, scope, earlier.line)}
               for earlier in calls)


def _diagnostic(module, scope, stale: Ancestor, step: Step, backward: Backward, calls, alone: bool) -> Finding:
    source = module.source
    name = source.segment(stale.target)
    step_code = source.segment(step.call)
    after = (_update_after(source, scope, step, backward, calls) or _keep_to_own(source, scope, step, backward)) \
        if alone else None
    if after is not None:
        return module.finding(CODE, "stale", _where_stepped(stale, step), after, carrier=name, made_at=stale.stmt,
                              backward=backward.call, steps=(step.call,))
    # What it was made from in the same block, with history, is made again with it: the first
    # backward went through those graphs too (`fake = generator(z)` under `discriminator(fake)`).
    fix = recompute_forward.recompute_before_use(
        source, scope, stale.stmt, step.line, backward.statement,
        f"Recompute `{name}` after `{step_code}` (line {step.line}), so the backward goes through "
        f"a graph built with the updated weights",
        upstream=_made_history(scope))
    retaining = [c for c in calls if c.line < step.line and same_pass(stale.stmt, c.call) and c.retains_graph()]
    if fix is not None and _reads_history_it_does_not_make(scope, stale, step, backward):
        # The backward goes on into a graph made before the step (an imagined rollout), now with
        # some weights stepped and some not: whether that is what the code means, or both
        # updates should take their gradients before either steps, the source does not say.
        fix = fix.unproven()
    elif fix is not None and retaining and not any(shared_ancestor(retaining[-1], later, scope) is not None
                                                   for later in calls if later.line > backward.line):
        # Kept for this backward alone: recomputed, its graph is no longer needed. One a later
        # backward shares (tianshou's actor loss, on the same actor's forward) stays kept.
        keyword = next((k.arg for k in retaining[-1].call.keywords if k.arg in RETAIN_KEYWORDS), "retain_graph")
        drop = graph_options.drop_keyword(source, retaining[-1].call, keyword)
        if drop is not None:
            fix = Fix(fix.message + f", without {keyword}=True", fix.edits + (drop,))
    if fix is not None and not alone:
        # Several updates stepped the weights first (rlkit's qf1 and qf2): recomputed after the
        # last, the loss is taken at weights they all changed, where the code built it before
        # any of them, as if its own update came first (rlkit's fix): the source does not say.
        fix = fix.unproven()
    if fix is not None and step.call.func.attr != "step":  # a load or a soft update
        # Recomputed after the load, the target network's output is the loaded network's: the
        # values change, which moving the load after the update would not do.
        fix = fix.unproven()
    if fix is None and alone:
        fix = _update_after(source, scope, step, backward, calls, retained=False)
    return module.finding(CODE, "stale", _where_stepped(stale, step), fix, carrier=name, made_at=stale.stmt,
                          backward=backward.call,
                          steps=(step.call,))


def _where_stepped(stale: Ancestor, step: Step) -> ast.AST:
    """Where the diagnostic points: the name made, or, where its statement spans lines, the call
    of the stepped module in it (rlkit's `self.qf2(obs, new_obs_actions)`, the second argument of
    a `torch.min(...)` over three lines), the line the runtime names too."""
    if stale.value is None or step.modules is None or stale.stmt.end_lineno == stale.stmt.lineno:
        return stale.target
    return next((c for c in ast.walk(stale.value) if isinstance(c, ast.Call)
                 and isinstance(c.func, (ast.Name, ast.Attribute)) and src.canonical(c.func) in step.modules),
                stale.target)


def _update_after(source, scope, step: Step, backward: Backward, calls, retained: bool = True) -> Fix | None:
    """MorvanZhou's GAN: `D_loss` and `G_loss` both made before `opt_D.step()`, and
    `D_loss.backward(retain_graph=True)` keeping the graph for `G_loss`: the code means both
    gradients at the weights the forward ran with. D's whole update moves after G's, as the
    runtime's first fix for this shape does (and the maintainer's fix, G first, trains). Where the
    loss is made after the step, the code means the stepped weights: None, and the recompute.
    Without `retained`, the moved backward keeps no graph: deocclusion's CGAN, where no recompute
    can be offered (the generator's loss is a sum built with `+=`), as the runtime then moves the
    updates too."""
    if step.call.func.attr != "step" or not isinstance(backward.root, (ast.Name, ast.Attribute)):
        return None
    made = src.last_assignment(scope, src.canonical(backward.root), backward.line)
    failing, step_stmt = backward.statement, src.statement_of(step.call)
    if made is None or made.stmt.lineno >= step.line:
        return None
    found = update_moved_after(src.enclosing_block(failing), step_stmt, failing)
    if found is None:
        return None
    moved, end, anchor = found
    moved_calls = [c for c in calls if any(c.statement is stmt for stmt in moved)]
    if len(moved_calls) != 1:
        return None
    # What the moved loss reaches of the weights stepped first (a plain tensor the resampling
    # weights' optimizer trains, not a module) the source does not always show: its backward is
    # kept to its own optimizer's parameters.
    if moved_calls[0].retains_graph():
        return reorder_updates.update_after(source, moved, end, backward.call, step.call.func.value,
                                            moved_calls[0].call, keep_to_own=True, anchor=anchor) if retained else None
    # deocclusion's discriminator loss takes the generator's output detached, so the two losses
    # share no graph the source shows, and the moved backward needs none kept. What the source
    # does not show they may still share (the moved backward would then find it freed).
    if retained or shared_ancestor(moved_calls[0], backward, scope) is not None:
        return None
    fix = reorder_updates.update_after(source, moved, end, backward.call, step.call.func.value, moved_calls[0].call,
                                       keep_to_own=True, retain=False, anchor=anchor)
    return fix.unproven() if fix is not None else None


def _keep_to_own(source, scope, step: Step, backward: Backward) -> Fix | None:
    """InfoMax-VAE, read from the source: `optim_D.zero_grad(); info_loss.backward();
    optim_D.step()` after `optim_VAE.step()`, the critic's loss made from the encoder's output.
    The backward is kept to `optim_D`'s parameters (`inputs=`), as the runtime's first fix for
    this shape does: it stops at the critic, so it never needs the stepped encoder's weights.
    Only where the source shows both optimizers' modules, no stepped module is called on what
    the kept optimizer's modules made (the path to them would need its weights), and every
    other optimizer of the loop whose modules the loss reaches zeroes its gradients before it
    steps again, so the gradients this backward no longer leaves there were never used."""
    if step.call.func.attr != "step" or not step.modules or backward.keyword("inputs") is not None:
        return None
    own_name = step_after(backward.statement)
    own = next((s for s in steps(scope) if s.optimizer == own_name and s.line > backward.line), None)
    after = next_in_its_loop(backward.statement)
    if own is None or not own.modules or own.modules & step.modules or after is None:
        return None
    reached = _reached_before_the_kept(backward, scope, step.modules, own.modules)
    if reached is None or not reached & own.modules:
        return None
    for other in steps(scope):
        if other.optimizer != own.optimizer and (other.modules is None or other.modules & reached) \
                and not zeroed_before_use(after, other.optimizer):
            return None
    return Fix(f"Keep `{source.segment(backward.call)}` to the parameters `{own.optimizer}` steps (`inputs=`), so it "
               f"no longer goes back through the weights `{source.segment(step.call)}` (line {step.line}) changed; "
               f"the gradients it no longer leaves in the other modules are zeroed before their next step",
               (graph_options.insert_keyword(source, backward.call, graph_options.optimizers_inputs(own.optimizer)),))


def _reached_before_the_kept(backward: Backward, scope, stepped: frozenset[str], kept) -> set[str] | None:
    """The modules `backward`'s graph calls, or None where one of the `stepped` modules is called
    on what the `kept` ones made: the path back to the kept modules' parameters would then go
    through the stepped weights."""
    reached: set[str] = set()
    for ancestor in ancestors(backward.root, scope, backward.line):
        called = modules_called(ancestor.value, scope, ancestor.line) if ancestor.value is not None else set()
        reached |= called
        if called & stepped and (_called_on(ancestor.value, stepped, kept, scope, ancestor.line) or any(
                b.value is not None and modules_called(b.value, scope, b.line) & kept
                for b in ancestors(ancestor.value, scope, ancestor.line))):
            return None
    return reached


def _called_on(value: ast.AST, outer: frozenset[str], inner, scope, line: int) -> bool:
    """Whether `value` calls one of the `outer` modules on what one of the `inner` ones returns:
    `actor(critic(s))` for outer actor and inner critic, not `critic(torch.cat([s, actor(s)]))`."""
    return any(src.canonical(call.func) in outer
               and any(modules_called(arg, scope, line) & inner for arg in [*call.args, *(k.value for k in call.keywords)])
               for call in ast.walk(value) if isinstance(call, ast.Call))


def _reads_history_it_does_not_make(scope, stale: Ancestor, step: Step, backward: Backward) -> bool:
    """Whether the statements the fix runs again read a value with history that they do not
    make (`flatten_states`, made by the model the other optimizer trains): the graph behind it
    is the one the first backward went through, which must then still be retained."""
    plan = recompute_forward.recomputed(scope, stale.stmt, step.line, backward.statement, _made_history(scope))
    if plan is None:
        return False
    made: set[str] = set()
    for stmt in recompute_forward.copied_assignments(plan):
        reads = [n for n in ast.walk(src.value_of(stmt)) if isinstance(n, ast.Name) and n.id not in made]
        if any(has_history(n, scope, stmt.lineno) for n in reads):
            return True
        made |= {n.id for t in src.targets_of(stmt) for n in ast.walk(t) if isinstance(n, ast.Name)}
    return False


def _made_history(scope):
    """Which statements made a value with history: the fix runs them again with the carrier."""
    return lambda stmt: has_history(src.value_of(stmt), scope, stmt.lineno, strict=True)


# A hard target update between the target network's forward and the backward through it.
TARGET_UPDATE = """
        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, s):
                return torch.tanh(self.fc(s))

        actor, target_actor = Actor(), Actor()
        critic = nn.Linear(6, 1)
        optimizer = torch.optim.Adam(critic.parameters())
        for s, s2, r in batches:
            next_q = critic(torch.cat([s2, target_actor(s2)], 1))
{before}            loss = (r + 0.99 * next_q - critic(torch.cat([s, actor(s)], 1))).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
{after}
"""

# The model comes from a factory passed as a parameter (Spinning Up's `actor_critic`): only the
# optimizers' `.parameters()` show its parts are modules.
FACTORY_DDPG = """
        def ddpg(actor_critic, steps):
            main = actor_critic(4, 2)
            pi_optimizer = torch.optim.Adam(main.pi.parameters())
            q_optimizer = torch.optim.Adam(main.q.parameters())
            for t in range(steps):
                o, a, r = sample()
                q = main.q(o, a)
{early}                q_loss = (q - r).pow(2).mean()
                q_optimizer.zero_grad()
                q_loss.backward()
                q_optimizer.step()
{late}                pi_optimizer.zero_grad()
                pi_loss.backward()
                pi_optimizer.step()
"""
PI_LOSS = "                pi_loss = -main.q(o, main.pi(o)).mean()\n"

# Each network holds its own optimizer (`agent.critic.optimizer`).
OWN_OPTIMIZERS = """
        class Critic(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(6, 1)
                self.optimizer = torch.optim.Adam(self.parameters())

            def forward(self, s, a):
                return self.fc(torch.cat([s, a], 1))

        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.optimizer = torch.optim.Adam(self.parameters())

            def forward(self, s):
                return self.fc(s)

        class Agent:
            def __init__(self):
                self.actor, self.critic = Actor(), Critic()

            def learn(self, s, r):
                q = self.critic(s, self.actor(s))
                critic_loss = (q - r).pow(2).mean()
                self.critic.optimizer.zero_grad()
                critic_loss.backward(retain_graph=True)
                self.critic.optimizer.step()
{actor_loss}                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self.actor.optimizer.step()
"""

SOFT_UPDATE = ("            with torch.no_grad():\n"
               "                for t, p in zip(target_actor.parameters(), actor.parameters()):\n"
               "                    t.copy_(0.995 * t + 0.005 * p)\n")

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
# pranz24's SAC critic: one module, a Q head of its own layers each.
TWO_HEADS = """
        class QNetwork(nn.Module):
            def __init__(self):
                super().__init__()
                {layers}

            def forward(self, x):
                {forward}

        critic = QNetwork()
        critic_optim = torch.optim.Adam(critic.parameters())
        for x, y in batches:
            qf1, qf2 = critic(x)
            qf1_loss = (qf1 - y).pow(2).mean()
            qf2_loss = (qf2 - y).pow(2).mean()
            critic_optim.zero_grad({keep})
            qf1_loss.backward({retain})
            critic_optim.step()
            critic_optim.zero_grad()
            qf2_loss.backward()
            critic_optim.step()
"""
SEPARATE_HEADS = dict(layers="self.q1 = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))\n"
                             "                self.q2 = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))",
                      forward="return self.q1(x), self.q2(x)", retain="")
# The first backward keeps the trunk's graph, which the second goes through again.
SHARED_TRUNK = dict(layers="self.trunk = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))\n"
                           "                self.q1, self.q2 = nn.Linear(4, 1), nn.Linear(4, 1)",
                    forward="h = self.trunk(x)\n                return self.q1(h), self.q2(h)",
                    retain="retain_graph=True")


INVALID: list[Invalid] = [
    Invalid("a model class holding both networks and their optimizers (params= by keyword), made at module "
            "level below the training function that reads it (RN's inpainting)", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.generator = nn.Linear(4, 4)
                self.discriminator = nn.Linear(4, 1)
                self.gen_optimizer = optim.Adam(params=self.generator.parameters())
                self.dis_optimizer = optim.Adam(params=self.discriminator.parameters())

        def train():
            for z, real in batches:
                fake = model.generator(z)
                d_loss = model.discriminator(real).mean() - model.discriminator(fake.detach()).mean()
                g_fake = model.discriminator(fake)
                g_loss = -g_fake.mean()
                model.dis_optimizer.zero_grad()
                d_loss.backward()
                model.dis_optimizer.step()
                model.gen_optimizer.zero_grad()
                g_loss.backward()
                model.gen_optimizer.step()

        model = Model()
        train()
    """),
    Invalid("one actor-critic module whose forward runs the critic stepped by its own optimizer (FiredUp's DDPG)",
            """
        class ActorCritic(nn.Module):
            def __init__(self):
                super().__init__()
                self.policy = nn.Linear(3, 1)
                self.q = nn.Linear(4, 1)

            def forward(self, x, a):
                q = self.q(torch.cat((x, a), dim=1))
                q_pi = self.q(torch.cat((x, self.policy(x)), dim=1))
                return q, q_pi

        main = ActorCritic()
        q_optimizer = optim.Adam(main.q.parameters())
        pi_optimizer = optim.Adam(main.policy.parameters())
        for obs, acts, backup in batches:
            q, q_pi = main(obs, acts)
            pi_loss = -q_pi.mean()
            q_loss = (q - backup).pow(2).mean()
            q_optimizer.zero_grad()
            q_loss.backward()
            q_optimizer.step()
            pi_optimizer.zero_grad()
            pi_loss.backward()
            pi_optimizer.step()
    """),
    Invalid("two critics given to the trainer and stepped before the policy's backward through both (rlkit's SAC)",
            """
        class Trainer:
            def __init__(self, policy, qf1, qf2):
                self.policy, self.qf1, self.qf2 = policy, qf1, qf2
                self.policy_optimizer = optim.Adam(self.policy.parameters())
                self.qf1_optimizer = optim.Adam(self.qf1.parameters())
                self.qf2_optimizer = optim.Adam(self.qf2.parameters())

            def train(self, obs, actions, q_target):
                new_actions = self.policy(obs)
                q_new_actions = torch.min(
                    self.qf1(obs, new_actions),
                    self.qf2(obs, new_actions),
                )
                policy_loss = -q_new_actions.mean()
                qf1_loss = (self.qf1(obs, actions) - q_target).pow(2).mean()
                qf2_loss = (self.qf2(obs, actions) - q_target).pow(2).mean()
                self.qf1_optimizer.zero_grad()
                qf1_loss.backward()
                self.qf1_optimizer.step()
                self.qf2_optimizer.zero_grad()
                qf2_loss.backward()
                self.qf2_optimizer.step()
                self.policy_optimizer.zero_grad()
                policy_loss.backward()
                self.policy_optimizer.step()
    """),
    Invalid("the generator's loss started at 0 and given the adversarial term with `+=` before the "
            "discriminator's step (deocclusion's CGAN)", """
        G, D = nn.Linear(4, 4), nn.Linear(4, 1)
        opt_g, opt_d = optim.Adam(G.parameters()), optim.Adam(D.parameters())
        for z, real in batches:
            fake = G(z)
            d_loss = D(real).mean() - D(fake.detach()).mean()
            g_loss = 0
            g_loss += -D(fake).mean()
            g_loss += fake.pow(2).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    """),
    Invalid("optimizers held by the networks: the actor's loss reuses the critic's output after its step",
            OWN_OPTIMIZERS.format(actor_loss="                actor_loss = -q.mean()\n")),
    Invalid("DDPG from a factory parameter: the actor's loss made before the critic's step",
            FACTORY_DDPG.format(early=PI_LOSS, late="")),
    Invalid("a target network loaded between its forward and the backward through it (MADDPG)",
            TARGET_UPDATE.format(before="            target_actor.load_state_dict(actor.state_dict())\n", after="")),
    Invalid("a soft update written into the target's parameters before the backward through it",
            TARGET_UPDATE.format(before=SOFT_UPDATE, after="")),
    Invalid("FactorVAE: a trainer class steps the VAE before the discriminator's backward", """
        from model import Discriminator, FactorVAE

        class Solver:
            def __init__(self):
                self.VAE = FactorVAE(10).to(device)
                self.D = Discriminator(10).to(device)
                self.optim_VAE = optim.Adam(self.VAE.parameters())
                self.optim_D = optim.Adam(self.D.parameters())

            def train(self):
                for x_true1, x_true2 in self.data_loader:
                    x_recon, mu, logvar, z = self.VAE(x_true1)
                    D_z = self.D(z)
                    vae_loss = recon_loss(x_true1, x_recon) + (D_z[:, :1] - D_z[:, 1:]).mean()
                    self.optim_VAE.zero_grad()
                    vae_loss.backward(retain_graph=True)
                    self.optim_VAE.step()
                    z_pperm = permute_dims(self.VAE(x_true2, no_dec=True)).detach()
                    D_tc_loss = 0.5 * (F.cross_entropy(D_z, zeros) + F.cross_entropy(self.D(z_pperm), ones))
                    self.optim_D.zero_grad()
                    D_tc_loss.backward()
                    self.optim_D.step()
    """),
    Invalid("a GAN written before PyTorch 0.4, with retain_variables", """
        G, D = nn.Linear(5, 15), nn.Sequential(nn.Linear(15, 1), nn.Sigmoid())
        for step in range(100):
            fake = G(torch.randn(64, 5))
            prob_fake = D(fake)
            D_loss = -torch.mean(torch.log(D(real)) + torch.log(1. - prob_fake))
            G_loss = torch.mean(torch.log(1. - prob_fake))
            opt_D.zero_grad()
            D_loss.backward(retain_variables=True)
            opt_D.step()
            opt_G.zero_grad()
            G_loss.backward()
            opt_G.step()
    """),
    Invalid("optimizers imported by class name (`from torch.optim import Adam, RMSprop`)", """
        from torch.optim import Adam, RMSprop
        actor, critic = nn.Linear(4, 2), nn.Linear(6, 1)
        actor_updater, critic_updater = Adam(actor.parameters()), RMSprop(critic.parameters())
        for state, target_q in replay:
            q = critic(torch.cat([state, actor(state)], 1))
            critic_loss = mse_loss(q, target_q)
            critic_updater.zero_grad()
            critic_loss.backward(retain_graph=True)
            critic_updater.step()
            actor_loss = -q.mean()
            actor_updater.zero_grad()
            actor_loss.backward()
            actor_updater.step()
    """),
    Invalid("an optimizer module imported under another name (`import torch.optim as O`)", """
        import torch.optim as O
        model = nn.Linear(3, 1)
        updater = O.SGD(model.parameters(), lr=0.1)
        for x, y in batches:
            out = model(x)
            loss = mse_loss(out, y)
            loss.backward(retain_graph=True)
            updater.step()
            (out ** 2).mean().backward()
    """),
    Invalid("the discriminator zeroed, then its loss summed over the scales in a loop, stepped before the "
            "generator's backward through its old output (AGAIN-VC's MelGAN)", """
        G, D = nn.Linear(4, 4), nn.Linear(4, 1)
        g_optimizer, d_optimizer = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
        for mel, audio in batches:
            fake = G(mel)
            d_fake = D(fake)
            d_real = [D(audio)]
            d_loss = 0
            for scale in d_real:
                d_loss += F.relu(1 - scale).mean()
            D.zero_grad()
            d_loss.backward()
            d_optimizer.step()
            g_loss = -d_fake.mean()
            G.zero_grad()
            g_loss.backward()
            g_optimizer.step()
    """),
    Invalid("two Q heads on a shared trunk: the first head's step changes the trunk the second's graph used",
            TWO_HEADS.format(**SHARED_TRUNK, keep="")),
    Invalid("two Q heads of their own layers, the gradients zeroed rather than set to None before the first "
            "head's backward: the step moves the second head too", TWO_HEADS.format(**SEPARATE_HEADS,
                                                                                     keep="set_to_none=False")),
    Invalid("step through an optimizer the file can't see into, then backward through the old forward", """
        model = nn.Linear(3, 1)
        optimizer = make_optimizer(model)
        for x, y in batches:
            out = model(x)
            loss = mse_loss(out, y)
            loss.backward(retain_graph=True)
            optimizer.step()
            (out ** 2).mean().backward()
    """),
]
VALID: list[Valid] = [
    Valid("an optimizer passed in steps only the domain classifier, whose backward reads the features "
          "detached, after both modules were zeroed (FL-MRCM)", """
        class Trainer:
            def __init__(self, optimizer, optimizer_fd):
                self.optimizer, self.optimizer_fd = optimizer, optimizer_fd

            def train(self, net, net_fd, batches):
                net.train()
                net_fd.train()
                optimizer, optimizer_fd = self.optimizer, self.optimizer_fd
                for x, y in batches:
                    net.zero_grad()
                    net_fd.zero_grad()
                    output, z = net(x)
                    fd_loss = net_fd(z.detach()).mean()
                    fd_loss.backward()
                    optimizer_fd.step()
                    loss = (output - y).abs().mean() + net_fd(z).mean()
                    loss.backward()
                    optimizer.step()
    """),
    Valid("two Q heads of their own layers, each head's loss stepped in turn: the first step leaves the "
          "second head's weights alone, their gradients None (pranz24's SAC)", TWO_HEADS.format(**SEPARATE_HEADS, keep="")),
    Valid("the GAN's updates reordered: D's backward after G's step, kept to D's parameters with inputs=", """
        G, D = nn.Linear(5, 15), nn.Sequential(nn.Linear(15, 1), nn.Sigmoid())
        opt_G, opt_D = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
        for step in range(100):
            fake = G(torch.randn(64, 5))
            prob_fake = D(fake)
            D_loss = -torch.mean(torch.log(D(real)) + torch.log(1. - prob_fake))
            G_loss = torch.mean(torch.log(1. - prob_fake))
            opt_G.zero_grad()
            G_loss.backward(retain_graph=True)
            opt_G.step()
            opt_D.zero_grad()
            D_loss.backward(inputs=[p for group in opt_D.param_groups for p in group['params']])
            opt_D.step()
    """),
    Valid("InfoMax-VAE: the critic's backward after the VAE's step, kept to the critic's own parameters", """
        VAE, D = nn.Linear(6, 4), nn.Linear(10, 1)
        optim_VAE, optim_D = torch.optim.Adam(VAE.parameters()), torch.optim.Adam(D.parameters())
        for x_true in data_loader:
            z = VAE(x_true)
            info_xz = -D(torch.cat([x_true, z], 1)).mean()
            vae_loss = z.pow(2).mean() + info_xz
            optim_VAE.zero_grad()
            vae_loss.backward(retain_graph=True)
            optim_VAE.step()
            optim_D.zero_grad()
            info_xz.backward(inputs=list(D.parameters()))
            optim_D.step()
    """),
    Valid("optimizers held by the networks: the actor's loss from a fresh critic forward",
          OWN_OPTIMIZERS.format(actor_loss="                actor_loss = -self.critic(s, self.actor(s)).mean()\n")),
    Valid("DDPG from a factory parameter: the actor's loss made after the critic's step",
          FACTORY_DDPG.format(early="", late=PI_LOSS)),
    Valid("the target network loaded after the update", TARGET_UPDATE.format(
        before="", after="            target_actor.load_state_dict(actor.state_dict())\n")),
    Valid("the soft update after the update", TARGET_UPDATE.format(before="", after=SOFT_UPDATE)),
    Valid("a soft update through .data, which the backward never sees", TARGET_UPDATE.format(
        before=SOFT_UPDATE.replace("t.copy_", "t.data.copy_"), after="")),
    Valid("optimizers imported by class name, the actor's loss from a forward after the critic's step", """
        from torch.optim import Adam, RMSprop
        actor, critic = nn.Linear(4, 2), nn.Linear(6, 1)
        actor_updater, critic_updater = Adam(actor.parameters()), RMSprop(critic.parameters())
        for state, target_q in replay:
            critic_loss = mse_loss(critic(torch.cat([state, actor(state).detach()], 1)), target_q)
            critic_updater.zero_grad()
            critic_loss.backward()
            critic_updater.step()
            actor_loss = -critic(torch.cat([state, actor(state)], 1)).mean()
            actor_updater.zero_grad()
            actor_loss.backward()
            actor_updater.step()
    """),
    Valid("DDPG: critic on stored actions, actor loss from a fresh forward after the critic step", """
        actor, critic = Actor(), Critic()
        for state, action, target_q in replay:
            critic_loss = mse_loss(critic(state, action), target_q)
            critic_opt.zero_grad()
            critic_loss.backward()
            critic_opt.step()
            actor_loss = -critic(state, actor(state)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
    """),
    Valid("gradient accumulation with a conditional step", """
        model = nn.Linear(4, 1)
        for i, (x, y) in enumerate(loader):
            loss = mse_loss(model(x), y) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
    """),
    Valid("SAC: the entropy temperature stepped before the actor's backward (rl_algorithms)", """
        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 3)

            def forward(self, states):
                out = self.layer(states)
                return out, out.sum(-1), out

        class SACLearner:
            def __init__(self):
                self.actor = Actor()
                self.log_alpha = torch.zeros(1, requires_grad=True)
                self.alpha_optim = optim.Adam([self.log_alpha], lr=3e-4)
                self.actor_optim = optim.Adam(self.actor.parameters(), lr=3e-4)

            def update_model(self, states):
                new_actions, log_prob, pre_tanh_value = self.actor(states)
                alpha_loss = (-self.log_alpha * (log_prob + target_entropy).detach()).mean()
                self.alpha_optim.zero_grad()
                alpha_loss.backward()
                self.alpha_optim.step()
                alpha = self.log_alpha.exp()
                actor_loss = (alpha * log_prob).mean() + pre_tanh_value.pow(2).mean()
                self.actor_optim.zero_grad()
                actor_loss.backward()
                self.actor_optim.step()
    """),
]
