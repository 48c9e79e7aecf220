"""Cheap hooks on backward calls and optimizer steps.

Per backward call we record the autograd sequence-number high-water mark (nodes created before
the call have smaller numbers), the call site and `retain_graph`; per optimizer step, the call
site and the optimizer; per `load_state_dict`, the call site and the module. When an autograd error escapes a backward call, or a call retains a graph,
the hooks hand the records to the callbacks `install` was given (the front-end's: explain the
error and add a note, or record it for IPython to show); they import no analysis themselves.

`Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad` are hooked; a
`loss.backward()` passes two of them, so its traceback gains two frames, both marked
`__tracebackhide__` (pytest and IPython hide them; `explainer run` strips them).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import linecache
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable

import torch

from . import journal
from .records import PACKAGE_DIR, BackwardCall, LoadCall, StepCall, ZeroingCall, is_library_file, outside_libraries

_peek_sequence_nr = torch._C._autograd._get_sequence_nr
# While torch.compile traces, the hooks step aside: dynamo would otherwise trace into them, fail
# on sys._getframe and warn the user about our code. It breaks the graph at the backward as it
# always does, and the backward then runs eagerly, through the hooks.
# `_dynamo_tracing() or _compiler._is_compiling_flag` is `torch.compiler.is_compiling()` at under
# half its cost, on every backward and step: dynamo folds `is_dynamo_compiling()` to True while it
# traces (so it never reads the flag), and the flag is set while a compile session runs code for
# real (AOTAutograd's own autograd.grad, non-strict export). Older torch has only the function.
_compiler = getattr(torch, "compiler", None)
if hasattr(_compiler, "is_dynamo_compiling") and hasattr(_compiler, "_is_compiling_flag"):
    _dynamo_tracing = _compiler.is_dynamo_compiling
else:
    _dynamo_tracing = getattr(_compiler, "is_compiling", None) or (lambda: False)
    _compiler = type("NoCompileSession", (), {"_is_compiling_flag": False})
_ticks = itertools.count(1)


class _PerThread(threading.local):
    def __init__(self) -> None:
        # One attribute read per backward call: [depth, calls]. `calls` holds raw tuples
        # (tick, mark, root_ids, code, lasti, retain_graph, create_graph, api); the BackwardCall,
        # with its line number, is built only when an explanation needs it.
        self.state: list = [0, deque(maxlen=16)]


_local = _PerThread()
_steps: deque[tuple] = deque(maxlen=64)  # (tick, mark, optimizer ref, code, lasti)
_loads: deque[tuple] = deque(maxlen=16)  # (tick, mark, module ref, code, lasti)
# (tick, optimizer or module ref); a record this long that begins after a step may have lost
# a zeroing made since.
ZEROINGS_KEPT = 64
_zeroings: deque[tuple] = deque(maxlen=ZEROINGS_KEPT)
_originals: dict[str, object] = {}
_step_hook_handle = None
# The code object of the last frame found to be the user's, shared by the backward and step hooks:
# a training loop calls both from the same code every time, and `is` against it skips reading
# the file name (a frame attribute, a code attribute and a `startswith` on every call).
_last_user_code: list = [None]
# Call sites whose graph was already checked for growth, with how often.
_growth_checks: dict[tuple, int] = {}
_GROWTH_CHECKS_PER_SITE = 8
# How many more backward calls that retain nothing look for a graph kept aside (a running total
# of the loss): it shows from the third call, so the first ones of the process are enough, and
# the calls after them pay one test.
KEPT_CHECKS = 10
_kept_checks: list = [KEPT_CHECKS]
# What `install` was given: called with (error, call, roots, caller frame, recent calls, recent
# steps, recent loads, recent zeroings) when an autograd error escapes a backward call, and with (call, roots, caller frame,
# recent calls, recent steps) -> whether it warned, when a call retains a graph or is one of the
# first ten (a graph kept aside from the backward calls grows too).
OnError = Callable[..., None]
OnGrowth = Callable[..., bool]
_callbacks: list = [None, None]  # [on_error, on_growth]


def _line_of(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def _column_of(code, lasti: int) -> int | None:
    """The column the instruction at `lasti` starts at (the call's own expression), read only
    when an error is explained."""
    positions = code.co_positions()
    for _ in range(lasti // 2):
        next(positions, None)
    found = next(positions, None)
    return found[2] if found is not None else None


def _site(code, lasti: int) -> tuple[str, int, int | None]:
    if code is None:
        return "<unknown>", 0, None
    return code.co_filename, _line_of(code, lasti), _column_of(code, lasti)


def _as_call(raw: tuple) -> BackwardCall:
    tick, mark, root_ids, code, lasti, retain_graph, create_graph, api = raw
    filename, row, column = _site(code, lasti)
    return BackwardCall(tick, mark, root_ids, filename, row, retain_graph, create_graph, api, column)


def recent_calls() -> tuple[BackwardCall, ...]:
    return tuple(_as_call(raw) for raw in _local.state[1])


def recent_steps() -> tuple[StepCall, ...]:
    return tuple(StepCall(tick, mark, ref, *_site(code, lasti)) for tick, mark, ref, code, lasti in _steps)


def recent_loads() -> tuple[LoadCall, ...]:
    return tuple(LoadCall(tick, mark, ref, *_site(code, lasti)) for tick, mark, ref, code, lasti in _loads)


def recent_zeroings() -> tuple[ZeroingCall, ...]:
    return tuple(ZeroingCall(tick, ref) for tick, ref in _zeroings)


def zeroings_recorded(owner) -> bool:
    """Whether `owner`'s `zero_grad()` calls are recorded: the hooks are installed and its class
    has not replaced the one `install` wraps (`torch.optim.Optimizer`'s or `torch.nn.Module`'s)."""
    method = getattr(type(owner), "zero_grad", None)
    return installed() and (method is torch.optim.Optimizer.zero_grad or method is torch.nn.Module.zero_grad)


# The hooked callables, by name: (owner, attribute, kind recorded, name of the roots parameter).
_TARGETS = {
    "Tensor.backward": (lambda: torch.Tensor, "backward", "backward", "self"),
    "autograd.backward": (lambda: torch.autograd, "backward", "backward", "tensors"),
    "autograd.grad": (lambda: torch.autograd, "grad", "grad", "outputs"),
}

# The wrapper runs on every backward call, so it is generated with the original's own parameter
# list: binding `*args, **kwargs` and picking them apart cost more than everything it records
# (measured in benchmarks/run.py, part 1b). Generating the code, as dataclasses does, keeps one
# implementation for every torch version's signature.
_WRAPPER_TEMPLATE = """
def hooked({parameters}):
    __tracebackhide__ = True
    if dynamo_tracing() or compiler._is_compiling_flag:
        return original({forward})
    state = per_thread.state
    if state[0]:
        return original({forward})
    caller = getframe(1)
    code = caller.f_code
    if code is not user_code[0]:
        if library(code.co_filename):
            if transform(code.co_filename):
                return original({forward})
            caller = user_frame(caller)
            code = caller.f_code if caller is not None else None
        else:
            user_code[0] = code
    create = True if create_graph else False
    retain = create if retain_graph is None else (True if retain_graph else False)
    call = (next(ticks), peek(), {root_ids}, code,
            caller.f_lasti if caller is not None else 0, retain, create, kind)
    calls = state[1]
    if retain:
        if not create and calls:  # a higher-order graph spans its steps on purpose (MAML)
            check_growth(call, {roots}, caller)
    elif kept_checks[0] and calls:  # a graph kept aside shows in the first iterations
        kept_checks[0] -= 1
        check_growth(call, {roots}, caller)
    state[0] = 1
    try:
        return original({forward})
    except RuntimeError as error:
        explain_into(error, call, {roots}, caller)
        raise
    finally:
        state[0] = 0
        calls.append(call)
"""


# Names the template binds itself: a parameter of the same name would shadow them.
_TEMPLATE_NAMES = {
    "dynamo_tracing", "compiler", "state", "caller", "code", "user_code", "create", "retain", "call", "calls",
    "error", "original", "per_thread", "getframe", "library", "user_frame", "ticks", "peek", "kind",
    "check_growth", "explain_into", "kept_checks", "transform",
}


def _root_ids(roots_name: str) -> str:
    """The expression for the ids of the roots: `Tensor.backward`'s root is always `self`, the
    functions take a tensor or a sequence of them."""
    if roots_name == "self":
        return "(id(self),)"
    return f"tuple(map(id, {roots_name})) if type({roots_name}) is tuple or type({roots_name}) is list " \
           f"else (id({roots_name}),)"


class UnsupportedTorch(RuntimeError):
    """This torch's backward functions don't have the parameters the hooks record."""


def _parameter_lists(signature: inspect.Signature, namespace: dict) -> tuple[str, str]:
    """`signature` as a `def` parameter list, and the arguments that pass each parameter on
    unchanged. Default values go into `namespace` (the generated code refers to them by name)."""
    parameters, forward = [], []
    values = list(signature.parameters.values())
    for index, parameter in enumerate(values):
        name = parameter.name
        if parameter.kind is parameter.VAR_POSITIONAL:
            parameters.append(f"*{name}")
            forward.append(f"*{name}")
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            parameters.append(f"**{name}")
            forward.append(f"**{name}")
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and not any(p.startswith("*") for p in parameters):
            parameters.append("*")
        if parameter.default is parameter.empty:
            parameters.append(name)
        else:
            namespace[f"_default_{index}"] = parameter.default
            parameters.append(f"{name}=_default_{index}")
        positional = parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        forward.append(name if positional else f"{name}={name}")
        if parameter.kind is parameter.POSITIONAL_ONLY and all(
                later.kind is not later.POSITIONAL_ONLY for later in values[index + 1:]):
            parameters.append("/")
    return ", ".join(parameters), ", ".join(forward)


def _in_a_transform(filename: str) -> bool:
    """Whether torch.func's transforms make the call (`vmap(grad(loss_fn))`, titans-pytorch's
    per-sample gradients of its neural memory): their `autograd.grad` differentiates the graph of
    their own level, built and freed inside the call, never one the user's backward calls share.
    Recorded, it would be taken for the backward that freed the graph."""
    return f"{os.sep}torch{os.sep}_functorch{os.sep}" in filename


def _make_wrapper(name: str, kind: str, roots_name: str, original):
    """A function with `original`'s signature that records the call, then calls `original`.

    Nested calls (a backward inside a backward hook, reentrant checkpointing, `Tensor.backward`
    calling `autograd.backward`) go straight through: only the outermost call is recorded."""
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError) as error:
        raise UnsupportedTorch(f"cannot read the signature of {original!r}") from error
    names = list(signature.parameters)
    if not names or names[0] != roots_name or not {"retain_graph", "create_graph"} <= set(names):
        raise UnsupportedTorch(f"unexpected signature {original.__qualname__}{signature}")
    clashes = set(names) & _TEMPLATE_NAMES
    if clashes:
        raise UnsupportedTorch(f"{original.__qualname__} has parameters named {sorted(clashes)}")
    namespace = {
        "original": original, "per_thread": _local, "getframe": sys._getframe,
        "library": is_library_file, "user_code": _last_user_code, "user_frame": outside_libraries, "ticks": _ticks,
        "peek": _peek_sequence_nr, "kind": kind, "check_growth": _check_growth, "kept_checks": _kept_checks,
        "explain_into": _explain_into, "dynamo_tracing": _dynamo_tracing, "compiler": _compiler,
        "transform": _in_a_transform,
    }
    parameters, forward = _parameter_lists(signature, namespace)
    code = _WRAPPER_TEMPLATE.format(parameters=parameters, forward=forward, roots=roots_name,
                                    root_ids=_root_ids(roots_name))
    # A file name inside this package marks the frame as ours (user_frame, the CLI's traceback);
    # registering the text in linecache lets a traceback that does show the frame quote it.
    filename = f"{PACKAGE_DIR}runtime/<hook of {name}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102
    hooked = namespace["hooked"]
    functools.update_wrapper(hooked, original)
    return hooked


def _explain_into(error: RuntimeError, call: tuple, roots, caller) -> None:
    on_error = _callbacks[0]
    if on_error is not None:
        on_error(error, _as_call(call), roots, caller, recent_calls(), recent_steps(), recent_loads(),
                 recent_zeroings())


def _check_growth(call: tuple, roots, caller) -> None:
    on_growth = _callbacks[1]
    site = (call[3], call[4])
    done = _growth_checks.get(site, 0)
    if on_growth is None or done >= _GROWTH_CHECKS_PER_SITE:
        return
    _growth_checks[site] = done + 1
    if on_growth(_as_call(call), roots, caller, recent_calls(), recent_steps()):
        _growth_checks[site] = _GROWTH_CHECKS_PER_SITE


# How many frames up the user's `step()` call is, per optimizer class (torch wraps `step`).
_step_depth: dict[type, int] = {}


def _on_step(optimizer, args, kwargs) -> None:
    if _dynamo_tracing() or _compiler._is_compiling_flag:
        return
    depth = _step_depth.get(type(optimizer))
    caller = sys._getframe(depth) if depth else None
    code = caller.f_code if caller is not None else None
    if code is None or code is not _last_user_code[0]:
        if code is None or is_library_file(code.co_filename):
            caller, depth = sys._getframe(1), 1
            while caller is not None and is_library_file(caller.f_code.co_filename):
                caller, depth = caller.f_back, depth + 1
            _step_depth[type(optimizer)] = depth
            code = caller.f_code if caller is not None else None
        else:
            _last_user_code[0] = code
    _steps.append((next(_ticks), _peek_sequence_nr(), weakref.ref(optimizer), code,
                   caller.f_lasti if caller is not None else 0))


def _recording_loads(original):
    """`Module.load_state_dict`, recording where the user called it: it writes into the module's
    parameters in place, so a graph built before it fails its backward as after a step. Loading
    is rare, so this wrapper can afford finding the user's frame each time."""

    @functools.wraps(original)
    def load_state_dict(self, *args, **kwargs):
        __tracebackhide__ = True
        if not (_dynamo_tracing() or _compiler._is_compiling_flag):
            caller = outside_libraries(sys._getframe(1))
            _loads.append((next(_ticks), _peek_sequence_nr(), weakref.ref(self),
                           caller.f_code if caller is not None else None, caller.f_lasti if caller is not None else 0))
        return original(self, *args, **kwargs)

    return load_state_dict


