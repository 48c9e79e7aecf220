"""BX007 step-before-backward."""
from .cause import Cause, Message

_VERSIONS = "The graph saved the old weights (version {expected_version}), and they are now at version {version}."

CAUSE = Cause(
    code="BX007",
    name="step-before-backward",
    title="`optimizer.step()` between a graph's forward and a backward through it",
    what="""\
Flags a tensor computed by a module whose parameters an optimizer updates, when that
optimizer's `step()` runs after the tensor was computed and before a later `backward()` that
goes through it, in the same pass. Usually the first backward kept the graph with
`retain_graph=True`.""",
    why="""\
`step()` updates the parameters in place. The graph saved their old values for the backward
pass, so the later backward raises "one of the variables needed for gradient computation has
been modified by an inplace operation ... is at version 2". Adding `retain_graph=True`, the hint
of the first error, is how most code gets here. Even when no error is raised (the optimizer had
no gradients yet), the gradient would be computed with weights that no longer exist.""",
    example="""\
actor, critic = nn.Linear(4, 2), nn.Linear(6, 1)
critic_opt = torch.optim.Adam(critic.parameters())
q = critic(torch.cat([state, actor(state)], 1))
critic_loss = mse_loss(q, target_q)
actor_loss = -q.mean()
critic_loss.backward(retain_graph=True)
critic_opt.step()
actor_loss.backward()""",
    use_instead="""\
actor, critic = nn.Linear(4, 2), nn.Linear(6, 1)
critic_opt = torch.optim.Adam(critic.parameters())
q = critic(torch.cat([state, actor(state)], 1))
critic_loss = mse_loss(q, target_q)
critic_loss.backward()
critic_opt.step()
q = critic(torch.cat([state, actor(state)], 1))
actor_loss = -q.mean()
actor_loss.backward()""",
    messages={
        "stale": Message(
            "`{step.code}` (line {step.row}) updates in place the weights that computed `{carrier}`, and "
            "`{backward.code}` (line {backward.row}) back-propagates through `{carrier}`'s graph afterwards: "
            "'modified by an inplace operation'"),
        "run-step": Message(
            "`{carrier}` was changed in place by `{step.code}` (line {step.row}) after the graph that this backward "
            "uses was built (`{built}` at {where}). " + _VERSIONS,
            "`{carrier}` was updated by {updater} after this graph was built.",
            ("modified in place by {step.code} after this graph was built",
             "built before the step, back-propagated after it")),
        "run-step-site": Message(
            "`{carrier}` was changed in place by `{step.code}` (line {step.row}) after the graph that this backward "
            "uses was built (the forward, before the step). " + _VERSIONS,
            "`{carrier}` was updated by {updater} after this graph was built.",
            ("modified in place by the optimizer step",)),
    },
)
