"""The checker's findings as ruff-like text and as JSON (ruff's shape, see CONTRACT.md)."""
from __future__ import annotations

import json
import os

from ..model import Finding
from .ansi import Painter


def render_text(diagnostics: list[Finding], line_of, fixed: int | None = None, unchecked: int = 0,
                unsafe_fixes: bool = False, color: bool = False) -> str:
    """ruff's layout: `path:row:col: CODE [*] message` (`path:cell N:row:col:` in a notebook;
    `[*]` where --fix would apply the fix), the source line with the range underlined, and the
    fix. `line_of(diagnostic)` gives the line; `fixed` is how many fixes --fix applied (None
    without --fix); `unchecked` how many files could not be read or parsed (their errors go to
    stderr); `unsafe_fixes`: --unsafe-fixes was given; `color`: ANSI colours, in ruff's
    scheme (the cli decides, from the terminal and NO_COLOR / FORCE_COLOR)."""
    paint = Painter(color)
    out = []
    for d in diagnostics:
        path = os.path.relpath(d.filename) if os.path.isabs(d.filename) else d.filename
        cell = f"cell {d.cell}:" if d.cell is not None else ""
        mark = paint("[*]", "cyan") + " " if _applied(d, unsafe_fixes) else ""
        out.append(f"{paint(path, 'bold')}{paint(':', 'cyan')}{cell}{d.location.row}{paint(':', 'cyan')}"
                   f"{d.location.column}{paint(':', 'cyan')} {paint(d.code, 'bold', 'red')} {mark}{d.message}")
        line = line_of(d)
        gutter = " " * len(str(d.location.row))
        if line is not None:
            width = (d.end_location.column - d.location.column) if d.end_location.row == d.location.row else len(line) - d.location.column + 1
            out.append(paint(f"{gutter} |", "bold", "blue"))
            out.append(f"{paint(f'{d.location.row} |', 'bold', 'blue')} {line}")
            out.append(f"{paint(f'{gutter} |', 'bold', 'blue')} {' ' * (d.location.column - 1)}"
                       f"{paint('^' * max(1, width), 'bold', 'red')}")
        if d.fix is not None:
            kind = "fix" if d.fix.applicability == "safe" else f"{d.fix.applicability} fix"
            style = ("bold", "cyan") if d.fix.applicability == "safe" else ("bold", "yellow")
            out.append(f"{paint(f'{gutter} =', 'bold', 'blue')} {paint(kind, *style)}: {d.fix.message}")
        out.append("")
    count = len(diagnostics)
    if fixed:
        out.append(f"Found {count + fixed} diagnostic{'s' if count + fixed != 1 else ''} "
                   f"({fixed} fixed, {count} remaining).")
    elif count:
        out.append(f"Found {count} diagnostic{'s' if count != 1 else ''}.")
    else:
        out.append("No diagnostics." if unchecked else "All checks passed.")
    if unchecked:
        out[-1] += f" {unchecked} input{'s' if unchecked != 1 else ''} could not be checked (stderr says why)."
    if fixed is None:
        out.extend(line.replace("[*]", paint("[*]", "cyan"), 1) for line in _fixable_summary(diagnostics, unsafe_fixes))
    return "\n".join(out)


def render_statistics(diagnostics: list[Finding], unsafe_fixes: bool = False) -> str:
    """ruff's `--statistics`: how many of each code, most first, `[*]` where --fix fixes them."""
    from ..causes import BY_CODE

    counts: dict[str, list[Finding]] = {}
    for d in diagnostics:
        counts.setdefault(d.code, []).append(d)
    width = len(str(max((len(found) for found in counts.values()), default=0)))
    rows = sorted(counts.items(), key=lambda item: (-len(item[1]), item[0]))
    out = [f"{len(found):>{width}}\t{code}\t{'[*]' if any(_applied(d, unsafe_fixes) for d in found) else '[ ]'} "
           f"{BY_CODE[code].name}" for code, found in rows]
    return "\n".join(out) if out else "All checks passed."


def _applied(diagnostic: Finding, unsafe_fixes: bool) -> bool:
    """--fix would apply this diagnostic's fix (an unsafe one only with --unsafe-fixes)."""
    fix = diagnostic.fix
    return fix is not None and (fix.applicability == "safe" or unsafe_fixes and fix.applicability == "unsafe")


def _fixable_summary(diagnostics: list[Finding], unsafe_fixes: bool) -> list[str]:
    fixable = sum(1 for d in diagnostics if _applied(d, unsafe_fixes))
    hidden = 0 if unsafe_fixes else sum(1 for d in diagnostics if d.fix is not None and d.fix.applicability == "unsafe")
    if not fixable and not hidden:
        return []
    # ruff's wording: "[*] 2 fixable with the `--fix` option (1 hidden fix can be enabled ...)."
    line = f"[*] {fixable} fixable with the `--fix` option" if fixable else "No fixes available"
    if hidden:
        line += f" ({hidden} hidden fix{'es' if hidden != 1 else ''} can be enabled with the `--unsafe-fixes` option)"
    return [line + "."]


def render_json(diagnostics: list[Finding]) -> str:
    return json.dumps([d.to_check_json() for d in diagnostics], indent=2)
