"""The rules, one per module. Each has CODE, NAME, a docstring in ruff's form (What it does /
Why is this bad? / Example / Use instead) and `check(module) -> Iterator[Diagnostic]`."""
from __future__ import annotations

from . import (
    bx001_carried_state,
    bx002_running_total,
    bx003_discarded_detach,
    bx004_made_once,
    bx005_stored_history,
    bx006_shared_graph,
    bx007_step_before_backward,
    bx008_retained_across_iterations,
    bx009_loss_without_history,
    bx010_grad_frees_graph,
)

RULES = [bx001_carried_state, bx002_running_total, bx003_discarded_detach, bx004_made_once, bx005_stored_history,
         bx006_shared_graph, bx007_step_before_backward, bx008_retained_across_iterations,
         bx009_loss_without_history, bx010_grad_frees_graph]
BY_CODE = {rule.CODE: rule for rule in RULES}


def doc_page(rule) -> str:
    """The rule's docs page: its docstring, with the code and name as the title."""
    summary, _, body = rule.__doc__.strip().partition("\n")
    headline = summary.split(":", 1)[1].strip()
    return f"# {rule.CODE} {rule.NAME}\n\n{headline[0].upper()}{headline[1:]}\n{body}\n"
