"""The extension in a real VS Code: code-server (VS Code in a browser) with the packaged .vsix,
driven by Playwright in Debian's chromium. The diagnostic shows in the Problems panel at the
sample's culprit line with its squiggle, and the quick fix (Ctrl+.) changes the text and clears
it; the same in a notebook built from the sample, where the problem is on the loop cell's own line.
Screenshots land in benchmarks/results/vscode-e2e/."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import manifest
from conftest import ROOT

CLIENT = ROOT / "vscode-client"
SHOTS = ROOT / "benchmarks" / "results" / "vscode-e2e"
SAMPLE = {s.name: s for s in manifest.samples()}["rnn_hidden_chunks"]
pytestmark = pytest.mark.skipif(shutil.which("npm") is None or os.geteuid() != 0,
                                reason="needs npm, and root for apt (scripts/vscode_e2e_setup.sh)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    """A Python without the server installed: with useBundled it runs the extension's copy."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if python is None or subprocess.run([python, "-c", "import lsp_server"], capture_output=True,
                                        cwd="/").returncode == 0:
        return None
    return python


STRATEGIES = {
    # the project's environment, where the server is installed
    "fromEnvironment": lambda: sys.executable,
    # a bare Python: only the server bundled in the .vsix can answer
    "useBundled": system_python,
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_diagnostic_quick_fix_and_notebook_in_code_server(tmp_path, strategy):
    python = STRATEGIES[strategy]()
    if python is None:
        pytest.skip("no system Python without the server installed")
    shots = SHOTS if strategy == "fromEnvironment" else SHOTS / strategy
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

    data, extensions, workspace = tmp_path / "data", tmp_path / "extensions", tmp_path / "workspace"
    (data / "User").mkdir(parents=True)
    workspace.mkdir()
    (data / "User" / "settings.json").write_text(json.dumps({
        "workbench.startupEditor": "none", "security.workspace.trust.enabled": False,
        "backwardExplainer.interpreter": [python], "backwardExplainer.importStrategy": strategy}))
    shutil.copy(SAMPLE.path, workspace / SAMPLE.path.name)
    notebook_row = write_notebook(workspace / "truncated_bptt.ipynb", SAMPLE.path.read_text())
    # Modules that would shadow the server's own if it ran from the workspace folder.
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in ["lsp_server/__init__.py", "lsp_server/__main__.py", "pygls.py"]:
        (workspace / name).parent.mkdir(exist_ok=True)
        (workspace / name).write_text(f"open({str(markers / name.replace('/', '.'))!r}, 'w').write('ran')\n")
    installed = subprocess.run(["node", entry, "--install-extension", str(vsix), "--extensions-dir", str(extensions),
                                "--user-data-dir", str(data)], capture_output=True, text=True, timeout=300)
    assert "was successfully installed" in installed.stdout, installed.stdout + installed.stderr

    port = free_port()
    server = subprocess.Popen(["node", entry, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--user-data-dir",
                               str(data), "--extensions-dir", str(extensions), "--disable-telemetry",
                               "--disable-update-check", "--disable-workspace-trust", str(workspace)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "code-server did not start"
                time.sleep(0.5)
        shots.mkdir(parents=True, exist_ok=True)
        culprit_column = 10
        driven = subprocess.run([f"{cache_dir}/playwright/bin/python", str(ROOT / "tests" / "editors" / "vscode_drive.py"),
                                 f"http://127.0.0.1:{port}", str(workspace), str(shots), SAMPLE.path.name,
                                 str(SAMPLE.culprit_row), str(culprit_column - 1), "truncated_bptt.ipynb"],
                                capture_output=True, text=True, timeout=900)
        assert driven.returncode == 0, driven.stderr[-3000:]
        report = json.loads(driven.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)

    (problem,) = [p for p in report["problems"] if "BX001" in p]
    assert f"[Ln {SAMPLE.culprit_row}, Col {culprit_column}]" in problem and "backward-explainer" in problem
    assert report["squiggles"] >= 1
    assert "hidden.detach()" in report["text_after_fix"] and report["problems_after_fix"] == []

    (cell_problem,) = [p for p in report["notebook_problems"] if "BX001" in p]
    assert f"[Ln {notebook_row}, Col {culprit_column}]" in cell_problem
    assert "hidden.detach()" in report["notebook_cells_after_fix"][-1].replace("\xa0", " ")
    assert report["notebook_problems_after_fix"] == []
    assert sorted(p.name for p in markers.iterdir()) == []  # the server ran none of the workspace's code
