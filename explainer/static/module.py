"""One file under check: its parsed source, and how rules turn nodes into diagnostics."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ..fixes.edits import node_end, node_start
from ..model import Fix
from ..reading import source as src
from .diagnostic import Diagnostic

DOCS = Path(__file__).resolve().parent / "docs"


def docs_url(code: str) -> str:
    return (DOCS / f"{code}.md").as_uri()


@dataclass
class CheckedModule:
    source: src.Source

    @property
    def tree(self) -> ast.Module:
        return self.source.tree

    def diagnostic(self, code: str, node: ast.AST, message: str, fix: Fix | None = None) -> Diagnostic:
        return Diagnostic(code, message, self.source.filename, node_start(self.source, node),
                          node_end(self.source, node), fix, docs_url(code))
