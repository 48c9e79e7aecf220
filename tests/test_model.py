"""The data model: one Finding for both engines; its JSON forms, and reading one back."""
from __future__ import annotations

import json

import pytest

from explainer.model import CallSite, Culprit, Edit, Evidence, Finding, Fix, Location, MalformedFinding
from explainer.static.check import check_text

CARRIED = """\
import torch
rnn = torch.nn.RNNCell(3, 4)
hidden = torch.zeros(1, 4)
for step in range(3):
    hidden = rnn(torch.randn(1, 3), hidden)
    hidden.sum().backward()
"""


def runtime_finding() -> Finding:
    backward = CallSite("/w/train.py", 6, "hidden.sum().backward()")
    return Finding("BX001", "run-carried", "/w/train.py", Location(5, 5), Location(5, 11),
                   Evidence("hidden", CallSite("/w/train.py", 5, "hidden = rnn(x, hidden)"), backward, backward,
                            advice="grows", facts=(("repeat", "iteration"),)),
                   (Fix("Detach `hidden`", (Edit("/w/train.py", "hidden.detach()", Location(5, 30), Location(5, 36)),)),),
                   (Culprit("hidden", "/w/train.py", Location(5, 5), "carried across iterations", "hidden = rnn(x, hidden)"),),
                   kind="second-backward", origin="runtime")


def test_a_checker_finding_in_ruffs_shape():
    (found,) = check_text(CARRIED, "train.py")
    data = found.to_check_json()
    assert list(data) == ["code", "message", "filename", "location", "end_location", "fix", "url"]
    assert data["fix"]["edits"][0].keys() == {"content", "location", "end_location"}  # the file is the finding's
    assert Fix.from_json(data["fix"], "train.py") == found.fix
    assert found.origin == "static" and found.kind is None and found.evidence.carrier == "hidden"


def test_a_runtime_finding_round_trips_through_its_json():
    finding = runtime_finding()
    data = json.loads(json.dumps(finding.to_json()))
    assert Finding.from_json(data) == finding
    # The contract's fields, then the added ones.
    assert list(data)[:11] == ["kind", "severity", "message", "culprits", "fixes", "summary", "confidence", "backward",
                               "freed_by", "steps", "retain_graph_advice"]
    assert data["message"] == finding.message and "Fix:" not in data["message"]
    assert data["retain_graph_advice"].startswith("Don't add retain_graph=True")


@pytest.mark.parametrize("damage, where", [
    (lambda d: d.update(code="BX999"), "finding: expected a code and a variant"),
    (lambda d: d.update(kind="oops"), "finding: expected a kind"),
    (lambda d: d["fixes"][0]["edits"][0].update(location={"row": 1}), "fixes[0].edits[0].location: expected"),
    (lambda d: d["culprits"][0].update(filename=None), "culprits[0]: expected a culprit"),
    (lambda d: d["evidence"].update(steps="no"), "evidence: expected"),
    (lambda d: d["evidence"]["backward"].update(row="6"), "evidence.backward: expected a call site"),
])
def test_malformed_json_is_refused_saying_where(damage, where):
    data = runtime_finding().to_json()
    damage(data)
    with pytest.raises(MalformedFinding) as raised:
        Finding.from_json(data)
    assert str(raised.value).startswith(where) and "\n" not in str(raised.value)


def test_a_fix_preview_is_a_diff_with_context_at_the_edits_true_places(tmp_path):
    """actor_critic_step's recompute goes after `critic_opt.step()`: the preview once showed it
    under the first edit's line, before the step, with no line around it."""
    from explainer.model import Edit, Fix, Location
    from explainer.render.text import fix_preview

    script = tmp_path / "ac.py"
    script.write_text("for s in states:\n    opt.zero_grad()\n    loss.backward(retain_graph=True)\n"
                      "    opt.step()\n    log(loss)\n    log(s)\n    actor_opt.zero_grad()\n    actor_loss.backward()\n")
    fix = Fix("recompute", (
        Edit(str(script), "loss.backward()", Location(3, 5), Location(3, 37)),
        Edit(str(script), "    q = critic(s)\n", Location(8, 1), Location(8, 1))))
    assert fix_preview(fix) == [
        "ac.py:3",
        "      opt.zero_grad()",
        "-     loss.backward(retain_graph=True)",
        "+     loss.backward()",
        "      opt.step()",
        "ac.py:8",
        "      actor_opt.zero_grad()",
        "+     q = critic(s)",
        "      actor_loss.backward()",
    ]


def test_every_renderer_says_which_fixes_are_not_proven_safe():
    """An unsafe alternative (MAML's detach of the fast weights crashes in autograd.grad) is
    named as such wherever the finding is shown, not only in the JSON and the editors."""
    import dataclasses
    import io

    from explainer.render.html import render_html
    from explainer.render.terminal import render_rich
    from explainer.render.text import render_note

    finding = runtime_finding()
    safe = finding.fixes[0]
    finding = dataclasses.replace(finding, fixes=(safe, Fix("Detach it where the loop starts", safe.edits, "unsafe")))
    marked = "Or (unsafe: it may change what trains): Detach it where the loop starts"
    note = render_note(finding)
    assert marked in note and "Fix: Detach `hidden`" in note
    assert marked in render_html(finding)
    rich = io.StringIO()
    render_rich(dataclasses.replace(finding, fixes=(safe.unproven(),)), rich)
    assert "Fix (unsafe: it may change what trains): Detach `hidden`" in " ".join(rich.getvalue().split())
