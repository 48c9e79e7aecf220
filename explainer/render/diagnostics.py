"""Static diagnostics as ruff-like text and as JSON (ruff's shape, see CONTRACT.md)."""
from __future__ import annotations

import json
import os

from ..static.diagnostic import Diagnostic


def render_text(diagnostics: list[Diagnostic], lines_of) -> str:
    out = []
    for d in diagnostics:
        path = os.path.relpath(d.filename) if os.path.isabs(d.filename) else d.filename
        out.append(f"{path}:{d.location.row}:{d.location.column}: {d.code} {d.message}")
        line = lines_of(d.filename, d.location.row)
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
    out.append(f"Found {count} diagnostic{'s' if count != 1 else ''}." if count else "All checks passed.")
    return "\n".join(out)


def render_json(diagnostics: list[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diagnostics], indent=2)
