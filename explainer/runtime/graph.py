"""Walks of the autograd graph.

Nodes are keyed by `id()` while a walk holds them; the walk object is dropped when the
explanation is built, so no graph outlives it. A node is *stale* when its sequence number is
below the mark recorded at an earlier backward call: it was created before that call.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

LEAF_SEQ = 2**64 - 1  # AccumulateGrad reports this

# Reading `next_functions` gives a node a Python wrapper that the node then keeps for life, and
# torch frees a chain of wrapped nodes recursively in C: a few 10^4 of them in a row overflow an
# 8 MiB stack when the user's graph is freed (a segfault seen at 6*10^4 on torch 2.13). So one
# explanation wraps at most this many nodes, across all its walks, and answers from what it saw.
WRAP_BUDGET = 15_000

# Nodes with as many inputs as the list the user passed (`torch.stack(states)`): reading their
# `next_functions` wraps every input at once, so their width is read first, from the output's
# shape along the joined dimension (exact for stack, at least the count for cat).
_LIST_INPUTS = frozenset({"StackBackward0", "CatBackward0"})


class _Budget:
    """Nodes wrapped by this explanation so far. Ids are stable while it runs: a wrapped node
    keeps its wrapper, and the user's graph outlives the explanation."""

    remaining = WRAP_BUDGET
    wrapped: set[int] = set()
    expanded: set[int] = set()  # nodes whose children are wrapped already: free to walk again

    def affords(self, node, reserve: int = 0) -> bool:
        return id(node) in self.expanded or self.remaining - _width(node) > reserve

    def charge(self, node, children) -> None:
        self.expanded.add(id(node))
        for child, _ in children:
            key = id(child)
            if key not in self.wrapped:
                self.wrapped.add(key)
                self.remaining -= 1


_budget = _Budget()


def _width(node) -> int:
    """How many inputs reading `node.next_functions` may wrap beyond the usual few: 0 for most
    nodes, the list's length bound for `torch.stack`/`torch.cat`, the whole budget when that
    cannot be read."""
    if type(node).__name__ not in _LIST_INPUTS:
        return 0
    try:
        dim = node._saved_dim
        dim = dim - 2**64 if dim >= 2**63 else dim  # a negative dim reads back unsigned
        return int(node._input_metadata[0].shape[dim])
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return WRAP_BUDGET


def children(node, reserve: int = 0):
    """`node.next_functions` charged to this explanation's budget, or () when the budget, less
    `reserve`, cannot afford wrapping them."""
    return _afforded_children(node, reserve) or ()


def _afforded_children(node, reserve: int = 0):
    """As `children`, but None when the budget cannot afford them (a walk then stops short)."""
    if not _budget.affords(node, reserve):
        return None
    found = node.next_functions
    _budget.charge(node, found)
    return found


def reset_budget(nodes: int = WRAP_BUDGET) -> None:
    _budget.remaining = nodes
    _budget.wrapped = set()
    _budget.expanded = set()


def budget_left() -> int:
    return _budget.remaining


def is_leaf(node) -> bool:
    return type(node).__name__ == "AccumulateGrad"


def sequence(node) -> int:
    """`node`'s autograd sequence number, and LEAF_SEQ for a leaf's AccumulateGrad whatever number
    the torch build gives it: made when the leaf was first used, it would look like history of
    that iteration, in every graph that reaches the weights."""
    seq = node._sequence_nr()
    return LEAF_SEQ if seq != LEAF_SEQ and type(node).__name__ == "AccumulateGrad" else seq


def leaf_variable(node):
    return getattr(node, "variable", None)


@dataclass
class Walk:
    """The part of a graph reached from some roots."""

    nodes: dict[int, object] = field(default_factory=dict)
    consumers: dict[int, list[int]] = field(default_factory=dict)
    seq: dict[int, int] = field(default_factory=dict)
    complete: bool = True

    def node(self, key: int):
        return self.nodes[key]


def walk(roots, *, expand=None, reserve: int = 0) -> Walk:
    """Breadth-first from `roots` (grad_fn nodes). `expand(seq)` False stops at a node.
    Stops early (`complete` False) when the wrap budget, less `reserve`, runs out."""
    result = Walk()
    nodes, consumers, seqs = result.nodes, result.consumers, result.seq
    queue = deque()
    for root in roots:
        if root is not None and id(root) not in nodes:
            nodes[id(root)] = root
            consumers[id(root)] = []
            queue.append(root)
    while queue:
        node = queue.popleft()
        key = id(node)
        seq = sequence(node)
        seqs[key] = seq
        if expand is not None and not expand(seq):
            continue
        found = _afforded_children(node, reserve)
        if found is None:
            result.complete = False
            continue
        for child, _ in found:
            if child is None:
                continue
            child_key = id(child)
            if child_key in nodes:
                consumers[child_key].append(key)
                continue
            nodes[child_key] = child
            consumers[child_key] = [key]
            queue.append(child)
    return result


# Backward nodes of views: what a node saved may be their input itself.
_VIEWS = frozenset(f"{name}Backward0" for name in (
    "T", "Transpose", "Permute", "View", "Reshape", "ReshapeAlias", "Unsqueeze", "Squeeze", "Expand",
    "Slice", "Select", "AsStrided", "Unbind", "Split", "SplitWithSizes", "Alias", "Unfold", "Diagonal",
    "Narrow")) | {"SqueezeBackward1", "SqueezeBackward2", "TransposeBackward1", "SelectBackward1"}


