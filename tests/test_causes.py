"""The cause catalog: its docs pages are in sync, every cause's Example has the bug and its Use
instead does not (run through the checker, or, for the causes only a run can see, run under the
explainer), each rule's VALID and INVALID cases hold, and every message renders."""
from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from conftest import run_explainer
from explainer import causes
from explainer.causes.cause import DOCS
from explainer.fixes.edits import apply_edits
from explainer.model import CallSite, Evidence, Finding, Location
from explainer.static.check import check_paths, check_text
from explainer.static.rules import BY_CODE as RULES

STATIC = [c for c in causes.CAUSES if not c.runtime_only and not c.parse_error]
PARSE_ERRORS = [c for c in causes.CAUSES if c.parse_error]
RUNTIME_ONLY = [c for c in causes.CAUSES if c.runtime_only]


def test_every_cause_has_its_docs_page_in_sync():
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(f"{c.code}.md" for c in causes.CAUSES)
    for cause in causes.CAUSES:
        page = (DOCS / f"{cause.code}.md").read_text()
        assert page == cause.doc_page(), f"run scripts/write_docs.py ({cause.code} is out of date)"
        for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert heading in page


def test_every_cause_the_checker_can_see_has_its_rule_and_the_others_none():
    assert sorted(RULES) == [c.code for c in STATIC]


def codes(text: str) -> list[str]:
    return [f.code for f in check_text(textwrap.dedent(text), "example.py")]


@pytest.mark.parametrize("cause", STATIC, ids=lambda c: c.code)
def test_the_example_is_flagged_and_its_use_instead_is_not(cause):
    assert cause.code in codes(cause.example), cause.example
    assert cause.code not in codes(cause.use_instead), cause.use_instead


INVALID = [(code, case) for code, rule in sorted(RULES.items()) for case in rule.INVALID]
VALID = [(code, case) for code, rule in sorted(RULES.items()) for case in rule.VALID]


@pytest.mark.parametrize("code, case", INVALID, ids=[f"{code}: {case.name}" for code, case in INVALID])
def test_an_invalid_case_is_flagged_once_and_its_fix_silences_it(code, case):
    text = textwrap.dedent(case.code)
    found = [f for f in check_text(text, "invalid.py") if f.code == code]
    assert len(found) == 1 and found[0].fix is not None, [(f.code, f.location.row) for f in found]
    patched = apply_edits(text, found[0].fix.edits)
    compile(patched, case.name, "exec")
    assert not [f for f in check_text(patched, "invalid.py") if f.code == code]


@pytest.mark.parametrize("code, case", VALID, ids=[f"{code}: {case.name}" for code, case in VALID])
def test_a_valid_case_is_silent(code, case):
    assert check_text(textwrap.dedent(case.code), "valid.py") == []


@pytest.mark.parametrize("cause", PARSE_ERRORS, ids=lambda c: c.code)
def test_code_that_does_not_parse_is_reported_by_check_and_its_use_instead_is_not(cause, tmp_path):
    example, fixed = tmp_path / "example.py", tmp_path / "use_instead.py"
    example.write_text(cause.example + "\n")
    fixed.write_text(cause.use_instead + "\n")
    assert [d.code for d in check_paths([str(example)]).diagnostics] == [cause.code]
    assert check_paths([str(fixed)]).diagnostics == []


@pytest.mark.parametrize("cause", RUNTIME_ONLY, ids=lambda c: c.code)
def test_a_runtime_only_example_is_explained_with_its_code_and_its_use_instead_runs(cause, tmp_path):
    example, fixed = tmp_path / "example.py", tmp_path / "use_instead.py"
    example.write_text(cause.example + "\n")
    fixed.write_text(cause.use_instead + "\n")
    ran = run_explainer(example, tmp_path=tmp_path)
    assert ran.returncode == 1 and [f["code"] for f in ran.findings] == [cause.code], ran.stderr
    clean = run_explainer(fixed, tmp_path=tmp_path)
    assert (clean.returncode, clean.findings) == (0, []), clean.stderr


# Every field a template may name, as an analysis or a rule fills it.
FACTS = {"value": "new_h", "term": "loss", "backpropagated": True, "call": "h.detach()", "iterable": "hidden",
         "owner": "loop", "loop_row": 7, "repeat": "pass", "function": "predict", "decorator": "torch.no_grad()",
         "decorator_row": 3, "loss": "loss", "cut": "`.detach()`", "graph": "loss", "grad_call": "torch.autograd.grad(l, x)",
         "api": "grad", "change": "h += 1", "saver": "relu", "built": "q", "manual": False, "expected_version": 0,
         "version": 1, "graph_nodes": 20000, "kept": "buffer.items.log_probs", "via": "buffer.add(samples)",
         "via_row": 8, "read": 4, "module": "self.layer", "caller": "loss = closure()", "caller_row": 12,
         "grad_off": "`@torch.no_grad()` on `step`", "made": "self.fake_B", "detached_row": 6, "plain_rows": "7",
         "error": "invalid syntax", "method": "meter.update", "consumer": "finish_episode",
         "switch": "torch.set_grad_enabled(False)", "switch_file": "/w/train.py", "switch_row": 4,
         "switch_function": "evaluate", "iterations": 3, "kept_aside": True, "freeze": "for p in gen.parameters():",
         "freeze_row": 3, "unfreeze_row": 9, "attribute": "features", "holder_class": "SaveFeatures",
         "alias": "path", "helper": "detach_to_cpu", "helper_cut": "x.detach()", "helper_row": 70,
         "output": "out", "output_row": 5,
         "factory": "torch.tensor", "copies": 6, "called": "my_seq", "enable": "torch.enable_grad()", "enable_row": 14,
         "copy": "torch.tensor(losses)", "sequence": "losses", "input": "w", "made_by": "loss.backward()",
         "callback": "dynamics_func"}


def evidence(**changes) -> Evidence:
    site = CallSite("/w/train.py", 9, "loss.backward()")
    full = Evidence("hidden", CallSite("/w/train.py", 5, "h = f(h)"), site, CallSite("/w/train.py", 9, "loss.backward()"),
                    (CallSite("/w/train.py", 8, "opt.step()"),), "grows", tuple(FACTS.items()))
    return replace(full, **changes)


@pytest.mark.parametrize("cause", causes.CAUSES, ids=lambda c: c.code)
def test_every_message_renders_from_the_evidence(cause):
    for variant, message in cause.messages.items():
        finding = Finding(cause.code, variant, "/w/train.py", Location(5, 1), Location(5, 2), evidence())
        assert finding.message and "{" not in finding.message, variant
        assert finding.summary and "{" not in finding.summary, variant
        for index in range(len(message.roles)):
            assert causes.role_of(cause.code, variant, index, finding.evidence)
    for advice in causes.ADVICE:
        assert "{" not in causes.advice_of(Finding("BX001", "itself", "", Location(1, 1), Location(1, 1),
                                                evidence(advice=advice)))


def test_a_finding_says_nothing_twice():
    """The message is the explanation; the fix and the retain_graph advice are said once, by
    whatever renders the finding (the README's example once showed the fix twice)."""
    for cause in causes.CAUSES:
        for variant, message in cause.messages.items():
            for text in (message.detail, message.summary):
                assert "Fix:" not in text and not any(advice[:40] in text for advice in causes.ADVICE.values()), \
                    (cause.code, variant)
