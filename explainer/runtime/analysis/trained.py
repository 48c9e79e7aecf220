"""What is trained: the leaves a tensor's history reaches, and the parameters an optimizer
updates. Fixes detach a tensor for an update whose optimizer does not train what made it."""
from __future__ import annotations

from ...reading.training import update_receiver, zeroed_before_use
from .. import graph


def leaves_under(grad_fn) -> list:
    """The leaf tensors (parameters, inputs that require grad) a tensor's history reaches."""
    if grad_fn is None:
        return []
    return [graph.leaf_variable(n) for n in graph.walk([grad_fn]).nodes.values() if graph.is_leaf(n)]


def parameters_under(grad_fn) -> set[int]:
    return {id(leaf) for leaf in leaves_under(grad_fn)}


def optimizer_parameters(steps) -> set[int]:
    """The parameters the optimizers of the recorded `steps` train."""
    ids = set()
    for step in steps:
        ids |= trained_by(step.optimizer())
    return ids


def every_optimizer_parameter(steps, frames) -> set[int]:
    """The parameters of every optimizer the program holds, not only of those that have stepped
    so far: the generator's optimizer steps after the critic's first steps, and what it trains
    is trained all the same."""
    ids = optimizer_parameters(steps)
    for optimizer in held_optimizers(frames):
        ids |= trained_by(optimizer)
    return ids


def held_optimizers(frames) -> list:
    """Every optimizer the user's frames hold: in their variables, and one level into the
    objects, lists and dicts those hold (`self.optimizer_G`, StyleTTS2's
    `optimizer.optimizers['wd']`)."""
    import torch

    found: list = []
    seen: set[int] = set()

    def look(value, depth: int) -> None:
        if id(value) in seen or len(seen) > 20_000:
            return
        seen.add(id(value))
        if isinstance(value, torch.optim.Optimizer):
            found.append(value)
        elif depth > 0 and isinstance(value, (list, tuple)):
            for item in value[:64]:
                look(item, depth - 1)
        elif depth > 0 and isinstance(value, dict):
            for item in list(value.values())[:256]:
                look(item, depth - 1)
        elif depth > 0 and not isinstance(value, (type, torch.Tensor, torch.nn.Module)) \
                and isinstance(getattr(value, "__dict__", None), dict):
            for item in list(vars(value).values())[:256]:
                look(item, depth - 1)

    for frame in frames:
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                look(value, 2)
    return found


def trained_by(optimizer) -> set[int]:
    if optimizer is None:
        return set()
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def reads_on_the_way(grad_fn, targets: set[int], changed: set[int]) -> bool:
    """Whether a node on a path from `grad_fn` to one of the leaves `targets` takes one of the
    leaves `changed` as an input (directly or through views, `graph.input_leaves`): it saved that
    tensor to compute the gradient of its other inputs, so a backward kept to `targets` still
    needs it unchanged. True when the walk could not see the whole graph."""
    if grad_fn is None:
        return False
    walked = graph.walk([grad_fn])
    if not walked.complete:
        return True
    on_the_way = {key for key, node in walked.nodes.items()
                  if graph.is_leaf(node) and id(graph.leaf_variable(node)) in targets}
    pending = list(on_the_way)
    while pending:
        for consumer in walked.consumers.get(pending.pop(), []):
            if consumer not in on_the_way:
                on_the_way.add(consumer)
                pending.append(consumer)
    return any(not graph.is_leaf(walked.nodes[key]) and any(id(v) in changed for v in graph.input_leaves(walked.nodes[key]))
               for key in on_the_way)


def left_unused(ctx, statements, filename: str, parameters: set[int], own: str) -> set[int] | None:
    """The gradients a backward no longer leaves in `parameters` were never used where every
    optimizer stepped in `statements` (what runs before that backward runs again), but `own`,
    that trains some of them zeroes its gradients before it steps and before any `.grad` is
    read. The parameters none of those optimizers train, or None where one uses them first."""
    left = set(parameters)
    for name in {update_receiver(stmt, "step") for stmt in statements} - {None, own}:
        trained = trained_by(ctx.lookup(name, filename))
        if left & trained and not zeroed_before_use(statements, name):
            return None
        left -= trained
    return left
