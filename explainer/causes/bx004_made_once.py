"""BX004 made-once."""
from .cause import Cause, Message

_LIKELY = ("an earlier backward freed that graph and this backward goes through it again. {unrecorded}, so this "
           "is read from the source and from what the graph shows: likely, not certain.")

CAUSE = Cause(
    code="BX004",
    name="made-once",
    title="a tensor with history computed once before a loop, outside an LBFGS closure or in `__init__`",
    what="""\
Flags a value computed from parameters (or a module's output) once, then back-propagated again
and again: before a loop that calls `backward()` (`w_hat = w / w.norm()`), outside an LBFGS
closure (`pred = model(x)`), or in `__init__` and used in `forward`
(`self.scale = torch.exp(self.log_scale)`).""",
    why="""\
The value's graph is built once. The first `backward()` frees it; the next one raises "Trying to
backward through the graph a second time". With `retain_graph=True` it runs but is wrong: the
value never follows the updated parameters, and after `optimizer.step()` the old graph fails with
"modified by an inplace operation".""",
    example="""\
w = torch.randn(8, requires_grad=True)
w_hat = w / w.norm()
for x, y in batches:
    loss = ((x @ w_hat - y) ** 2).mean()
    loss.backward()""",
    use_instead="""\
w = torch.randn(8, requires_grad=True)
for x, y in batches:
    w_hat = w / w.norm()
    loss = ((x @ w_hat - y) ** 2).mean()
    loss.backward()""",
    notes="""\
A list filled with module outputs before the loop and read by every pass (deep mutual learning's
`outputs`, one per model, each model's loss also reading the others' `outputs[j]`) is the same
bug: the first pass's backward frees every item it read. The fix detaches the peers' items,
`outputs[j].detach()`, where a pass learns from them.

When the loop calls the model that made the value again, the value is a snapshot of that model's
output before the updates (PPO's `old_log_probs`), and the fix keeps it detached instead:
`old_log_probs = dist.log_prob(actions).detach()`. Recomputing it in the loop would make it equal
to the fresh output.""",
    messages={
        "before": Message(
            "`{carrier}` is computed once, before the {owner}, and every backward in the {owner} goes through its "
            "graph: the first frees it"),
        "filled": Message(
            "`{carrier}` is filled before the loop, and every backward in the loop goes through its items: the "
            "first frees their graphs"),
        "init": Message(
            "`{carrier}` is computed once, in `__init__`, from parameters: every forward reuses its graph, and the "
            "first backward frees it"),
        "run-before": Message(
            "`{carrier}` is computed once at {where}, before the {owner} that calls backward. {freed} its graph, "
            "and this backward (line {backward.row}) goes through it again.",
            "`{carrier}` is computed once, before the {owner}, and every backward reuses its graph.",
            ("computed once before the {owner}",)),
        "run-partly-detached": Message(
            "`{carrier}` ({where}) is made from `{made}`, computed once before the repeated backward, and read "
            "detached at line {detached_row} but not at line {plain_rows}: those reads go back into `{made}`'s "
            "graph. {freed} it, and this backward (line {backward.row}) goes through it again.",
            "`{carrier}` is detached for one term of the loss but not for another, which reuses a freed graph.",
            ("read without `.detach()` into a graph made once",)),
        "run-init": Message(
            "`{carrier}` is computed once at {where} from parameters, so every forward reuses the same graph. "
            "{freed} it, and this backward (line {backward.row}) needs it again.",
            "`{carrier}` was computed once, in `__init__`, and every call reuses its graph.",
            ("computed once in __init__",)),
        "run-filled": Message(
            "`{carrier}` (filled at {where}) holds tensors made before the loop at line {loop_row}. {freed} the "
            "graphs of every item its loss read, and this backward (line {backward.row}) needs some of them "
            "again.",
            "`{carrier}` is filled before the loop, and each pass's backward goes through all of it.",
            ("filled before the loop whose every pass back-propagates through it",)),
        "likely-before": Message(
            "`{carrier}` is computed once at {where}, before the loop, so every backward reuses its graph; "
            + _LIKELY,
            "`{carrier}` most likely carries a graph that an earlier backward freed.",
            ("likely carrier of the freed graph",)),
        "likely-init": Message(
            "`{carrier}` is computed once at {where}, in `__init__`, so every call reuses its graph; " + _LIKELY,
            "`{carrier}` most likely carries a graph that an earlier backward freed.",
            ("likely carrier of the freed graph",)),
    },
)
