"""Make the objects that register forward hooks again, once their hooks are removed."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading.source import Source
from .edits import insert_lines_after, statement_text


def register_again(source: Source, made: ast.stmt, removal: ast.stmt, name: str) -> Fix:
    """Repeat `made` (`sfs = [SaveFeatures(m) for m in layers]`) after `removal` (`for sf in sfs:
    sf.close()`): what they hold after it is the output of the last forward before it, graph and
    all. The steps that ran while the hooks were registered keep their gradients."""
    return Fix(f"Register the hooks of `{name}` again after line {removal.end_lineno} removed them: repeat line "
               f"{made.lineno} there, so the next forwards refill them",
               (insert_lines_after(source, removal, statement_text(source, made)),))
