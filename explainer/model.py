"""The data model: one Finding for both engines, as ruff has one Diagnostic.

A Finding is plain data (no tensors, no frames, no AST): the static checker and the runtime
explainer both return it, and every front-end (the exception note, the terminal, Jupyter HTML,
`run --json`, `check --format json|sarif`, the language server) renders it. It holds facts: a
cause's code and the evidence that was found; the sentences come from the cause catalog
(`explainer.causes`).

Rows are 1-based; columns are 1-based code points; an end is exclusive. `cell`, wherever it
appears, is the number of a notebook's cell as the notebook shows it (from 1, markdown cells
included), and rows then count within that cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .causes import ADVICE, BY_CODE, Cause, advice_of, detail_of, summary_of

Kind = Literal["second-backward", "inplace-modified", "no-grad", "graph-growth"]
KINDS = ("second-backward", "inplace-modified", "no-grad", "graph-growth")
Severity = Literal["error", "warning"]
Applicability = Literal["safe", "unsafe", "display-only"]
Confidence = Literal["certain", "likely", "guess"]
Origin = Literal["static", "runtime"]


class MalformedFinding(ValueError):
    """JSON that is not a finding as `to_json` writes it (what was wrong, where)."""


@dataclass(frozen=True)
class Location:
    row: int
    column: int

    def to_json(self) -> dict:
        return {"row": self.row, "column": self.column}

    @classmethod
    def from_json(cls, data, where: str) -> Location:
        _expect(isinstance(data, dict) and all(type(data.get(k)) is int for k in ("row", "column")),
                where, "a location {row, column} of integers")
        return cls(data["row"], data["column"])


@dataclass(frozen=True)
class Edit:
    filename: str
    content: str
    location: Location
    end_location: Location
    cell: int | None = None

    def to_json(self, with_filename: bool = True) -> dict:
        """The edit as both commands write it; `check` names the file once, on the diagnostic."""
        data = {"filename": self.filename} if with_filename else {}
        data.update(content=self.content, location=self.location.to_json(), end_location=self.end_location.to_json())
        if self.cell is not None:
            data["cell"] = self.cell
        return data

    @classmethod
    def from_json(cls, data, filename: str = "", where: str = "edit") -> Edit:
        _expect(isinstance(data, dict), where, "an object")
        name = data.get("filename", filename)
        _expect(isinstance(name, str) and isinstance(data.get("content"), str), where,
                "a filename and a content that are strings")
        cell = data.get("cell")
        _expect(cell is None or type(cell) is int, where, "a cell that is an integer")
        return cls(name, data["content"], Location.from_json(data.get("location"), f"{where}.location"),
                   Location.from_json(data.get("end_location"), f"{where}.end_location"), cell)


@dataclass(frozen=True)
class Fix:
    message: str
    edits: tuple[Edit, ...]
    applicability: Applicability = "safe"

    def unproven(self) -> Fix:
        """This fix, offered as unsafe: the source does not show its edit is right for the
        types involved (`.detach()` on what may be no tensor), or it removes a cut."""
        return Fix(self.message, self.edits, "unsafe") if self.applicability == "safe" else self

    def to_json(self, with_filenames: bool = True) -> dict:
        return {"message": self.message, "applicability": self.applicability,
                "edits": [e.to_json(with_filenames) for e in self.edits]}

    @classmethod
    def from_json(cls, data, filename: str = "", where: str = "fix") -> Fix:
        """A fix as either command writes it (`filename`: the file of edits that name none)."""
        _expect(isinstance(data, dict) and isinstance(data.get("message"), str)
                and data.get("applicability") in ("safe", "unsafe", "display-only")
                and isinstance(data.get("edits"), list), where, "a message, an applicability and a list of edits")
        return cls(data["message"], tuple(Edit.from_json(e, filename, f"{where}.edits[{i}]")
                                          for i, e in enumerate(data["edits"])), data["applicability"])


@dataclass(frozen=True)
class CallSite:
    """A call in the user's code: a backward, an `autograd.grad`, an optimizer step, or the
    statement that made a tensor. `code` is its source, as written."""

    filename: str
    row: int
    code: str = ""

    def to_json(self) -> dict:
        return {"filename": self.filename, "row": self.row, "code": self.code}

    @classmethod
    def from_json(cls, data, where: str) -> CallSite | None:
        if data is None:
            return None
        _expect(isinstance(data, dict) and isinstance(data.get("filename"), str) and type(data.get("row")) is int
                and isinstance(data.get("code", ""), str), where, "a call site {filename, row, code}")
        return cls(data["filename"], data["row"], data.get("code", ""))


@dataclass(frozen=True)
class Culprit:
    """A tensor to blame, named as the user wrote it, where it was made; `role` says how it is
    involved (a sentence of the catalog's)."""

    name: str
    filename: str
    location: Location
    role: str
    source_line: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "filename": self.filename, "location": self.location.to_json(), "role": self.role,
                "source_line": self.source_line}

    @classmethod
    def from_json(cls, data, where: str) -> Culprit:
        _expect(isinstance(data, dict) and all(isinstance(data.get(k, ""), str) for k in ("name", "role"))
                and isinstance(data.get("filename"), str) and isinstance(data.get("source_line") or "", str),
                where, "a culprit {name, filename, location, role}")
        return cls(data.get("name", ""), data["filename"], Location.from_json(data.get("location"), f"{where}.location"),
                   data.get("role", ""), data.get("source_line") or "")


