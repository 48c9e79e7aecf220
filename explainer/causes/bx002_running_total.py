"""BX002 running-total."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX002",
    name="running-total",
    title="`total = total + loss` without `.item()`",
    what="""\
Flags `total = total + loss` (or `total += loss`) inside a loop that calls `backward()`, where
`loss` carries autograd history and is not converted with `.item()`; and the same total kept by
a tracker object, `meter.update(loss)` where `update` does `self.sum += val` (an `AverageMeter`
of this file or of the project's own files).""",
    why="""\
`total` keeps the graph of every iteration alive: memory grows each step. If `total` is itself
back-propagated, the second backward goes through the first iteration's freed graph and raises
"Trying to backward through the graph a second time". The PyTorch FAQ names this pattern.""",
    example="""\
total = 0
for x, y in batches:
    loss = loss_fn(model(x), y)
    total = total + loss
    total.backward()""",
    use_instead="""\
total = 0
for x, y in batches:
    loss = loss_fn(model(x), y)
    total = total + loss.item()
    loss.backward()""",
    messages={
        "total": Message(
            "`{carrier}` adds up `{term}` with its autograd history: every iteration's graph stays alive"
            "{on_backward}"),
        "total-freed": Message(
            "`{carrier}` still holds the terms that `{freed_by.code}` (line {freed_by.row}) back-propagated and "
            "freed: adding `{term}` to it keeps their graphs, and back-propagating `{carrier}` again goes through "
            "them: 'backward through the graph a second time'"),
        "tracker": Message(
            "`{method}` adds `{term}` with its autograd history into `{carrier}`: every iteration's graph "
            "stays alive"),
        "run-total": Message(
            "`{carrier}`, re-assigned at {where}, adds up every iteration's loss with its autograd graph. "
            "{freed} the graphs of the earlier iterations, and this backward (line {backward.row}) goes through "
            "them again.",
            "`{carrier}` adds up losses with their graphs, and back-propagating it goes through freed graphs.",
            ("carried across iterations",)),
        "run-kept-total": Message(
            "`{carrier}`, re-assigned at {where}, adds up the loss of every iteration with its autograd graph. "
            "No backward goes through it, but it keeps the graphs of {iterations} earlier iterations alive, one "
            "more each iteration: memory grows until training slows down or runs out.",
            "`{carrier}` adds up losses with their graphs: every iteration's graph stays alive.",
            ("keeps every iteration's graph",)),
    },
)
