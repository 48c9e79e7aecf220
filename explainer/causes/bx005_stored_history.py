"""BX005 stored-history."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX005",
    name="stored-history",
    title="tensors with history kept in a list or dict that later forwards read",
    what="""\
Flags `memory.append(h)` / `cache["prev"] = out` inside a loop that calls `backward()`, when the
container was made before the loop, the stored value has autograd history, and later forwards in
the loop read the container. Also a list an object keeps (`policy.saved_log_probs`, made `[]` in
`__init__`) that one function fills with tensors with history (`select_action`) and a function
called again and again back-propagates through (`finish_episode`), when nothing ever empties it.""",
    why="""\
Each stored tensor keeps the graph of the step that made it. The first `backward()` frees that
graph; the next step reads the stored tensor and back-propagates into it: "Trying to backward
through the graph a second time". With `retain_graph=True` it runs, but every step goes back
through all earlier ones, and memory grows with the container.""",
    example="""\
encoder, head = nn.Linear(8, 8), nn.Linear(8, 1)
memory = []
for x, y in batches:
    h = encoder(x)
    if memory:
        h = h + torch.stack(memory).mean(0)
    memory.append(h)
    loss_fn(head(h), y).backward()""",
    use_instead="""\
encoder, head = nn.Linear(8, 8), nn.Linear(8, 1)
memory = []
for x, y in batches:
    h = encoder(x)
    if memory:
        h = h + torch.stack(memory).mean(0)
    memory.append(h.detach())
    loss_fn(head(h), y).backward()""",
    notes="""\
When the loss reaches the stored tensors only through the container (REINFORCE's
`-torch.stack(log_probs).sum() * episode_return`), detaching them would leave it nothing to
train: the fix empties the container after the backward that consumed it
(`log_probs.clear()`).

At runtime, objects that keep what forward hooks store (fastai's `SaveFeatures`) are stale once
their hooks are removed (`sf.close()`): the next section of a notebook reads the output of the
last forward before the removal. The fix makes them again, hooks and all, right after the removal.""",
    messages={
        "stored": Message(
            "`{carrier}` keeps `{value}` with its autograd history across iterations, and a later step "
            "back-propagates into it"),
        "kept-by-object": Message(
            "`{carrier}` keeps `{value}` with its autograd history and is never emptied: each call of "
            "`{consumer}` back-propagates through everything stored so far, the earlier calls' freed graphs "
            "included"),
        "run-stored": Message(
            "`{carrier}` (filled at {where}) holds tensors with the graphs of earlier steps. {freed} those graphs, "
            "and this backward (line {backward.row}) reaches them through `{carrier}`.",
            "`{carrier}` keeps tensors whose graphs an earlier backward already freed.",
            ("stores tensors that keep earlier graphs",)),
        "likely-stored": Message(
            "`{carrier}` is filled at {where} with tensors that keep the graphs of earlier steps; an earlier "
            "backward freed that graph and this backward goes through it again. {unrecorded}, so this is read "
            "from the source and from what the graph shows: likely, not certain.",
            "`{carrier}` most likely carries a graph that an earlier backward freed.",
            ("likely carrier of the freed graph",)),
        "run-kept-stored": Message(
            "`{carrier}` (stored at {where}) keeps a tensor made from the one stored in the previous iteration, "
            "with its autograd graph: it chains the graphs of {iterations} earlier iterations, one more each "
            "iteration, and no backward goes through them. Memory grows until training slows down or runs out.",
            "`{carrier}` chains every iteration's graph to the previous one: memory grows.",
            ("keeps every iteration's graph",)),
        "run-kept-each": Message(
            "`{carrier}` (filled at {where}) keeps a tensor of each of the last {iterations} iterations with its "
            "autograd graph, one more each iteration. Their backward calls already ran, so no backward can go "
            "through them again; they only hold memory until the list is dropped.",
            "`{carrier}` keeps every iteration's graph after its backward: memory grows.",
            ("keeps each iteration's graph",)),
        "run-kept-unread": Message(
            "`{carrier}` (filled at {where}) keeps a tensor of each of the last {iterations} iterations with its "
            "autograd graph, one more each iteration. The function only appends to it, so no backward ever goes "
            "through them; they only hold memory until the list is dropped.",
            "`{carrier}` keeps every iteration's graph, and nothing back-propagates them: memory grows.",
            ("keeps each iteration's graph",)),
        "run-hooks-removed": Message(
            "The hooks of `{carrier}` (made at {where}) were removed, and `{holder_class}.{attribute}` still holds "
            "the output of the last forward before that. {freed} that forward's graph, and this backward "
            "(line {backward.row}) reaches it again through `{carrier}`: no forward refills `{attribute}` while "
            "the hooks are gone.",
            "The hooks of `{carrier}` were removed: it still holds `{attribute}` from a forward whose graph an "
            "earlier backward freed.",
            ("its hooks were removed; it holds a freed graph's output",)),
    },
)
