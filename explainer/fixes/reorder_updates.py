"""Fixes that reorder whole updates (`opt.zero_grad()`, `loss.backward()`, `opt.step()`): the
edits of a run of statements cut and put back elsewhere, and the update moved after the next
one so both gradients are taken at the weights the graph was built with."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading.source import Source
from . import graph_options
from .edits import apply_edits, insert_lines_after, insert_lines_before


def move_lines(source: Source, moved: list[ast.stmt], anchor: ast.stmt, after: bool = False,
               text: str | None = None) -> tuple[Edit, Edit]:
    """Cut the lines of `moved`, a run of statements of one block, and put them back as they are
    (from `text`, where they were edited first) before `anchor`, or after it: the edits of every
    reordering that moves a whole update."""
    first, final = moved[0].lineno, moved[-1].end_lineno
    lines = (source.text if text is None else text).splitlines()[first - 1:final]
    insert = insert_lines_after if after else insert_lines_before
    return Edit(source.filename, "", Location(first, 1), Location(final + 1, 1)), insert(source, anchor, lines, indent="")


def update_after(source: Source, moved: list[ast.stmt], end: ast.stmt, failing: ast.Call, stepped: ast.expr,
                 moved_backward: ast.Call, keep_to_own: bool) -> Fix | None:
    """`stepped`'s update (`moved`, its `zero_grad()` to its `step()`) goes after `end`, the step
    of the update the failing backward belongs to, and that backward keeps the graph for it
    (`retain_graph=True`). With `keep_to_own`, the moved backward also reaches weights the other
    update has stepped by then: `inputs=` keeps it to `stepped`'s own parameters. None where the
    moved backward already names its inputs."""
    text = source.text
    if keep_to_own:
        if any(k.arg == "inputs" for k in moved_backward.keywords):
            return None
        own = f"[p for group in {source.segment(stepped)}.param_groups for p in group['params']]"
        text = apply_edits(text, [graph_options.insert_keyword(source, moved_backward, f"inputs={own}")])
    retain = graph_options.add_retain_graph(source, failing, "")
    edits = (*move_lines(source, moved, end, after=True, text=text), *(retain.edits if retain is not None else ()))
    first, final = moved[0].lineno, moved[-1].end_lineno
    following = f"`{source.segment(end)}` (line {end.lineno})"
    return Fix(f"Move the update of `{source.segment(stepped)}` (lines {first}-{final}) after {following}, and keep "
               f"this backward's graph for it with `retain_graph=True`: both backward calls then go through the "
               f"weights the graph was built with, and each optimizer steps with the gradients of its own loss "
               f"(the moved `zero_grad()` clears what this backward left in its parameters)", edits, "safe")
