"""The cause catalog: one typed record per cause, one module each (`bx001_carried_state`, ...).

A cause has a stable code (BX001...), a name, its documentation in ruff's four sections, and
the messages its findings show: templates over a finding's evidence (`{carrier}`, `{where}`,
`{backward.row}`, its facts), one per variant. The static rules, the runtime analyses, the
renderers, SARIF, hover, `explainer rule` and the docs pages all read it; nobody parses a
docstring. Analyses return facts (a Finding and its Evidence); the sentences are written here.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..places import place
from . import (
    bx000_syntax_error,
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
    bx012_freed_graph,
)
from .cause import Cause, Message

# What to say about retain_graph=True, which PyTorch's message suggests and is usually wrong.
ADVICE = {
    "grows": "Don't add retain_graph=True: it would keep every earlier iteration's graph alive, so each "
             "backward goes through all of them (time and memory grow every iteration), and after "
             "optimizer.step() the old graph fails with 'modified by an inplace operation'.",
    "not-the-cause": "retain_graph has nothing to do with this error: the graph still exists, but a value it "
                     "saved was overwritten.",
    "after-step": "retain_graph=True is wrong here: the optimizer step between the two backward calls changed "
                  "weights that the old graph saved, so reusing it raises 'modified by an inplace operation' "
                  "(before PyTorch 1.5 it silently gave wrong gradients).",
    "first-update": "retain_graph=True would make this run, but the first loss would still back-propagate into "
                    "the model that produced `{carrier}`: detach it for that update instead.",
    "sum-losses": "retain_graph=True on the first backward is correct here (no optimizer step between the two "
                  "backward calls), but summing the losses and calling backward once is faster and frees the "
                  "graph.",
    "create-graph": "retain_graph=True alone would run, but the penalty would have no gradient: "
                    "create_graph=True is what makes the gradient differentiable.",
    "two-passes": "retain_graph=True on the first call is correct here (no optimizer step between the two); "
                  "asking for all the gradients in one call is faster and frees the graph once.",
    "twice": "retain_graph=True on the first call would make this run, but every gradient would be counted "
             "twice (and after an optimizer step it fails with 'modified by an inplace operation').",
    "no-graph": "retain_graph has nothing to do with this error: the loss has no graph at all.",
}


@dataclass(frozen=True)
class _Phrases(Mapping):
    """The names a template may use: the evidence's fields and facts, and the phrases derived
    from them, each written once here."""

    evidence: object  # model.Evidence (the model imports this catalog, not the other way)
    extra: Mapping = field(default_factory=dict)

    def __getitem__(self, name: str):
        if name in self.extra:
            return self.extra[name]
        evidence = self.evidence
        facts = dict(evidence.facts)
        if name in facts:
            return facts[name]
        if name in ("carrier", "made_at", "backward", "freed_by", "steps"):
            return getattr(evidence, name)
        phrase = getattr(self, f"_{name.replace('-', '_')}", None)
        if phrase is None:
            raise KeyError(name)
        return phrase(evidence, facts)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    @staticmethod
    def _step(evidence, facts):
        """The last optimizer step between the two calls."""
        return evidence.steps[-1]

    @staticmethod
    def _where(evidence, facts):
        """`train.py:19`, where the carrier was made."""
        made = evidence.made_at
        return place(made.filename, made.row) if made is not None else "an earlier line"

    @staticmethod
    def _switched_at(evidence, facts):
        """`line 163, in `check_accuracy``, where autograd was switched off; its file's name too
        when that is not the backward's."""
        backward = evidence.backward
        filename, row = facts.get("switch_file", ""), facts.get("switch_row", 0)
        at = f"line {row}" if backward is None or filename in ("", backward.filename) else place(filename, row)
        function = facts.get("switch_function", "")
        return f"{at}, in `{function}`" if function else at

    @staticmethod
    def _freed(evidence, facts):
        """Who freed the graph: "`loss.backward()` in the previous iteration freed" when it is the
        failing call's own line, else "`loss.backward()` (line 14) freed"."""
        freed, backward = evidence.freed_by, evidence.backward
        repeat = facts.get("repeat", "iteration")
        # A call of the user's that runs the backward inside a library (`trainer.fit(...)`):
        # the call is the user's line, the backward is the library's.
        who = f"`{freed.code}`" if re.search(r"backward|grad", freed.code) or not freed.code \
            else f"The backward run inside `{freed.code}`"
        if backward is not None and (freed.filename, freed.row) == (backward.filename, backward.row):
            return f"{who} in the previous {repeat} freed"
        return f"{who} (line {freed.row}) freed"

    @staticmethod
    def _freed_where(evidence, facts):
        """`line 14`, or `helpers.py:14` when the freeing call is in another file."""
        freed, backward = evidence.freed_by, evidence.backward
        same_file = backward is None or freed.filename == backward.filename
        return f"line {freed.row}" if same_file else place(freed.filename, freed.row)

    @staticmethod
    def _freed_call(evidence, facts):
        """` (`loss.backward()`, line 14)`, or nothing when no earlier call was recorded."""
        freed = evidence.freed_by
        return f" (`{freed.code}`, line {freed.row})" if freed is not None else ""

    @staticmethod
    def _versions(evidence, facts):
        return (f"The graph saved version {facts.get('expected_version', '?')}, and it is now at version "
                f"{facts.get('version', '?')}.")

    @staticmethod
    def _this_call(evidence, facts):
        return "this `autograd.grad` call" if facts.get("api") == "grad" else "this backward"

    @staticmethod
    def _saved(evidence, facts):
        """The operation that saved the overwritten tensor."""
        saver = facts.get("saver")
        return f"`{saver}`" if saver else "an earlier operation"

    @staticmethod
    def _unrecorded(evidence, facts):
        """Why a runtime explanation could only read the source."""
        nodes = facts.get("graph_nodes")
        if nodes is not None:
            return f"The graph is larger than one explanation walks ({nodes:,} nodes seen)"
        return "No earlier backward was recorded (the explainer was not installed yet, or it ran inside torch.compile)"

    @staticmethod
    def _updater(evidence, facts):
        """What changed the weights: the optimizer, or the hand-written update's own code."""
        return f"`{evidence.steps[-1].code}`" if facts.get("manual") else "the optimizer"

    @staticmethod
    def _on_backward(evidence, facts):
        """", and back-propagating the total goes through freed graphs" when the total is."""
        return ", and back-propagating the total goes through freed graphs" if facts.get("backpropagated") else ""


