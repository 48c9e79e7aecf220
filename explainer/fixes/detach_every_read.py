"""Detach a value at every read where the user already detaches it at some."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading import source as src
from .edits import replace


def reads(function: ast.AST, name: str) -> tuple[list[ast.Name], list[ast.Name]]:
    """(detached, plain) loads of `name` in `function`: `name.detach()` and the others."""
    detached, plain = [], []
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = src.parent(node)
            is_detach = isinstance(parent, ast.Attribute) and parent.attr == "detach" \
                and isinstance(src.parent(parent), ast.Call)
            (detached if is_detach else plain).append(node)
    return detached, plain


def detach_the_other_reads(source: src.Source, name: str, plain: list[ast.Name], detached: ast.Name) -> Fix:
    """`cal_gradient_penalty(netD, real_AB, fake_AB)` -> `..., fake_AB.detach()` beside
    `netD(fake_AB.detach())`. Unsafe: what made the value no longer gets these reads' gradients
    in this step (a generator, from the discriminator's penalty)."""
    rows = ", ".join(str(n.lineno) for n in plain)
    return Fix(f"Detach `{name}` where line{'s' if len(plain) > 1 else ''} {rows} read{'' if len(plain) > 1 else 's'} "
               f"it, as line {detached.lineno} does: those reads go back into a graph made once, which the first "
               f"backward frees", tuple(replace(source, n, f"{name}.detach()") for n in plain), "unsafe")


def detach_reads_outside_training(source: src.Source, method: ast.AST, reads: list[ast.expr]) -> Fix:
    """`covar_chol = self.covar_chol.detach()` where `forward` predicts with what the last fit
    kept on the model (BoTorch's PairwiseGP, 44e296c8): the fit needs their graphs, a prediction
    only their values."""
    names = list(dict.fromkeys(source.segment(n) for n in reads))
    listed = ", ".join(f"`{n}`" for n in names)
    rows = sorted({n.lineno for n in reads})
    where = f"line{'s' if len(rows) > 1 else ''} {', '.join(str(r) for r in rows)}"
    return Fix(f"Detach {listed} where `{method.name}` reads {'them' if len(names) > 1 else 'it'} when the model is "
               f"not training ({where}): {'they reach' if len(names) > 1 else 'it reaches'} the graph of the last "
               f"training pass, which its backward freed",
               tuple(replace(source, n, f"{source.segment(n)}.detach()") for n in reads))
