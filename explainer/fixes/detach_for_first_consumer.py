"""Detach a shared tensor for the update that must not reach its producer (GAN discriminator)."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, canonical, own_nodes, reads, targets_of
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


def detach_in_own_loss(source: Source, scope: ast.AST, carrier: str, after_row: int, failing: ast.stmt,
                       this: str, other: str, why: str) -> Fix | None:
    """Detach `carrier` where the statements that make the loss `this` alone read it, between
    `after_row` (where it was made) and `failing`: `loss_d = ... discriminator(fake)` becomes
    `discriminator(fake.detach())`, `loss_g`'s read stays. None where a statement that reads it
    also flows into `other`, the loss of the earlier backward."""
    statements = [stmt for stmt in own_nodes(scope) if isinstance(stmt, (ast.Assign, ast.AugAssign))
                  and after_row < stmt.lineno < failing.lineno]
    feeding = [stmt for stmt in statements if reads(stmt, carrier) and this in _flows_into(stmt, statements)]
    if not feeding or any(other in _flows_into(stmt, statements) for stmt in feeding):
        return None
    rows = [stmt.lineno for stmt in feeding]
    return detach_before(source, scope, carrier, min(rows) - 1, max(rows), why)


def _flows_into(stmt: ast.stmt, statements: list[ast.stmt]) -> set[str]:
    """The names `stmt` binds, and those bound after it from them, among `statements`."""
    made = {canonical(t) for t in targets_of(stmt)}
    for later in statements:
        if later.lineno > stmt.lineno and any(reads(later, m) for m in made):
            made |= {canonical(t) for t in targets_of(later)}
    return made
