"""BX010 grad-frees-graph, found in source: the cause and its docs are explainer/causes/bx010_grad_frees_graph.py."""
from __future__ import annotations

from collections.abc import Iterator

from ...causes.bx010_grad_frees_graph import CAUSE
from ...fixes import graph_options
from ...model import Finding
from ...reading import source as src
from ...reading.dataflow import ancestors, same_pass, shared_ancestor
from ...reading.training import backward_calls, scopes
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    source = module.source
    for scope in scopes(module.tree):
        calls = backward_calls(scope)
        for index, grad in enumerate(calls):
            if grad.api != "grad" or not grad.frees_graph():
                continue
            later = next((c for c in calls[index + 1:] if same_pass(grad.call, c.call)
                          and shared_ancestor(grad, c, scope) is not None), None)
            if later is None:
                continue
            results = {src.canonical(t) for t in src.targets_of(grad.statement)}
            feeds_loss = any(a.expression in results for a in ancestors(later.root, scope, later.line))
            if feeds_loss:
                fix = graph_options.add_create_graph(source, grad.call)
            else:
                fix = graph_options.add_retain_graph(
                    source, grad.call, "Keep the graph for the later backward with `retain_graph=True`")
            shared = shared_ancestor(grad, later, scope)
            yield module.finding(CODE, "frees-feeds" if feeds_loss else "frees", grad.call, fix,
                                 carrier=source.segment(shared.target), made_at=shared.stmt, backward=later.call,
                                 freed_by=grad.call)


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("autograd.grad for logging, then backward through the same loss", """
        model = nn.Linear(3, 1)
        for x, y in batches:
            loss = mse_loss(model(x), y)
            input_grad = torch.autograd.grad(loss, x)
            log(input_grad)
            loss.backward()
    """),
]
VALID: list[Valid] = [
    Valid("WGAN-GP: gradient penalty with create_graph=True", """
        critic = Critic()
        for real, fake in loader:
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            score = critic(mixed)
            grads = torch.autograd.grad(score.sum(), mixed, create_graph=True)[0]
            penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
            loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
            loss.backward()
            opt.step()
    """),
    Valid("MAML: inner gradients with create_graph, then the outer backward", """
        model = nn.Linear(4, 1)
        for task in tasks:
            inner_loss = mse_loss(model(task.x), task.y)
            grads = torch.autograd.grad(inner_loss, model.parameters(), create_graph=True)
            adapted = [p - 0.1 * g for p, g in zip(model.parameters(), grads)]
            outer_loss = mse_loss(functional_forward(task.x2, adapted), task.y2)
            outer_loss.backward()
            meta_opt.step()
    """),
    Valid("gradients of one loss, then a reference loss on detached copies (miles-credit's tests)", """
        members = [m.requires_grad_(True) for m in members]
        loss = crps_loss(members, y)
        grads = torch.autograd.grad(loss, members)
        reference_members = [m.detach().clone().requires_grad_(True) for m in members]
        reference = reference_crps(reference_members, y)
        reference.backward()
    """),
    Valid('MAML-Pytorch: first-order inner steps with autograd.grad, one outer backward', """
        net = Learner()
        for i in range(task_num):
            loss = F.cross_entropy(net(x_spt[i]), y_spt[i])
            grad = torch.autograd.grad(loss, net.parameters())
            fast_weights = list(map(lambda p: p[1] - lr * p[0], zip(grad, net.parameters())))
            for k in range(1, update_step):
                loss = F.cross_entropy(net(x_spt[i], fast_weights), y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights)
                fast_weights = list(map(lambda p: p[1] - lr * p[0], zip(grad, fast_weights)))
                losses_q[k + 1] += F.cross_entropy(net(x_qry[i], fast_weights), y_qry[i])
        meta_optim.zero_grad()
        (losses_q[-1] / task_num).backward()
        meta_optim.step()
    """),
]
