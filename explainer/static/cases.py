"""A rule's own test cases, kept beside it as Fixit keeps them: code it must leave alone and code
it must flag. tests/test_causes.py runs every rule's cases."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Valid:
    """Correct code, often from a real repository: the checker flags nothing in it (no rule)."""

    name: str
    code: str


@dataclass(frozen=True)
class Invalid:
    """A bug this rule flags exactly once; its fix leaves code that parses and that the rule no
    longer flags."""

    name: str
    code: str
