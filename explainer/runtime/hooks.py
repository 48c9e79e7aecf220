"""Cheap hooks on backward calls and optimizer steps.

Per backward call we record the autograd sequence-number high-water mark (nodes created before
the call have smaller numbers), the call site and `retain_graph`; per optimizer step, the call
site and the optimizer. When an explained error escapes a backward call, `analysis.explain`
turns it into a Finding, attached to the exception as a PEP 678 note.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from collections import deque
from dataclasses import dataclass

import torch

from . import journal

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_peek_sequence_nr = torch._C._autograd._get_sequence_nr
_ticks = itertools.count(1)


@dataclass(frozen=True, slots=True)
class BackwardCall:
    tick: int
    mark: int
    root_seqs: tuple[int, ...]
    filename: str
    row: int
    retain_graph: bool
    create_graph: bool
    api: str
    thread: int


@dataclass(frozen=True, slots=True)
class StepCall:
    tick: int
    mark: int
    optimizer: weakref.ref
    filename: str
    row: int
    thread: int


class _Recorder(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.calls: deque[BackwardCall] = deque(maxlen=16)


_local = _Recorder()
_steps: deque[StepCall] = deque(maxlen=64)
_originals: dict[str, object] = {}
_step_hook_handle = None
# Call sites whose retain_graph=True graph was already checked, with how often.
_growth_checks: dict[tuple[str, int], int] = {}
_GROWTH_CHECKS_PER_SITE = 8


def is_internal_file(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_PACKAGE_DIR)


def user_site(frame) -> tuple[str, int]:
    while frame is not None and is_internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def recent_calls() -> tuple[BackwardCall, ...]:
    return tuple(_local.calls)


def recent_steps() -> tuple[StepCall, ...]:
    return tuple(_steps)


def _root_seqs(tensors) -> tuple[int, ...]:
    if isinstance(tensors, torch.Tensor):
        tensors = (tensors,)
    seqs = []
    try:
        for tensor in tensors:
            grad_fn = getattr(tensor, "grad_fn", None)
            if grad_fn is not None:
                seqs.append(grad_fn._sequence_nr())
    except TypeError:
        pass
    return tuple(seqs)


def _argument(args, kwargs, index: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


# Positions of (roots, retain_graph, create_graph) in each hooked signature.
_SIGNATURES = {
    "autograd.backward": (0, 2, 3),
    "autograd.grad": (0, 3, 4),
}
_ROOT_NAMES = {"autograd.backward": "tensors", "autograd.grad": "outputs"}


def _make_wrapper(api: str, original):
    roots_at, retain_at, create_at = _SIGNATURES[api]
    roots_name = _ROOT_NAMES[api]

    def hooked(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (pytest and IPython hide this frame)
        recorder = _local
        if recorder.depth:
            return original(*args, **kwargs)
        roots = _argument(args, kwargs, roots_at, roots_name)
        create_graph = bool(_argument(args, kwargs, create_at, "create_graph", False))
        retain = _argument(args, kwargs, retain_at, "retain_graph", None)
        retain_graph = create_graph if retain is None else bool(retain)
        caller = sys._getframe(1)
        filename, row = user_site(caller)
        call = BackwardCall(
            next(_ticks), _peek_sequence_nr(), _root_seqs(roots), filename, row,
            retain_graph, create_graph, "grad" if api == "autograd.grad" else "backward",
            threading.get_ident(),
        )
        if retain_graph and recorder.calls:
            _check_growth(call, roots, caller)
        recorder.depth += 1
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            _explain_into(error, call, roots, caller)
            raise
        finally:
            recorder.depth -= 1
            recorder.calls.append(call)
            del caller

    hooked.__name__ = getattr(original, "__name__", api)
    hooked.__qualname__ = getattr(original, "__qualname__", api)
    hooked.__doc__ = getattr(original, "__doc__", None)
    hooked.__wrapped__ = original
    return hooked


def _explain_into(error: RuntimeError, call: BackwardCall, roots, caller) -> None:
    from . import analysis  # imported on first error only: keeps `import explainer` cheap

    analysis.explain_and_note(error, call, roots, caller, recent_calls(), recent_steps())


def _check_growth(call: BackwardCall, roots, caller) -> None:
    site = (call.filename, call.row)
    done = _growth_checks.get(site, 0)
    if done >= _GROWTH_CHECKS_PER_SITE:
        return
    _growth_checks[site] = done + 1
    from . import analysis

    if analysis.warn_if_graph_grows(call, roots, caller, recent_calls(), recent_steps()):
        _growth_checks[site] = _GROWTH_CHECKS_PER_SITE


def _on_step(optimizer, args, kwargs) -> None:
    filename, row = user_site(sys._getframe(1))
    _steps.append(
        StepCall(next(_ticks), _peek_sequence_nr(), weakref.ref(optimizer), filename, row,
                 threading.get_ident())
    )


def installed() -> bool:
    return bool(_originals)


def install() -> None:
    """Hook backward, autograd.grad and optimizer steps. Idempotent."""
    global _step_hook_handle
    if _originals:
        return
    # `Tensor.backward` calls `torch.autograd.backward`, so hooking that one catches both and
    # adds a single frame (marked __tracebackhide__) to the user's traceback, not two.
    _originals["autograd.backward"] = torch.autograd.backward
    _originals["autograd.grad"] = torch.autograd.grad
    torch.autograd.backward = _make_wrapper("autograd.backward", torch.autograd.backward)
    torch.autograd.grad = _make_wrapper("autograd.grad", torch.autograd.grad)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _step_hook_handle = register_optimizer_step_post_hook(_on_step)


def uninstall() -> None:
    """Restore what `install` replaced, and forget every record."""
    global _step_hook_handle
    if not _originals:
        return
    torch.autograd.backward = _originals.pop("autograd.backward")
    torch.autograd.grad = _originals.pop("autograd.grad")
    if _step_hook_handle is not None:
        _step_hook_handle.remove()
        _step_hook_handle = None
    _local.calls.clear()
    _steps.clear()
    _growth_checks.clear()
    journal.clear()
