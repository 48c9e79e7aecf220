"""Whether a fix can run at all: the edited file still parses, and every name the edit reads is
bound where it is read. A fix that fails either is never offered: applied, it would crash
before it trained anything (`x = x.detach()` before `x` exists, an expression moved to where
its names are not defined, a method left without a body)."""
from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Iterator

from ..model import Fix
from ..reading import source as src
from .edits import apply_edits

_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__builtins__", "__spec__",
                                        "__loader__", "__package__", "__annotations__", "__path__"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# The nodes that can bind a name (`_bindings`); most nodes are none of them.
_BINDERS = (ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global,
            ast.Nonlocal, ast.ExceptHandler, ast.arg, ast.MatchAs, ast.MatchStar)


def runs(fix: Fix) -> bool:
    """True when every file the fix edits still parses after it, and the fix leaves no name
    read before it is bound that the file did not already read so."""
    by_file: dict[str, list] = {}
    for edit in fix.edits:
        by_file.setdefault(edit.filename, []).append(edit)
    for filename, edits in by_file.items():
        source = src.load(filename)
        if source is None:
            return False
        try:
            after = src.parse(filename, apply_edits(source.text, edits))
        except (SyntaxError, ValueError):
            return False
        try:
            within = _functions_edited(source.tree, edits)
            if within is not None and not within <= {_path(f) for f in src.nodes_of(after.tree, _FUNCTIONS[:2])}:
                within = None  # an edited function is gone: every read is looked at
            if within is None:
                before = src.cached(source.tree, "unbound_reads", lambda: unbound_reads(source.tree))
            else:
                before = unbound_reads(source.tree, within)
            if unbound_reads(after.tree, within) - before:
                return False
        finally:
            src.dispose(after.tree)
    return True


def _functions_edited(tree: ast.Module, edits) -> frozenset[str] | None:
    """The paths (`_path`) of the innermost functions that hold every edit, whose reads are all
    an edit inside a function can change (its own, and those of the functions it defines); None
    where an edit reaches the module's own statements, which every function may read."""
    functions = src.nodes_of(tree, _FUNCTIONS[:2])
    paths = set()
    for edit in edits:
        first, last = edit.location.row, max(edit.location.row, edit.end_location.row - (edit.end_location.column == 1))
        around = [f for f in functions if f.body and f.body[0].lineno <= first and last <= f.end_lineno]
        if not around:
            return None
        paths.add(_path(max(around, key=lambda f: f.lineno)))
    return frozenset(paths)


def unbound_reads(tree: ast.Module, within: frozenset[str] | None = None) -> set[tuple[str, str]]:
    """(scope, name) for each name read where no binding can reach it: not bound earlier in its
    own function (or module body), not a parameter, not bound in an enclosing function or at
    module level, not a builtin. Loose where Python is dynamic (`global`, star imports, `del`):
    it only has to tell a fix's new reads from the file's own. With `within`, only in the
    functions of those paths and the functions they define."""
    # Each scope's own nodes are walked once: the bindings, the reads and the functions it
    # defines all come from that one list (three walks of it were most of a fix check's time).
    walked: dict[int, list[ast.AST]] = {}
    known: dict[int, dict[str, list[int]]] = {}

    def nodes(scope: ast.AST) -> list[ast.AST]:
        if id(scope) not in walked:
            walked[id(scope)] = list(_own_walk(scope))
        return walked[id(scope)]

    def bindings(scope: ast.AST) -> dict[str, list[int]]:
        if id(scope) not in known:
            known[id(scope)] = _bindings(scope, nodes(scope))
        return known[id(scope)]

    module = bindings(tree)
    if "*" in module:
        return set()
    found: set[tuple[str, str]] = set()
    if within is None:
        scopes = _scopes(tree, nodes)
    else:
        starts = [f for f in src.nodes_of(tree, _FUNCTIONS[:2]) if _path(f) in within]
        scopes = (s for f in starts
                  for s in _scopes(f, nodes, [a for a in src.ancestors(f) if isinstance(a, _FUNCTIONS)][::-1], _path(f)))
    for scope, enclosing, path in scopes:
        own = bindings(scope)
        visible = set(module).union(*(bindings(outer) for outer in enclosing))
        for node in nodes(scope):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in _BUILTINS:
                rows = own.get(node.id)
                if rows is not None and min(rows) < node.lineno:
                    continue
                if scope is not tree and node.id in visible:
                    continue
                found.add((path, node.id))
    return found


