"""Tensors with history kept in a container that outlives the iteration (BX005): a later
backward reaches the graphs an earlier one freed through the container."""
from __future__ import annotations

import ast

import torch

from ...fixes import detach_carried, empty_container, stop_caching
from ...model import Finding, Fix
from ...reading import source as src
from .. import graph
from ..records import BackwardCall
from .context import Context
from .evidence import culprit, finding, freed_graph
from .locate import Candidate
from .trained import leaves_under


def explain_stored(ctx: Context, candidate: Candidate, previous: BackwardCall, current: graph.Walk, failing, source,
            scope) -> Finding:
    located, name = candidate.located, candidate.name
    fixes = []
    memo = stop_caching.stop_caching(located.source, located.class_node, located.store, located.target_text) \
        if located is not None and located.class_node is not None and isinstance(located.store, ast.Assign) else None
    keyed = stop_caching.keyed_cache(located)
    if keyed is not None:
        # Rebuilt only when its key changes (torch-pme's cell): rebuilt on every call, as
        # torch-pme's maintainers did, it holds that call's graph.
        fixes.append(stop_caching.rebuild_every_call(located.source, keyed))
    elif memo is not None and leaves_under(candidate.binding.value.grad_fn):
        # A memo the class computes anew where it is None (robustness_of_gnns' `self.adj_preped`),
        # made from tensors that train: detached, it would stop training them after the first call.
        fixes.append(memo)
    elif located is not None and failing is not None and _trains_only_through(ctx, candidate, current):
        # Detaching at the store would leave this loss with nothing to train.
        if src.reads(scope, name):
            fixes.append(empty_container.empty_after_backward(source, failing, name))
    elif located is not None:
        steps = candidate.binding.steps
        # Kept by a call that names the attribute (`self.register_buffer("cached", freqs)`).
        cache = located.target is not located.store and steps and steps[-1][0] == "attr"
        if cache:
            container = f"self.{steps[-1][1]}"
        elif isinstance(located.store, ast.Call) and isinstance(located.store.func, ast.Attribute):
            container = located.source.segment(located.store.func.value)  # `hidden_states[layer_name]`
        else:
            container = name
        fix = detach_carried.detach_stored_value(located.source, located.store, container,
                                                 _stored_as_tuple(ctx, candidate.binding),
                                                 _stored_as_list(ctx, candidate.binding, located))
        # A module's cache may be read again within the step that fills it (every layer asks it
        # for the same frequencies), and a state stored for the next time step of this pass is:
        # detaching either changes this step's gradients too. This pass's graph shows how often a
        # pass reads what the last one stored; read once (GPyTorch's `self.mean_cache`, handed to
        # the solve that made it), no pass reads its own store before its backward.
        unsafe = (cache and not _read_once_this_pass(candidate, current)) or candidate.used_now
        fixes.append(Fix(fix.message, fix.edits, "unsafe") if fix is not None and unsafe else fix)
    return finding("BX005", "run-stored", "second-backward", freed_graph(ctx, name, located, previous, "grows"),
                   [culprit(ctx, candidate)], fixes, "certain" if located is not None else "likely")


def _read_once_this_pass(candidate: Candidate, current: graph.Walk) -> bool:
    """Whether exactly one node of this pass's graph consumes the stored value."""
    grad_fn = candidate.binding.value.grad_fn
    return grad_fn is not None and len(set(current.consumers.get(id(grad_fn), ()))) == 1


def _stored_as_tuple(ctx: Context, binding) -> bool:
    """The frames reach the tensor inside a tuple of tensors stored whole (`hidden_states['input'][0][0]`,
    where `hh` was appended)."""
    steps = binding.steps
    trailing = 0
    while trailing < len(steps) and steps[-1 - trailing][0] == "item" and isinstance(steps[-1 - trailing][1], int):
        trailing += 1
    if trailing < 2:
        return False
    element = ctx.reach(binding, steps[:len(steps) - trailing + 1])
    return isinstance(element, tuple) and all(isinstance(item, torch.Tensor) for item in element)


def _stored_as_list(ctx: Context, binding, located) -> bool:
    """The statement stores a whole list of tensors under the name the frames reach the tensor
    by an index of (`received_gradient = self.uploaded_gradients[i]`, then `received_gradient[0]`)."""
    steps = binding.steps
    if not isinstance(located.store, ast.Assign) or not steps or located.target_text != binding.base \
            or not all(kind == "item" for kind, _ in steps):
        return False
    whole = ctx.reach(binding, ())
    return isinstance(whole, list) and bool(whole) and all(isinstance(item, torch.Tensor) for item in whole)


def _trains_only_through(ctx: Context, candidate: Candidate, current: graph.Walk) -> bool:
    """Whether every path from this backward's roots to a parameter passes through a tensor
    held in the candidate's container (`torch.stack(losses).mean().backward()`)."""
    held = ctx.tensors_in_container(candidate.binding)
    blocked = {id(t.grad_fn) for t in held if t.grad_fn is not None}
    if not blocked:
        return False
    children: dict[int, list[int]] = {}
    for child, consumers in current.consumers.items():
        for consumer in consumers:
            children.setdefault(consumer, []).append(child)
    pending = [id(r) for r in ctx.root_nodes() if id(r) not in blocked]
    seen = set(pending)
    while pending:
        key = pending.pop()
        if current.seq.get(key) == graph.LEAF_SEQ:
            return False
        for child in children.get(key, ()):
            if child not in seen and child not in blocked:
                seen.add(child)
                pending.append(child)
    return True
