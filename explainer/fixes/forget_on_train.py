"""Forget a module's kept value when it goes back to training: what an evaluation under
`torch.no_grad()` filled it with has no graph."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading.source import Source


def forget_when_training(source: Source, class_node: ast.ClassDef, expression: str) -> Fix | None:
    """pykeen's CompGCN: `train()` drops `self.enriched_representations`, so the first forward in
    training mode computes it again, with a graph. None where the class has a `train` of its own
    (it would be replaced) or `expression` is not one of its attributes."""
    if not expression.startswith("self.") or any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                                                 and node.name == "train" for node in class_node.body):
        return None
    last = class_node.body[-1]
    indent = source.indent_of(class_node.body[0].lineno)
    lines = ["def train(self, mode=True):", "    if mode:", f"        {expression} = None",
             "    return super().train(mode)"]
    at = Location(last.end_lineno + 1, 1)
    return Fix(f"Drop `{expression}` when the module goes back to training (`train()`): the value an "
               f"evaluation kept was computed with autograd off, and the next forward computes it again, "
               f"with a graph", (Edit(source.filename, "\n" + "".join(f"{indent}{line}\n" for line in lines), at, at),))
