"""BX006 shared-graph, found in source: the cause and its docs are explainer/causes/bx006_shared_graph.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx006_shared_graph import CAUSE
from ...fixes import (
    detach_for_first_consumer,
    graph_options,
    own_value,
    recompute_forward,
    remove_statement,
    sum_losses,
)
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import (
    Ancestor,
    ancestor_keys,
    ancestors,
    modules_called,
    root_ancestors,
    same_pass,
    shared_ancestor,
    steps,
)
from ...reading.training import (
    Backward,
    backward_calls,
    has_history,
    is_module,
    next_in_its_loop,
    scopes,
    zeroed_before_use,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
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
                if shared is None or id(shared.stmt) in flagged or _apart(shared, first, second, scope):
                    continue
                flagged.add(id(shared.stmt))
                yield _diagnostic(module, scope, shared, first, second)
                break


def _apart(shared: Ancestor, first: Backward, second: Backward, scope) -> bool:
    """Each loss reads its own attributes or keys of an object no module call made
    (`dest.float_attr`, then `dest.scores`, of `dest = k2.expand_ragged_attributes(src)`; pix2pixHD's
    `loss_dict['G_GAN']`, then `loss_dict['D_fake']`): such an object holds tensors made apart, so
    sharing it is no evidence of sharing a graph. A model's output (`out.logits`, `out.loss`)
    comes from one forward, and stays shared."""
    value = shared.value
    if not isinstance(value, ast.Call) or is_module(value.func, scope, shared.line):
        return False
    first_reads, second_reads = _parts_read(first, shared, scope), _parts_read(second, shared, scope)
    return None not in (first_reads, second_reads) and bool(first_reads) and bool(second_reads) \
        and not (first_reads & second_reads)


def _parts_read(backward: Backward, shared: Ancestor, scope) -> frozenset[str] | None:
    """What of `shared` a call's loss reads, in the loss itself and in what it was computed from
    (`loss_G = loss_dict['G_GAN'] + ...`)."""
    values = [backward.root, *(a.value for a in root_ancestors(backward, scope)
                               if a.value is not None and a.stmt is not shared.stmt)]
    parts: set[str] = set()
    for value in values:
        found = _attributes_read(value, shared.expression)
        if found is None:
            return None
        parts |= found
    return frozenset(parts)


def _attributes_read(root, expression: str) -> frozenset[str] | None:
    """The attributes and constant keys of `expression` that `root` reads (`dest.scores`,
    `loss_dict['D_fake']`, `loss_dict.get('G_VGG', 0)`), or None where it reads the whole value."""
    parts = set()
    for read in src.reads(root, expression):
        parent = src.parent(read)
        call = src.parent(parent)
        if isinstance(parent, ast.Subscript) and parent.value is read and isinstance(parent.slice, ast.Constant):
            parts.add(repr(parent.slice.value))
        elif isinstance(parent, ast.Attribute) and parent.attr == "get" and isinstance(call, ast.Call) \
                and call.func is parent and call.args and isinstance(call.args[0], ast.Constant):
            parts.add(repr(call.args[0].value))
        elif isinstance(parent, ast.Attribute) and parent.value is read and parent.attr not in _TENSOR_VIEWS:
            parts.add(parent.attr)
        else:
            return None
    return frozenset(parts)


# Attributes of a tensor that are the tensor itself, seen another way.
_TENSOR_VIEWS = frozenset({"T", "mT", "H", "mH", "real", "imag"})


def _diagnostic(module: CheckedModule, scope, shared: Ancestor, first: Backward, second: Backward) -> Finding:
    source = module.source
    if _same_tensor(first, second, scope):
        return module.finding(CODE, "twice", second.call,
                              remove_statement.remove_call(source, second.statement, second.root),
                              carrier=source.segment(second.root), backward=second.call, freed_by=first.call)
    between = [s for s in steps(scope) if same_pass(first.call, s.call) and same_pass(s.call, second.call)]
    name = source.segment(shared.target)
    # `gen_imgs = generator(z)`, made for the second update and read by nothing: the one meant.
    fix = own_value.read_unused_value(source, scope, shared.stmt, name, second.statement) \
        if isinstance(shared.stmt, ast.Assign) else None
    if fix is None and between:
        step = between[-1]
        producers = _producers(shared, scope)
        follower = next((s for s in steps(scope) if same_pass(second.call, s.call) and s.line > second.line), None)
        if step.modules is not None and producers and not (producers & step.modules):
            fix = detach_for_first_consumer.detach_before(source, scope, shared.expression,
                                                          shared.stmt.end_lineno, first.line)
        elif follower is not None and follower.modules is not None and producers \
                and not (producers & follower.modules):
            why = detach_for_first_consumer.LATER_UPDATE.format(step=source.segment(follower.call), carrier="{carrier}")
            fix = detach_for_first_consumer.detach_before(source, scope, shared.expression, step.line, second.line,
                                                          why) \
                or _detach_in_own_loss(source, scope, shared, first, second, step, why)
        if fix is None:
            fix = recompute_forward.recompute_before_use(
                source, scope, shared.stmt, step.line, second.statement,
                f"Recompute `{name}` after `{source.segment(step.call)}` (line {step.line}): the step "
                f"changed the weights its graph was built with",
                upstream=lambda stmt: has_history(src.value_of(stmt), scope, stmt.lineno))
    elif fix is None:
        fix = sum_losses.sum_and_backward_once(source, first.statement, second.statement) \
            or graph_options.add_retain_graph(source, first.call, "Keep the shared graph for the second "
                                              "backward with `retain_graph=True` (no step in between)")
    return module.finding(CODE, "shared", shared.target, fix, carrier=name, made_at=shared.stmt, backward=second.call,
                          freed_by=first.call, steps=tuple(s.call for s in between))



def _detach_in_own_loss(source, scope, shared: Ancestor, first: Backward, second: Backward, step, why: str):
    """The Stack Overflow GAN, read from the source: `fake` detached where `loss_d` alone reads
    it, where the stepped optimizer (the generator's) zeroes its gradients before it steps again
    in the loop, so what `loss_d.backward()` no longer leaves in the generator was never used."""
    after = next_in_its_loop(second.statement)
    stepped = src.canonical(step.call.func.value) if isinstance(step.call.func, ast.Attribute) else None
    this, other = (src.canonical(b.root) if isinstance(b.root, (ast.Name, ast.Attribute)) else None
                   for b in (second, first))
    if after is None or stepped is None or this is None or other is None or not zeroed_before_use(after, stepped):
        return None
    return detach_for_first_consumer.detach_in_own_loss(source, scope, shared.expression, shared.stmt.end_lineno,
                                                        second.statement, this, other, why)


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


# Sharpness-aware minimisation in a training function given the model (samples/real/
# sam_second_pass_reuses_output.py): `first_step()` moves the weights, and the second pass's loss
# is `{second}`.
SAM_SECOND_PASS = """
        def train(loader, model, criterion, optimizer):
            model.train()
            for images, target in loader:
                output = model(images)
                loss = criterion(output, target)
                loss.backward()
                optimizer.first_step(zero_grad=True)
                {second}.backward()
                optimizer.second_step(zero_grad=True)
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("SAM's second pass reusing the first pass's output, the model given to the training function",
            SAM_SECOND_PASS.format(second="criterion(output, target)")),
    Invalid("the same loss back-propagated again under a condition", """
        model = nn.Linear(4, 1)
        for x in batches:
            loss = model(x).pow(2).mean()
            loss.backward()
            if log_gradients:
                loss.backward()
            optimizer.step()
    """),
    Invalid("the same loss back-propagated twice", """
        model = nn.Linear(3, 1)
        for x, y in batches:
            loss = mse_loss(model(x), y)
            loss.backward()
            loss.backward()
    """),
    Invalid("an advantage shared by the critic and the actor updates", """
        actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
        actor_opt = torch.optim.Adam(actor.parameters())
        critic_opt = torch.optim.Adam(critic.parameters())
        for s, returns in batches:
            dist = torch.distributions.Categorical(logits=actor(s))
            a = dist.sample()
            value = critic(s).squeeze(-1)
            advantage = returns - value
            critic_opt.zero_grad()
            advantage.pow(2).mean().backward()
            critic_opt.step()
            actor_loss = -(dist.log_prob(a) * advantage).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
    """),
    Invalid("the generator trained first, then the discriminator's loss read the same output (a Q&A's GAN)", """
        G, D = nn.Linear(2, 3), nn.Linear(3, 1)
        opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
        for z, real in batches:
            fake = G(z)
            loss_g = -D(fake).mean()
            loss_d = D(real).mean() - D(fake).mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
    """),
    Invalid("the generator's step scores the critic's sample, not the one it made for itself", """
        G, D = nn.Linear(2, 3), nn.Linear(3, 1)
        opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
        for z in noise:
            fake = G(z)
            opt_d.zero_grad()
            D(fake).mean().backward()
            opt_d.step()
            gen = G(z)
            opt_g.zero_grad()
            (-D(fake).mean()).backward()
            opt_g.step()
    """),
]
VALID: list[Valid] = [
    Valid("SAM's second pass running the model again (the SAM example's own fix)",
          SAM_SECOND_PASS.format(second="criterion(model(images), target)")),
    Valid("summed losses", """
        for x, y in batches:
            features = trunk(x)
            (head1(features).mean() + head2(features).mean()).backward()
    """),
    Valid("GAN: the discriminator sees fake.detach() (dcgan)", """
        generator, discriminator = Generator(), Discriminator()
        for real in loader:
            fake = generator(torch.randn(8, 4))
            d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(discriminator(fake), ones)
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    """),
    Valid("two losses on one trunk, retain_graph=True and no step in between", """
        trunk, head1, head2 = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)
        for x in loader:
            features = trunk(x)
            loss1, loss2 = head1(features).mean(), head2(features).mean()
            optimizer.zero_grad()
            loss1.backward(retain_graph=True)
            loss2.backward()
            optimizer.step()
    """),
    Valid("two losses over the same leaf tensors, one backward each", """
        w = torch.randn(3, requires_grad=True)
        x = torch.rand(3, requires_grad=True).cuda()
        for batch in loader:
            loss1 = (batch @ w).sum() + x.sum()
            loss1.backward()
            loss2 = (batch @ w).pow(2).sum() + x.sum()
            loss2.backward()
    """),
    Valid("a constant scale, moved to a parameter's dtype, multiplies two losses (k2's tests)", """
        float_attr = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
        dest = arc_sort(float_attr)
        expected = torch.empty_like(dest)
        expected[0] = float_attr[1]
        scale = torch.tensor([10, 20, 30]).to(float_attr)
        (dest * scale).sum().backward()
        (expected * scale).sum().backward()
    """),
    Valid('each loss reads its own entries of a dict of losses made inside the model (pix2pixHD)', """
        losses, generated = model(label, image)
        loss_dict = dict(zip(model.loss_names, losses))
        loss_D = (loss_dict['D_fake'] + loss_dict['D_real']) * 0.5
        loss_G = loss_dict['G_GAN'] + loss_dict.get('G_VGG', 0)
        optimizer_G.zero_grad()
        loss_G.backward()
        optimizer_G.step()
        optimizer_D.zero_grad()
        loss_D.backward()
        optimizer_D.step()
    """),
    Valid("two attributes of a library's object, each back-propagated once (k2's tests)", """
        src = k2.Fsa.from_str(s).requires_grad_(True)
        dest = k2.expand_ragged_attributes(src)
        scale = torch.tensor([10, 20, 10])
        (dest.float_attr * scale).sum().backward()
        (dest.scores * scale).sum().backward()
    """),
    Valid("the same loss back-propagated under a condition and under its negation (Lightning's tests)", """
        tensor = torch.tensor(1.0, requires_grad=True)
        summed = strategy.all_gather(tensor).sum()
        if not NEW_XLA:
            summed.backward()
        if sync_grads:
            if NEW_XLA:
                summed.backward()
    """),
]