def _recording_zeroings(original):
    """`Optimizer.zero_grad` and `Module.zero_grad`, recording that they ran: a step moved past
    one would apply other gradients. Called once a step, and only its owner is kept."""

    @functools.wraps(original)
    def zero_grad(self, *args, **kwargs):
        __tracebackhide__ = True
        if not (_dynamo_tracing() or _compiler._is_compiling_flag):
            _zeroings.append((next(_ticks), weakref.ref(self)))
        return original(self, *args, **kwargs)

    return zero_grad


def installed() -> bool:
    return bool(_originals)


def install(on_error: OnError, on_growth: OnGrowth) -> None:
    """Hook `Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad`, and add an
    optimizer step post-hook, and record `Module.load_state_dict` calls and the optimizers' and
    modules' `zero_grad()` calls; autograd errors and retained graphs go to the callbacks. Installed
    again, only the callbacks change. Raises UnsupportedTorch, with nothing hooked, when a
    signature is not the one the hooks read.

    `Tensor.backward` is hooked itself, not only through the `autograd.backward` it calls: from
    its own wrapper the user's frame is the caller, while finding it from inside
    `autograd.backward` would build a frame object for `Tensor.backward` on every call."""
    global _step_hook_handle
    _callbacks[:] = [on_error, on_growth]
    if _originals:
        return
    wrappers = {}
    for name, (owner, attribute, kind, roots_name) in _TARGETS.items():
        original = getattr(owner(), attribute)
        wrappers[name] = (owner(), attribute, original, _make_wrapper(name, kind, roots_name, original))
    load = torch.nn.Module.load_state_dict
    wrappers["Module.load_state_dict"] = (torch.nn.Module, "load_state_dict", load, _recording_loads(load))
    for owner, name in ((torch.optim.Optimizer, "Optimizer.zero_grad"), (torch.nn.Module, "Module.zero_grad")):
        wrappers[name] = (owner, "zero_grad", owner.zero_grad, _recording_zeroings(owner.zero_grad))
    for name, (target, attribute, original, wrapper) in wrappers.items():
        _originals[name] = (target, attribute, original)
        setattr(target, attribute, wrapper)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _step_hook_handle = register_optimizer_step_post_hook(_on_step)


def install_or_say_why_not(on_error: OnError, on_growth: OnGrowth) -> bool:
    """`install`, for front-ends that must not stop the user's code: one line on stderr if this
    torch cannot be hooked."""
    try:
        install(on_error, on_growth)
    except UnsupportedTorch as error:
        print(f"[explainer] not installed: {error}", file=sys.stderr)
        return False
    return True


def uninstall() -> None:
    """Restore what `install` replaced, and forget every record."""
    global _step_hook_handle
    if not _originals:
        return
    for target, attribute, original in _originals.values():
        setattr(target, attribute, original)
    _originals.clear()
    _callbacks[:] = [None, None]
    if _step_hook_handle is not None:
        _step_hook_handle.remove()
        _step_hook_handle = None
    _local.state[1].clear()
    _steps.clear()
    _loads.clear()
    _zeroings.clear()
    _growth_checks.clear()
    _kept_checks[0] = KEPT_CHECKS
    _step_depth.clear()
    _last_user_code[0] = None
    journal.clear()
