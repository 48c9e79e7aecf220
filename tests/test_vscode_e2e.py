"""The extension in a real VS Code: code-server (VS Code in a browser) with the packaged .vsix,
driven by Playwright in Debian's chromium (tests/editors/vscode_drive.py).

- The diagnostic shows in the Problems panel at the sample's culprit line with its squiggle, and
  the quick fix (Ctrl+.) changes the text and clears it; the same in a notebook built from the
  sample, where the problem is on the loop cell's own line. With the default settings, in the
  project's environment and with a bare Python (where the server bundled in the .vsix runs, and
  pip never does).
- Hovering a culprit that `explainer run` explained shows where its history crossed the
  boundary, as a code block, in the light and dark themes.
- In restricted mode (the user answers "No" to the workspace-trust prompt) an interpreter that
  the workspace's own settings name is never launched, and the checks still run with the user's;
  once the folder is trusted, that interpreter is used.

Screenshots land in benchmarks/results/vscode-e2e/."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys

import boundary_labels
import pytest

import manifest
from conftest import ROOT, free_port, wait_until_serving
from kernel_session import NOTEBOOK_PICTURE_ALT, explained_notebook

CLIENT = ROOT / "vscode-client"
SHOTS = ROOT / "benchmarks" / "results" / "vscode-e2e"
SAMPLE = {s.name: s for s in manifest.samples()}["rnn_hidden_chunks"]
pytestmark = pytest.mark.skipif(shutil.which("npm") is None or os.geteuid() != 0,
                                reason="needs npm, and root for apt (scripts/vscode_e2e_setup.sh)")


def write_notebook(path, source: str) -> int:
    """The sample as a notebook as Jupyter saves it: a heading, the set-up cell, the loop cell.
    Returns the culprit's row within the loop cell."""
    nbformat = pytest.importorskip("nbformat")
    lines = source.splitlines(keepends=True)
    loop = next(i for i, line in enumerate(lines) if line.startswith("for "))
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_markdown_cell("# Truncated BPTT"),
                      nbformat.v4.new_code_cell("".join(lines[:loop]).rstrip()),
                      nbformat.v4.new_code_cell("".join(lines[loop:]))]
    nbformat.write(notebook, str(path))
    return SAMPLE.culprit_row - loop


