"""BX006 shared-graph."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX006",
    name="shared-graph",
    title="two backward calls in one pass on losses sharing an un-detached tensor (GAN `fake`, two heads on one "
          "trunk)",
    what="""\
Flags a tensor with autograd history (`fake = generator(z)`, `features = trunk(x)`) that feeds
two losses back-propagated one after the other, when the first `backward()` does not keep the
graph (`retain_graph`).""",
    why="""\
The first `backward()` frees the graph behind the shared tensor. The second one reaches that
freed graph and raises "Trying to backward through the graph a second time". The error's hint,
`retain_graph=True`, is only right when no optimizer step runs between the two calls; after a
step it gives "modified by an inplace operation" instead.""",
    example="""\
generator, discriminator = nn.Linear(4, 8), nn.Linear(8, 1)
opt_d = torch.optim.Adam(discriminator.parameters())
fake = generator(z)
d_loss = bce(discriminator(real), ones) + bce(discriminator(fake), zeros)
d_loss.backward()
opt_d.step()
g_loss = bce(discriminator(fake), ones)
g_loss.backward()""",
    use_instead="""\
generator, discriminator = nn.Linear(4, 8), nn.Linear(8, 1)
opt_d = torch.optim.Adam(discriminator.parameters())
fake = generator(z)
d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
d_loss.backward()
opt_d.step()
g_loss = bce(discriminator(fake), ones)
g_loss.backward()""",
    notes="""\
The same holds for the update after the second backward: an actor's loss needs the critic's
`advantage` only as a value (`advantage.detach()`), because `actor_opt` does not train the critic.
For two losses on one trunk with no step between them, back-propagate their sum once:
`(loss1 + loss2).backward()`. The same loss back-propagated twice is a duplicate call: remove the
second one (with `retain_graph=True` it would count every gradient twice).""",
    messages={
        "shared": Message(
            "`{carrier}` feeds both `{freed_by.code}` (line {freed_by.row}) and `{backward.code}` (line "
            "{backward.row}): the first backward frees the graph that made `{carrier}`, so the second raises "
            "'backward through the graph a second time'"),
        "twice": Message(
            "`{carrier}` is back-propagated twice: `{freed_by.code}` (line {freed_by.row}) already did it, and its "
            "graph is freed, so this call raises 'backward through the graph a second time'"),
        "run-shared": Message(
            "`{carrier}` (made at {where}) is part of the graphs of two backward calls. `{freed_by.code}` (line "
            "{freed_by.row}) went through it first and freed its graph; this backward (line {backward.row}) needs "
            "it again.",
            "`{carrier}` is shared by two backward calls, and the first one freed its graph.",
            ("shared by two backward calls",)),
        "run-twice": Message(
            "`{freed_by.code}` ({freed_where}) already back-propagated `{carrier}`, and this call (line "
            "{backward.row}) back-propagates the same tensor again.",
            "`{carrier}` is back-propagated twice: `{freed_by.code}` ({freed_where}) already did it.",
            ("back-propagated a second time",)),
    },
)
