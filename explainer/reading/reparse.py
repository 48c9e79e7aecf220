"""Parsing an editor's document again after an edit, re-using what the edit left alone.

At 10,000 lines, parsing and linking the whole file took most of a check (about 0.15 s of
0.2 s), far over what an edit may cost in an editor. A `Reparser` keeps the linked top-level
statements of the last text it parsed; for the next text it parses only the lines between the
last statement before the first changed line and the first statement after the last one, moves
the statements below by the lines the edit added or removed, and puts the module together. The
result is the tree a full parse gives (tests/test_reparse.py compares them edit by edit); where
that cannot be shown from the text alone it parses the whole file.

What the readers remember on a tree (`source.cached`) survives only where it depends on nothing
but the node's own subtree; the rest is forgotten after each check (`forget_findings`).
"""
from __future__ import annotations

import ast

from . import linking
from . import source as src


class Reparser:
    """Successive texts of one document, each parsed re-using the previous one's statements.
    One thread at a time: the language server checks documents one after the other."""

    def __init__(self) -> None:
        self._lines: tuple[str, ...] = ()
        self._linked: list[linking.Linked] = []
        self._module: ast.Module | None = None
        # What the last parse did, for tests and benchmarks: "full", or "reused N of M".
        self.last = ""

    def parse(self, filename: str, text: str) -> src.Source:
        """`text` parsed and linked, as `source.parse` would. Raises SyntaxError/ValueError as
        it does, and then keeps the last text that parsed to compare the next one with."""
        self.forget_findings()  # in case no check did since the last parse
        lines = src.split_lines(text)
        module = self._module
        if module is None or not self._reuse(lines):
            module = self._parse_whole(filename, text)
        module._filename, module._text = filename, text  # type: ignore[attr-defined]
        self._lines = lines
        return src.Source(filename, text, lines, module)

    def forget_findings(self) -> None:
        """Forget what the readers remembered on the tree that depends on more than a node's
        own subtree (`source.cached`): the next text may change it (a class edited, a step
        moved)."""
        if self._module is None:
            return
        src.forget(self._module)
        for one in self._linked:
            for scope in one.scopes:
                src.forget(scope)

    def close(self) -> None:
        """Free the trees (their parent links are cycles)."""
        for one in self._linked:
            _dispose(one)
        if self._module is not None:
            self._module.__dict__.clear()
        self._linked, self._module, self._lines = [], None, ()

    # -- parsing --------------------------------------------------------------------------------

    def _parse_whole(self, filename: str, text: str) -> ast.Module:
        module = src.parse_tree(text, filename)
        linked = linking.link(module)
        depth = linking.assemble(module, linked)
        if depth > src.MAX_DEPTH:
            for one in linked:
                _dispose(one)
            raise SyntaxError(f"nested too deeply to check ({depth} levels; the limit is {src.MAX_DEPTH})")
        self.close()
        self._module, self._linked = module, linked
        self.last = "full"
        return module

    def _reuse(self, lines: tuple[str, ...]) -> bool:
        """Parse only what changed since the last text into the same module; False (nothing
        changed) when that cannot be done safely, for a full parse instead."""
        old, linked = self._lines, self._linked
        same_before = _common_prefix(old, lines)
        same_after = _common_prefix(old[::-1][:len(old) - same_before], lines[::-1][:len(lines) - same_before])
        moved = len(lines) - len(old)
        # Statements wholly in the unchanged lines above and below the edit, never two sharing
        # a line (`a = 1; b = 2`) across the boundary.
        before = 0
        while before < len(linked) and linked[before].last_line <= same_before:
            before += 1
        while before and before < len(linked) and linked[before].first_line <= linked[before - 1].last_line:
            before -= 1
        after = len(linked)
        while after > before and linked[after - 1].first_line > len(old) - same_after:
            after -= 1
        while after < len(linked) and after > before and linked[after].first_line <= linked[after - 1].last_line:
            after += 1
        start = linked[before - 1].last_line + 1 if before else 1
        end = linked[after].first_line - 1 + moved if after < len(linked) else len(lines)
        # A backslash continues the statement above onto the edited lines: let the full parse
        # say what that means.
        if before and lines[start - 2].rstrip("\r\n").endswith("\\"):
            return False
        snippet = "".join(lines[start - 1:end])
        try:
            parsed = src.parse_tree("\n" * (start - 1) + snippet, "<edit>")
        except (SyntaxError, ValueError):
            return False  # perhaps fine with what surrounds it (an indented line added to a def)
        module = self._module
        fresh = [linking.link_statement(statement, module) for statement in parsed.body]
        depth = max((len(one.levels) + 1 for one in fresh), default=1)
        if depth > src.MAX_DEPTH:
            for one in fresh:
                _dispose(one)
            return False
        for one in linked[before:after]:
            _dispose(one)
        if moved:
            for one in linked[after:]:
                one.shift(moved)
        self._linked = [*linked[:before], *fresh, *linked[after:]]
        for key in [k for k in module.__dict__ if k not in module._fields]:
            del module.__dict__[key]
        linking.assemble(module, self._linked)  # no deeper than the text that parsed, or `fresh`
        self.last = f"reused {before + len(linked) - after} of {len(self._linked)}"
        return True


def _common_prefix(a, b) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def _dispose(one: linking.Linked) -> None:
    for node in one.nodes():
        node.__dict__.clear()
