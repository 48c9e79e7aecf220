"""Make an in-place change out of place, so the graph keeps the value it saved."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading import source as src
from ..reading.source import Source
from .edits import imports_torch, insert_lines_before, node_end, replace, statement_text

# In-place methods without an out-of-place twin of the same name: those get the clone.
_NO_TWIN = {"copy_", "zero_", "fill_", "fill_diagonal_", "set_", "resize_", "resize_as_", "normal_",
            "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_"}
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
              ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_WHY = "the graph keeps the value it saved, and the new one is a new tensor"


def _rewritten(source: Source, stmt: ast.stmt, name: str) -> str | None:
    """The statement written out of place (`h = h + 1`, `h = h.clamp(0, 1)`), if it has a form."""
    if isinstance(stmt, ast.AugAssign) and type(stmt.op) in _OPERATORS:
        value = source.segment(stmt.value)
        if not isinstance(stmt.value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)):
            value = f"({value})"
        return f"{name} = {name} {_OPERATORS[type(stmt.op)]} {value}"
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") \
            and not call.func.attr.endswith("__") and call.func.attr not in _NO_TWIN:
        arguments = source.segment(call)[len(source.segment(call.func)):]
        return f"{name} = {source.segment(call.func.value)}.{call.func.attr[:-1]}{arguments}"
    return None


def has_twin(method: str) -> bool:
    """Whether the in-place method (`clamp_`) has an out-of-place twin (`clamp`)."""
    return method not in _NO_TWIN


def calls_out_of_place(source: Source, stmt: ast.stmt) -> Fix | None:
    """`angles = angles.div_(norm(angles).add_(1e-16))` -> `angles.div(norm(angles).add(1e-16))`:
    each in-place call whose result the statement uses is called out of place, since the graph
    may have saved what any of them wrote into (torchaudio's Griffin-Lim, PR 730). None where one
    has no out-of-place twin, or where none is found."""
    calls = [node for node in ast.walk(stmt) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr.endswith("_") and not node.func.attr.endswith("__")]
    if not calls or any(call.func.attr in _NO_TWIN for call in calls):
        return None
    edits = []
    for call in sorted(calls, key=lambda c: (c.func.end_lineno, c.func.end_col_offset)):
        end = node_end(source, call.func)
        edits.append(Edit(source.filename, call.func.attr[:-1], Location(end.row, end.column - len(call.func.attr)), end))
    names = ", ".join(f"`{call.func.attr}`" for call in sorted(calls, key=lambda c: c.func.end_col_offset))
    return Fix(f"Call {names} out of place (without the trailing `_`) in line {stmt.lineno}: each writes into "
               f"a tensor an earlier operation may have saved for the backward, and the statement uses "
               f"what it returns", tuple(edits))


def out_of_place(source: Source, stmt: ast.stmt, name: str) -> Fix | None:
    """`h += 1` -> `h = h + 1`; `h.clamp_(0, 1)` -> `h = h.clamp(0, 1)`; anything else that
    writes into `h` (`h[mask] = 0`) gets `h = h.clone()` first."""
    text = _rewritten(source, stmt, name)
    if text is not None:
        return Fix(f"Write `{text}` instead of changing `{name}` in place: {_WHY}", (replace(source, stmt, text),))
    return Fix(f"Copy `{name}` before changing it in place (`{name} = {name}.clone()`): {_WHY}",
               (insert_lines_before(source, stmt, [f"{name} = {name}.clone()"]),))


def copy_where_read(source: Source, stmts: list[ast.stmt], name: str) -> Fix | None:
    """`torch.einsum(..., [q, self.queue])` -> `[q, self.queue.clone()]`: the graph saves a copy,
    and the state may then be written into in place as before (MoCo's queue). In each of `stmts`:
    every statement through which the graph may get the state (both returns of Quaterion's
    `XbmBuffer.get`)."""
    reads = [node for stmt in stmts for node in ast.walk(stmt) if isinstance(node, (ast.Name, ast.Attribute))
             and isinstance(node.ctx, ast.Load) and source.segment(node) == name]
    if not reads:
        return None
    # A slice is copied, not the whole state it is cut from (`self._embeddings[: self._pointer]`).
    copied = [parent if isinstance(parent := src.parent(node), ast.Subscript) and parent.value is node else node
              for node in reads]
    return Fix(f"Give the graph a copy of `{name}` where it reads it (`{name}.clone()`): the state "
               f"is then written into in place as before, and the graph keeps the value it saved",
               tuple(replace(source, node, f"{source.segment(node)}.clone()") for node in copied))


def replace_state(source: Source, stmt: ast.stmt, name: str) -> Fix | None:
    """State kept across steps (`self.bank[idx] = feats` in forward) and written into in place
    after the graph saved it: give it a new tensor, without history, under no_grad."""
    if not imports_torch(source):
        return out_of_place(source, stmt, name)
    text = _rewritten(source, stmt, name)
    body = [text] if text is not None else [f"{name} = {name}.clone()", *statement_text(source, stmt)]
    indent = source.indent_of(stmt.lineno)
    block = "with torch.no_grad():\n" + "\n".join(f"{indent}    {line}" for line in body)
    return Fix(f"Give `{name}` a new tensor under `torch.no_grad()` instead of writing into the one "
               f"the graph saved: the graph keeps the value it saved, and the state carries no "
               f"history into the next step", (replace(source, stmt, block),))


def copy_module_input(source: Source, call: ast.Call, module: str, saved: str) -> Fix:
    """`self.dropout(self.activation(h))` -> `self.dropout(self.activation(h).clone())`: a module
    made to write in place after it was built (MVANet sets `m.inplace = True` on every dropout of
    the model) overwrites a copy, and what `saved` saved for the backward stays as it was. The
    same values and gradients, so safe; the maintainer's fix."""
    argument = call.args[0]
    text = source.segment(argument)
    simple = isinstance(argument, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    return Fix(f"Give `{module}` a copy of its input (`.clone()`): it writes in place (its `inplace` was set "
               f"after it was built) and overwrites what {saved} saved for the backward",
               (replace(source, argument, f"{text}.clone()" if simple else f"({text}).clone()"),))