def system_python() -> str | None:
    """A Python without the server installed: only the extension's bundled copy can answer."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if python is None or subprocess.run([python, "-c", "import lsp_server"], capture_output=True,
                                        cwd="/").returncode == 0:
        return None
    return python


ENVIRONMENTS = {
    # the project's environment, where the server is installed
    "project": lambda: sys.executable,
    # a bare Python, with the default settings: the bundled server takes over (issue 22)
    "bare": system_python,
}


@contextlib.contextmanager
def code_server(tmp_path, workspace, user_settings: dict, workspace_trust: bool):
    """code-server with the packaged extension, serving `workspace`; yields (url, e2e cache)."""
    cache = subprocess.run(["bash", str(ROOT / "scripts" / "vscode_e2e_setup.sh")], capture_output=True, text=True,
                           timeout=1800)
    assert cache.returncode == 0, cache.stderr[-3000:]
    cache_dir = cache.stdout.strip().splitlines()[-1]
    entry = f"{cache_dir}/node_modules/code-server/out/node/entry.js"
    vsix = CLIENT / "backward-explainer.vsix"
    if not vsix.exists():
        built = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=CLIENT, capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-2000:]
        built = subprocess.run(["npm", "run", "package"], cwd=CLIENT, capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-2000:]

    data, extensions = tmp_path / "data", tmp_path / "extensions"
    (data / "User").mkdir(parents=True)
    (data / "User" / "settings.json").write_text(json.dumps({
        "workbench.startupEditor": "none", "security.workspace.trust.enabled": workspace_trust, **user_settings}))
    installed = subprocess.run(["node", entry, "--install-extension", str(vsix), "--extensions-dir", str(extensions),
                                "--user-data-dir", str(data)], capture_output=True, text=True, timeout=300)
    assert "was successfully installed" in installed.stdout, installed.stdout + installed.stderr

    port = free_port()
    server = subprocess.Popen(["node", entry, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--user-data-dir",
                               str(data), "--extensions-dir", str(extensions), "--disable-telemetry",
                               "--disable-update-check", *([] if workspace_trust else ["--disable-workspace-trust"]),
                               str(workspace)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/healthz", server, "code-server")
        yield f"http://127.0.0.1:{port}", cache_dir
    finally:
        server.terminate()
        server.wait(timeout=30)


def drive(cache_dir: str, scenario: str, *args) -> dict:
    """Run one scenario of tests/editors/vscode_drive.py; its JSON report."""
    driven = subprocess.run([f"{cache_dir}/playwright/bin/python", str(ROOT / "tests" / "editors" / "vscode_drive.py"),
                             scenario, *map(str, args)], capture_output=True, text=True, timeout=900)
    assert driven.returncode == 0, driven.stderr[-3000:]
    return json.loads(driven.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_diagnostic_quick_fix_and_notebook_in_code_server(tmp_path, environment):
    """With the default settings. For the bare Python the interpreter is a wrapper that logs
    every command it runs: the server runs (bundled), and pip never does."""
    python = ENVIRONMENTS[environment]()
    if python is None:
        pytest.skip("no system Python without the server installed")
    shots = SHOTS if environment == "project" else SHOTS / environment
    commands = tmp_path / "python-commands.log"
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {commands}\nexec {python} \"$@\"\n")
    wrapper.chmod(0o755)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    shutil.copy(SAMPLE.path, workspace / SAMPLE.path.name)
    notebook_row = write_notebook(workspace / "truncated_bptt.ipynb", SAMPLE.path.read_text())
    # Modules that would shadow the server's own if it ran from the workspace folder.
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in ["lsp_server/__init__.py", "lsp_server/__main__.py", "pygls.py"]:
        (workspace / name).parent.mkdir(exist_ok=True)
        (workspace / name).write_text(f"open({str(markers / name.replace('/', '.'))!r}, 'w').write('ran')\n")

    settings = {"backwardExplainer.interpreter": [str(wrapper)]}
    with code_server(tmp_path, workspace, settings, workspace_trust=False) as (url, cache_dir):
        shots.mkdir(parents=True, exist_ok=True)
        culprit_column = 10
        report = drive(cache_dir, "fix", url, workspace, shots, SAMPLE.path.name, SAMPLE.culprit_row,
                       culprit_column - 1, "truncated_bptt.ipynb")

    # The language status says the server runs, with which Python and which copy of it.
    copy = "server from the environment" if environment == "project" else "bundled server"
    assert f"{wrapper}, {copy}" in report["language_status"], report["language_status"]
    # One time stamp a line: the log's own (the client's "[Info  - 3:04:05 PM]" is stripped).
    assert any("backward-explainer 0.1.0 started" in line for line in report["log"]), report["log"]
    assert not any("[Info " in line or "[Warn " in line for line in report["log"]), report["log"]
    # The code link opens the rule's page rendered, not its Markdown source in an editable tab.
    assert [t for t in report["rule_tabs"] if "BX001" in t] == ["Preview BX001.md"], report["rule_tabs"]
    (problem,) = [p for p in report["problems"] if "BX001" in p]
    assert f"[Ln {SAMPLE.culprit_row}, Col {culprit_column}]" in problem and "backward-explainer" in problem
    assert report["squiggles"] >= 1
    assert "hidden.detach()" in report["text_after_fix"] and report["problems_after_fix"] == []

    (cell_problem,) = [p for p in report["notebook_problems"] if "BX001" in p]
    assert f"[Ln {notebook_row}, Col {culprit_column}]" in cell_problem
    assert "hidden.detach()" in report["notebook_cells_after_fix"][-1].replace("\xa0", " ")
    assert report["notebook_problems_after_fix"] == []
    assert sorted(p.name for p in markers.iterdir()) == []  # the server ran none of the workspace's code
    ran = commands.read_text().splitlines()
    assert any(line.endswith("-m lsp_server") for line in ran) and not any("pip" in line for line in ran), ran


def test_an_explained_notebook_reads_in_the_dark_theme(tmp_path):
    """A notebook saved with an explained error, opened in VS Code's default dark theme: the
    error output, then the explanation, whose text (code lines included: `--jp-*` fallbacks once
    made them near-white on white) has contrast of at least 4.5:1, and whose culprit and backward
    lines carry their text marks; its boundary picture is decoded in the picture's own colours."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    explained_notebook(workspace / "explained.ipynb")
    shots = SHOTS / "notebook-output"
    shots.mkdir(parents=True, exist_ok=True)
    with code_server(tmp_path, workspace, {"workbench.colorTheme": "Default Dark Modern"},
                     workspace_trust=False) as (url, cache_dir):
        report = drive(cache_dir, "output", url, workspace, shots, "explained.ipynb")

    assert "vs-dark" in report["theme"].split()
    text = report["outputs_text"]
    error, explanation = text.find("RuntimeError: Trying to backward"), text.find("carries the graph")
    assert 0 <= error < explanation, text
    assert report["culprit_line"].lstrip().startswith("hidden ▶   2")
    assert report["backward_line"].lstrip().startswith("backward ▶   5")
    low = [c for c in report["contrast"] if c["ratio"] < 4.5]
    assert len(report["contrast"]) >= 15 and not low, low
    (picture,) = report["pictures"]
    assert boundary_labels.decoded_problems(picture, NOTEBOOK_PICTURE_ALT) == []


