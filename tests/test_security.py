"""Nothing runs that shouldn't. A hostile workspace holds modules that write a marker file when
imported: ones named like the tool's own packages and dependencies (`lsp_server`, `explainer`,
`pygls`, `jedi`), `gi` (which jedi would import for real by default), and the user's own `models`
that the training script imports. The checker, the language server as each editor starts it,
jedi and `explainer run` are run in it; no marker may appear. A control run (`python -m
lsp_server` from the workspace) shows a marker does appear when workspace code runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_wire import WireClient

from explainer import editor, handoff
from explainer.model import CallSite, Culprit, Edit, Evidence, Finding, Fix, Location
from lsp_server.jupyterlab import spec

BIN = Path(sys.executable).parent
HOSTILE = ["lsp_server/__init__.py", "lsp_server/__main__.py", "explainer/__init__.py", "explainer/__main__.py",
           "pygls/__init__.py", "jedi/__init__.py", "gi/__init__.py", "lsprotocol/__init__.py", "models.py"]
TRAIN = """\
import torch
from gi import make_head
from models import make_model

model = make_model()
head = make_head()
hidden = torch.zeros(1, 4)
for step in range(3):
    hidden = model(hidden)
    head(hidden).sum().backward()
"""


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = tmp_path / "hostile"
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in HOSTILE:
        module = root / name
        module.parent.mkdir(parents=True, exist_ok=True)
        tag = name.replace("/", ".")
        module.write_text(f"open({str(markers / tag)!r}, 'w').write('imported')\n"
                          "import torch\n\n"
                          "class Net(torch.nn.Module):\n    pass\n\n"
                          "def make_model():\n    return Net()\n\n"
                          "def make_head():\n    return Net()\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'hostile'\n")
    (root / "train.py").write_text(TRAIN)
    return root


def markers(workspace: Path) -> list[str]:
    return sorted(p.name for p in (workspace.parent / "markers").iterdir())


def served_diagnostics(command: list[str], workspace: Path) -> list[str]:
    """Start the server as `command` in `workspace`, open train.py, and return the codes it
    publishes (after a hover and a code action too, which run more of the server)."""
    client = WireClient(command, cwd=workspace)
    try:
        client.initialize(workspace.as_uri())
        uri = (workspace / "train.py").as_uri()
        client.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": TRAIN}}})
        found = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                                and m["params"]["uri"] == uri, timeout=60)
        assert found is not None, "the server published nothing"
        at = {"line": 8, "character": 4}
        assert client.request(10, "textDocument/hover", {"textDocument": {"uri": uri}, "position": at}) is not None
        assert client.request(11, "textDocument/codeAction", {"textDocument": {"uri": uri}, "range": {
            "start": at, "end": at}, "context": {"diagnostics": []}}) is not None
        return [d["code"] for d in found[1]["params"]["diagnostics"]]
    finally:
        client.close()


def test_control_python_m_from_the_workspace_runs_workspace_code(workspace):
    # Why no front-end starts the server with `python -m lsp_server` in the workspace: this
    # is what the markers catch.
    subprocess.run([sys.executable, "-m", "lsp_server", "--help"], cwd=workspace, capture_output=True, timeout=60)
    assert markers(workspace) == ["lsp_server.__init__.py", "lsp_server.__main__.py"]


def test_checker_imports_and_runs_nothing_from_the_workspace(workspace):
    checked = subprocess.run([str(BIN / "explainer"), "check", ".", "--format", "json"], cwd=workspace,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1, checked.stderr
    codes = [d["code"] for d in json.loads(checked.stdout)]
    assert "BX001" in codes
    assert markers(workspace) == []


@pytest.mark.parametrize("launcher", ["console-script", "jupyterlab-spec"])
def test_language_server_imports_and_runs_nothing_from_the_workspace(workspace, launcher, monkeypatch):
    # Neovim, Emacs and Helix start `backward-explainer-lsp` (docs/editors.md); JupyterLab uses
    # the spec's argv (offered once the user opts in); VS Code runs `python -m lsp_server` from
    # the extension's own folder (vscode-client/src/interpreter.ts serverCommand), which the e2e
    # test runs for real.
    monkeypatch.setenv("BACKWARD_EXPLAINER_JUPYTERLAB", "1")
    command = [str(BIN / "backward-explainer-lsp")] if launcher == "console-script" \
        else spec(None)["backward-explainer"]["argv"]
    assert "BX001" in served_diagnostics(command, workspace)
    assert markers(workspace) == []


def test_jedi_answers_from_source_without_subprocesses_or_imports(workspace, monkeypatch):
    from explainer.reading import jedi_types

    jedi_types._call_gives_module.cache_clear()
    spawned = []
    original = subprocess.Popen.__init__

    def record(self, args, *rest, **kwargs):
        spawned.append(args)
        return original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    before = set(sys.modules)
    train = str(workspace / "train.py")
    assert jedi_types._call_gives_module(train, "from models import make_model", "make_model") is True
    assert jedi_types._call_gives_module(train, "from gi import make_head", "make_head") is True
    # Only jedi, parso and the standard library they use: nothing installed (torch) or local.
    site_packages = Path(jedi_types._jedi().__file__).parent.parent
    loaded = [(name, getattr(sys.modules[name], "__file__", None) or "") for name in set(sys.modules) - before]
    outside_stdlib = {name.split(".")[0] for name, file in loaded
                      if file.startswith((str(site_packages), str(workspace)))}
    assert outside_stdlib <= {"jedi", "parso"}, outside_stdlib
    assert spawned == []
    assert markers(workspace) == []
    jedi = jedi_types._jedi()
    assert jedi.settings.auto_import_modules == []
    assert jedi_types._project(str(workspace))._load_unsafe_extensions is False


def test_explainer_run_executes_only_the_named_script(workspace):
    script = workspace / "run_me.py"
    script.write_text("import torch\n"
                      "w = torch.ones(2, requires_grad=True)\n"
                      "loss = (w * 2).sum()\n"
                      "loss.backward()\n"
                      "loss.backward()\n")
    ran = subprocess.run([str(BIN / "explainer"), "run", "run_me.py"], cwd=workspace, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "EXPLAINER_HANDOFF": "1"})
    assert ran.returncode == 1 and "second-backward" in ran.stderr, ran.stderr[-2000:]
    assert markers(workspace) == []


def entry_naming(culprit_file: str, edit_file: str) -> dict:
    """A findings-file entry as `explainer run` writes it, naming these files."""
    backward = CallSite(culprit_file, 10, "loss.backward()")
    edit = Edit(edit_file, "hidden.detach()", Location(9, 20), Location(9, 26))
    finding = Finding("BX001", "run-carried", culprit_file, Location(9, 5), Location(9, 11),
                      Evidence("hidden", backward=backward, freed_by=backward, advice="grows"),
                      (Fix("detach", (edit,)),),
                      (Culprit("hidden", culprit_file, Location(9, 5), "carried", "    hidden = model(hidden)"),),
                      kind="second-backward", origin="runtime")
    return {"run": "train.py", "written": 0, "cells": {}, "findings": [finding.to_json()]}


def test_findings_file_naming_files_outside_the_workspace_is_rejected(workspace, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(TRAIN)
    (workspace / "link.py").symlink_to(outside)
    inside = str(workspace / "train.py")
    entries = [entry_naming(inside, inside), entry_naming("train.py", "train.py"),
               entry_naming(str(outside), str(outside)), entry_naming(inside, str(outside)),
               entry_naming(inside, "../outside.py"), entry_naming("../outside.py", inside),
               entry_naming(str(workspace / "link.py"), str(workspace / "link.py")),
               entry_naming(inside, "/etc/passwd"), entry_naming("", inside)]
    findings = workspace / handoff.FILE
    findings.parent.mkdir()
    findings.write_text(json.dumps({"version": handoff.VERSION, "entries": entries}))
    kept = handoff.read(findings)
    assert [e.findings[0].culprits[0].filename for e in kept] == [inside, "train.py"]
    # What the editor shows for the outside file: nothing, so no quick fix can edit it.
    assert editor.runtime_findings(handoff.read(findings), str(outside), TRAIN) == []
    assert len(editor.runtime_findings(kept, inside, TRAIN)) == 1


def broken(change) -> dict:
    """A well-formed findings file, `change`d in one place."""
    entry = entry_naming("train.py", "train.py")
    change(entry["findings"][0])
    return {"entries": [entry]}


@pytest.mark.parametrize("broken", [
    broken(lambda f: f.update(kind=1)), broken(lambda f: f.update(code="BX999")),
    broken(lambda f: f.update(variant="no-such-message")),
    broken(lambda f: f["culprits"][0].update(location={"row": "9"})),
    broken(lambda f: f["fixes"][0].update(edits="x")),
    broken(lambda f: f["evidence"].update(facts={"value": [1, 2]})),
    broken(lambda f: f["evidence"].update(advice="whatever")),
    {"entries": [{"findings": "x"}]}, {"entries": {"a": 1}}, ["entries"], "null",
])
def test_malformed_findings_are_dropped_and_the_server_keeps_checking(workspace, broken):
    findings = workspace / handoff.FILE
    findings.parent.mkdir()
    findings.write_text(broken if isinstance(broken, str) else json.dumps(broken))
    assert handoff.read(findings) == []
    assert "BX001" in served_diagnostics([str(BIN / "backward-explainer-lsp")], workspace)
