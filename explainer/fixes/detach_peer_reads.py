"""Detach the items a loop's loss reads from the other passes' models (mutual learning)."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, call_receiver, canonical, enclosing_block, own_nodes, parent, reads
from .edits import replace

_BLOCKS = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.Try)


def peer_items(loop: ast.AST, container: str, own_index: str, before_row: int) -> list[ast.Subscript]:
    """`outputs[j]` read in `loop` (up to `before_row`) under an index other than `own_index`,
    the one that picks this pass's optimizer, and not detached yet."""
    peers = []
    for stmt in own_nodes(loop):
        if not isinstance(stmt, ast.stmt) or isinstance(stmt, _BLOCKS) or stmt.lineno > before_row:
            continue
        for read in reads(stmt, container):
            item = parent(read)
            if isinstance(item, ast.Subscript) and item.value is read and isinstance(item.slice, ast.Name) \
                    and item.slice.id != own_index and not _detached(item):
                peers.append(item)
    return peers


def _detached(item: ast.Subscript) -> bool:
    above = parent(item)
    return isinstance(above, ast.Attribute) and above.attr in ("detach", "item", "data")


def detach_peer_items(source: Source, loop: ast.AST, container: str, own_index: str, before_row: int) -> Fix | None:
    """`outputs[j]` -> `outputs[j].detach()` for each peer item."""
    peers = peer_items(loop, container, own_index, before_row)
    if not peers:
        return None
    edits = tuple(replace(source, item, f"{source.segment(item)}.detach()") for item in peers)
    return Fix(f"Detach `{canonical(peers[0])}` where this pass's loss learns from it: "
               f"`{container}[{own_index}]` is the output this pass trains; the others come from "
               f"the other passes' models, and their own passes still need those graphs", edits)


def own_index(backward: ast.stmt, loop: ast.AST) -> str | None:
    """`i` in `self.optimizers[i].step()` after the backward statement, or else the loop's own
    variable: the index of the model this pass trains."""
    body = enclosing_block(backward)
    for stmt in body[next((i for i, s in enumerate(body) if s is backward), len(body)):]:
        receiver = call_receiver(stmt, "step")
        if isinstance(receiver, ast.Subscript) and isinstance(receiver.slice, ast.Name):
            return receiver.slice.id
    target = getattr(loop, "target", None)
    return target.id if isinstance(target, ast.Name) else None
