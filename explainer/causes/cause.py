"""What a cause is: its code and name, its documentation, and its messages."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent / "docs"


@dataclass(frozen=True)
class Message:
    """What a finding of one variant says: `detail` (a paragraph), `summary` (one line, the
    headline of runtime explanations) and, per culprit, its role."""

    detail: str
    summary: str = ""
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cause:
    code: str
    name: str
    title: str  # what it finds, in a phrase (the README's table, SARIF's short description)
    what: str  # ## What it does
    why: str  # ## Why is this bad?
    example: str  # ## Example: code that has the bug
    use_instead: str  # ## Use instead: the same code, fixed
    messages: Mapping[str, Message]
    notes: str = ""  # more on the fix, after the examples
    # Where the checker cannot see the cause, the examples are whole scripts that run: the
    # example raises the error and is explained with this code, the fixed one runs clean.
    runtime_only: bool = False
    # Found by parsing, not by a rule: code that does not parse (its examples go through `check`).
    parse_error: bool = False
    severity: str = "error"

    def doc_page(self) -> str:
        """The docs page (also `explainer rule CODE`)."""
        parts = [f"# {self.code} {self.name}", "", _sentence(self.title), "", "## What it does", self.what, "",
                 "## Why is this bad?", self.why, "", "## Example", _fenced(self.example), "", "## Use instead",
                 _fenced(self.use_instead)]
        if self.notes:
            parts.append(self.notes)
        return "\n".join(parts) + "\n"

    @property
    def url(self) -> str:
        return (DOCS / f"{self.code}.md").as_uri()


def _sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}."


def _fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"
