"""Cheap hooks on backward calls and optimizer steps.

Per backward call we record the autograd sequence-number high-water mark (nodes created before
the call have smaller numbers), the call site and `retain_graph`; per optimizer step, the call
site and the optimizer. When an explained error escapes a backward call, `analysis` turns it
into a Finding, attached to the exception as a PEP 678 note.

`Tensor.backward` calls `torch.autograd.backward`, so hooking that one (and `autograd.grad`)
catches every backward and adds a single frame, marked `__tracebackhide__`, to a traceback.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from collections import deque
from typing import NamedTuple

import torch

from . import journal

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_INTERNAL = (_TORCH_DIR, _PACKAGE_DIR)
_peek_sequence_nr = torch._C._autograd._get_sequence_nr
_ticks = itertools.count(1)


class BackwardCall(NamedTuple):
    """One recorded backward / autograd.grad call. `mark` is the next autograd sequence number
    at the call: every node created before the call has a smaller one."""

    tick: int
    mark: int
    root_ids: tuple[int, ...]
    filename: str
    row: int
    retain_graph: bool
    create_graph: bool
    api: str


class StepCall(NamedTuple):
    tick: int
    mark: int
    optimizer: weakref.ref
    filename: str
    row: int


class _PerThread(threading.local):
    def __init__(self) -> None:
        # One attribute read per backward call: [depth, calls]. `calls` holds raw tuples
        # (tick, mark, root_ids, code, lasti, retain_graph, create_graph, api); the BackwardCall,
        # with its line number, is built only when an explanation needs it.
        self.state: list = [0, deque(maxlen=16)]


_local = _PerThread()
_steps: deque[tuple] = deque(maxlen=64)  # (tick, mark, optimizer ref, code, lasti)
_originals: dict[str, object] = {}
_step_hook_handle = None
# Call sites whose retain_graph=True graph was already checked, with how often.
_growth_checks: dict[tuple, int] = {}
_GROWTH_CHECKS_PER_SITE = 8


def is_internal_file(filename: str) -> bool:
    return filename.startswith(_INTERNAL)


def user_frame(frame):
    """The first frame outside torch and this package, going outwards."""
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
    return frame


def _line_of(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def _site(code, lasti: int) -> tuple[str, int]:
    return (code.co_filename, _line_of(code, lasti)) if code is not None else ("<unknown>", 0)


def _as_call(raw: tuple) -> BackwardCall:
    tick, mark, root_ids, code, lasti, retain_graph, create_graph, api = raw
    return BackwardCall(tick, mark, root_ids, *_site(code, lasti), retain_graph, create_graph, api)


def recent_calls() -> tuple[BackwardCall, ...]:
    return tuple(_as_call(raw) for raw in _local.state[1])


def recent_steps() -> tuple[StepCall, ...]:
    return tuple(StepCall(tick, mark, ref, *_site(code, lasti)) for tick, mark, ref, code, lasti in _steps)


# Positions of (roots, retain_graph, create_graph) in each hooked signature.
_SIGNATURES = {"autograd.backward": (0, 2, 3), "autograd.grad": (0, 3, 4)}
_ROOT_NAMES = {"autograd.backward": "tensors", "autograd.grad": "outputs"}


def _make_wrapper(api: str, original):
    """The wrapper runs on every backward call: keep it to a few attribute reads."""
    roots_at, retain_at, create_at = _SIGNATURES[api]
    roots_name = _ROOT_NAMES[api]
    kind = "grad" if api == "autograd.grad" else "backward"
    getframe, peek, ticks, per_thread = sys._getframe, _peek_sequence_nr, _ticks, _local

    def hooked(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (pytest and IPython hide this frame)
        state = per_thread.state
        if state[0]:
            return original(*args, **kwargs)
        roots = args[roots_at] if len(args) > roots_at else kwargs.get(roots_name)
        create_graph = args[create_at] if len(args) > create_at else kwargs.get("create_graph", False)
        retain = args[retain_at] if len(args) > retain_at else kwargs.get("retain_graph")
        retain_graph = bool(create_graph) if retain is None else bool(retain)
        # Tensor.backward calls us as (self, gradient, retain_graph, create_graph, inputs=...):
        # then the user's frame is two up. Asking for it directly builds one frame object, not two.
        caller = getframe(2 if len(args) == 4 and len(kwargs) == 1 and "inputs" in kwargs else 1)
        if caller.f_code.co_filename.startswith(_INTERNAL):
            caller = user_frame(caller)
        many = type(roots) is tuple or type(roots) is list
        call = (next(ticks), peek(), tuple(map(id, roots)) if many else (id(roots),),
                caller.f_code if caller is not None else None,
                caller.f_lasti if caller is not None else 0, retain_graph, bool(create_graph), kind)
        calls = state[1]
        if retain_graph and calls:
            _check_growth(call, roots, getframe(1))
        state[0] = 1
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            _explain_into(error, call, roots, getframe(1))
            raise
        finally:
            state[0] = 0
            calls.append(call)

    hooked.__name__ = getattr(original, "__name__", api)
    hooked.__qualname__ = getattr(original, "__qualname__", api)
    hooked.__doc__ = getattr(original, "__doc__", None)
    hooked.__wrapped__ = original
    return hooked


def _explain_into(error: RuntimeError, call: tuple, roots, caller) -> None:
    # Imported on the first error only: keeps `import explainer` and `install()` cheap.
    from . import analysis

    analysis.explain_and_note(error, _as_call(call), roots, caller, recent_calls(), recent_steps())


def _check_growth(call: tuple, roots, caller) -> None:
    site = (call[3], call[4])
    done = _growth_checks.get(site, 0)
    if done >= _GROWTH_CHECKS_PER_SITE:
        return
    _growth_checks[site] = done + 1
    from . import analysis

    if analysis.warn_if_graph_grows(_as_call(call), roots, caller, recent_calls(), recent_steps()):
        _growth_checks[site] = _GROWTH_CHECKS_PER_SITE


# How many frames up the user's `step()` call is, per optimizer class (torch wraps `step`).
_step_depth: dict[type, int] = {}


def _on_step(optimizer, args, kwargs) -> None:
    depth = _step_depth.get(type(optimizer))
    caller = sys._getframe(depth) if depth else None
    if caller is None or caller.f_code.co_filename.startswith(_INTERNAL):
        caller, depth = sys._getframe(1), 1
        while caller is not None and caller.f_code.co_filename.startswith(_INTERNAL):
            caller, depth = caller.f_back, depth + 1
        _step_depth[type(optimizer)] = depth
    _steps.append((next(_ticks), _peek_sequence_nr(), weakref.ref(optimizer),
                   caller.f_code if caller is not None else None,
                   caller.f_lasti if caller is not None else 0))


def installed() -> bool:
    return bool(_originals)


def install() -> None:
    """Hook `autograd.backward` (which `Tensor.backward` calls), `autograd.grad` and optimizer
    steps. Idempotent."""
    global _step_hook_handle
    if _originals:
        return
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
    _local.state[1].clear()
    _steps.clear()
    _growth_checks.clear()
    _step_depth.clear()
    journal.clear()
