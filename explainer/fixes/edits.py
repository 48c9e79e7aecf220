"""Edits on source text: build them from AST nodes, apply them to text."""
from __future__ import annotations

import ast

from ..model import Edit, Location
from ..reading.source import Source


def node_start(source: Source, node: ast.AST) -> Location:
    return Location(node.lineno, source.column(node.lineno, node.col_offset))


def node_end(source: Source, node: ast.AST) -> Location:
    return Location(node.end_lineno, source.column(node.end_lineno, node.end_col_offset))


def replace(source: Source, node: ast.AST, content: str) -> Edit:
    return Edit(source.filename, content, node_start(source, node), node_end(source, node))


def insert_lines_before(source: Source, stmt: ast.stmt, lines: list[str], indent: str | None = None) -> Edit:
    """Insert whole lines before `stmt`'s first line, at `stmt`'s indentation."""
    indent = source.indent_of(stmt.lineno) if indent is None else indent
    text = "".join(f"{indent}{line}\n" for line in lines)
    at = Location(stmt.lineno, 1)
    return Edit(source.filename, text, at, at)


def insert_lines_after(source: Source, stmt: ast.stmt, lines: list[str], indent: str | None = None) -> Edit:
    """Insert whole lines after `stmt`'s last line, at `stmt`'s indentation."""
    indent = source.indent_of(stmt.lineno) if indent is None else indent
    text = "".join(f"{indent}{line}\n" for line in lines)
    at = Location(stmt.end_lineno + 1, 1)
    return Edit(source.filename, text, at, at)


def overlapping(edits, more) -> bool:
    """Whether an edit of `more` overlaps one of `edits` (they could not be applied together)."""
    return any((e.location.row, e.location.column) < (m.end_location.row, m.end_location.column)
               and (m.location.row, m.location.column) < (e.end_location.row, e.end_location.column)
               for e in edits for m in more)


def delete_lines(source: Source, stmt: ast.stmt) -> Edit:
    return Edit(source.filename, "", Location(stmt.lineno, 1), Location(stmt.end_lineno + 1, 1))


def imports_torch(source: Source) -> bool:
    """Whether the file has a plain `import torch`, so a fix can write `torch.no_grad()`."""
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
               for n in ast.walk(source.tree))


def statement_text(source: Source, stmt: ast.stmt) -> list[str]:
    """The statement's source lines (no trailing comment), dedented to its own first line."""
    first, *rest = source.segment(stmt).split("\n")
    indent = source.indent_of(stmt.lineno)
    return [first] + [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in rest]


def apply_edits(text: str, edits) -> str:
    """Apply non-overlapping edits (rows/columns 1-based, end exclusive) to `text`."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(location: Location) -> int:
        if location.row - 1 >= len(lines):
            return len(text)
        return starts[location.row - 1] + location.column - 1

    spans = sorted(((offset(e.location), offset(e.end_location), e.content) for e in edits),
                   reverse=True)
    previous_start = len(text) + 1
    for start, end, content in spans:
        if end > previous_start:
            raise ValueError("overlapping edits")
        text = text[:start] + content + text[end:]
        previous_start = start
    return text