def _scopes(top: ast.AST, nodes: Callable[[ast.AST], list[ast.AST]], around: list[ast.AST] | None = None,
            path: str = "") -> Iterator[tuple[ast.AST, list[ast.AST], str]]:
    """`top` (the module, or a function with the functions `around` it) and every function in it,
    with the functions around each and a path naming it (`_path`); `nodes` gives a scope's own
    nodes (`_own_walk`)."""
    stack = [(top, list(around or []), path)]
    while stack:
        scope, enclosing, path = stack.pop()
        yield scope, enclosing, path
        for node in nodes(scope):
            if isinstance(node, _FUNCTIONS) and node is not scope:
                outer = enclosing + ([scope] if not isinstance(scope, ast.Module) else [])
                stack.append((node, outer, f"{path}.{_name(node)}"))


def _path(function: ast.AST) -> str:
    """`.train.step` for `step` defined in `train`: the names of the functions around it and its
    own, without rows, so that a function keeps its path when an edit above it moves it."""
    names = [_name(a) for a in src.ancestors(function) if isinstance(a, _FUNCTIONS)][::-1]
    return "".join(f".{name}" for name in [*names, _name(function)])


def _name(function: ast.AST) -> str:
    return getattr(function, "name", "<lambda>")


def _own_walk(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`, not descending into the functions it defines (their defaults and
    decorators are the scope's own). Class bodies count as the scope's."""
    pending = list(ast.iter_child_nodes(scope)) if not isinstance(scope, ast.Lambda) else [scope.body]
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        pending = list(scope.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, _FUNCTIONS):
            pending.extend(node.args.defaults + [d for d in node.args.kw_defaults if d is not None])
            pending.extend(getattr(node, "decorator_list", []))
            continue
        pending.extend(ast.iter_child_nodes(node))


def _bindings(scope: ast.AST, own: list[ast.AST]) -> dict[str, list[int]]:
    """Each name bound in `scope` (its own body, comprehensions included), with the rows; `own`
    is the scope's own nodes (`_own_walk`)."""
    bound: dict[str, list[int]] = {}

    def add(name: str, row: int) -> None:
        bound.setdefault(name, []).append(row)

    if isinstance(scope, _FUNCTIONS):
        arguments = scope.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                    *filter(None, [arguments.vararg, arguments.kwarg])]:
            add(arg.arg, 0)
    for node in own:
        if not isinstance(node, _BINDERS):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            add(node.id, _row_of_binding(node))
        elif isinstance(node, (*_FUNCTIONS[:2], ast.ClassDef)) and node is not scope:
            add(node.name, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                add("*" if alias.name == "*" else (alias.asname or alias.name.split(".")[0]), node.lineno)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                add(name, 0)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            add(node.name, node.lineno)
        elif isinstance(node, ast.arg) and not isinstance(scope, _FUNCTIONS):
            add(node.arg, node.lineno)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            add(node.name, node.lineno)
    return bound


def _row_of_binding(name: ast.Name) -> int:
    """The row from which a stored name can be read: a comprehension's target from the
    comprehension's own first row (its element comes first in the text); a loop's target from
    the loop's row; an assignment's from the row after its value (`x = x.detach()` reads the old
    `x`)."""
    for ancestor in src.ancestors(name):
        if isinstance(ancestor, ast.comprehension):
            return src.parent(ancestor).lineno - 1
        if isinstance(ancestor, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
            return ancestor.lineno
        if isinstance(ancestor, ast.NamedExpr):
            return ancestor.lineno
        if isinstance(ancestor, ast.stmt):
            return ancestor.end_lineno
    return name.lineno
