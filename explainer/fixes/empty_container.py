"""Empty a container of tensors once a backward has consumed them."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, canonical
from .edits import insert_lines_after, insert_lines_before


def empty_after_backward(source: Source, backward: ast.stmt, container: str) -> Fix:
    """`torch.stack(log_probs).sum().backward()` -> the same, then `log_probs.clear()`: the
    next update starts from the tensors of its own steps, whose graphs are still there."""
    return Fix(f"Empty `{container}` after the backward that consumed it, so the next backward "
               f"sees only the tensors stored since, whose graphs are still there", (insert_lines_after(source, backward, [f"{container}.clear()"]),))


def empty_after_each_call(source: Source, function: ast.FunctionDef, containers: list[str]) -> Fix | None:
    """`policy.saved_log_probs.clear()` (and the episode's other lists) at the end of the function
    that back-propagates through them, as pytorch/examples' reinforce.py ends `finish_episode`
    with `del policy.saved_log_probs[:]`: each call then sees only what was stored since the last.
    None when the function's last statement returns something read from them."""
    last = function.body[-1]
    lines = [f"{container}.clear()" for container in containers]
    if isinstance(last, ast.Return):
        if last.value is not None and any(
                canonical(n) in containers for n in ast.walk(last.value) if isinstance(n, (ast.Attribute, ast.Name))):
            return None
        edit = insert_lines_before(source, last, lines)
    else:
        edit = insert_lines_after(source, last, lines)
    names = ", ".join(f"`{c}`" for c in containers)
    return Fix(f"Empty {names} at the end of `{function.name}`, after the backward that went through them, "
               f"so its next call back-propagates only what was stored since", (edit,))
