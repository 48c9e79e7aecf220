"""The checker for editors: documents and notebooks held in memory, the user's settings, the
hover text and "fix all". The language server (lsp_server/) only translates these to LSP.

Nothing here imports torch or the code it reads.
"""
from __future__ import annotations

import ast
import gc
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field

from .check import apply_safe_fixes, check_text
from .diagnostic import Diagnostic
from .notebook import Notebook
from .rules import BY_CODE

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
    hidden: set[int] = set()
    while True:
        notebook = Notebook.from_sources(path, sources, frozenset(hidden))
        try:
            ast.parse(notebook.text)
            break
        except SyntaxError as error:
            cell, _ = notebook.cell_of(error.lineno or 1)
            if cell in hidden:
                return found
            hidden.add(cell)
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


def hover_markdown(diagnostic: Diagnostic) -> str:
    """What a hover on the diagnostic shows: the finding, its fix, and why the pattern breaks."""
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
