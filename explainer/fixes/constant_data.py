"""A value made once that each backward needs only as a value: keep it without history."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source, canonical
from .edits import insert_lines_after, replace

_PARAMETER = frozenset({"nn.Parameter", "torch.nn.Parameter", "Parameter", "nn.parameter.Parameter"})


def detach_data(source: Source, stmt: ast.stmt, name: str, leaves: str) -> Fix | None:
    """`Y = X @ true_W + b` -> `Y = (X @ true_W + b).detach()`: made once, used as a target."""
    return detach_value(source, stmt, f"Make `{name}` without history: it comes from {leaves}, which "
                                      f"no optimizer trains, so it is data, and every backward only "
                                      f"needs its value", name)


def detach_snapshot(source: Source, stmt: ast.stmt, name: str, model: str) -> Fix | None:
    """`old_log_probs = dist.log_prob(actions)` before PPO's update epochs -> `.detach()`: the loop
    calls the same model again, so this value is its output before the updates, a constant."""
    return detach_value(source, stmt, f"Keep `{name}` as a fixed snapshot, without history: the "
                                      f"loop calls `{model}` again, so `{name}` stands for its output "
                                      f"before the updates", name)


def detach_value(source: Source, stmt: ast.stmt, why: str, name: str | None = None) -> Fix | None:
    """`.detach()` on the value of `stmt`; None when that value is a tuple, list, dict or set
    (`self.a, self.b = a, b`), which has no `.detach()`. Where the statement unpacks what a call
    returns (`X_train_encoded, loss = autoencoder(X)`), `name`, one of its targets, is detached
    on the next line."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or value is None \
            or isinstance(value, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return None
    if any(isinstance(target, (ast.Tuple, ast.List)) for target in getattr(stmt, "targets", ())):
        unpacked = [element for target in stmt.targets if isinstance(target, (ast.Tuple, ast.List))
                    for element in target.elts]
        if name is None or canonical(name) not in {canonical(e) for e in unpacked} or len(stmt.targets) != 1:
            return None
        return Fix(why, (insert_lines_after(source, stmt, [f"{name} = {name}.detach()"]),))
    text = source.segment(value)
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"
    return Fix(why, (replace(source, value, f"{text}.detach()"),))


def parameter_outside(source: Source, stmt: ast.stmt, name: str) -> Fix | None:
    """MiniGP's `self.length_scale = torch.exp(nn.Parameter(torch.log(x)))`: the parameter made
    inside the expression belongs to no module, so no optimizer trains it, and the value keeps
    the graph built once. The whole value becomes the parameter, as MiniGP's maintainers did
    (`nn.Parameter(torch.exp(torch.log(x)))`): the user asked for a trained value. It trains
    what was never trained before: unsafe. None where the statement makes no such parameter."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, ast.Assign) or not isinstance(value, ast.Call):
        return None
    inner = [c for c in ast.walk(value) if c is not value and isinstance(c, ast.Call)
             and canonical(c.func) in _PARAMETER and len(c.args) == 1 and not c.keywords]
    if len(inner) != 1:
        return None
    callee, made = source.segment(inner[0].func), source.segment(inner[0])
    whole = source.segment(value).replace(made, source.segment(inner[0].args[0]), 1)
    return Fix(f"Make `{name}` itself the `{callee}`: the one made inside the expression belongs to no "
               f"module, so no optimizer trains it (the value then trains, which it never did)",
               (replace(source, value, f"{callee}({whole})"),), "unsafe")
