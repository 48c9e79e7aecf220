"""Empty a container of tensors once a backward has consumed them."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source
from .edits import insert_lines_after


def empty_after_backward(source: Source, backward: ast.stmt, container: str) -> Fix:
    """`torch.stack(log_probs).sum().backward()` -> the same, then `log_probs.clear()`: the
    next update starts from the tensors of its own steps, whose graphs are still there."""
    return Fix(f"Empty `{container}` after the backward that consumed it, so the next backward "
               f"sees only the tensors stored since, whose graphs are still there", (insert_lines_after(source, backward, [f"{container}.clear()"]),))
