"""Update module state without recording autograd history."""
from __future__ import annotations

import ast

from ..model import Edit, Fix
from ..reading.source import Source, assignments, canonical, enclosing_function, parent, targets_of
from .edits import imports_torch, node_end, node_start, replace, statement_text


def update_under_no_grad(source: Source, stmt: ast.stmt, attribute: str) -> Fix | None:
    if not isinstance(stmt, (ast.Assign, ast.AugAssign)) or stmt.lineno != stmt.end_lineno:
        return None
    if any(canonical(target) != canonical(attribute) for target in targets_of(stmt)):
        return None  # `out, self.hidden = self.gru(...)`: no_grad would cut `out` from the loss too
    if isinstance(stmt.value, (ast.Name, ast.Attribute, ast.Subscript)):
        return None  # storing an existing tensor under no_grad keeps its history
    indent = source.indent_of(stmt.lineno)
    if imports_torch(source):
        content = f"with torch.no_grad():\n{indent}    {source.segment(stmt)}"
        return Fix(f"Update `{attribute}` under `torch.no_grad()`: it is running state, not "
                   f"something to back-propagate through", (replace(source, stmt, content),))
    value = stmt.value
    return Fix(f"Store `{attribute}` detached: it is running state, not something to "
               f"back-propagate through", (replace(source, value, f"({source.segment(value)}).detach()"),))


def update_every_branch_under_no_grad(source: Source, stmt: ast.stmt, attribute: str) -> Fix | None:
    """`update_under_no_grad` for `stmt` and every other statement of its method that computes
    `attribute` anew (`if self.memory is not None: ... else: self.memory = k.T @ v`): one branch
    left recording would carry the history on."""
    first = update_under_no_grad(source, stmt, attribute)
    method = enclosing_function(stmt)
    if first is None or method is None:
        return first
    edits = list(first.edits)
    for other in assignments(method, attribute, deep=True):
        value = getattr(other.stmt, "value", None)
        if other.stmt is stmt or value is None or isinstance(value, (ast.Constant, ast.Name)):
            continue
        more = update_under_no_grad(source, other.stmt, attribute)
        if more is None:
            return None
        edits.extend(more.edits)
    return Fix(first.message, tuple(edits), first.applicability)


def write_in_place_under_no_grad(source: Source, writes: list[ast.stmt], names: list[str]) -> Fix | None:
    """nflows' `self.running_mean.mul_(1 - m).add_(mean * m)`, each in-place write of running
    state run under `torch.no_grad()`, as torch's own batch norm updates its statistics:
    whatever the arguments are (a float, a tensor with a graph), the state gets their values and
    no history. Writes on consecutive lines of one block share one `with`."""
    if not imports_torch(source) or not writes:
        return None
    writes = sorted({id(w): w for w in writes}.values(), key=lambda w: w.lineno)
    groups: list[list[ast.stmt]] = []
    for write in writes:
        if groups and parent(write) is parent(groups[-1][-1]) and write.lineno == groups[-1][-1].end_lineno + 1:
            groups[-1].append(write)
        else:
            groups.append([write])
    edits = []
    for group in groups:
        indent = source.indent_of(group[0].lineno)
        body = "".join(f"\n{indent}    {line}" for write in group for line in statement_text(source, write))
        edits.append(Edit(source.filename, f"with torch.no_grad():{body}", node_start(source, group[0]),
                          node_end(source, group[-1])))
    written = " and ".join(f"`{name}`" for name in dict.fromkeys(names))
    return Fix(f"Write {written} in place under `torch.no_grad()`: running state, not something to "
               f"back-propagate through", tuple(edits))
