"""The engine for editors: documents and notebooks held in memory, the user's settings, the
findings the explainer handed over at runtime, one diagnostic per bug, the hover text and
"fix all". The language server (lsp_server/) only translates these to LSP.

A notebook is a list of its cells, in order: the text of each code cell, None for a markdown or
raw cell, so `cell` numbers are the notebook's own, as `explainer check` gives them.

Nothing here imports torch or the code it reads.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .handoff import Entry
from .model import CallSite, Edit, Finding, Fix, Location
from .reading.notebook import Notebook, NotebookError, without_unparseable_cells
from .reading.reparse import Reparser
from .render import diagram
from .static.check import NOQA, apply_safe_fixes, check_text

SEVERITIES = ("error", "warning", "information", "hint")
Cells = list  # list[str | None]: a notebook's cells in order, None for a cell that is not code


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


def check_document(text: str, path: str, settings: Settings, reparser: Reparser | None = None) -> list[Finding] | None:
    """The checker's findings for a document's current text; None while it does not parse
    (mid-typing), so an editor can keep what it showed. `reparser`: the document's own, which
    re-parses only what changed since its last check."""
    if not settings.enable:
        return []
    try:
        return check_text(text, path, settings.select or None, settings.ignore or None, reparser)
    except (SyntaxError, ValueError):
        return None


def check_cells(cells: Cells, path: str, settings: Settings, reparser: Reparser | None = None) -> list[list[Finding]]:
    """The checker's findings per cell of a notebook (rows within the cell), the code cells read
    as one module in order. Cells that don't parse are left out and get none. `reparser`: the
    notebook's own."""
    found: list[list[Finding]] = [[] for _ in cells]
    if not settings.enable:
        return found
    try:
        notebook = _cells_as_module(cells, path)
    except NotebookError:
        return found
    checked = check_text(notebook.text, path, settings.select or None, settings.ignore or None, reparser)
    for finding in checked:
        mapped = notebook.to_cells(finding)
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


def fix_all_cells(cells: Cells, path: str, settings: Settings) -> Cells | None:
    """A notebook's cells with every safe fix applied, the code cells read as one module (as
    `check --fix` does to an .ipynb), or None if nothing changes. Cells that don't parse are
    left as they are."""
    if not settings.enable:
        return None
    try:
        notebook = _cells_as_module(cells, path)
        fixed, count = apply_safe_fixes(notebook.text, path, settings.select or None, settings.ignore or None)
        if not count:
            return None
        code = iter(notebook.cells_from_text(fixed))
    except (SyntaxError, ValueError):  # NotebookError included
        return None
    return ["".join(next(code)) if text is not None else None for text in cells]


def fix_all_in_cell(cells: Cells, number: int, path: str, settings: Settings) -> str | None:
    """Code cell `number` (the notebook's numbering, from 1) with every safe fix whose edits all
    lie inside it applied (the cells read as one module, so names defined in other cells count),
    or None if it does not change. A fix that also edits another cell is left to
    `fix_all_cells`: applied to one cell alone it would be half a fix."""
    if not settings.enable or cells[number - 1] is None:
        return None
    try:
        notebook = _cells_as_module(cells, path)
        index = notebook.code_cells.index(number - 1)
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
        code_texts = ["".join(lines) for lines in notebook.cells_from_text(fixed)]
    except (SyntaxError, ValueError):  # NotebookError included
        return None
    sources = [text for text in cells if text is not None]
    if any(text != source for n, (text, source) in enumerate(zip(code_texts, sources)) if n != index):
        return None  # a guard: `inside` keeps every edit in this cell, so none other can change
    return code_texts[index] if code_texts[index] != sources[index] else None


def _cells_as_module(cells: Cells, path: str) -> Notebook:
    """An editor's notebook as one module, cells that don't parse hidden."""
    notebook, _ = without_unparseable_cells(lambda hidden: Notebook.from_sources(path, cells, hidden))
    return notebook


# -- what the explainer saw at runtime ---------------------------------------------------------


