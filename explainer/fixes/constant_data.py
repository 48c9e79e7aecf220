"""A value made once that each backward needs only as a value: keep it without history."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source
from .edits import replace


def detach_data(source: Source, stmt: ast.stmt, name: str, leaves: str) -> Fix | None:
    """`Y = X @ true_W + b` -> `Y = (X @ true_W + b).detach()`: made once, used as a target."""
    return detach_value(source, stmt, f"Make `{name}` without history: it comes from {leaves}, which "
                                      f"no optimizer trains, so it is data, and every backward only "
                                      f"needs its value")


def detach_snapshot(source: Source, stmt: ast.stmt, name: str, model: str) -> Fix | None:
    """`old_log_probs = dist.log_prob(actions)` before PPO's update epochs -> `.detach()`: the loop
    calls the same model again, so this value is its output before the updates, a constant."""
    return detach_value(source, stmt, f"Keep `{name}` as a fixed snapshot, without history: the "
                                      f"loop calls `{model}` again, so `{name}` stands for its output "
                                      f"before the updates")


def detach_value(source: Source, stmt: ast.stmt, why: str) -> Fix | None:
    """`.detach()` on the value of `stmt`; None when that value is a tuple, list, dict or set
    (`self.a, self.b = a, b`), which has no `.detach()`."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or value is None \
            or isinstance(value, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return None
    text = source.segment(value)
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"
    return Fix(why, (replace(source, value, f"{text}.detach()"),))
