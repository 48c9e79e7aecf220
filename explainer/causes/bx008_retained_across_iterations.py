"""BX008 retained-across-iterations."""
from .cause import Cause, Message

_GROWS = "so each backward goes through all earlier iterations and time and memory grow"

CAUSE = Cause(
    code="BX008",
    name="retained-across-iterations",
    title="`retain_graph=True` where the loss's history spans iterations",
    severity="warning",
    what="""\
Flags `backward(retain_graph=True)` inside a training loop when the loss depends on a tensor
whose history reaches into earlier iterations: a state re-assigned from itself without
`.detach()`, or a tensor with history computed before the loop.""",
    why="""\
Without `retain_graph=True` the second iteration raises "Trying to backward through the graph a
second time". With it, nothing is ever freed: every iteration's graph stays chained to the next,
each backward goes through all earlier iterations, and time and memory grow until training
crawls. After an `optimizer.step()` the old graph also holds stale weights, which ends in
"modified by an inplace operation".""",
    example="""\
w = torch.randn(1, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.01)
estimate = torch.zeros(1)
for step in range(steps):
    for t in range(horizon):
        estimate = estimate + w * x
    loss = ((y - estimate) ** 2).mean()
    loss.backward(retain_graph=True)
    optimizer.step()""",
    use_instead="""\
w = torch.randn(1, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.01)
estimate = torch.zeros(1)
for step in range(steps):
    estimate = estimate.detach()
    for t in range(horizon):
        estimate = estimate + w * x
    loss = ((y - estimate) ** 2).mean()
    loss.backward()
    optimizer.step()""",
    messages={
        "carried": Message(
            "`retain_graph=True` keeps every iteration's graph alive: `{carrier}` (line {made_at.row}) is carried "
            "from one iteration to the next without `.detach()`, " + _GROWS),
        "before": Message(
            "`retain_graph=True` keeps every iteration's graph alive: `{carrier}` (line {made_at.row}) is computed "
            "once, before the loop, " + _GROWS),
        "run-growth": Message(
            "`{carrier}` (re-assigned at {where}) carries autograd history from earlier iterations, and "
            "retain_graph=True at line {backward.row} keeps that history alive: every backward goes through all "
            "earlier iterations, so each step gets slower and memory grows.",
            "`{carrier}` links each iteration's graph to the previous one; retain_graph=True keeps them all.",
            ("carried across iterations",)),
    },
)