def runtime_findings(entries: list[Entry], path: str, text: str) -> list[Finding]:
    """The runtime findings whose culprit is in the file `path`, on `text`, while the culprit's
    line still reads as it did when it ran."""
    lines = text.splitlines()
    found = []
    for entry in entries:
        for finding in entry.findings:
            if finding.culprits and os.path.abspath(finding.culprits[0].filename) == os.path.abspath(path):
                found.extend(_still_there(finding, lines, path, None))
    return found


def runtime_cell_findings(entries: list[Entry], cells: Cells, path: str) -> list[list[Finding]]:
    """The same for a notebook: a finding from a kernel cell lands on the open cell whose text is
    that cell's source (so it goes away once the cell is edited)."""
    found: list[list[Finding]] = [[] for _ in cells]
    for entry in entries:
        for finding in entry.findings:
            executed = entry.cells.get(finding.culprits[0].filename) if finding.culprits else None
            if executed is None:
                continue
            for index, source in enumerate(cells):
                if source is not None and source.strip() == executed.strip():
                    # IPython drops a cell's leading blank lines before running it.
                    shift = _leading_blank_lines(source) - _leading_blank_lines(executed)
                    found[index].extend(_still_there(finding, source.splitlines(), path, index + 1, shift))
    return found


def _leading_blank_lines(text: str) -> int:
    lines = text.splitlines()
    return next((i for i, line in enumerate(lines) if line.strip()), len(lines))


def _still_there(finding: Finding, lines: list[str], path: str, cell: int | None, shift: int = 0) -> list[Finding]:
    """`finding` moved onto this document (or cell), or nothing when its culprit's line changed
    since the run: the finding no longer describes it."""
    culprit = finding.culprits[0]
    row = culprit.location.row + shift
    line = lines[row - 1] if 0 < row <= len(lines) else None
    if line is None or line.strip() != culprit.source_line.strip():
        return []

    def moved(location: Location) -> Location:
        return Location(location.row + shift, location.column)

    def moved_site(site: CallSite | None) -> CallSite | None:
        """A call in the culprit's file (or cell) moves with it onto this document."""
        if site is None or site.filename != culprit.filename:
            return site
        return replace(site, filename=path, row=site.row + shift)

    fix = finding.fix
    fixes = ()
    if fix is not None and all(cell is not None or os.path.abspath(e.filename) == os.path.abspath(path)
                               for e in fix.edits):
        fixes = (Fix(fix.message, tuple(replace(e, filename=path, cell=cell, location=moved(e.location),
                                                end_location=moved(e.end_location)) for e in fix.edits),
                     fix.applicability),)
    evidence = finding.evidence
    evidence = replace(evidence, made_at=moved_site(evidence.made_at), backward=moved_site(evidence.backward),
                       freed_by=moved_site(evidence.freed_by), steps=tuple(map(moved_site, evidence.steps)))
    return [replace(finding, filename=path, cell=cell, location=moved(finding.location),
                    end_location=moved(finding.end_location), fixes=fixes, evidence=evidence)]


def one_per_bug(checked: list[Finding], ran: list[Finding]) -> list[Finding]:
    """The checker's findings and the runtime's, for one document (or cell), with each bug once.

    A runtime finding and a checker finding of the same cause at the same place are one bug:
    it is shown where the checker points, with the explanation of what happened when it ran and
    its fix (proven on that run), and marked `confirmed`. "The same place" is a line the checker's
    range covers: the runtime culprit's, or the failing call's (`retain_graph=True` at the
    backward, while the runtime names the carrier); or, for an in-place change, the line that
    changed the tensor, which both name. A runtime finding the checker could not see stays on its
    own."""
    merged = list(checked)
    alone = []
    for finding in ran:
        index = next((i for i, c in enumerate(merged) if not c.confirmed and _same_bug(c, finding)), None)
        if index is None:
            alone.append(finding)
            continue
        static = merged[index]
        merged[index] = replace(finding, location=static.location, end_location=static.end_location,
                                cell=static.cell, fixes=finding.fixes or static.fixes, confirmed=True)
    return sorted(merged + alone, key=lambda f: (f.location.row, f.location.column, f.code))


