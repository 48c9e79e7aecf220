"""Jupyter notebooks as one Python module: code cells in order, so state made in one cell and
used in a later cell's loop is seen, with IPython syntax (magics, `!shell`, `x?`) neutralized.

Each cell follows a boundary comment line, and each IPython-only line becomes a `pass` carrying
its index, so the module's text can be edited (`--fix`) and split back into cells with the
original IPython lines restored. Diagnostics are mapped to (cell, row in cell).
"""
from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from ..model import Edit, Finding, Fix, Location
from . import source as src

_BOUNDARY = "# explainer: code cell {number} ({token})\n"
_BOUNDARY_LINE = re.compile(r"^# explainer: code cell (\d+) \((\w+)\)$")
_PLACEHOLDER = "{indent}pass  # explainer: ipython line {index} ({token})\n"
_PLACEHOLDER_LINE = re.compile(r"^(\s*)pass  # explainer: ipython line (\d+) \((\w+)\)$")
# Cell magics whose body is still Python.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


class NotebookError(ValueError):
    """Not a notebook we can read (bad JSON, not nbformat 4)."""


@dataclass
class Notebook:
    path: str
    document: dict
    code_cells: list[int]  # positions in document["cells"] of the code cells, in order
    text: str  # the module: every code cell after its boundary line
    starts: list[int]  # per code cell, the module row of its first line
    ipython_lines: list[str]
    token: str
    ends_with_newline: list[bool]  # per code cell, as stored (Jupyter itself stores none)

    @classmethod
    def read(cls, path: str, raw: str, hidden: frozenset[int] = frozenset()) -> Notebook:
        """`hidden`: cell numbers kept out of the module (cells that don't parse)."""
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as error:
            raise NotebookError(f"not a notebook (invalid JSON: {error.msg})") from error
        cells = document.get("cells") if isinstance(document, dict) else None
        if not isinstance(cells, list):
            raise NotebookError("not a notebook (no cells; nbformat 4 is supported)")
        metadata = document.get("metadata") or {}
        kernelspec = metadata.get("kernelspec") or {} if isinstance(metadata, dict) else None
        if not isinstance(kernelspec, dict):
            raise NotebookError("not a notebook (metadata and its kernelspec must be objects)")
        if kernelspec.get("language", "python") != "python":
            raise NotebookError("not a Python notebook")
        for number, cell in enumerate(cells, 1):
            source = cell.get("source", "") if isinstance(cell, dict) and cell.get("cell_type") == "code" else ""
            if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(s, str) for s in source)):
                raise NotebookError(f"not a notebook (cell {number}: source must be a string or a list of strings)")
        return cls._build(path, document, _token(raw), hidden)

    @classmethod
    def from_sources(cls, path: str, cells: list[str | None], hidden: frozenset[int] = frozenset()) -> Notebook:
        """An editor's notebook document: cell N is `cells[N-1]`, its text for a code cell and
        None for a markdown (or raw) cell, so cells are numbered as the notebook shows them."""
        document = {"cells": [{"cell_type": "code", "source": text} if text is not None else
                              {"cell_type": "markdown", "source": ""} for text in cells], "metadata": {}}
        return cls._build(path, document, _token("".join(t for t in cells if t is not None)), hidden)

    @classmethod
    def _build(cls, path: str, document: dict, token: str, hidden: frozenset[int]) -> Notebook:
        cells = document["cells"]
        code_cells = [i for i, c in enumerate(cells) if isinstance(c, dict) and c.get("cell_type") == "code"]
        parts, starts, ipython_lines, ends_with_newline = [], [], [], []
        row = 1
        for number, position in enumerate(code_cells, 1):
            parts.append(_BOUNDARY.format(number=number, token=token))
            row += 1
            starts.append(row)
            lines = _cell_lines(cells[position])
            ends_with_newline.append(bool(lines) and lines[-1].endswith("\n"))
            for line in _neutralized(lines, ipython_lines, token, hide_all=position + 1 in hidden):
                parts.append(line)
                row += 1
        return cls(path, document, code_cells, "".join(parts), starts, ipython_lines, token, ends_with_newline)

    def cell_of(self, row: int) -> tuple[int, int]:
        """(cell, row within the cell) of a module row. Cells are numbered as the notebook shows
        them: from 1, markdown cells included."""
        index = max((i for i, start in enumerate(self.starts) if start <= row), default=0)
        return self.code_cells[index] + 1, row - self.starts[index] + 1

    def cell_lines(self, cell: int) -> list[str]:
        """The source lines of the notebook's cell number `cell`, as stored."""
        return _cell_lines(self.document["cells"][cell - 1])

    def to_cells(self, finding: Finding) -> Finding:
        """`finding` of the module's text, in the cell it points into (rows within that cell)."""
        cell, row = self.cell_of(finding.location.row)
        end_cell, end_row = self.cell_of(finding.end_location.row)
        end = Location(end_row, finding.end_location.column) if end_cell == cell else \
            Location(row, finding.location.column + 1)
        fixes = tuple(Fix(f.message, tuple(self._edit_to_cells(e) for e in f.edits), f.applicability)
                      for f in finding.fixes)
        return replace(finding, location=Location(row, finding.location.column), end_location=end, fixes=fixes,
                       cell=cell)

    def _edit_to_cells(self, edit: Edit) -> Edit:
        cell, row = self.cell_of(edit.location.row)
        end_cell, end_row = self.cell_of(edit.end_location.row)
        if end_cell != cell:  # an edit that ends at the start of the next cell's boundary line
            end_row = len(self.cell_lines(cell)) + 1
        return replace(edit, location=Location(row, edit.location.column),
                       end_location=Location(end_row, edit.end_location.column), cell=cell)

    def cells_from_text(self, text: str) -> list[list[str]]:
        """The code cells' lines, as stored, from an edited module `text`, with the original
        IPython lines restored. Raises NotebookError when the edit moved or removed cell boundaries."""
        cells: list[list[str]] = []
        for line in text.splitlines(keepends=True):
            boundary = _BOUNDARY_LINE.match(line.rstrip("\r\n"))
            if boundary and boundary.group(2) == self.token:
                if int(boundary.group(1)) != len(cells) + 1:
                    raise NotebookError("a fix moved the cell boundaries")
                cells.append([])
                continue
            if not cells:
                raise NotebookError("a fix wrote before the first cell")
            placeholder = _PLACEHOLDER_LINE.match(line.rstrip("\r\n"))
            if placeholder and placeholder.group(3) == self.token:
                line = self.ipython_lines[int(placeholder.group(2))]
            cells[-1].append(line)
        if len(cells) != len(self.code_cells):
            raise NotebookError("a fix removed a cell boundary")
        for lines, newline in zip(cells, self.ends_with_newline):
            if lines and lines[-1].endswith("\n") and not newline:
                lines[-1] = lines[-1][:-1]
        return cells

    def with_text(self, text: str) -> str:
        """The notebook's JSON with its code cells replaced from an edited module `text`.
        Raises NotebookError when the edit moved or removed cell boundaries."""
        cells = self.cells_from_text(text)
        document = json.loads(json.dumps(self.document))
        for position, lines in zip(self.code_cells, cells):
            source = document["cells"][position].get("source")
            document["cells"][position]["source"] = "".join(lines) if isinstance(source, str) else lines
        text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800") can only be written escaped
            text = json.dumps(document, indent=1) + "\n"
        return text


