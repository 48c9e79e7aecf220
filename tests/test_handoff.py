"""explainer.handoff: one entry per run in the project's .explainer/findings.json, replaced by
the next explanation, removed by a clean run, never breaking the run."""
from __future__ import annotations

import json

from explainer import handoff
from explainer.model import CallSite, Culprit, Evidence, Finding, Location


def finding(name: str, filename: str) -> Finding:
    backward = CallSite(filename, 4, "loss.backward()")
    return Finding("BX001", "run-carried", filename, Location(3, 5), Location(3, 5 + len(name)),
                   Evidence(name, backward=backward, freed_by=backward, advice="grows"),
                   culprits=(Culprit(name, filename, Location(3, 5), "carried", "h = rnn(x, h)"),),
                   kind="second-backward", origin="runtime")


def test_entries_are_replaced_per_run_and_removed_by_a_clean_run(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_HANDOFF", "1")
    (tmp_path / ".git").mkdir()
    (tmp_path / "pkg").mkdir()
    script = tmp_path / "pkg" / "train.py"
    script.write_text("h = rnn(x, h)\n")
    path = handoff.publish(str(script), [finding("h", str(script))], where=script.parent)
    assert path == tmp_path / ".explainer" / "findings.json"  # the project's root, not the script's folder
    assert (tmp_path / ".explainer" / ".gitignore").read_text() == "*\n"
    handoff.publish("other", [finding("g", str(script))], where=script.parent)
    handoff.publish(str(script), [finding("state", str(script))], where=script.parent)
    entries = handoff.read(path)
    assert sorted(e.run for e in entries) == sorted(["other", str(script)])
    mine = next(e for e in entries if e.run == str(script))
    assert mine.findings[0].culprits[0].name == "state"
    assert mine.findings[0].culprits[0].source_line == "h = rnn(x, h)"
    # What is read back is the finding that was written: the same facts, the same sentences.
    assert mine.findings == (finding("state", str(script)),)
    assert mine.findings[0].message == finding("state", str(script)).message
    handoff.publish(str(script), [], where=script.parent)
    assert [e.run for e in handoff.read(path)] == ["other"]


def test_relative_culprit_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_HANDOFF", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("h = rnn(x, h)\n")
    path = handoff.publish("train.py", [finding("h", "train.py")])
    (entry,) = handoff.read(path)
    assert entry.findings[0].culprits[0].filename == str(tmp_path / "train.py")
    assert entry.findings[0].filename == str(tmp_path / "train.py")


def test_turned_off_or_failing_it_costs_nothing_or_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EXPLAINER_HANDOFF", "0")
    assert handoff.publish("run", [finding("h", "x.py")], where=tmp_path) is None
    assert not (tmp_path / ".explainer").exists()
    monkeypatch.setenv("EXPLAINER_HANDOFF", "1")
    (tmp_path / ".explainer").write_text("a file where the folder should be")
    assert handoff.publish("run", [finding("h", "x.py")], where=tmp_path) is None
    err = capsys.readouterr().err
    assert err.startswith("[explainer] could not hand the findings to the editor") and err.count("\n") == 1


def test_a_damaged_findings_file_reads_as_empty_and_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_HANDOFF", "1")
    (tmp_path / ".explainer").mkdir()
    damaged = tmp_path / ".explainer" / "findings.json"
    damaged.write_text("{not json")
    assert handoff.read(damaged) == []
    handoff.publish("run", [finding("h", "x.py")], where=tmp_path)
    assert json.loads(damaged.read_text())["entries"][0]["run"] == "run"