def _render(template: str, evidence, **extra) -> str:
    return template.format_map(_Phrases(evidence, extra))


def _message(code: str, variant: str) -> Message:
    return BY_CODE[code].messages[variant]


def detail_of(finding) -> str:
    return _render(_message(finding.code, finding.variant).detail, finding.evidence)


def summary_of(finding) -> str:
    """The one-line headline; the detail's first sentence where the variant has none."""
    message = _message(finding.code, finding.variant)
    return _render(message.summary, finding.evidence) if message.summary else detail_of(finding)


def role_of(code: str, variant: str, index: int, evidence) -> str:
    """What the `index`-th culprit of a finding of this variant is."""
    roles = _message(code, variant).roles
    return _render(roles[min(index, len(roles) - 1)], evidence) if roles else ""


def advice_of(finding) -> str:
    """What retain_graph=True would do here (runtime findings), or ""."""
    key = finding.evidence.advice
    return _render(ADVICE[key], finding.evidence) if key else ""


CAUSES: tuple[Cause, ...] = tuple(module.CAUSE for module in (
    bx000_syntax_error, bx001_carried_state, bx002_running_total, bx003_discarded_detach, bx004_made_once,
    bx005_stored_history,
    bx006_shared_graph, bx007_step_before_backward, bx008_retained_across_iterations, bx009_loss_without_history,
    bx010_grad_frees_graph, bx011_changed_in_place, bx012_freed_graph))
BY_CODE: dict[str, Cause] = {cause.code: cause for cause in CAUSES}
