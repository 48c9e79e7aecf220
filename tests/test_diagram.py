"""The boundary diagram (issue 24): drawn from a finding's evidence, its labels are the finding's
own (carrier, lines, calls, steps, the line fixes[0] edits), in text and in SVG; the SVG is
self-contained, its labels readable (≥ 4.5:1) on its own background, and its size does not
depend on the graph. docs/boundary.md shows one picture per cause, each what its sample draws."""
from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import boundary_labels
import pytest

import manifest
from conftest import ROOT, run_explainer
from explainer.model import Finding
from explainer.render import diagram

BY_NAME = {s.name: s for s in manifest.samples() + manifest.real_cases()}
_spec = importlib.util.spec_from_file_location("draw_docs", ROOT / "scripts" / "draw_docs.py")
draw_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(draw_docs)
# The samples docs/boundary.md draws, one per cause with a boundary: carried across passes,
# shared within one pass, saved then changed in place by a step or by the user's own code,
# stored in a container, kept by retain_graph, freed by autograd.grad.
FAMILIES = list(draw_docs.PICTURES.values())


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


def test_a_statement_over_several_lines_is_drawn_on_one_without_its_comments(findings):
    finding = findings["rnn_hidden_chunks"]
    made_at = replace(finding.evidence.made_at, code="out, hidden = model(x,  # the state\n        hidden)")
    drawn = diagram.timeline(replace(finding, evidence=replace(finding.evidence, made_at=made_at)))
    assert f"{made_at.row}  out, hidden = model(x, hidden)  makes `hidden`" in re.sub(r" {2,}", "  ", diagram.text(drawn)[0])
    assert "the state" not in diagram.svg(drawn) and "out, hidden = model(x, hidden)</tspan>" in diagram.svg(drawn)


def test_a_long_statement_is_cut_so_that_what_it_did_stays_on_screen(findings):
    """A call written over thirteen lines (nf-soft-mining's render call, 300 characters) is drawn
    on one, with no space inside its brackets, as its first 71 characters and an ellipsis, so
    that the row stays near a terminal's width."""
    finding = findings["rnn_hidden_chunks"]
    arguments = ",\n".join(f"    argument_{i}=argument_{i}" for i in range(12))
    made_at = replace(finding.evidence.made_at, code=f"out, hidden = model(\n{arguments})")
    drawn = diagram.timeline(replace(finding, evidence=replace(finding.evidence, made_at=made_at)))
    first = diagram.text(drawn)[0]
    assert "out, hidden = model(argument_0=argument_0, argument_1=argument_1, argum…  makes `hidden`" in \
        re.sub(r" {2,}", "  ", first)
    assert len(first) < 110 and "argument_11" not in diagram.svg(drawn)
    assert diagram.size(drawn)[0] < 1000


def test_no_boundary_no_picture(findings):
    finding = findings["rnn_hidden_chunks"]
    assert diagram.timeline(replace(finding, kind="no-grad")) is None
    assert diagram.timeline(replace(finding, evidence=replace(finding.evidence, backward=None))) is None


def test_run_writes_the_errors_picture_with_svg(tmp_path):
    """`explainer run --svg OUT` draws the finding it writes to --json; a script that ran to
    its end with a growth warning, the warning's; a script with neither gets one line, and no
    file."""
    out = tmp_path / "boundary.svg"
    ran = run_explainer(BY_NAME["rnn_hidden_chunks"].path, tmp_path=tmp_path, svg=out)
    (data,) = ran.findings
    assert out.read_text() == diagram.svg(diagram.timeline(Finding.from_json(data))) + "\n"

    growing = tmp_path / "growing.svg"
    ran = run_explainer(BY_NAME["seed003_yest_retain_graph"].path, tmp_path=tmp_path, svg=growing)
    (data,) = ran.findings
    assert ran.returncode == 0 and data["kind"] == "graph-growth"
    assert growing.read_text() == diagram.svg(diagram.timeline(Finding.from_json(data))) + "\n"
    assert "goes through it all again" in growing.read_text()
    assert "<title>`Yest` keeps the graphs of earlier iterations" in growing.read_text()

    clean = tmp_path / "clean.py"
    clean.write_text("print('fine')\n")
    nothing = tmp_path / "nothing.svg"
    ran = run_explainer(clean, tmp_path=tmp_path, svg=nothing)
    assert ran.returncode == 0 and not nothing.exists()
    assert ran.stderr == \
        f"explainer: no explained error or growth warning to draw; --svg {str(nothing)!r} not written\n"


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


