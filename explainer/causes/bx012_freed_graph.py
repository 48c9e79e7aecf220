"""BX012 freed-graph."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX012",
    name="freed-graph",
    title="a backward through a graph an earlier backward freed, linked by a tensor no variable holds (a "
          "closure's, a generator's)",
    runtime_only=True,
    what="""\
Found when it runs: the backward fails with "Trying to backward through the graph a second time",
the graph it goes through was freed by an earlier backward, and no variable in your frames
(locals, globals, attributes, lists and dicts) holds the tensor that links the two. It is kept
somewhere the explainer does not look: a closure's cell, a generator's frame, a C extension.""",
    why="""\
The tensor's graph was built once and freed by the first backward; every later backward through
it fails. As with a state carried across iterations, `retain_graph=True` would keep every graph
alive and grow time and memory.""",
    example="""\
import torch

w = torch.ones(3, requires_grad=True)


def make_loss():
    h = w * 2
    return lambda: (h * h).sum()


loss_of = make_loss()
for step in range(2):
    loss_of().backward()""",
    use_instead="""\
import torch

w = torch.ones(3, requires_grad=True)


def make_loss():
    def loss():
        h = w * 2
        return (h * h).sum()
    return loss


loss_of = make_loss()
for step in range(2):
    loss_of().backward()""",
    messages={
        "run-unnamed": Message(
            "This backward goes through a graph that an earlier backward already freed{freed_call}, but no "
            "variable in your frames holds the tensor that links them.",
            "This backward reaches a graph an earlier backward freed."),
    },
)
