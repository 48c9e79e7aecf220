"""The checker's findings as ruff-like text and as JSON (ruff's shape, see CONTRACT.md)."""
from __future__ import annotations

import json
import os

from ..model import Finding


def render_text(diagnostics: list[Finding], line_of, fixed: int | None = None, unchecked: int = 0) -> str:
    """ruff's layout: `path:row:col: CODE message` (`path:cell N:row:col:` in a notebook), the
    source line with the range underlined, and the fix. `line_of(diagnostic)` gives the line;
    `fixed` is how many fixes --fix applied (None without --fix); `unchecked` how many files
    could not be read or parsed (their errors go to stderr)."""
    out = []
    for d in diagnostics:
        path = os.path.relpath(d.filename) if os.path.isabs(d.filename) else d.filename
        cell = f"cell {d.cell}:" if d.cell is not None else ""
        out.append(f"{path}:{cell}{d.location.row}:{d.location.column}: {d.code} {d.message}")
        line = line_of(d)
        if line is not None:
            gutter = " " * len(str(d.location.row))
            width = (d.end_location.column - d.location.column) if d.end_location.row == d.location.row else len(line) - d.location.column + 1
            out.append(f"{gutter} |")
            out.append(f"{d.location.row} | {line}")
            out.append(f"{gutter} | {' ' * (d.location.column - 1)}{'^' * max(1, width)}")
        if d.fix is not None:
            out.append(f"{' ' * len(str(d.location.row))} = fix: {d.fix.message}")
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
    return "\n".join(out)


def render_json(diagnostics: list[Finding]) -> str:
    return json.dumps([d.to_check_json() for d in diagnostics], indent=2)
