"""BX010 grad-frees-graph."""
from .cause import Cause, Message

_AGAIN = ("`{freed_by.code}` frees the graph of `{carrier}`, and `{backward.code}` (line {backward.row}) goes "
          "through it again: 'backward through the graph a second time'")

CAUSE = Cause(
    code="BX010",
    name="grad-frees-graph",
    title="`autograd.grad` without `create_graph`/`retain_graph` before a backward through the same graph",
    what="""\
Flags `torch.autograd.grad(outputs, inputs)` called without `create_graph=True` or
`retain_graph=True` when a later `backward()` in the same pass goes through the same graph, for
example a gradient penalty added to the loss it was computed from.""",
    why="""\
`autograd.grad` frees the graph it went through, as `backward()` does. The later backward
raises "Trying to backward through the graph a second time". And when the gradient feeds the
loss (a gradient penalty, WGAN-GP, input-gradient regularization), it was computed without a
graph of its own, so the penalty would not be trained even if the error went away.""",
    example="""\
model = nn.Linear(3, 1)
inputs = torch.randn(4, 3, requires_grad=True)
loss = mse_loss(model(inputs), targets)
grads = torch.autograd.grad(loss, inputs)
penalty = grads[0].pow(2).sum(1).mean()
(loss + 0.1 * penalty).backward()""",
    use_instead="""\
model = nn.Linear(3, 1)
inputs = torch.randn(4, 3, requires_grad=True)
loss = mse_loss(model(inputs), targets)
grads = torch.autograd.grad(loss, inputs, create_graph=True)
penalty = grads[0].pow(2).sum(1).mean()
(loss + 0.1 * penalty).backward()""",
    messages={
        "frees": Message(_AGAIN),
        "frees-feeds": Message(_AGAIN + "; its result feeds that loss, so it also needs a graph of its own"),
        "run-feeds": Message(
            "`{grad_call}` at line {freed_by.row} back-propagated through `{graph}`'s graph and freed it (no "
            "create_graph/retain_graph), and this backward (line {backward.row}) goes through `{graph}` again. "
            "Its result feeds a loss, so it must build a graph itself.",
            "`autograd.grad` freed `{graph}`'s graph, and the final backward needs it.",
            ("computed without a graph; `{graph}`'s graph was freed by it",)),
        "run-two-passes": Message(
            "`{grad_call}` at line {freed_by.row} back-propagated through `{carrier}`'s graph and freed it, and "
            "{this_call} (line {backward.row}) goes through `{carrier}` again.",
            "Two gradient computations go through `{carrier}`'s graph, and the first freed it.",
            ("its graph freed by the first gradient computation",)),
    },
)
