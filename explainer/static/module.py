"""One file under check: its parsed source, and how rules turn nodes into findings."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ..causes import BY_CODE
from ..fixes.edits import node_end, node_start
from ..model import CallSite, Evidence, Fact, Finding, Fix
from ..reading import source as src


@dataclass
class CheckedModule:
    source: src.Source

    @property
    def tree(self) -> ast.Module:
        return self.source.tree

    def site(self, node: ast.AST) -> CallSite:
        """A call or statement of this file, with its source as written."""
        return CallSite(self.source.filename, node.lineno, self.source.segment(node))

    def finding(self, code: str, variant: str, node: ast.AST, fix: Fix | None = None, *, carrier: str = "",
                made_at: ast.AST | None = None, backward: ast.AST | None = None, freed_by: ast.AST | None = None,
                steps: tuple[ast.AST, ...] = (), **facts: Fact) -> Finding:
        """A finding of cause `code` at `node`; the other nodes are its evidence."""
        evidence = Evidence(carrier, self.site(made_at) if made_at is not None else None,
                            self.site(backward) if backward is not None else None,
                            self.site(freed_by) if freed_by is not None else None,
                            tuple(self.site(s) for s in steps), facts=tuple(facts.items()))
        return Finding(code, variant, self.source.filename, node_start(self.source, node),
                       node_end(self.source, node), evidence, (fix,) if fix is not None else (),
                       severity=BY_CODE[code].severity)
