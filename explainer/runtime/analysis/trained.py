"""What is trained: the leaves a tensor's history reaches, and the parameters an optimizer
updates. Fixes detach a tensor for an update whose optimizer does not train what made it."""
from __future__ import annotations

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


def trained_by(optimizer) -> set[int]:
    if optimizer is None:
        return set()
    return {id(p) for group in optimizer.param_groups for p in group["params"]}