Fact = str | int | bool


@dataclass(frozen=True)
class Evidence:
    """What an analysis established, in the fields the catalog's messages are written over.

    `carrier`: the tensor to blame, as written (`hidden`, `self.state`, `cache["prev"]`).
    `made_at`: the statement that made it (or changed it). `backward`: the call that failed, or
    that the finding is about. `freed_by`: the earlier call that freed the graph. `steps`:
    optimizer steps between the two. `advice`: which retain_graph advice applies (a key of
    `ADVICE`). `facts`: the cause's own fields (`value`, `owner`, `loop_row`, ...)."""

    carrier: str = ""
    made_at: CallSite | None = None
    backward: CallSite | None = None
    freed_by: CallSite | None = None
    steps: tuple[CallSite, ...] = ()
    advice: str = ""
    facts: tuple[tuple[str, Fact], ...] = ()

    def to_json(self) -> dict:
        return {"carrier": self.carrier, "made_at": self.made_at.to_json() if self.made_at else None,
                "backward": self.backward.to_json() if self.backward else None,
                "freed_by": self.freed_by.to_json() if self.freed_by else None,
                "steps": [s.to_json() for s in self.steps], "advice": self.advice, "facts": dict(self.facts)}

    @classmethod
    def from_json(cls, data, where: str = "evidence") -> Evidence:
        _expect(isinstance(data, dict), where, "an object")
        steps, facts = data.get("steps", []), data.get("facts", {})
        _expect(isinstance(data.get("carrier", ""), str) and isinstance(data.get("advice", ""), str)
                and data.get("advice", "") in ("", *ADVICE) and isinstance(steps, list)
                and isinstance(facts, dict) and all(isinstance(v, (str, int, bool)) for v in facts.values()),
                where, "a carrier, an advice of the catalog's, a list of steps and facts of strings and integers")
        return cls(data.get("carrier", ""), CallSite.from_json(data.get("made_at"), f"{where}.made_at"),
                   CallSite.from_json(data.get("backward"), f"{where}.backward"),
                   CallSite.from_json(data.get("freed_by"), f"{where}.freed_by"),
                   tuple(CallSite.from_json(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)),
                   data.get("advice", ""), tuple(facts.items()))


