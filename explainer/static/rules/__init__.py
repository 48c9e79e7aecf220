"""The rules, one per module: each finds one cause of the catalog (`CODE`, its documentation in
explainer/causes/) in source, `check(module) -> Iterator[Finding]`, and lists the code it must
flag (`INVALID`) and must not (`VALID`) beside the cause's own Example and Use instead."""
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
    bx011_changed_in_place,
)

RULES = [bx001_carried_state, bx002_running_total, bx003_discarded_detach, bx004_made_once, bx005_stored_history,
         bx006_shared_graph, bx007_step_before_backward, bx008_retained_across_iterations,
         bx009_loss_without_history, bx010_grad_frees_graph, bx011_changed_in_place]
BY_CODE = {rule.CODE: rule for rule in RULES}

