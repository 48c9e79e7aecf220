"""Every sample through `python -m explainer run --json`: the right kind, culprit and line, and
`fixes[0]` applied to the script makes it run clean. Fixed twins and clean scripts give nothing."""
from __future__ import annotations

import shutil

import pytest

import manifest
from _device import DEVICE
from explainer.fixes.edits import apply_edits
from explainer.model import Finding, Fix

BUGGY = [s for s in manifest.samples() if s.kind != "none"]
CLEAN = [s for s in manifest.samples() if s.kind == "none"]
TWINS = [s for s in manifest.samples() if s.fixed is not None]


def test_there_are_enough_samples():
    assert len(BUGGY) >= 20 and len(TWINS) == len(BUGGY)


@pytest.mark.parametrize("sample", BUGGY, ids=lambda s: s.name)
def test_buggy_sample_is_explained_and_fixes_0_runs_clean(sample, explain_run, tmp_path):
    run = explain_run(sample.path)
    if sample.kind == "graph-growth":
        assert run.returncode == 0, run.stderr
    else:
        assert run.returncode == 1
    assert len(run.findings) == 1, run.stderr
    finding = run.findings[0]
    assert finding["kind"] == sample.kind
    culprit = finding["culprits"][0]
    assert culprit["name"] == sample.culprit_on(DEVICE.type)
    assert culprit["location"]["row"] == sample.culprit_row
    assert culprit["filename"] == str(sample.path)
    assert "[explainer]" in run.stderr
    # The JSON is the Finding, whole: an editor reading it back gets the same facts and sentences.
    assert Finding.from_json(finding).to_json() == finding

    fix = finding["fixes"][0]
    assert fix["applicability"] == "safe"
    assert {e["filename"] for e in fix["edits"]} == {str(sample.path)}
    patched = tmp_path / "patched" / sample.path.name
    patched.parent.mkdir()
    shutil.copy(sample.path.parent / "_device.py", patched.parent)
    patched.write_text(apply_edits(sample.path.read_text(), Fix.from_json(fix).edits))
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


@pytest.mark.parametrize("sample", TWINS, ids=lambda s: s.name)
def test_fixed_twin_runs_clean(sample, explain_run):
    run = explain_run(sample.fixed)
    assert (run.returncode, run.findings) == (0, []), run.stderr


@pytest.mark.parametrize("sample", CLEAN, ids=lambda s: s.name)
def test_clean_seed_scenario_gives_no_finding(sample, explain_run):
    run = explain_run(sample.path)
    assert (run.returncode, run.findings) == (0, []), run.stderr
