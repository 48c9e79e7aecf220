"""Empty a container of tensors once a backward has consumed them."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..source import Source


def empty_after_backward(source: Source, backward: ast.stmt, container: str) -> Fix:
    """`torch.stack(log_probs).sum().backward()` -> the same, then `log_probs.clear()`: the
    next update starts from the tensors of its own steps, whose graphs are still there."""
    row = backward.end_lineno + 1
    at = Location(row, 1)
    text = f"{source.indent_of(backward.lineno)}{container}.clear()\n"
    return Fix(f"Empty `{container}` after the backward that consumed it, so the next backward "
               f"sees only the tensors stored since, whose graphs are still there", (Edit(source.filename, text, at, at),))
