"""Find the user's names for tensors: frame locals and globals, object attributes (`self.x`,
`model.hidden`), list, tuple and dict entries, to a bounded depth."""
from __future__ import annotations

import collections
import itertools
import sys
import types
from dataclasses import dataclass

import torch

MAX_DEPTH = 3
MAX_ITEMS = 64
# How many of the user's objects cost no depth in one search (`_free`): bounded, since such
# objects may link without end (a linked list of nodes).
MAX_FREE_OBJECTS = 256


@dataclass
class Binding:
    """One way a user can reach a value: `base` in frame `frame_index`, then `steps`."""

    frame_index: int
    base: str
    steps: tuple[tuple[str, object], ...]  # ("attr", name) | ("item", key)
    value: object
    owner: object | None  # the object holding the last attribute (for `self.x` lookup)

    @property
    def expression(self) -> str:
        text = self.base
        for kind, key in self.steps:
            text += f".{key}" if kind == "attr" else f"[{key!r}]"
        return text

    @property
    def container_expression(self) -> str:
        """The expression without a trailing index: `memory` for `memory[3]`."""
        steps = self.steps
        while steps and steps[-1][0] == "item" and isinstance(steps[-1][1], int):
            steps = steps[:-1]
        return Binding(self.frame_index, self.base, steps, None, None).expression

    @property
    def in_sequence(self) -> bool:
        """An element of a list or tuple (`memory[3]`, `hidden[0]`)."""
        return bool(self.steps) and self.steps[-1][0] == "item" and isinstance(self.steps[-1][1], int)


def _skippable(name: str, value) -> bool:
    return (
        name.startswith("__")
        or isinstance(value, (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType))
    )


def bindings(frames) -> list[Binding]:
    """Every tensor reachable from the frames, first binding per tensor wins: inner frames before
    outer, and within a frame shallow before deep, locals before globals (the loop's `memory`
    before the `model.attn.memory` it was also stored as)."""
    found: list[Binding] = []
    seen: set[int] = set()
    visited_objects: set[int] = set()
    free = [MAX_FREE_OBJECTS]
    by_frame: dict[int, list] = {}
    for index, name, value in variables(frames):
        if not _skippable(name, value):
            by_frame.setdefault(index, []).append((index, name, (), value, None, 0))
    for index in sorted(by_frame):
        pending = collections.deque(by_frame[index])
        while pending:
            _collect(found, seen, visited_objects, free, pending, *pending.popleft())
    return found


def variables(frames):
    """(frame index, name, value) for each frame's locals, then its globals. Globals belong to
    the frame that runs the module's own code when it is on the stack: a helper's local `state`
    and the loop's global `state` are two variables, and each must be looked up in its own scope."""
    module_frame = {}
    for index, frame in enumerate(frames):
        if frame.f_globals is frame.f_locals:
            module_frame.setdefault(id(frame.f_globals), index)
    for index, frame in enumerate(frames):
        scopes = [frame.f_locals]
        if frame.f_globals is not frame.f_locals and module_frame.get(id(frame.f_globals), index) <= index:
            scopes.append(frame.f_globals)
        for scope in scopes:
            for name, value in list(scope.items()):
                yield index, name, value


def _collect(found, seen, visited, free, pending, frame_index, base, steps, value, owner, depth) -> None:
    """Bind `value` if it is a tensor, else queue what it holds, one level deeper (the user's
    objects and models it holds none, while `free` lasts)."""
    if isinstance(value, torch.Tensor):
        if id(value) not in seen:
            seen.add(id(value))
            found.append(Binding(frame_index, base, steps, value, owner))
        return
    if depth >= MAX_DEPTH or id(value) in visited:
        return
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return
    visited.add(id(value))

    def queue(step, item, holder, deeper=1):
        pending.append((frame_index, base, steps + (step,), item, holder, depth + deeper))

    if isinstance(value, torch.nn.Module):
        for attr, item in _module_members(value):
            queue(("attr", attr), item, value)
        # A submodule costs no depth: a model's state lies as deep as its tree of modules goes
        # (`model.layers[0].attention.cache_k`), and the tree is finite (each module is visited once).
        indexed = isinstance(value, (torch.nn.ModuleList, torch.nn.Sequential))
        for attr, item in value._modules.items():
            if item is not None:
                queue(("item", int(attr)) if indexed and attr.isdigit() else ("attr", attr), item, value, 0)
    elif isinstance(value, (list, tuple)):
        indices = range(len(value))
        if len(value) > MAX_ITEMS:
            half = MAX_ITEMS // 2
            indices = list(range(half)) + list(range(len(value) - half, len(value)))
        for i in indices:
            queue(("item", i), value[i], owner, 1 - _free(value[i], visited, free))
    elif isinstance(value, dict):
        # islice, not list(): a 10^7-entry vocabulary would cost a second to copy
        for key, item in list(itertools.islice(value.items(), MAX_ITEMS)):
            if isinstance(key, (str, int)):
                queue(("item", key), item, owner, 1 - _free(item, visited, free))
    elif is_user_object(value):
        for attr, item in list(vars(value).items()):
            if not attr.startswith("__"):
                queue(("attr", attr), item, value, 1 - _free(item, visited, free))


