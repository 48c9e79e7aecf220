"""The checker for editors: documents and notebooks held in memory, the user's settings, the
hover text and "fix all". The language server (lsp_server/) only translates these to LSP.

Nothing here imports torch or the code it reads.
"""
from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from ..model import Fix, Location, edits_from_json
from ..reading.notebook import Notebook, NotebookError, without_unparseable_cells
from .check import apply_safe_fixes, check_text
from .diagnostic import Diagnostic
from .module import DOCS
from .rules import BY_CODE

RUNTIME_DOCS = (DOCS / "runtime.md").as_uri()

SEVERITIES = ("error", "warning", "information", "hint")


@dataclass(frozen=True)
class Settings:
    """What a user can set (`initializationOptions`, or `workspace/configuration` section
    `backwardExplainer`)."""

    enable: bool = True
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    severity: str = "warning"
    problems: tuple[str, ...] = field(default=(), compare=False)  # what was wrong in the input

    @classmethod
    def from_client(cls, raw, base: Settings | None = None) -> Settings:
        """Settings from a client's JSON, keeping `base`'s value (and saying why) for anything
        malformed: a typo in a settings file must not stop the checker."""
        base = base or cls()
        if raw is None:
            return base
        if not isinstance(raw, dict):
            return cls(base.enable, base.select, base.ignore, base.severity,
                       (f"settings must be an object, got {type(raw).__name__}",))
        problems = []
        enable = raw.get("enable", base.enable)
        if not isinstance(enable, bool):
            problems.append(f"enable must be true or false, got {enable!r}")
            enable = base.enable
        codes = {}
        for key in ("select", "ignore"):
            value = raw.get(key, list(getattr(base, key)))
            if isinstance(value, str):
                value = [part for part in value.split(",")]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(f"{key} must be a list of codes, got {value!r}")
                value = list(getattr(base, key))
            codes[key] = tuple(v.strip().upper() for v in value if v.strip())
        severity = raw.get("severity", base.severity)
        if severity not in SEVERITIES:
            problems.append(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
            severity = base.severity
        return cls(enable, codes["select"], codes["ignore"], severity, tuple(problems))


@contextmanager
def collector_paused():
    """No garbage collection while a check runs: a check allocates tens of thousands of AST
    nodes, and the collections they trigger were most of an editor's tail latency. The trees
    are freed by reference counting (`source.dispose`), so nothing piles up meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_document(text: str, path: str, settings: Settings) -> list[Diagnostic] | None:
    """Diagnostics for a document's current text; None while it does not parse (mid-typing),
    so an editor can keep what it showed."""
    if not settings.enable:
        return []
    try:
        with collector_paused():
            return check_text(text, path, settings.select or None, settings.ignore or None)
    except (SyntaxError, ValueError):
        return None


def check_cells(sources: list[str], path: str, settings: Settings) -> list[list[Diagnostic]]:
    """Diagnostics per code cell of a notebook (rows within the cell), the cells read as one
    module in order. Cells that don't parse are left out and get none."""
    found: list[list[Diagnostic]] = [[] for _ in sources]
    if not settings.enable:
        return found
    try:
        notebook = _cells_as_module(sources, path)
    except NotebookError:
        return found
    with collector_paused():
        checked = check_text(notebook.text, path, settings.select or None, settings.ignore or None)
    for diagnostic in checked:
        mapped = notebook.to_cells(diagnostic)
        found[mapped.cell - 1].append(mapped)
    return found


def fix_all(text: str, path: str, settings: Settings) -> str | None:
    """The document with every safe fix applied (as `check --fix`), or None if nothing changes."""
    if not settings.enable:
        return None
    try:
        fixed, count = apply_safe_fixes(text, path, settings.select or None, settings.ignore or None)
    except (SyntaxError, ValueError):
        return None
    return fixed if count else None


def fix_all_cells(sources: list[str], path: str, settings: Settings) -> list[str] | None:
    """A notebook's code cells with every safe fix applied, the cells read as one module (as
    `check --fix` does to an .ipynb), or None if nothing changes. Cells that don't parse are
    left as they are."""
    if not settings.enable:
        return None
    try:
        notebook = _cells_as_module(sources, path)
        fixed, count = apply_safe_fixes(notebook.text, path, settings.select or None, settings.ignore or None)
        if not count:
            return None
        cells = notebook.cells_from_text(fixed)
    except (SyntaxError, ValueError):  # NotebookError included
        return None
    return ["".join(lines) for lines in cells]


def fix_all_in_cell(sources: list[str], index: int, path: str, settings: Settings) -> str | None:
    """Code cell `sources[index]` with every safe fix whose edits all lie inside it applied (the
    cells read as one module, so names defined in other cells count), or None if it does not
    change. A fix that also edits another cell is left to `fix_all_cells`: applied to one cell
    alone it would be half a fix."""
    if not settings.enable:
        return None
    try:
        notebook = _cells_as_module(sources, path)
        original_rows = notebook.text.count("\n")
        first = notebook.starts[index]
        # The next cell's boundary line, or None for the last cell; only this cell's rows change,
        # so in an edited text it moves by the change in the number of lines.
        boundary = notebook.starts[index + 1] - 1 if index + 1 < len(notebook.starts) else None

        def inside(text: str, fix) -> bool:
            end = None if boundary is None else boundary + text.count("\n") - original_rows
            return all(edit.location.row >= first
                       and (end is None or (edit.end_location.row, edit.end_location.column) <= (end, 1))
                       for edit in fix.edits)

        fixed, count = apply_safe_fixes(notebook.text, path, settings.select or None, settings.ignore or None,
                                        accept=inside)
        if not count:
            return None
        cells = ["".join(lines) for lines in notebook.cells_from_text(fixed)]
    except (SyntaxError, ValueError):  # NotebookError included
        return None
    if any(text != source for n, (text, source) in enumerate(zip(cells, sources)) if n != index):
        return None  # a guard: `inside` keeps every edit in this cell, so none other can change
    return cells[index] if cells[index] != sources[index] else None


def _cells_as_module(sources: list[str], path: str) -> Notebook:
    """An editor's notebook (its code cells' texts) as one module, cells that don't parse hidden."""
    notebook, _ = without_unparseable_cells(lambda hidden: Notebook.from_sources(path, sources, hidden))
    return notebook


def runtime_diagnostics(entries: list[dict], path: str, text: str) -> list[Diagnostic]:
    """The runtime findings (`explainer.handoff` entries) whose culprit is in the file `path`,
    as diagnostics on `text`, while the culprit's line still reads as it did when it ran."""
    lines = text.splitlines()
    found = []
    for finding in _findings(entries):
        for culprit in finding.get("culprits", [])[:1]:
            if os.path.abspath(culprit.get("filename", "")) == os.path.abspath(path):
                found.extend(_runtime_diagnostic(finding, culprit, lines, path, None))
    return found


def runtime_cell_diagnostics(entries: list[dict], sources: list[str], path: str) -> list[list[Diagnostic]]:
    """The same for a notebook's code cells: a finding from a kernel cell lands on the open cell
    whose text is that cell's source (so it goes away once the cell is edited)."""
    found: list[list[Diagnostic]] = [[] for _ in sources]
    for entry in entries:
        cells = entry.get("cells") or {}
        for finding in _findings([entry]):
            for culprit in finding.get("culprits", [])[:1]:
                executed = cells.get(culprit.get("filename"))
                if executed is None:
                    continue
                for index, source in enumerate(sources):
                    if source.strip() == executed.strip():
                        # IPython drops a cell's leading blank lines before running it.
                        shift = _leading_blank_lines(source) - _leading_blank_lines(executed)
                        found[index].extend(_runtime_diagnostic(finding, culprit, source.splitlines(), path,
                                                                index + 1, shift))
    return found


def _leading_blank_lines(text: str) -> int:
    lines = text.splitlines()
    return next((i for i, line in enumerate(lines) if line.strip()), len(lines))


def _findings(entries: list[dict]) -> list[dict]:
    return [f for e in entries for f in e.get("findings", []) if isinstance(f, dict)]


def _runtime_diagnostic(finding: dict, culprit: dict, lines: list[str], path: str, cell: int | None, shift: int = 0):
    row, column = culprit["location"]["row"] + shift, culprit["location"]["column"]
    line = lines[row - 1] if 0 < row <= len(lines) else None
    if line is None or line.strip() != (culprit.get("source_line") or "").strip():
        return []  # the line changed since the run: the finding no longer describes it
    name = culprit.get("name", "")
    end = column + len(name) if line[column - 1:column - 1 + len(name)] == name else len(line) + 1
    fixes = finding.get("fixes") or []
    fix = None
    if fixes and all(os.path.abspath(e.get("filename", path)) == os.path.abspath(path) or cell is not None
                     for e in fixes[0]["edits"]):
        fix = Fix(fixes[0]["message"], tuple(
            replace(e, filename=path, cell=cell, location=Location(e.location.row + shift, e.location.column),
                    end_location=Location(e.end_location.row + shift, e.end_location.column))
            for e in edits_from_json(fixes[0], path)), fixes[0]["applicability"])
    return [Diagnostic(finding["kind"], f"{finding['message']} (explained when it ran)", path,
                       Location(row, column), Location(row, end), fix, RUNTIME_DOCS, cell)]


def hover_markdown(diagnostic: Diagnostic) -> str:
    """What a hover on the diagnostic shows: the finding, its fix, and why the pattern breaks."""
    if diagnostic.code not in BY_CODE:  # a runtime finding: its message says everything
        parts = [f"**{diagnostic.code}** (runtime): {diagnostic.message}"]
        if diagnostic.fix is not None:
            parts.append(f"**Fix**: {diagnostic.fix.message}.")
        return "\n\n".join([*parts, f"[runtime findings]({diagnostic.url})"])
    rule = BY_CODE[diagnostic.code]
    parts = [f"**{diagnostic.code} {rule.NAME}**: {diagnostic.message}"]
    if diagnostic.fix is not None:
        parts.append(f"**Fix**: {diagnostic.fix.message}.")
    why = _section(rule.__doc__, "## Why is this bad?")
    if why:
        parts.append(why)
    parts.append(f"[{diagnostic.code} documentation]({diagnostic.url})")
    return "\n\n".join(parts)


def _section(doc: str, heading: str) -> str:
    text = doc.split(heading, 1)[1] if heading in doc else ""
    return text.split("\n## ", 1)[0].strip()


def overlapping(diagnostics: Iterable[Diagnostic], start: tuple[int, int], end: tuple[int, int]) -> list[Diagnostic]:
    """Diagnostics whose range meets [start, end] ((row, column), 1-based code points)."""
    return [d for d in diagnostics
            if (d.location.row, d.location.column) <= end and start <= (d.end_location.row, d.end_location.column)]
