"""Split a sum of losses that two optimizers step on, one backward per optimizer's terms."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading import source as src
from .edits import replace


def terms(value: ast.expr) -> list[tuple[int, ast.expr]]:
    """(sign, term) of a sum: `a + w * b - c` -> [(1, a), (1, w * b), (-1, c)]."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Add, ast.Sub)):
        sign = 1 if isinstance(value.op, ast.Add) else -1
        right = [(s * sign, t) for s, t in terms(value.right)] if isinstance(value.right, ast.BinOp) \
            and isinstance(value.right.op, (ast.Add, ast.Sub)) else [(sign, value.right)]
        return terms(value.left) + right
    return [(1, value)]


def _sum(source: src.Source, parts: list[tuple[int, ast.expr]]) -> str:
    text = ""
    for sign, term in parts:
        written = source.segment(term)
        if isinstance(term, ast.BinOp) and isinstance(term.op, (ast.Add, ast.Sub)):
            written = f"({written})"
        text += (("-" if sign < 0 else "") if not text else (" - " if sign < 0 else " + ")) + written
    return text


def part_name(loss: str, optimizer: str) -> str:
    """`total_loss` and `self.critic_optim` -> `total_loss_critic`."""
    short = optimizer.split(".")[-1]
    for affix in ("_optimizer", "_optim", "_opt", "optimizer_", "optim_", "opt_"):
        short = short.replace(affix, "")
    return f"{loss}_{short}" if short.isidentifier() and short not in ("optimizer", "optim", "opt") else f"{loss}_part"


def split_backward(source: src.Source, made: ast.Assign, loss: str, first: list[tuple[int, ast.expr]],
                   second: list[tuple[int, ast.expr]], first_name: str, second_name: str,
                   first_receiver: ast.expr, second_receiver: ast.expr) -> Fix:
    """`total_loss = actor_loss + w * critic_loss` back-propagated before the critic's step and
    again after it: the first backward takes the critic's terms, the second the others. Each
    optimizer still sees the gradients it saw, and no backward needs weights a step changed."""
    indent = source.indent_of(made.lineno)
    lines = [f"{first_name} = {_sum(source, first)}", f"{indent}{second_name} = {_sum(source, second)}",
             f"{indent}{loss} = {first_name} + {second_name}"]
    return Fix(f"Split `{loss}`: back-propagate `{first_name}` ({_sum(source, first)}) before the step and "
               f"`{second_name}` ({_sum(source, second)}) after it; each optimizer's parameters get the "
               f"gradients they got from `{loss}`, and the second backward needs none of the stepped weights",
               (replace(source, made, "\n".join(lines)), replace(source, first_receiver, first_name),
                replace(source, second_receiver, second_name)))
