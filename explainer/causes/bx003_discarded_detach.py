"""BX003 discarded-detach."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX003",
    name="discarded-detach",
    title="`h.detach()` as a statement, its result thrown away",
    what="""\
Flags, inside a loop that calls `backward()`, `h.detach()` used as a statement (`for h in
hidden: h.detach()` too), and `h = h.detach()` where `h` is only the loop variable of `for h in
hidden:`. (Outside training
loops `.detach()` is often a stream's or socket's, whose result may be dropped on purpose.)""",
    why="""\
`detach()` returns a new tensor; it does not change `h`. The state keeps its autograd history, so
the next backward reaches into the previous iteration's freed graph ("Trying to backward through
the graph a second time"), or the graph grows without bound.""",
    example="""\
for x, y in batches:
    hidden.detach()
    out, hidden = model(x, hidden)
    loss_fn(out, y).backward()""",
    use_instead="""\
for x, y in batches:
    hidden = hidden.detach()
    out, hidden = model(x, hidden)
    loss_fn(out, y).backward()""",
    messages={
        "discarded": Message("`{call}` returns a new tensor that is thrown away: `{carrier}` keeps its history"),
        "per-element": Message(
            "`{call}` in a loop over `{carrier}` returns a new tensor that is thrown away: `{carrier}` keeps its "
            "history"),
        "loop-variable": Message(
            "`{carrier} = {carrier}.detach()` only re-binds the loop variable: `{iterable}` still holds the "
            "tensors with history"),
    },
)
