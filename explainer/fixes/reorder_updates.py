"""Fixes that reorder whole updates (`opt.zero_grad()`, `loss.backward()`, `opt.step()`): the
edits of a run of statements cut and put back elsewhere, and the update moved after the next
one so both gradients are taken at the weights the graph was built with."""
from __future__ import annotations

import ast
from dataclasses import replace

from ..model import Edit, Fix, Location
from ..reading.source import Source
from ..reading.training import update_receiver
from . import graph_options
from .edits import apply_edits, insert_lines_after, insert_lines_before


def move_lines(source: Source, moved: list[ast.stmt], anchor: ast.stmt, after: bool = False,
               text: str | None = None, lead: ast.stmt | None = None) -> tuple[Edit, Edit]:
    """Cut the lines of `moved`, a run of statements of one block, and put them back as they are
    (from `text`, where they were edited first) before `anchor`, or after it, with a copy of the
    statement `lead` first where one is given (Dreamer's `zero_grad()`, which stays where it
    is too): the edits of every reordering that moves a whole update."""
    first, final = moved[0].lineno, moved[-1].end_lineno
    lines = (source.text if text is None else text).splitlines()[first - 1:final]
    if lead is not None:
        lines.insert(0, lines[0][:len(lines[0]) - len(lines[0].lstrip())] + source.segment(lead))
    insert = insert_lines_after if after else insert_lines_before
    return Edit(source.filename, "", Location(first, 1), Location(final + 1, 1)), insert(source, anchor, lines, indent="")


def update_after(source: Source, moved: list[ast.stmt], end: ast.stmt, failing: ast.Call, stepped: ast.expr,
                 moved_backward: ast.Call, keep_to_own: bool, retain: bool = True,
                 anchor: ast.stmt | None = None) -> Fix | None:
    """`stepped`'s update (`moved`, its `zero_grad()` to its `step()`) goes after `end`, the step
    of the update the failing backward belongs to, and that backward keeps the graph for it
    (`retain_graph=True`). With `keep_to_own`, the moved backward also reaches weights the other
    update has stepped by then: `inputs=` keeps it to `stepped`'s own parameters. The moved
    backward's `retain_variables=True` (retain_graph's name before PyTorch 0.4, which today's
    backward rejects) goes: it is the last backward now. None where the moved backward already
    names its inputs, or where it is kept to an ensemble's optimizers stepped in a loop (one
    `inputs=` cannot name them). Without `retain`, the two backward calls go through graphs of
    their own (deocclusion's discriminator, given the generator's output detached): nothing is
    kept. The update goes after `anchor` where that is not `end` (the `if update_policy:` that
    holds the other update)."""
    text = source.text
    keywords = [graph_options.drop_keyword(source, moved_backward, "retain_variables")] \
        if any(k.arg == "retain_variables" for k in moved_backward.keywords) else []
    if keep_to_own:
        if any(k.arg == "inputs" for k in moved_backward.keywords) or isinstance(moved[-1], ast.For):
            return None
        own = graph_options.optimizers_inputs(source.segment(stepped))
        insert = graph_options.insert_keyword(source, moved_backward, own)
        if keywords and not moved_backward.args and len(moved_backward.keywords) == 1:
            insert = replace(insert, content=own)  # the only argument went: no separator
        keywords.append(insert)
    text = apply_edits(text, [e for e in keywords if e is not None])
    kept = graph_options.add_retain_graph(source, failing, "") if retain else None
    edits = (*move_lines(source, moved, anchor or end, after=True, text=text),
             *(kept.edits if kept is not None else ()))
    first, final = moved[0].lineno, moved[-1].end_lineno
    following = f"`{source.segment(end)}` (line {end.lineno})"
    other = update_receiver(end, "step")
    if not retain:
        return Fix(f"Update `{source.segment(stepped)}` after {f'`{other}`' if other else 'the next update'}: move "
                   f"its update (lines {first}-{final}) after {following}; the two backward calls go through graphs "
                   f"of their own, and each then takes its gradients at the weights its graph was built with",
                   edits, "safe")
    return Fix(f"Update `{source.segment(stepped)}` after {f'`{other}`' if other else 'the next update'}: move its "
               f"update (lines {first}-{final}) after {following}, and keep this backward's graph for it with "
               f"`retain_graph=True`; both backward calls then go through the weights the graph was built with, and "
               f"each optimizer steps with the gradients of its own loss (the moved `zero_grad()` clears what this "
               f"backward left in its parameters)", edits, "safe")
