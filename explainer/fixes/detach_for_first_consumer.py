"""Detach a shared tensor for the update that must not reach its producer (GAN discriminator)."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, own_nodes, reads
from .edits import replace

FIRST_UPDATE = ("Detach `{carrier}` for the first update: its loss must not back-propagate into "
                "the model that produced `{carrier}`, and the second update still needs that graph")

LATER_UPDATE = ("Detach `{carrier}` for the `{step}` update: that optimizer does not train the model "
                "that produced `{carrier}`, so this loss needs it only as a value")


def detach_before(source: Source, scope: ast.AST, carrier: str, after_row: int, before_row: int,
                  why: str = FIRST_UPDATE) -> Fix | None:
    """Detach each read of `carrier` in the statements between the two rows."""
    uses = []
    for stmt in own_nodes(scope):
        if isinstance(stmt, ast.stmt) and not isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)) \
                and after_row < stmt.lineno <= before_row:
            uses.extend(reads(stmt, carrier))
    if not uses:
        return None
    edits = tuple(replace(source, use, f"{source.segment(use)}.detach()") for use in uses)
    return Fix(why.format(carrier=carrier), edits)
