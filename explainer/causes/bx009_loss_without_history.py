"""BX009 loss-without-history."""
from .cause import Cause, Message

_NO_GRAPH = ("and `{loss}` is computed only from it and data: `{backward.code}` (line {backward.row}) has no graph "
             "to go through ('does not require grad')")

CAUSE = Cause(
    code="BX009",
    name="loss-without-history",
    title="a loss computed only from values cut by `no_grad` or `.detach()`",
    what="""\
Flags the value that cut a loss off its graph (a forward under `torch.no_grad()`, a call to a
helper decorated with `@torch.no_grad()`, or `x = x.detach()`) when `backward()` is then called
on a loss computed only from such values and data; and the forward of a model of the file that
runs after a call left autograd off for the whole process (`torch.set_grad_enabled(False)` as a
statement, in a helper or in a function it calls, with nothing turning it back on).""",
    why="""\
The loss has no `grad_fn`, so `backward()` raises "element 0 of tensors does not require grad
and does not have a grad_fn". The usual quick fix, `loss.requires_grad = True`, silences the
error but trains nothing: the gradient stops at the loss and never reaches the model.""",
    example="""\
model = nn.Linear(3, 1)
with torch.no_grad():
    out = model(x)
loss = F.mse_loss(out, y)
loss.backward()""",
    use_instead="""\
model = nn.Linear(3, 1)
out = model(x)
loss = F.mse_loss(out, y)
loss.backward()""",
    messages={
        "no-grad": Message("`{carrier}` is computed under `torch.no_grad()` (line {made_at.row}), " + _NO_GRAPH),
        "decorated": Message(
            "`{carrier}` (line {made_at.row}) comes from `{function}()`, which runs under `@{decorator}` (line "
            "{decorator_row}), " + _NO_GRAPH),
        "detached": Message("`{carrier}` is detached at line {made_at.row}, " + _NO_GRAPH),
        "switched-off": Message(
            "`{carrier}` (line {made_at.row}) comes from `{module}`, whose parameters train, but `{switch}` "
            "({switched_at}) turned autograd off for everything that runs after it, not just for its own "
            "function, and nothing turns it back on before this forward: `{backward.code}` (line {backward.row}) "
            "has no graph to go through ('does not require grad')"),
        "module-cut": Message("`{carrier}` returns a value cut from the graph by {cut} (line {made_at.row}, in "
                              "`{function}`), " + _NO_GRAPH),
        "run-cut": Message(
            "`{carrier}` was cut from the graph by {cut} at {where}, so the loss built from it has no grad_fn and "
            "there is nothing to back-propagate (line {backward.row}).",
            "`{carrier}` was cut from the graph before the loss was built.",
            ("cut from the graph by {cut}",)),
        "run-cut-in-helper": Message(
            "`{carrier}` was cut from the graph by `{helper}()` at {where}, which returns `{helper_cut}` (line "
            "{helper_row}) of what it is given, so the loss has no grad_fn and there is nothing to "
            "back-propagate (line {backward.row}).",
            "`{carrier}` was cut from the graph by `{helper}()`.",
            ("cut from the graph by `{helper}()`",)),
        "run-cut-in-callback": Message(
            "`{carrier}` is returned cut from the graph by {cut} ({where}) in `{callback}()`, which is passed "
            "to `{called}` and makes what it returns: the loss made of that has no grad_fn, and there is nothing "
            "to back-propagate (line {backward.row}).",
            "`{carrier}` is returned cut from the graph by `{callback}()`.",
            ("cut from the graph in `{callback}()`",)),
        "run-rewrapped": Message(
            "`{carrier}` ({where}) is made in `{helper}()`, which `{called}` runs, from `torch.tensor([...])` "
            "of values computed from what trains: `torch.tensor` copies them into a new tensor without a graph "
            "({copies} such copies there), so the loss has no grad_fn and the backward (line {backward.row}) has "
            "nothing to go through.",
            "`{carrier}` is copied out of the graph by `torch.tensor([...])` in `{helper}()`.",
            ("copied out of the graph by `torch.tensor([...])`",)),
        "run-copied": Message(
            "`{carrier}` ({where}) is made by `{copy}`, which copies the values of `{sequence}`, computed from "
            "what trains, into a new tensor (`{factory}`) without their graph, so the loss has no grad_fn and "
            "the backward (line {backward.row}) has nothing to go through.",
            "`{carrier}` is copied out of the graph by `{copy}`.",
            ("copied out of the graph by `{copy}`",)),
        "run-output-unused": Message(
            "`{carrier}` ({where}) is computed only from data: `{output}`, the output of `{module}` (line "
            "{output_row}), is never read on the way to it, so the loss has no grad_fn and the backward (line "
            "{backward.row}) has nothing to go through.",
            "`{carrier}` is computed without `{output}`, the model's output.",
            ("computed without the model's output `{output}`",)),
        "run-constant": Message(
            "`{carrier}` ({where}) can be a constant made by `{factory}()`, which has no graph: `{loss}` has no "
            "grad_fn, so it was made of such constants alone this time (a branch that replaces the terms that "
            "come from the model), and the backward (line {backward.row}) has nothing to go through.",
            "`{carrier}` is a constant made by `{factory}()`: the loss has no graph.",
            ("a constant made by `{factory}()`",)),
        "run-grad-off": Message(
            "`{carrier}` ({where}) comes from `{module}`, whose parameters train, yet it has no grad_fn: "
            "`{caller}` (line {caller_row}) runs under {grad_off}, so nothing the training step computes "
            "is recorded for the backward (line {backward.row}).",
            "`{carrier}` was computed with autograd off, under {grad_off}.",
            ("computed with autograd off",)),
        "run-grad-off-input": Message(
            "`{carrier}` ({where}) is computed from `{input}`, which requires grad, yet it has no grad_fn: "
            "`{caller}` (line {caller_row}) runs under {grad_off}, so nothing it computes is recorded for the "
            "backward (line {backward.row}).",
            "`{carrier}` was computed with autograd off, under {grad_off}.",
            ("computed with autograd off",)),
        "run-inference-mode": Message(
            "`{carrier}` ({where}) comes from `{module}`, whose parameters train, yet it has no grad_fn: `{caller}` "
            "(line {caller_row}) runs under {grad_off}, and `{enable}` (line {enable_row}) inside it turns autograd "
            "on but does not leave inference mode, so every tensor made there is an inference tensor, without a "
            "graph for the backward (line {backward.row}).",
            "`{carrier}` was made in inference mode, which `{enable}` does not leave.",
            ("made in inference mode",)),
        "run-switched-off": Message(
            "`{carrier}` ({where}) comes from `{module}`, whose parameters train, yet it has no grad_fn: "
            "`{switch}` ({switched_at}) turned autograd off for everything that runs after it, not just for "
            "its own function, and nothing turned it back on before this forward, so the backward (line "
            "{backward.row}) has no graph to go through.",
            "`{carrier}` was computed with autograd off: `{switch}` ({switched_at}) left it off.",
            ("computed with autograd off, left off by `{switch}`",)),
        "run-kept-without-grad": Message(
            "`{carrier}` keeps what `{method}` computed the last time it was empty (line {made_at.row}), and "
            "autograd was off then: it has no grad_fn, though the parameters of `{module}` train, and `{method}` returns it as long "
            "as it is set, so the loss built from it has nothing to back-propagate (line {backward.row}).",
            "`{carrier}` was kept from a call that ran with autograd off.",
            ("kept from a call with autograd off",)),
        "run-frozen": Message(
            "`{carrier}` ({where}) comes from `{module}`, whose parameters train now, yet it has no grad_fn: it was "
            "made while they were frozen by `{freeze}` (line {freeze_row}), and they were only set trainable again "
            "at line {unfreeze_row}, after it, so the backward (line {backward.row}) has no graph to go through.",
            "`{carrier}` was made while `{module}`'s parameters were frozen.",
            ("made while `{module}` was frozen",)),
        "run-grad-without-graph": Message(
            "`{carrier}` holds the gradients that `{made_by}` (line {made_at.row}) left in `.grad`, made without "
            "`create_graph=True`: they have no graph of their own, so `{backward.code}` (line {backward.row}) has "
            "nothing to differentiate them through.",
            "`{carrier}` are gradients made without `create_graph=True`.",
            ("made without a graph by `{made_by}`",)),
        "run-decorated": Message(
            "`{carrier}` (line {made_at.row}) comes from `{function}()`, which runs under `@{decorator}` (line "
            "{decorator_row}), so it has no grad_fn and there is nothing to back-propagate (line {backward.row}).",
            "`{carrier}` was computed by `{function}()`, which records no graph.",
            ("computed without a graph by `@{decorator}` on `{function}`",)),
    },
)
