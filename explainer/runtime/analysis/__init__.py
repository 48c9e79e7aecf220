"""Turn an autograd error (or a growing retained graph) into a Finding.

The steps: split the graph reachable from the failing backward into nodes created since the
previous backward (current) and before it (stale); find where stale history enters; name the
tensor that carries it by looking through the user's frames; read the source to find the line
that made it; build the fixes. Everything that holds tensors, nodes or frames lives in local
variables of these functions and is gone when they return.
"""
from __future__ import annotations

import torch

from ...model import Finding
from .. import graph, journal, records
from ..errors import inplace_detail, kind_of
from ..records import BackwardCall
from .context import Context
from .growth import explain_graph_growth
from .inplace import explain_inplace, retained_before_step
from .no_grad import explain_no_grad
from .second_backward import explain_second_backward


def explain_error(error, call: BackwardCall, roots, caller, calls, steps, loads=(), zeroings=None) -> Finding | None:
    """The finding for an autograd error that escaped the backward call `call` (made from the
    frame `caller`), recorded in the journal; None for an error this project does not explain."""
    frames = []
    try:
        frames = records.user_frames(caller)
        finding = explain(error, call, roots, frames, calls, steps, loads, zeroings)
        warned = journal.warned_at(call.tick) if call is not None and finding is not None else None
        if warned is not None and finding.kind == "inplace-modified":
            # The graph kept with retain_graph=True (the warning) is the graph built before the
            # step: one bug, told once, by the error, with the carried state's fix.
            finding = retained_before_step(finding, warned)
            journal.retract_warning(warned)
        if finding is not None:
            journal.record_error(error, finding)
        return finding
    finally:
        frames.clear()


def explain_growing(call: BackwardCall, roots, caller, calls, steps) -> Finding | None:
    """The finding for a graph that grows across iterations (recorded in the journal), or None
    (also where the journal holds it already, found from another call):
    the retained graph of a call with retain_graph=True reaching into earlier iterations, or a
    tensor of the user's chaining the graphs of earlier iterations aside from `call`'s."""
    frames = []
    try:
        frames = records.user_frames(caller)
        finding = explain_growth(call, roots, frames, calls, steps)
        return finding if finding is not None and journal.record_warning(finding, call.tick) else None
    finally:
        frames.clear()


def explain(error, call: BackwardCall | None, roots, frames, calls, steps, loads=(), zeroings=None) -> Finding | None:
    kind = kind_of(error)
    if kind is None:
        return None
    graph.reset_budget()
    context = Context(call, _as_tensors(roots), frames, tuple(calls), tuple(steps), tuple(loads),
                      None if zeroings is None else tuple(zeroings))
    if kind == "second-backward":
        return explain_second_backward(context)
    if kind == "inplace-modified":
        return explain_inplace(context, inplace_detail(error))
    return explain_no_grad(context)


def explain_growth(call, roots, frames, calls, steps) -> Finding | None:
    graph.reset_budget()
    context = Context(call, _as_tensors(roots), frames, tuple(calls), tuple(steps))
    return explain_graph_growth(context)


def _as_tensors(roots) -> list:
    if isinstance(roots, torch.Tensor):
        return [roots]
    try:
        return [t for t in roots if isinstance(t, torch.Tensor)]
    except TypeError:
        return []
