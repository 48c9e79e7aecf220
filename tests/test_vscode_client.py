"""vscode-client/: `npm ci && npm test` (the interpreter and settings logic under node's test
runner) and `npm run package` (the .vsix), as the issue's done-when list states them."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import zipfile

import pytest

from conftest import ROOT

CLIENT = ROOT / "vscode-client"
NPM = shutil.which("npm")
pytestmark = pytest.mark.skipif(NPM is None, reason="needs node and npm")


def npm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NPM, *args], cwd=CLIENT, capture_output=True, text=True, timeout=600)


def test_npm_ci_test_and_package():
    installed = npm("ci", "--no-audit", "--no-fund")
    assert installed.returncode == 0, installed.stderr[-3000:]
    tested = npm("test")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "# fail 0" in tested.stdout and "# pass " in tested.stdout
    packaged = npm("run", "package")
    assert packaged.returncode == 0, packaged.stdout[-3000:] + packaged.stderr[-3000:]
    with zipfile.ZipFile(CLIENT / "backward-explainer.vsix") as vsix:
        names = set(vsix.namelist())
        manifest = json.loads(vsix.read("extension/package.json"))
    assert {"extension/dist/extension.js", "extension/package.json", "extension/readme.md"} <= names
    assert not any("node_modules" in name for name in names)  # bundled by esbuild
    # The package's own wheel, for "Install into this environment"; it requires no torch.
    (wheel,) = [n for n in names if n.startswith("extension/bundled/wheels/") and n.endswith(".whl")]
    with zipfile.ZipFile(CLIENT / "backward-explainer.vsix") as vsix, \
            zipfile.ZipFile(io.BytesIO(vsix.read(wheel))) as package:
        metadata = next(package.read(n).decode() for n in package.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not any("torch" in line and "extra ==" not in line for line in requires), requires
    trust = manifest["capabilities"]["untrustedWorkspaces"]
    assert trust["supported"] == "limited" and trust["restrictedConfigurations"] == ["backwardExplainer.interpreter"]
    assert "extensionDependencies" not in manifest  # the Python extension is used when present, not required
