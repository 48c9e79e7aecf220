"""The data model of an explanation.

A Finding is plain data (no tensors, no frames): every front-end (the exception note, the
terminal, Jupyter HTML, JSON for `explainer run --json`, and later the language server) is a
renderer of it. Rows are 1-based; columns are 1-based code points; `end` is exclusive.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["second-backward", "inplace-modified", "no-grad", "graph-growth"]
Severity = Literal["error", "warning"]
Applicability = Literal["safe", "unsafe", "display-only"]


@dataclass(frozen=True)
class Location:
    row: int
    column: int


@dataclass(frozen=True)
class Edit:
    filename: str
    content: str
    location: Location
    end_location: Location
    cell: int | None = None  # in a notebook: the 1-based code cell that rows count within


def edits_from_json(fix: dict, filename: str = "") -> list[Edit]:
    """The edits of a fix as written by `Finding.to_json` or a check diagnostic's JSON (whose
    edits name no file: they are in the diagnostic's)."""
    return [Edit(e.get("filename", filename), e["content"], Location(**e["location"]),
                 Location(**e["end_location"]), e.get("cell")) for e in fix["edits"]]


@dataclass(frozen=True)
class Fix:
    message: str
    edits: tuple[Edit, ...]
    applicability: Applicability = "safe"


@dataclass(frozen=True)
class Culprit:
    name: str
    filename: str
    location: Location
    role: str
    source_line: str = ""


@dataclass(frozen=True)
class CallSite:
    """Where the user called backward / autograd.grad / optimizer.step."""

    filename: str
    row: int
    code: str = ""


@dataclass
class Finding:
    kind: Kind
    severity: Severity
    summary: str
    message: str
    culprits: list[Culprit] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    backward: CallSite | None = None
    freed_by: CallSite | None = None
    steps: list[CallSite] = field(default_factory=list)
    retain_graph_advice: str = ""
    confidence: Literal["certain", "likely", "guess"] = "certain"

    def to_json(self) -> dict[str, Any]:
        """The shape promised in CONTRACT.md (fields may only be added)."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "culprits": [
                {"name": c.name, "filename": c.filename, "location": asdict(c.location), "role": c.role,
                 "source_line": c.source_line}
                for c in self.culprits
            ],
            "fixes": [
                {
                    "message": f.message,
                    "applicability": f.applicability,
                    "edits": [
                        {
                            "filename": e.filename,
                            "content": e.content,
                            "location": asdict(e.location),
                            "end_location": asdict(e.end_location),
                        }
                        for e in f.edits
                    ],
                }
                for f in self.fixes
            ],
            "summary": self.summary,
            "confidence": self.confidence,
            "backward": asdict(self.backward) if self.backward else None,
            "freed_by": asdict(self.freed_by) if self.freed_by else None,
            "steps": [asdict(s) for s in self.steps],
            "retain_graph_advice": self.retain_graph_advice,
        }
