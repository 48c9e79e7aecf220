"""A static diagnostic: plain data, rendered as text, JSON (ruff's shape) and later LSP."""
from __future__ import annotations

from dataclasses import dataclass

from ..model import Fix, Location


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    filename: str
    location: Location
    end_location: Location
    fix: Fix | None
    url: str
    cell: int | None = None

    def to_json(self) -> dict:
        data = {
            "code": self.code,
            "message": self.message,
            "filename": self.filename,
            "location": {"row": self.location.row, "column": self.location.column},
            "end_location": {"row": self.end_location.row, "column": self.end_location.column},
            "fix": None if self.fix is None else {
                "message": self.fix.message,
                "applicability": self.fix.applicability,
                "edits": [
                    {"content": e.content,
                     "location": {"row": e.location.row, "column": e.location.column},
                     "end_location": {"row": e.end_location.row, "column": e.end_location.column},
                     **({} if e.cell is None else {"cell": e.cell})}
                    for e in self.fix.edits
                ],
            },
            "url": self.url,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        return data
