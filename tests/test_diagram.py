"""The boundary diagram (issue 24, first slice): drawn from a finding's evidence, its labels are
the finding's own (carrier, lines, calls, steps, the line fixes[0] edits), in text and in SVG; the SVG
is self-contained, its labels readable (≥ 4.5:1) on its own background, and its size does not
depend on the graph."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

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


def _labels(finding: Finding) -> list[str]:
    """What the picture must show, read from the finding's JSON."""
    evidence = finding.to_json()["evidence"]
    sites = [evidence["made_at"], evidence["freed_by"], *evidence["steps"], evidence["backward"]]
    labels = [f"`{evidence['carrier']}`"]
    labels += [f"{site['row']}  {site['code']}" for site in sites if site is not None]
    first_fix = finding.to_json()["fixes"][0]
    labels.append(f"{min(e['location']['row'] for e in first_fix['edits'])}  edits here")
    return labels


@pytest.mark.parametrize("name", FAMILIES)
def test_the_text_diagram_shows_the_findings_labels(findings, name):
    finding = findings[name]
    drawn = "\n".join(diagram.text(diagram.timeline(finding)))
    squeezed = re.sub(r" {2,}", "  ", drawn)
    for label in _labels(finding):
        assert label in squeezed, (label, drawn)
    assert len(drawn.splitlines()) <= 8


@pytest.mark.parametrize("name", FAMILIES)
def test_the_svg_diagram_shows_the_findings_labels_readably(findings, name):
    finding = findings[name]
    picture = diagram.svg(diagram.timeline(finding))
    root = ET.fromstring(picture)
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("style", "script", "foreignObject")]
    texts = [e for e in root.iter() if e.tag.endswith("text")]
    shown = ["".join(e.itertext()) for e in texts]
    for label in _labels(finding):
        assert any(label in s for s in shown), (label, shown)
    for element in texts:
        assert _contrast(element.get("fill"), diagram.BACKGROUND) >= 4.5, element.get("fill")
        assert _contrast(element.get("fill"), diagram.FREED_FILL) >= 4.5, element.get("fill")


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


def _contrast(first: str, second: str) -> float:
    def luminance(colour: str) -> float:
        channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


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
