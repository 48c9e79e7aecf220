"""State filed in a dict of lists under a key a loop gives: `hidden_states[layer_name].append(hh)`
inside `for layer_name, layer in self.input_layers.items()`. The frames hold the value as
`hidden_states['input'][0]`; which of the file's appends under a variable key filed it is told
by the keys each append's loop runs over, read from the frame's own `self`."""
from __future__ import annotations

import ast

import torch

from ...reading import source as src
from ..naming import stored_attribute

_MISSING = object()


def appended_under_key(frame, source: src.Source, container: str, key) -> ast.Call | None:
    """The one `DICT[k].append(...)` in `source` whose loop gives `k` the value `key`, where
    `container` is `DICT[key]` as the frame reaches it; None when none or several do."""
    if not isinstance(key, (str, int)) or not container.endswith("]"):
        return None
    owner = frame.f_locals.get("self", _MISSING)
    found = []
    for node in ast.walk(source.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend", "insert") and isinstance(node.func.value, ast.Subscript)):
            continue
        filed = node.func.value
        if isinstance(filed.slice, ast.Constant) \
                or f"{src.canonical(filed.value)}[{key!r}]" != src.canonical(container):
            continue
        if key in _keys(node, filed.slice, owner):
            found.append(node)
    return found[0] if len(found) == 1 else None


def _keys(call: ast.Call, key: ast.expr, owner) -> list:
    """The values the loops around `call` give the expression `key` (`layer_name`, `layer.name`),
    with `self` read as `owner`; empty when they cannot be read without running user code."""
    root, attribute = (key, None) if isinstance(key, ast.Name) else (key.value, key.attr) \
        if isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name) else (None, None)
    if root is None:
        return []
    for loop in src.loops_around(call):
        if not isinstance(loop, ast.For):
            continue
        position = _bound_at(loop.target, root.id)
        if position is _MISSING:
            continue
        items = _items(loop.iter, owner)
        if position is not None:
            items = [item[position] if isinstance(item, tuple) and len(item) > position else _MISSING
                     for item in items]
        if attribute is not None:
            items = [stored_attribute(item, attribute, _MISSING) for item in items]
        return [item for item in items if item is not _MISSING]
    return []


def _bound_at(target: ast.expr, name: str):
    """None when the loop binds `name` whole, its position when it unpacks it from a tuple,
    _MISSING when it does not bind it."""
    if isinstance(target, ast.Name):
        return None if target.id == name else _MISSING
    if isinstance(target, ast.Tuple):
        for i, element in enumerate(target.elts):
            if isinstance(element, ast.Name) and element.id == name:
                return i
    return _MISSING


def _items(iterable: ast.expr, owner) -> list:
    """What `for ... in iterable` runs over, for `self.x`, `self.x.items()`, `.keys()`, `.values()`
    on a dict, a list or a container module; nothing else (a call could run user code)."""
    method = None
    if isinstance(iterable, ast.Call) and not iterable.args and isinstance(iterable.func, ast.Attribute) \
            and iterable.func.attr in ("items", "keys", "values"):
        method, iterable = iterable.func.attr, iterable.func.value
    value = _read(iterable, owner)
    if isinstance(value, torch.nn.ModuleDict):
        value = dict(value._modules)
    elif isinstance(value, (torch.nn.ModuleList, torch.nn.Sequential)):
        value = list(value._modules.values())
    if isinstance(value, dict):
        return list(getattr(value, method or "keys")())
    if isinstance(value, (list, tuple)) and method is None:
        return list(value)
    return []


def _read(expression: ast.expr, owner):
    if isinstance(expression, ast.Name):
        return owner if expression.id == "self" else _MISSING
    if isinstance(expression, ast.Attribute):
        base = _read(expression.value, owner)
        return _MISSING if base is _MISSING else stored_attribute(base, expression.attr, _MISSING)
    return _MISSING

