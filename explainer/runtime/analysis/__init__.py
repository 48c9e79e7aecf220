"""Turn an autograd error (or a growing retained graph) into a Finding.

The steps: split the graph reachable from the failing backward into nodes created since the
previous backward (current) and before it (stale); find where stale history enters; name the
tensor that carries it by looking through the user's frames; read the source to find the line
that made it; build the fixes. Everything that holds tensors, nodes or frames lives in local
variables of these functions and is gone when they return.
"""
from __future__ import annotations

import warnings

import torch

from ...model import Finding
from .. import graph, journal, naming
from ..errors import inplace_detail, kind_of
from ..hooks import BackwardCall
from .context import Context
from .growth import explain_graph_growth
from .inplace import explain_inplace
from .no_grad import explain_no_grad
from .second_backward import explain_second_backward

NOTE_PREFIX = "[explainer]"

class GraphGrowthWarning(UserWarning):
    """A graph kept alive with retain_graph=True reaches back into earlier iterations."""


# ---------------------------------------------------------------------------------------------
# Entry points called by the hooks


def explain_and_note(error, call, roots, caller, calls, steps) -> None:
    frames = []
    try:
        frames = naming.user_frames(caller)
        finding = explain(error, call, roots, frames, calls, steps)
        if finding is not None:
            journal.record_error(error, finding)
            from ...render.text import render_note

            error.add_note(render_note(finding))
    except Exception as internal:  # the user's error must stand, whatever happens here
        error.add_note(f"{NOTE_PREFIX} could not explain this error ({type(internal).__name__}: "
                       f"{internal}); the error above is PyTorch's own.")
    finally:
        frames.clear()


def warn_if_graph_grows(call, roots, caller, calls, steps) -> bool:
    frames = []
    try:
        frames = naming.user_frames(caller)
        finding = explain_growth(call, roots, frames, calls, steps)
        if finding is None:
            return False
        journal.record_warning(finding)
        from ...render.text import render_note

        warnings.warn_explicit(GraphGrowthWarning(render_note(finding)), GraphGrowthWarning,
                               call.filename, call.row)
        return True
    except Exception:
        return False
    finally:
        frames.clear()


def explain(error, call: BackwardCall | None, roots, frames, calls, steps) -> Finding | None:
    kind = kind_of(error)
    if kind is None:
        return None
    graph.reset_budget()
    context = Context(call, _as_tensors(roots), frames, tuple(calls), tuple(steps))
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