class Unparsed(NamedTuple):
    """A notebook cell left out because it does not parse: where, and the parser's message."""

    cell: int
    row: int  # within the cell
    column: int
    message: str


def without_unparseable_cells(build) -> tuple[Notebook, list[Unparsed]]:
    """`build(hidden)`, with every cell that does not parse hidden, and one record per hidden
    cell. Raises NotebookError when hiding a cell does not help."""
    hidden: set[int] = set()
    skipped: list[Unparsed] = []
    while True:
        notebook = build(frozenset(hidden))
        try:
            src.parse_tree(notebook.text, notebook.path)
            return notebook, skipped
        except SyntaxError as error:
            if error.lineno is None:  # nothing to skip by (the parser's "too deeply nested")
                raise NotebookError(f"cannot parse: {error.msg}") from error
            cell, row = notebook.cell_of(error.lineno)
            if cell in hidden:
                raise NotebookError(f"cannot parse: {error.msg}") from error
            hidden.add(cell)
            skipped.append(Unparsed(cell, row, max(1, error.offset or 1), error.msg))
        except UnicodeEncodeError as error:  # a lone surrogate ("\ud800" in the JSON) is not text
            cell, row = notebook.cell_of(notebook.text.count("\n", 0, error.start) + 1)
            if cell in hidden:
                raise NotebookError(f"cannot parse: {error.reason}") from error
            hidden.add(cell)
            skipped.append(Unparsed(cell, row, 1, error.reason))


def _token(raw: str) -> str:
    """A word that doesn't occur in the notebook, so our marker lines can't be mistaken."""
    number = 0
    while f"nb{number}" in raw:
        number += 1
    return f"nb{number}"


def _cell_lines(cell: dict) -> list[str]:
    source = cell.get("source", "")
    text = "".join(source) if isinstance(source, list) else str(source)
    return text.splitlines(keepends=True)


