"""Make an in-place change out of place, so the graph keeps the value it saved."""
from __future__ import annotations

import ast

from ..model import Fix
from ..source import Source
from .edits import insert_lines_before, replace

# In-place methods without an out-of-place twin of the same name: those get the clone.
_NO_TWIN = {"copy_", "zero_", "fill_", "fill_diagonal_", "set_", "resize_", "resize_as_", "normal_",
            "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_"}
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
              ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}


def out_of_place(source: Source, stmt: ast.stmt, name: str) -> Fix | None:
    """`h += 1` -> `h = h + 1`; `h.clamp_(0, 1)` -> `h = h.clamp(0, 1)`; anything else that
    writes into `h` (`h[mask] = 0`) gets `h = h.clone()` first."""
    why = "the graph keeps the value it saved, and the new one is a new tensor"
    if isinstance(stmt, ast.AugAssign) and type(stmt.op) in _OPERATORS:
        value = source.segment(stmt.value)
        if not isinstance(stmt.value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)):
            value = f"({value})"
        text = f"{name} = {name} {_OPERATORS[type(stmt.op)]} {value}"
        return Fix(f"Write `{text}` instead of changing `{name}` in place: {why}", (replace(source, stmt, text),))
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") \
            and not call.func.attr.endswith("__") and call.func.attr not in _NO_TWIN:
        method = call.func.attr[:-1]
        arguments = source.segment(call)[len(source.segment(call.func)):]
        text = f"{name} = {source.segment(call.func.value)}.{method}{arguments}"
        return Fix(f"Write `{text}` instead of changing `{name}` in place: {why}", (replace(source, stmt, text),))
    return Fix(f"Copy `{name}` before changing it in place (`{name} = {name}.clone()`): {why}",
               (insert_lines_before(source, stmt, [f"{name} = {name}.clone()"]),))