def is_view(node) -> bool:
    """Whether `node` is the backward of a view (`x.transpose(1, 2)`): what its consumer saved
    may be its input itself."""
    return type(node).__name__ in _VIEWS


def input_leaves(node):
    """The leaf tensors that are inputs of `node`, directly or through views (`weight.t()` for a
    linear layer): the ones it may have saved to compute the gradient of its other inputs.
    Deeper leaves went through computations whose results were saved instead (a buffer saved
    beside an activation is no parameter at all)."""
    frontier, seen = [node], set()
    while frontier:
        for child, _ in children(frontier.pop()):
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            if is_leaf(child):
                yield leaf_variable(child)
            elif is_view(child):
                frontier.append(child)


_SAVED_BY_TYPE: dict[type, tuple[str, ...]] = {}


def saved_attributes(node) -> tuple[str, ...]:
    """The attributes through which `node` shows what it saved for its backward (`_saved_self`)."""
    kind = type(node)
    names = _SAVED_BY_TYPE.get(kind)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _SAVED_BY_TYPE[kind] = names
    return names


def freed(node) -> bool | None:
    """Whether a backward already freed what `node` saved for its own backward: True, False, or
    None when it saved nothing it can be asked about (an addition, a leaf)."""
    saved_tensor = False
    for name in saved_attributes(node):
        try:
            value = getattr(node, name)
        except RuntimeError as error:
            if "freed" in str(error):  # "... saved tensors after they have already been freed"
                return True
            saved_tensor = True  # changed in place since (a weight stepped): saved, and still held
            continue
        saved_tensor = saved_tensor or isinstance(value, torch.Tensor) or (
            isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value))
    return False if saved_tensor else None


def changed_saved(node) -> str | None:
    """The attribute of `node` whose saved tensor was changed in place after it was saved (the
    version check its backward makes fails), or None. A custom Function's `saved_tensors` too."""
    custom = ("saved_tensors",) if hasattr(node, "_forward_cls") else ()
    for attribute in saved_attributes(node) + custom:
        try:
            getattr(node, attribute)
        except RuntimeError as error:
            if "inplace operation" in str(error):
                return attribute
        except Exception:
            continue
    return None


def _below(nodes, limit: int):
    """The nodes under `nodes`, themselves first, breadth-first, `limit` at most."""
    queue, seen = deque(nodes), set()
    while queue and len(seen) < limit:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        queue.extend(child for child, _ in children(node))


def freed_below(nodes, limit: int = 64) -> bool | None:
    """Whether the history below `nodes` (breadth-first, `limit` nodes at most) was freed: the
    first node that saved something tells. None when none of them did."""
    return next((answer for answer in map(freed, _below(nodes, limit)) if answer is not None), None)


def holds_freed(nodes, limit: int = 64) -> bool:
    """Whether any node below `nodes` (breadth-first, `limit` nodes at most) had what it saved
    freed by a backward: nothing holding it can be back-propagated again. Unlike `freed_below`,
    a node above it that saved something no backward went through (NakedAttention's
    `e_batch / len(loader)`, added up after the backward) does not hide it."""
    return any(freed(node) for node in _below(nodes, limit))


def trains_without(roots, avoided, limit: int = 4096) -> bool:
    """Whether the graph below `roots` reaches a leaf that requires grad other than through the
    node `avoided`: with what `avoided` made detached, a backward from `roots` would still have
    something to train. True when `limit` nodes do not tell."""
    queue, seen = deque(roots), set()
    while queue:
        node = queue.popleft()
        if node is None or node is avoided or id(node) in seen:
            continue
        if is_leaf(node) or len(seen) >= limit:
            return True
        seen.add(id(node))
        queue.extend(child for child, _ in children(node))
    return False


def stale_boundary(result: Walk, mark: int) -> list[int]:
    """Stale non-leaf nodes consumed by a current node: where old history enters this graph."""
    boundary = []
    for key, seq in result.seq.items():
        if seq >= mark or seq == LEAF_SEQ:
            continue
        if any(result.seq[c] >= mark for c in result.consumers[key]):
            boundary.append(key)
    return boundary


def shared_top(current: Walk, previous: Walk) -> list[int]:
    """Non-leaf nodes in both graphs whose consumers in `current` are not all shared."""
    tops = []
    for key in current.nodes:
        if key not in previous.nodes or current.seq.get(key) == LEAF_SEQ:
            continue
        consumers = current.consumers[key]
        if not consumers or any(c not in previous.nodes for c in consumers):
            tops.append(key)
    return tops


def reaches(start, targets: set[int], mark: int) -> bool:
    """Whether history from `start` reaches one of `targets` through nodes newer than `mark`."""
    if start is None:
        return False
    if id(start) in targets:
        return True
    seen = {id(start): start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if sequence(node) < mark:
            continue
        found = _afforded_children(node)
        if found is None:
            return False
        for child, _ in found:
            if child is None or id(child) in seen:
                continue
            if id(child) in targets:
                return True
            seen[id(child)] = child
            queue.append(child)
    return False
