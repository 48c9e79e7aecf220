"""Linking a parsed module for the readers: every node learns its parent and the scope that owns
it, the module lists all its nodes and each scope its own, in ast.walk's breadth-first order.

A module is linked one top-level statement at a time, and the statements' levels are then put
together: a statement an edit left alone keeps its links, so the language server re-links only
what changed (`reparse.Reparser`), and a module linked that way is the same as one linked whole.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
# Types whose nodes have line numbers: shifted when lines are inserted above them.
_POSITIONED = frozenset(t for t in vars(ast).values()
                        if isinstance(t, type) and issubclass(t, ast.AST) and "lineno" in t._attributes)


# Nodes the readers look for across the whole module, listed while linking (`Linked.indexed`).
INDEXED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
_INDEXED = frozenset(INDEXED)
# Positioned nodes without fields (contexts and operators have no position).
_FIELDLESS = frozenset({ast.Pass, ast.Break, ast.Continue})


@dataclass(eq=False)
class Linked:
    """One top-level statement, linked."""

    statement: ast.stmt
    # The statement's nodes depth by depth (the statement alone first), as ast.walk meets them.
    levels: list[list[ast.AST]]
    # Of those, the ones the module's scope owns (not inside a def, lambda or class).
    module_owned: list[list[ast.AST]]
    # The defs, lambdas and classes in it: what the readers remember lives on them.
    scopes: list[ast.AST]
    # Its defs, classes and imports (INDEXED) by depth, as ast.walk meets them.
    indexed: list[tuple[int, ast.AST]] = field(default_factory=list)
    # `pass`, `break`, `continue`: positioned, but fieldless, so never listed or linked.
    fieldless: list[ast.AST] = field(default_factory=list)

    @property
    def first_line(self) -> int:
        """Where the statement starts, its decorators included."""
        decorators = getattr(self.statement, "decorator_list", None)
        return min(self.statement.lineno, *(d.lineno for d in decorators)) if decorators else self.statement.lineno

    @property
    def last_line(self) -> int:
        return self.statement.end_lineno

    def nodes(self):
        for level in self.levels:
            yield from level

    def shift(self, lines: int) -> None:
        """Move the statement `lines` down (up when negative), as inserting lines above it does."""
        positioned = _POSITIONED
        for level in self.levels:
            for node in level:
                if type(node) in positioned:
                    node.lineno += lines
                    node.end_lineno += lines
        for node in self.fieldless:
            node.lineno += lines
            node.end_lineno += lines


def link(module: ast.Module) -> list[Linked]:
    """Link every statement of `module` (then `assemble` it)."""
    return [link_statement(statement, module) for statement in module.body]


def link_statement(statement: ast.stmt, module: ast.Module) -> Linked:
    """Link one top-level statement of `module`, breadth first."""
    # Contexts and operators (`Load`, `Store`, `Add`...) have no fields and are one shared
    # instance per process: they are left out, or concurrent checks in the language server
    # would write each other's `_owner` on them (and `dispose` would clear it mid-check).
    statement._parent = statement._owner = module  # type: ignore[attr-defined]
    levels, module_owned, scopes, indexed, fieldless = [], [], [], [], []
    own: dict[int, list[ast.AST]] = {}
    scope_types, node_type, jumps, listed = SCOPES, ast.AST, _FIELDLESS, _INDEXED
    level, mine_below = [statement], [statement]
    while level:
        levels.append(level)
        module_owned.append(mine_below)
        below: list[ast.AST] = []
        mine_below = []
        depth = len(levels) - 1
        for node in level:
            if type(node) in listed:
                indexed.append((depth, node))
            if isinstance(node, scope_types):
                owner = node
                mine = own[id(node)] = []
                scopes.append(node)
            else:
                owner = node._owner
                # The module's own nodes are listed when the statements are put together.
                mine = own[id(owner)] if owner is not module else mine_below
            # The list and the single child written out apiece: this loop touches every node of
            # every file checked, and wrapping each single child in a tuple to share one body
            # measured slower.
            for name in node._fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    for child in value:
                        if isinstance(child, node_type):
                            if child._fields:
                                child._parent = node
                                child._owner = owner
                                mine.append(child)
                                below.append(child)
                            elif type(child) in jumps:
                                fieldless.append(child)
                elif isinstance(value, node_type):
                    if value._fields:
                        value._parent = node
                        value._owner = owner
                        mine.append(value)
                        below.append(value)
        level = below
    for scope in scopes:
        scope._own_nodes = tuple(own[id(scope)])  # type: ignore[attr-defined]
    statement._levels = levels  # type: ignore[attr-defined]
    return Linked(statement, levels, module_owned, scopes, indexed, fieldless)


def assemble(module: ast.Module, linked: list[Linked]) -> int:
    """Make `linked` the body of `module` and list the module's nodes, its own nodes and its
    INDEXED nodes in ast.walk's order (depth by depth across the statements). Returns the
    module's depth."""
    module.body = [one.statement for one in linked]
    module._owner = module  # type: ignore[attr-defined]
    depths: list[list[ast.AST]] = []
    owned: list[list[ast.AST]] = []
    for one in linked:
        for depth, (level, mine) in enumerate(zip(one.levels, one.module_owned)):
            if depth == len(depths):
                depths.append([])
                owned.append([])
            depths[depth].extend(level)
            owned[depth].extend(mine)
    nodes = [module]
    for level in depths:
        nodes.extend(level)
    module._nodes = tuple(nodes)  # type: ignore[attr-defined]
    module._own_nodes = tuple(n for level in owned for n in level)  # type: ignore[attr-defined]
    indexed = [found for one in linked for found in one.indexed]
    indexed.sort(key=lambda found: found[0])  # stable: statement order within a depth
    module._indexed = tuple(node for _, node in indexed)  # type: ignore[attr-defined]
    return len(depths) + 1
