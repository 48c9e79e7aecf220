"""Read the function's own value instead of a tensor made the same way elsewhere."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading import source as src
from .edits import replace


def _position(stmt: ast.stmt, name: str) -> tuple[int, int] | None:
    """(position, count) of `name` among the statement's unpacked targets, or (0, 1) for a plain
    `name = ...` (a name or an attribute: `self.pred_fake = ...`)."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target = stmt.targets[0]
    if isinstance(target, ast.Tuple):
        names = [src.canonical(e) for e in target.elts]
        return (names.index(name), len(names)) if name in names else None
    return (0, 1) if src.canonical(target) == name else None


def _name_at(stmt: ast.Assign, position: tuple[int, int]) -> str | None:
    """The plain name `stmt` assigns at `position` (`_position`'s (index, count)), where its
    targets have that shape: `encoder_outputs` of `encoder_outputs, _ = encoder(...)`."""
    target = stmt.targets[0]
    elements = target.elts if isinstance(target, ast.Tuple) else [target]
    if len(elements) != position[1] or not isinstance(elements[position[0]], ast.Name):
        return None
    return elements[position[0]].id


def _arguments(call: ast.Call) -> list[str]:
    """The call's arguments as written, `.detach()` left out (`fake_AB.detach()` is `fake_AB`)."""
    def text(node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach" \
                and not node.args:
            return text(node.func.value)
        return src.canonical(node)
    return [text(a) for a in call.args] + [f"{k.arg}={text(k.value)}" for k in call.keywords]


def read_own_value(source: src.Source, function: ast.AST, made: ast.stmt, name: str) -> Fix | None:
    """`output_from_encoder, _ = encoder(en_sen, ...)` at module level, read by `train()`, which
    makes `encoder_outputs, _ = encoder(sentences, ...)` itself; `self.pred_fake =
    self.netD(fake_AB.detach())` kept by the discriminator's step, read by the generator's, which
    scores `pred_fake = self.netD(fake_AB)` itself: read the function's own value. The kept one
    holds the graph of an earlier forward, which an earlier backward freed. Safe when the two
    calls read the same arguments (but for a `.detach()`); else this step trains on other inputs."""
    position = _position(made, name)
    if position is None or not isinstance(made.value, ast.Call) or not isinstance(function, ast.FunctionDef):
        return None
    callee = src.canonical(made.value.func)
    reads = [n for n in ast.walk(function) if isinstance(n, (ast.Name, ast.Attribute))
             and isinstance(n.ctx, ast.Load) and src.canonical(n) == name]
    if not reads or any(isinstance(n, (ast.Name, ast.Attribute)) and not isinstance(n.ctx, ast.Load)
                        and src.canonical(n) == name for n in ast.walk(function)):
        return None
    for stmt in src.own_nodes(function):
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and stmt is not made
                and src.canonical(stmt.value.func) == callee and stmt.lineno < min(r.lineno for r in reads)):
            continue
        local = _name_at(stmt, position)
        if local is None:
            continue
        same = _arguments(stmt.value) == _arguments(made.value)
        return Fix(f"Read `{local}`, made by this function's own `{callee}(...)` (line {stmt.lineno}), instead "
                   f"of `{name}`: that one keeps the graph of an earlier forward, which an earlier backward "
                   f"freed" + ("" if same else " (from other inputs: changes what this step trains on)"),
                   tuple(replace(source, r, local) for r in reads), "safe" if same else "unsafe")
    return None


def read_unused_value(source: src.Source, scope: ast.AST, made: ast.stmt, name: str, failing: ast.stmt) -> Fix | None:
    """`gen_imgs = generator(z)`, made for the generator's step and never read, while that step
    scores `fake_imgs`, the discriminator's sample, whose graph the discriminator's backward
    freed (PyTorch-GAN's WGAN, fixed by reading `gen_imgs`): the value made the same way after
    the stale one, and read by nothing, is the one meant. Its reads of `name` between the two
    become reads of it. Safe when both calls read the same arguments (but for a `.detach()`)."""
    position = _position(made, name)
    if position is None or not isinstance(made.value, ast.Call):
        return None
    callee = src.canonical(made.value.func)
    for stmt in sorted((n for n in src.own_nodes(scope) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if not (made.lineno < stmt.lineno < failing.lineno and isinstance(stmt.value, ast.Call)
                and src.canonical(stmt.value.func) == callee):
            continue
        local = _name_at(stmt, position)
        if local is None or local == name or src.reads(scope, local):
            continue
        reads = [r for r in src.reads(scope, name) if stmt.end_lineno < r.lineno <= failing.end_lineno]
        if not reads:
            return None
        same = _arguments(stmt.value) == _arguments(made.value)
        return Fix(f"Read `{local}` instead of `{name}`: `{local}` is made by `{callee}(...)` (line {stmt.lineno}) "
                   f"for this step and read by nothing, while `{name}` keeps the graph an earlier backward freed"
                   + ("" if same else " (from other inputs: changes what this step trains on)"),
                   tuple(replace(source, r, local) for r in reads), "safe" if same else "unsafe")
    return None
