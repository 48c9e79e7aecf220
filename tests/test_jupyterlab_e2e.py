"""The explanation in a real JupyterLab (4.6, in its own environment), driven by Playwright in
Debian's chromium (tests/editors/jupyterlab_drive.py), in the Light and Dark themes, for a
notebook saved with an explained error, opened trusted (signed, as after a live run) and
untrusted (as reopened from elsewhere, whose HTML JupyterLab sanitises, dropping `<style>`).

Each time: the error output comes first, as IPython shows it, then the explanation; every piece
of the explanation's text has contrast of at least 4.5:1 over what is behind it; the culprit and
backward lines carry their text marks, tinted where the notebook is trusted; the boundary
picture is decoded at its own size, its alt text says what it shows, and the browser draws it
in the picture's own colours, whose labels are at least 4.5:1 over both of its fills.

Screenshots land in benchmarks/results/jupyterlab-e2e/."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import boundary_labels
import pytest

from conftest import ROOT, free_port, wait_until_serving
from explainer.render import diagram
from kernel_session import NOTEBOOK_PICTURE_ALT, explained_notebook

SHOTS = ROOT / "benchmarks" / "results" / "jupyterlab-e2e"
pytestmark = pytest.mark.skipif(shutil.which("npm") is None or os.geteuid() != 0,
                                reason="needs npm, and root for apt (scripts/vscode_e2e_setup.sh)")


def test_explanation_in_jupyterlab_light_and_dark_trusted_and_untrusted(tmp_path):
    setup = subprocess.run(["bash", str(ROOT / "scripts" / "jupyterlab_e2e_setup.sh")], capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, setup.stderr[-3000:]
    cache = setup.stdout.strip().splitlines()[-1]
    jupyter = f"{cache}/jupyterlab/bin/jupyter"
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    explained_notebook(notebooks / "trusted.ipynb")
    signed = subprocess.run([jupyter, "trust", str(notebooks / "trusted.ipynb")], env=env, capture_output=True,
                            text=True)
    assert signed.returncode == 0, signed.stderr
    # The same notebook edited elsewhere: its signature no longer matches (the notary signs
    # content, so an exact copy would be trusted too).
    reopened = json.loads((notebooks / "trusted.ipynb").read_text())
    reopened["cells"][0]["source"] = "# Truncated BPTT (edited elsewhere)"
    (notebooks / "untrusted.ipynb").write_text(json.dumps(reopened))

    port = free_port()
    lab = subprocess.Popen([jupyter, "lab", "--allow-root", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                            "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={notebooks}"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/api/status", lab, "JupyterLab")
        SHOTS.mkdir(parents=True, exist_ok=True)
        driven = subprocess.run([f"{cache}/playwright/bin/python", str(ROOT / "tests" / "editors" / "jupyterlab_drive.py"),
                                 f"http://127.0.0.1:{port}", env["JUPYTERLAB_SETTINGS_DIR"], str(SHOTS),
                                 "trusted.ipynb", "untrusted.ipynb"], capture_output=True, text=True, timeout=900)
        assert driven.returncode == 0, driven.stderr[-3000:]
        report = json.loads(driven.stdout.strip().splitlines()[-1])
    finally:
        lab.terminate()
        lab.wait(timeout=30)

    assert sorted(report) == ["trusted/dark", "trusted/light", "untrusted/dark", "untrusted/light"]
    for view, seen in report.items():
        trust, theme = view.split("/")
        assert seen["theme"] == {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}[theme]
        assert seen["order"] == ["application/vnd.jupyter.stderr", "text/html"], view
        assert seen["error"].startswith("RuntimeError: Trying to backward through the graph a second time"), view
        assert seen["culprit_line"].lstrip().startswith("hidden ▶   2     out, hidden = model("), view
        assert seen["backward_line"].lstrip().startswith("backward ▶   5     loss.backward()"), view
        low = [c for c in seen["contrast"] if c["ratio"] < 4.5]
        assert len(seen["contrast"]) >= 15 and not low, (view, low)
        if trust == "trusted":
            assert seen["style_blocks"] == 1 and seen["culprit_tint"] != "rgba(0, 0, 0, 0)", view
        else:  # sanitised: only the text marks are left
            assert seen["style_blocks"] == 0 and seen["culprit_tint"] == "rgba(0, 0, 0, 0)", view

        (picture,) = seen["pictures"]
        assert boundary_labels.decoded_problems(picture, NOTEBOOK_PICTURE_ALT) == [], view
    inks, fills = (diagram.INK, diagram.FADED, diagram.ACCENT), (diagram.BACKGROUND, diagram.FREED_FILL)
    assert min(boundary_labels.contrast(ink, fill) for ink in inks for fill in fills) >= 4.5