@pytest.mark.parametrize("theme", ["Default Light Modern", "Default Dark Modern"])
def test_a_runtime_findings_hover_draws_where_the_history_crossed(tmp_path, theme):
    """`explainer run` on the sample, then the editor: hovering the culprit, which the run
    confirmed, shows the boundary picture as a code block whose lines are the finding's labels
    (carrier, each call's line, the line the fix edits), readable (4.5:1) in the light and
    dark themes."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    shutil.copy(SAMPLE.path, workspace / SAMPLE.path.name)
    shutil.copy(ROOT / "samples" / "_device.py", workspace / "_device.py")
    ran = subprocess.run([sys.executable, "-m", "explainer", "run", SAMPLE.path.name], cwd=workspace,
                         env={**os.environ, "EXPLAINER_HANDOFF": "1"}, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1, ran.stderr[-2000:]
    (entry,) = json.loads((workspace / ".explainer" / "findings.json").read_text())["entries"]
    (finding,) = entry["findings"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = f"runtime-hover-{'dark' if 'Dark' in theme else 'light'}.png"
    with code_server(tmp_path, workspace, {"workbench.colorTheme": theme,
                                           "backwardExplainer.interpreter": [sys.executable]},
                     workspace_trust=False) as (url, cache_dir):
        report = drive(cache_dir, "hover", url, workspace, SHOTS, SAMPLE.path.name, SAMPLE.culprit_row, 9, shot)

    assert ("vs-dark" if "Dark" in theme else "vs") in report["theme"].split()
    # VS Code shows the diagnostic's message first, then the server's hover.
    assert "(confirmed when it ran)" in report["hover"] and "\nBX001 carried-state" in report["hover"], report["hover"]
    drawn = re.sub(r" {2,}", "  ", "\n".join(report["code_lines"]).replace("\xa0", " "))
    labels = boundary_labels.labels(finding)
    assert len(labels) >= 4 and [label for label in labels if label not in drawn] == [], (labels, drawn)
    low = [c for c in report["contrast"] if c["ratio"] < 4.5]
    assert len(report["contrast"]) >= 5 and not low, low


def test_restricted_mode_never_launches_the_workspaces_interpreter(tmp_path):
    """A cloned repository's `.vscode/settings.json` names its own "interpreter", a script that
    writes a marker and then runs the real Python. Answering "No" to the trust prompt, the checks
    run with the user's interpreter and the script never runs; trusting the folder then runs it
    (so the test can tell), and its server answers: the two restarts that trust sets off (trust
    granted, then the setting now applying) leave a working server (regression: pygls failed the
    second shutdown and the client started none)."""
    workspace = tmp_path / "cloned-repo"
    (workspace / ".vscode").mkdir(parents=True)
    shutil.copy(SAMPLE.path, workspace / SAMPLE.path.name)
    marker = tmp_path / "workspace-interpreter-ran"
    repo_python = workspace / "tools" / "python"
    repo_python.parent.mkdir()
    repo_python.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {sys.executable} \"$@\"\n")
    repo_python.chmod(0o755)
    (workspace / ".vscode" / "settings.json").write_text(json.dumps({"backwardExplainer.interpreter": [str(repo_python)]}))

    shots = SHOTS / "trust"
    shots.mkdir(parents=True, exist_ok=True)
    with code_server(tmp_path, workspace, {"backwardExplainer.interpreter": [sys.executable]},
                     workspace_trust=True) as (url, cache_dir):
        report = drive(cache_dir, "trust", url, workspace, shots, SAMPLE.path.name, marker)

    assert "Do you trust the authors" in report["trust_prompt"] and "Restricted Mode" in report["status_bar"]
    (problem,) = [p for p in report["restricted_problems"] if "BX001" in p]
    assert f"[Ln {SAMPLE.culprit_row}, Col 10]" in problem
    assert report["restricted_marker"] is False
    assert report["trusted_marker"] is True and "-m lsp_server" in marker.read_text()
    assert any("BX001" in p for p in report["trusted_problems"])