def _free(item, visited: set[int], free: list[int]) -> bool:
    """Whether `item` costs no depth: one of the user's objects (or a model), as a submodule
    costs none. A reporter's summary of summaries (`log_report._summary._summaries['loss']._x`)
    and a metric loss filed per model (`engine.ml_losses[0]['model'].center_loss`) lie as deep as
    the user's classes nest. `free` counts down how many more may."""
    if free[0] <= 0 or id(item) in visited or not (isinstance(item, torch.nn.Module) or is_user_object(item)):
        return False
    free[0] -= 1
    return True


def _module_members(module: torch.nn.Module):
    for attr, item in vars(module).items():
        if attr in ("_parameters", "_modules", "_buffers") or attr.startswith("__"):
            continue
        # torch's own private state (hooks' flags, a compiled call) is skipped; the user's
        # objects kept under a private name are not (torch-pme's `self._MI = MeshInterpolator(...)`).
        if attr.startswith("_") and not isinstance(item, (torch.Tensor, list, dict, tuple)) \
                and not is_user_object(item):
            continue
        yield attr, item
    yield from module._buffers.items()


def is_argument(frame, name: str) -> bool:
    """Whether `name` is a parameter of the function `frame` runs."""
    code = frame.f_code
    return name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def stored_attribute(obj, name: str, missing=None):
    """`obj.name` as stored, read without running a property or `__getattr__` of the user's: its
    `__dict__`, or a module's submodules, parameters and buffers; `missing` where it is neither."""
    held = getattr(obj, "__dict__", {})
    if name in held:
        return held[name]
    if isinstance(obj, torch.nn.Module):
        for store in (obj._modules, obj._parameters, obj._buffers):
            if name in store:
                return store[name]
    return missing


def is_user_object(value) -> bool:
    module = type(value).__module__ or ""
    if not hasattr(value, "__dict__") or module.startswith(("torch", "builtins", "numpy")):
        return False
    source = getattr(sys.modules.get(module), "__file__", None) or ""
    return module == "__main__" or (source and "site-packages" not in source)


def module_bindings(frames) -> list[tuple[str, torch.nn.Module, int]]:
    """(expression, module, frame_index) for every nn.Module bound in the frames, directly or
    through the user's objects and lists, shallow first (`self.VAE`, `models[1]`,
    `self.agents[0].target_actor`)."""
    modules, seen, visited, free = [], set(), set(), [MAX_FREE_OBJECTS]
    by_frame: dict[int, list] = {}
    for index, name, value in variables(frames):
        by_frame.setdefault(index, []).append((name, value, 0))
    for index in sorted(by_frame):
        pending = collections.deque(by_frame[index])
        while pending:
            expression, value, depth = pending.popleft()
            if isinstance(value, torch.nn.Module):
                if id(value) not in seen:
                    seen.add(id(value))
                    modules.append((expression, value, index))
                continue
            if depth >= MAX_DEPTH or id(value) in visited or _skippable(expression, value):
                continue
            if isinstance(value, (list, tuple)) and len(value) <= MAX_ITEMS:
                held = [(f"{expression}[{i}]", item) for i, item in enumerate(value)]
            elif isinstance(value, dict):
                held = [(f"{expression}[{key!r}]", item) for key, item in itertools.islice(value.items(), MAX_ITEMS)
                        if isinstance(key, (str, int))]
            elif is_user_object(value):
                held = [(f"{expression}.{attr}", item) for attr, item in list(vars(value).items())
                        if not attr.startswith("_")]
            else:
                continue
            visited.add(id(value))
            pending.extend((name, item, depth + 1 - _free(item, visited, free)) for name, item in held)
    return modules


def parameter_name(module_expression: str, dotted: str) -> str:
    """`critic` + `2.weight` -> `critic[2].weight`."""
    text = module_expression
    for part in dotted.split("."):
        text += f"[{part}]" if part.isdigit() else f".{part}"
    return text
