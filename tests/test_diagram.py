"""The boundary diagram (issue 24, first slice): drawn from a finding's evidence, its labels are
the finding's own (carrier, lines, calls, steps, the line fixes[0] edits), in text and in SVG; the SVG
is self-contained, its labels readable (≥ 4.5:1) on its own background, and its size does not
depend on the graph."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import boundary_labels
import pytest

import manifest
from conftest import run_explainer
from explainer.model import Finding
from explainer.render import diagram

BY_NAME = {s.name: s for s in manifest.samples() + manifest.real_cases()}
# One sample per family of the boundary: carried across passes, shared within one pass, saved
# then changed in place by a step, stored in a container.
FAMILIES = ["rnn_hidden_chunks", "gan_fake_reuse", "seed002_ex1_hidden_layer", "past_states_list"]


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> dict[str, Finding]:
    folder = tmp_path_factory.mktemp("diagram")
    found = {}
    for name in FAMILIES:
        (data,) = run_explainer(BY_NAME[name].path, tmp_path=folder).findings
        found[name] = Finding.from_json(data)
    return found


@pytest.mark.parametrize("name", FAMILIES)
def test_the_drawings_show_the_findings_labels(findings, name):
    data = findings[name].to_json()
    assert len(boundary_labels.labels(data)) >= 4 and boundary_labels.missing(data) == []
    assert len(diagram.text(diagram.timeline(findings[name]))) <= 8


@pytest.mark.parametrize("name", FAMILIES)
def test_the_svg_is_self_contained_and_its_labels_readable(findings, name):
    root = ET.fromstring(diagram.svg(diagram.timeline(findings[name])))
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("style", "script", "foreignObject")]
    texts = [e for e in root.iter() if e.tag.endswith("text")]
    assert texts
    for element in texts:
        assert boundary_labels.contrast(element.get("fill"), diagram.BACKGROUND) >= 4.5, element.get("fill")
        assert boundary_labels.contrast(element.get("fill"), diagram.FREED_FILL) >= 4.5, element.get("fill")


def test_a_drawing_that_is_not_the_findings_is_caught(findings):
    """The label check can fail: a picture drawn with the backward one line off misses it."""
    finding = findings["gan_fake_reuse"]  # its backward's line is no other call's
    backward = finding.evidence.backward
    shifted = replace(finding, evidence=replace(finding.evidence, backward=replace(backward, row=backward.row + 1)))
    assert boundary_labels.missing(finding.to_json(), shifted) == [f"text: {backward.row}  {backward.code}",
                                                                   f"svg: {backward.row}  {backward.code}"]


def test_the_picture_does_not_grow_with_the_graph(findings):
    """Only the evidence is drawn: a finding with the same evidence and a 10^6-node graph fact
    gives the same picture."""
    finding = findings["rnn_hidden_chunks"]
    large = replace(finding, evidence=replace(finding.evidence, facts=(("graph_nodes", 10**6),)))
    assert diagram.svg(diagram.timeline(large)) == diagram.svg(diagram.timeline(finding))


def test_no_boundary_no_picture(findings):
    finding = findings["rnn_hidden_chunks"]
    assert diagram.timeline(replace(finding, kind="no-grad")) is None
    assert diagram.timeline(replace(finding, evidence=replace(finding.evidence, backward=None))) is None


def test_run_writes_the_errors_picture_with_svg(tmp_path):
    """`explainer run --svg OUT` draws the finding it writes to --json; a script with no
    explained error gets one line, and no file."""
    out = tmp_path / "boundary.svg"
    ran = run_explainer(BY_NAME["rnn_hidden_chunks"].path, tmp_path=tmp_path, svg=out)
    (data,) = ran.findings
    assert out.read_text() == diagram.svg(diagram.timeline(Finding.from_json(data))) + "\n"

    clean = tmp_path / "clean.py"
    clean.write_text("print('fine')\n")
    nothing = tmp_path / "nothing.svg"
    ran = run_explainer(clean, tmp_path=tmp_path, svg=nothing)
    assert ran.returncode == 0 and not nothing.exists()
    assert ran.stderr == f"explainer: no explained error to draw; --svg {str(nothing)!r} not written\n"


def test_an_unwritable_svg_is_refused_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w')\n")
    ran = run_explainer(script, tmp_path=tmp_path, svg=tmp_path / "missing" / "out.svg")
    assert ran.returncode == 2 and not marker.exists() and ran.findings == []
    assert ran.stderr.startswith("explainer: can't write --svg ") and ran.stderr.count("\n") == 1


def test_the_note_and_the_rich_panel_show_the_timeline(findings):
    import io

    from explainer.render.terminal import render_rich
    from explainer.render.text import render_note

    finding = findings["gan_fake_reuse"]
    lines = diagram.text(diagram.timeline(finding))
    assert "\n".join(lines) in render_note(finding)
    rich = io.StringIO()
    render_rich(finding, rich)
    shown = rich.getvalue()
    assert all(line.strip() in shown for line in lines), shown
