"""BX001 carried-state."""
from .cause import Cause, Message

_RETAIN = ("`retain_graph=True` only hides it: every backward then goes through all earlier iterations (time "
           "and memory grow), and after `optimizer.step()` it fails with \"modified by an inplace operation\".")

CAUSE = Cause(
    code="BX001",
    name="carried-state",
    title="a state re-assigned from itself with history and never detached (`hidden`, `Yest = Yest + w*X`, "
          "`self.state` in `forward`)",
    what="""\
Flags a tensor that is re-assigned from its own previous value by something with autograd history
(`out, hidden = model(x, hidden)`, `Yest = Yest + w * X`, `self.hidden = ...self.hidden...` in a
module) inside a loop that calls `backward()` (or in a module method), when nothing detaches it.
Also flags the same state kept through another name: `new_h = cell(x, h)` ... `h = new_h`, and
a value with history kept for the next iteration's loss: `prev_loss = loss` after the backward,
read by the next iteration's objective. A value re-assigned after the backward
(`history = torch.cat([history, pred])`) is fixed by detaching the whole new value. Only state
that the loop's backward goes through counts: a copy kept for display or evaluation outputs are
left alone, and so is a name the pass re-binds (`output = model(data)`) before reading it.
`h = h.data` detaches, like `h = h.detach()`.""",
    why=f"""\
The new value's history includes the old one, so each iteration's graph is linked to the previous
iteration's. The first `backward()` frees the old graph and the next one raises "Trying to
backward through the graph a second time". {_RETAIN}""",
    example="""\
hidden = torch.zeros(1, 4, 8)
for x, y in batches:
    out, hidden = model(x, hidden)
    loss_fn(out, y).backward()""",
    use_instead="""\
hidden = torch.zeros(1, 4, 8)
for x, y in batches:
    out, hidden = model(x, hidden.detach())
    loss_fn(out, y).backward()""",
    messages={
        "itself": Message(
            "`{carrier}` is re-assigned from itself with autograd history and never detached: each backward "
            "reaches into the previous iteration's freed graph"),
        "through-name": Message(
            "`{carrier}` is re-assigned from `{value}`, made from `{carrier}` at line {made_at.row} with autograd "
            "history, and never detached: each backward reaches into the previous iteration's freed graph"),
        "kept": Message(
            "`{carrier}` keeps `{value}`, which has autograd history, for the next iteration, and the next "
            "iteration's backward goes through it: this iteration's backward has freed that graph"),
        "run-carried": Message(
            "`{carrier}`, re-assigned at {where}, still carries the autograd graph of the previous iteration. "
            "{freed} that graph, and this backward (line {backward.row}) tries to go through it again.",
            "`{carrier}` carries the graph of the previous iteration into this backward.",
            ("carried across iterations",)),
        "run-kept": Message(
            "`{carrier}` keeps `{kept}` (set at {where}), which still carries the autograd graph of the previous "
            "iteration: `{via}` (line {via_row}) stored it there. {freed} that graph, and this backward (line "
            "{backward.row}) tries to go through it again.",
            "`{carrier}` keeps the graph of the previous iteration, and this backward goes through it.",
            ("keeps the previous iteration's graph", "set here, with its graph")),
        "likely-carried": Message(
            "`{carrier}` is re-assigned from itself at {where}, so it carries the graph of the previous "
            "iteration; an earlier backward freed that graph and this backward goes through it again. "
            "{unrecorded}, so this is read from the source and from what the graph shows: likely, not certain.",
            "`{carrier}` most likely carries a graph that an earlier backward freed.",
            ("likely carrier of the freed graph",)),
    },
)