@pytest.mark.parametrize("code", draw_docs.PICTURES)
def test_the_docs_picture_is_what_its_sample_draws(findings, code):
    finding = findings[draw_docs.PICTURES[code]]
    assert finding.code == code
    drawn = draw_docs.picture(code).read_text() if draw_docs.picture(code).exists() else None
    assert drawn == diagram.svg(diagram.timeline(finding)) + "\n", "run scripts/draw_docs.py"


def test_the_docs_page_shows_every_picture_once():
    page = (ROOT / "docs" / "boundary.md").read_text()
    shown = re.findall(r"\]\(media/(boundary-BX\d{3}\.svg)\)", page)
    assert shown == [draw_docs.picture(code).name for code in draw_docs.PICTURES]
    assert sorted(p.name for p in draw_docs.MEDIA.glob("boundary-*.svg")) == sorted(shown)


MODEL = """\
import torch


class Tracker(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.GRUCell(3, 4)
        self.hidden = torch.zeros(2, 4)

    def forward(self, x):
        self.hidden = self.cell(x, self.hidden)
        return self.hidden.sum()
"""
TRAIN = """\
import torch
from model import Tracker

torch.manual_seed(0)
model = Tracker()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(2, 3))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_picture_across_two_files_names_the_file_of_each_line(tmp_path):
    """The state is carried in model.py, the loop is in train.py: line numbers alone would mix
    the two files, so each row gives its place."""
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "train.py").write_text(TRAIN)
    (data,) = run_explainer(tmp_path / "train.py", tmp_path=tmp_path, cwd=tmp_path).findings
    drawn = diagram.timeline(Finding.from_json(data))
    shown = re.sub(r" {2,}", "  ", "\n".join(diagram.text(drawn)))
    svg_rows = ["  ".join(t.strip() for t in e.itertext() if t.strip())
                for e in ET.fromstring(diagram.svg(drawn)).iter() if e.tag.endswith("text")]
    for label in ("model.py:11  self.hidden = self.cell(x, self.hidden)", "train.py:10  loss.backward()",
                  "train.py:11  optimizer.step()"):
        assert label in shown and any(label in row for row in svg_rows), (label, shown)
    assert boundary_labels.missing(data) == []


def test_a_hover_draws_a_cells_picture_only_when_its_calls_are_in_that_cell(findings):
    """A runtime finding moved onto a notebook cell keeps, for calls in other cells, the
    kernel's file name, which means nothing in the editor: no picture then."""
    from explainer import editor

    finding = replace(findings["rnn_hidden_chunks"], filename="notebook.ipynb", cell=2, origin="runtime")
    evidence = finding.evidence
    in_cell = replace(finding, evidence=replace(evidence, made_at=replace(evidence.made_at, filename="notebook.ipynb"),
                                                backward=replace(evidence.backward, filename="notebook.ipynb"),
                                                freed_by=replace(evidence.freed_by, filename="notebook.ipynb"),
                                                steps=tuple(replace(s, filename="notebook.ipynb") for s in evidence.steps)))
    assert "```text" in editor.hover_markdown(in_cell)
    across = replace(in_cell, evidence=replace(in_cell.evidence, backward=replace(
        evidence.backward, filename="/tmp/ipykernel_1/4242.py")))
    assert "```text" not in editor.hover_markdown(across) and "**Fix**" in editor.hover_markdown(across)


def test_a_change_by_your_own_code_is_drawn_after_the_line_that_saved_it(findings):
    """BX011: the finding's `made_at` is the in-place change; the line whose operation saved
    the tensor comes first (MoCo's queue, read by an einsum, then written by the enqueue)."""
    lines = [re.sub(r" {2,}", "  ", line) for line in diagram.text(diagram.timeline(findings["real/moco_queue_no_clone"]))]
    assert lines[0].endswith("43  l_neg = torch.einsum('nc,ck->nk', [q, self.queue])  saves `self.queue` for backward")
    assert lines[1].endswith("33  self.queue[:, ptr:ptr + batch_size] = keys.T  changes it in place")
