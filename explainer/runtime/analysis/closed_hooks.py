"""Outputs kept by forward hooks that were removed (fastai's `SaveFeatures`, closed at the end of
one section of a notebook and read again in the next): the object still holds what the last
forward before the removal stored, whose graph a backward has freed, and no forward refills it."""
from __future__ import annotations

import ast

from torch.utils.hooks import RemovableHandle

from ...fixes import register_again
from ...model import Finding, Location
from ...reading import source as src
from ..records import BackwardCall
from .context import Context
from .evidence import culprit_at, finding, freed_graph
from .locate import Candidate, Located


def explain_closed_hooks(ctx: Context, candidate: Candidate, others: list[Candidate],
                         previous: BackwardCall) -> Finding | None:
    """The finding when the stale tensor is an attribute of an object whose hooks are all
    removed, reached through a name bound to the objects that made them (`sfs`, not the loop
    variable left over from `for sf in sfs: sf.close()`); else None."""
    owner = candidate.binding.owner
    if owner is None or not _hooks_removed(owner):
        return None
    for reached in (candidate, *others):
        steps = reached.binding.steps
        if reached.located != candidate.located or type(reached.binding.owner) is not type(owner) \
                or not steps or steps[-1][0] != "attr":
            continue
        frame = ctx.frames[reached.binding.frame_index]
        source, scope = ctx.frame_source(frame)
        name = reached.binding.base
        made = _made_by(source, scope, name, frame.f_lineno, type(owner).__name__) if source is not None else None
        if made is None:
            continue
        target = next((t for t in src.targets_of(made) if src.canonical(t) == name), None)
        if target is None:
            continue
        here = Located(source, scope, made, target, name, False)
        attribute = steps[-1][1]
        evidence = freed_graph(ctx, name, here, previous, "grows", attribute=attribute,
                               holder_class=type(owner).__name__)
        removal = _last_removal(scope, name, frame.f_lineno, _removers(type(owner)))
        fix = register_again.register_again(source, made, removal, name) if removal is not None else None
        return finding("BX005", "run-hooks-removed", "second-backward", evidence,
                       [culprit_at(name, source, Location(target.lineno, target.col_offset + 1))], [fix])
    return None


def _hooks_removed(owner: object) -> bool:
    """The object keeps hook handles (`self.hook = m.register_forward_hook(...)`), every one removed."""
    handles = [v for v in getattr(owner, "__dict__", {}).values() if isinstance(v, RemovableHandle)]
    return bool(handles) and all(_removed(h) for h in handles)


def _removed(handle: RemovableHandle) -> bool:
    hooks = handle.hooks_dict_ref()
    return hooks is None or handle.id not in hooks


def _made_by(source: src.Source, scope: ast.AST, name: str, row: int, made_by: str) -> ast.stmt | None:
    """The assignment that last bound `name` before `row` when it calls `made_by`
    (`sfs = [SaveFeatures(m) for m in ...]`)."""
    assignment = src.last_assignment(scope, name, row)
    if assignment is None or not src.calls_named(assignment.stmt, made_by):
        return None
    return assignment.stmt


def _removers(cls: type) -> set[str]:
    """The methods of `cls` (or a class it derives from) that remove a hook (`def close(self):
    self.hook.remove()`)."""
    return {name for klass in cls.__mro__[:-1] for name, function in vars(klass).items()
            if "remove" in getattr(getattr(function, "__code__", None), "co_names", ())}


def _last_removal(scope: ast.AST, name: str, row: int, removers: set[str]) -> ast.stmt | None:
    """The statement that removed the hooks last before `row` runs: the last one above it in the
    blocks around it (`for sf in sfs: sf.close()` ending the previous section), else one further
    down a loop around it (`saver.close()` ending each phase)."""
    current = src.innermost_statement(scope, row)
    if current is None:
        return None
    around = {id(a) for a in src.ancestors(current)} | {id(scope)}
    removals = [_removal_statement(call, name) for call in src.own_nodes(scope) if _calls_on(call, name, removers)]
    above = [s for s in removals if s.end_lineno < current.lineno and id(src.parent(s)) in around]
    if above:
        return max(above, key=lambda s: s.lineno)
    loops = {id(loop) for loop in src.loops_around(current)}
    return next((s for s in removals if s.lineno > current.end_lineno
                 and any(id(a) in loops for a in src.ancestors(s)) and id(src.parent(s)) in around | loops), None)


def _calls_on(node: ast.AST, name: str, methods: set[str]) -> bool:
    """`name.close()`, or `sf.close()` in a loop over `name`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods
            and isinstance(node.func.value, ast.Name)):
        return False
    return node.func.value.id == name or _loop_over(node, node.func.value.id, name) is not None


def _removal_statement(call: ast.Call, name: str) -> ast.stmt:
    """The statement to follow: the loop over `name` that calls it on each element, else the call's own."""
    return _loop_over(call, call.func.value.id, name) or src.statement_of(call)


def _loop_over(node: ast.AST, variable: str, name: str) -> ast.For | None:
    return next((loop for loop in src.loops_around(node)
                 if isinstance(loop, ast.For) and src.iterated_by(loop.target, loop.iter, variable) is not None
                 and src.canonical(loop.iter) == name), None)