@dataclass(frozen=True)
class Finding:
    """One bug, whoever found it: the checker (`origin` "static") or the explainer at runtime
    ("runtime", with the contract's `kind` of the error). It points at `filename`,
    `location`..`end_location` (in `cell`, for a notebook): the line a person must change."""

    code: str
    variant: str  # which of the cause's messages (BY_CODE[code].messages)
    filename: str
    location: Location
    end_location: Location
    evidence: Evidence = field(default_factory=Evidence)
    fixes: tuple[Fix, ...] = ()
    culprits: tuple[Culprit, ...] = ()
    kind: Kind | None = None
    severity: Severity = "error"
    confidence: Confidence = "certain"
    origin: Origin = "static"
    cell: int | None = None
    # A static finding whose bug the explainer also saw happen when the code ran (editors).
    confirmed: bool = False

    @property
    def cause(self) -> Cause:
        return BY_CODE[self.code]

    @property
    def message(self) -> str:
        return detail_of(self)

    @property
    def summary(self) -> str:
        return summary_of(self)

    @property
    def retain_graph_advice(self) -> str:
        return advice_of(self)

    @property
    def url(self) -> str:
        return self.cause.url

    @property
    def fix(self) -> Fix | None:
        """The preferred fix (ruff's single `fix`)."""
        return self.fixes[0] if self.fixes else None

    @property
    def backward(self) -> CallSite | None:
        return self.evidence.backward

    @property
    def freed_by(self) -> CallSite | None:
        return self.evidence.freed_by

    @property
    def steps(self) -> tuple[CallSite, ...]:
        return self.evidence.steps

    def to_json(self) -> dict[str, Any]:
        """The shape `explainer run --json` promises in CONTRACT.md (fields may only be added)."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "culprits": [c.to_json() for c in self.culprits],
            "fixes": [f.to_json() for f in self.fixes],
            "summary": self.summary,
            "confidence": self.confidence,
            "backward": self.backward.to_json() if self.backward else None,
            "freed_by": self.freed_by.to_json() if self.freed_by else None,
            "steps": [s.to_json() for s in self.steps],
            "retain_graph_advice": self.retain_graph_advice,
            "code": self.code,
            "variant": self.variant,
            "url": self.url,
            "origin": self.origin,
            "filename": self.filename,
            "location": self.location.to_json(),
            "end_location": self.end_location.to_json(),
            "evidence": self.evidence.to_json(),
            **({} if self.cell is None else {"cell": self.cell}),
        }

    def to_check_json(self) -> dict[str, Any]:
        """The shape `explainer check --format json` promises (ruff's): one fix, edits that name
        no file (they are in the diagnostic's)."""
        data = {
            "code": self.code,
            "message": self.message,
            "filename": self.filename,
            "location": self.location.to_json(),
            "end_location": self.end_location.to_json(),
            "fix": None if self.fix is None else self.fix.to_json(with_filenames=False),
            "url": self.url,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        return data

    @classmethod
    def from_json(cls, data) -> Finding:
        """A finding as `to_json` wrote it (this version or an earlier one of the same shape).
        Raises MalformedFinding, saying what is wrong, for anything else: the JSON may come
        from a file anyone with access to the project can write."""
        _expect(isinstance(data, dict), "finding", "an object")
        code, variant = data.get("code"), data.get("variant")
        _expect(code in BY_CODE and variant in BY_CODE[code].messages, "finding",
                "a code and a variant of the catalog's")
        _expect(data.get("kind") in (None, *KINDS) and data.get("severity") in ("error", "warning")
                and data.get("confidence", "certain") in ("certain", "likely", "guess")
                and data.get("origin", "runtime") in ("static", "runtime") and isinstance(data.get("filename"), str),
                "finding", "a kind, severity, confidence and origin of the contract's, and a filename")
        culprits, fixes = data.get("culprits", []), data.get("fixes", [])
        _expect(isinstance(culprits, list) and isinstance(fixes, list), "finding", "lists of culprits and fixes")
        cell = data.get("cell")
        _expect(cell is None or type(cell) is int, "finding", "a cell that is an integer")
        return cls(code, variant, data["filename"], Location.from_json(data.get("location"), "finding.location"),
                   Location.from_json(data.get("end_location"), "finding.end_location"),
                   Evidence.from_json(data.get("evidence", {})),
                   tuple(Fix.from_json(f, data["filename"], f"fixes[{i}]") for i, f in enumerate(fixes)),
                   tuple(Culprit.from_json(c, f"culprits[{i}]") for i, c in enumerate(culprits)),
                   data.get("kind"), data["severity"], data.get("confidence", "certain"),
                   data.get("origin", "runtime"), cell)


def _expect(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise MalformedFinding(f"{where}: expected {what}")