def _same_bug(static: Finding, ran: Finding) -> bool:
    if static.code != ran.code or static.cell != ran.cell:
        return False
    rows = range(static.location.row, static.end_location.row + 1)
    backward = ran.evidence.backward
    at_backward = backward is not None and ran.cell is None and os.path.abspath(backward.filename) == \
        os.path.abspath(ran.filename) and backward.row in rows
    # An in-place change that two saved tensors lost (RefineNet's `x += path` after an in-place
    # ReLU and a max-pool): the checker names the ReLU's output, the run the max-pool's input,
    # and both name the line that changed it.
    made = static.evidence.made_at
    changed = static.code == "BX011" and made is not None and any(
        c.location.row == made.row and os.path.abspath(c.filename) == os.path.abspath(made.filename)
        for c in ran.culprits[1:]) and ran.cell is None
    return ran.location.row in rows or at_backward or changed


def hover_markdown(finding: Finding) -> str:
    """What a hover on the finding shows beside the diagnostic's own message (which the editor
    shows there already): the cause, for a finding seen when it ran the picture of where its
    history crossed the boundary (a text diagram: every client shows a code block), its fix, and
    why the pattern breaks."""
    cause = finding.cause
    parts = [f"**{finding.code} {cause.name}**: {cause.title}"]
    if finding.confirmed or finding.origin == "runtime":
        parts.append("*Confirmed when it ran.*" if finding.confirmed else "*Seen when it ran.*")
    drawn = diagram.timeline(finding) if not _calls_in_other_cells(finding) else None
    if drawn is not None:
        parts.append("```text\n" + "\n".join(diagram.text(drawn)) + "\n```")
    if finding.fix is not None:
        parts.append(f"**Fix**: {finding.fix.message}.")
    parts.append(cause.why)
    parts.append(f"[{finding.code} documentation]({finding.url})")
    return "\n\n".join(parts)


def _calls_in_other_cells(finding: Finding) -> bool:
    """Whether a notebook cell's finding has calls in other cells: those stay in the kernel's
    file for the cell that ran, which the editor cannot name (its picture would show that file's
    meaningless name), so the hover leaves the picture out."""
    evidence = finding.evidence
    sites = [evidence.made_at, evidence.backward, evidence.freed_by, *evidence.steps]
    return finding.cell is not None and any(s is not None and s.filename != finding.filename for s in sites)


def fix_title(finding: Finding) -> str:
    """A quick fix's title: the fix's first clause, in plain words (no backticks), and the code:
    `Detach hidden where it re-enters the next step (BX001)`."""
    text = finding.fix.message if finding.fix is not None else ""
    for stop in (", so ", ": ", "; "):
        text = text.split(stop, 1)[0]
    return f"{text.replace('`', '')} ({finding.code})"


def noqa_edit(finding: Finding, line: str) -> Edit | None:
    """The edit that silences `finding` on its line with `# noqa: CODE` (added to a noqa the line
    has already), as `check` reads it; None where a comment cannot go (a line continued by a
    backslash) or the line already silences the code."""
    code_part = line.rstrip("\r\n")
    if code_part.rstrip().endswith("\\"):
        return None
    end = Location(finding.location.row, len(code_part) + 1)
    existing = NOQA.search(code_part)
    if existing is not None:
        codes = [c.strip().upper() for c in (existing.group("codes") or "").split(",") if c.strip()]
        if not existing.group("codes") or finding.code in codes:
            return None
        start = Location(finding.location.row, existing.start() + 1)
        content = f"# noqa: {', '.join([*codes, finding.code])}"
        end = Location(finding.location.row, existing.end() + 1)
    else:
        start, content = end, f"  # noqa: {finding.code}"
    return Edit(finding.filename, content, start, end, finding.cell)


def overlapping(findings: Iterable[Finding], start: tuple[int, int], end: tuple[int, int]) -> list[Finding]:
    """Findings whose range meets [start, end] ((row, column), 1-based code points)."""
    return [f for f in findings
            if (f.location.row, f.location.column) <= end and start <= (f.end_location.row, f.end_location.column)]