def _neutralized(lines: list[str], ipython_lines: list[str], token: str, hide_all: bool) -> list[str]:
    """The cell's lines, each ending in a newline, with IPython-only syntax turned into `pass`
    placeholders. A cell magic that doesn't run Python (`%%bash`, `%%writefile`) hides its cell."""
    first = lines[0].strip() if lines else ""
    cell_magic = first.startswith("%%")
    hide_all = hide_all or cell_magic and (first[2:].split() or [""])[0] not in _PYTHON_CELL_MAGICS
    out = []
    for index, line in enumerate(lines):
        line = line if line.endswith("\n") else line + "\n"
        text = line.rstrip("\r\n")
        if hide_all or (index == 0 and cell_magic) or _is_ipython(text):
            indent = "" if hide_all or index == 0 else text[: len(text) - len(text.lstrip())]
            ipython_lines.append(line)
            out.append(_PLACEHOLDER.format(indent=indent, index=len(ipython_lines) - 1, token=token))
        else:
            out.append(line)
    return out


def _is_ipython(text: str) -> bool:
    """Lines IPython transforms: `%magic`, `!shell`, `x = !ls`, `x = %time f()`, `obj?`."""
    stripped = text.strip()
    if stripped.startswith(("%", "!")) or (stripped.startswith("?") and len(stripped) > 1):
        return True
    if re.match(r"^[\w.]+\s*=\s*[!%]", stripped):
        return True
    return stripped.endswith("?") and not stripped.startswith("#") and re.match(r"^[\w.\[\]()]+\?\??$", stripped) is not None


def source_lines_in_file(raw: str) -> dict[int, list[int]]:
    """Where each cell's source lines are in the notebook's own JSON text: cell number (from 1,
    markdown cells counted) -> the file row of each of its source lines. Jupyter writes
    `"source"` as a list of strings, one per line, each on a row of its own; a cell whose source
    is one string has all its lines on the row that string starts on. Empty for text that is not
    a notebook's JSON."""
    newlines = [i for i, char in enumerate(raw) if char == "\n"]

    def row_at(offset: int) -> int:
        return bisect.bisect_right(newlines, offset - 1) + 1

    try:
        document, _ = _Positions(raw, row_at).value(_skip_space(raw, 0))
    except (ValueError, IndexError, RecursionError):
        return {}
    cells = document.get("cells") if isinstance(document, dict) else None
    rows: dict[int, list[int]] = {}
    for number, cell in enumerate(cells if isinstance(cells, list) else [], 1):
        source = cell.get("source") if isinstance(cell, dict) else None
        if isinstance(source, _At) and isinstance(source.value, str):
            rows[number] = [source.row] * (source.value.count("\n") + 1)
        elif isinstance(source, list):
            rows[number] = [row for item in source if isinstance(item, _At) and isinstance(item.value, str)
                            for row in [item.row] * max(1, item.value.count("\n"))]
    return rows


class _At(NamedTuple):
    """A JSON string, with the file row it starts on."""

    value: str
    row: int


_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip_space(raw: str, at: int) -> int:
    return _SPACE.match(raw, at).end()


class _Positions:
    """A JSON reader that keeps, for every string, the row it starts on (json.loads keeps none)."""

    def __init__(self, raw: str, row_at) -> None:
        self.raw, self.row_at = raw, row_at

    def value(self, at: int):
        raw = self.raw
        char = raw[at]
        if char == '"':
            text, end = json.decoder.scanstring(raw, at + 1)
            return _At(text, self.row_at(at)), end
        if char == "{":
            result, at = {}, _skip_space(raw, at + 1)
            while raw[at] != "}":
                if raw[at] != '"':
                    raise ValueError("expected a key")
                key, at = json.decoder.scanstring(raw, at + 1)
                at = _skip_space(raw, at)
                if raw[at] != ":":
                    raise ValueError("expected ':'")
                result[key], at = self.value(_skip_space(raw, at + 1))
                at = _skip_space(raw, at)
                if raw[at] == ",":
                    at = _skip_space(raw, at + 1)
            return result, at + 1
        if char == "[":
            items, at = [], _skip_space(raw, at + 1)
            while raw[at] != "]":
                item, at = self.value(at)
                items.append(item)
                at = _skip_space(raw, at)
                if raw[at] == ",":
                    at = _skip_space(raw, at + 1)
            return items, at + 1
        for literal, meaning in (("true", True), ("false", False), ("null", None)):
            if raw.startswith(literal, at):
                return meaning, at + len(literal)
        number = _NUMBER.match(raw, at)
        if number is None:
            raise ValueError(f"unexpected {char!r}")
        return float(number.group()), number.end()
