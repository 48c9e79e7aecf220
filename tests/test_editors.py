"""Real editors as LSP clients: headless Neovim (Debian's 0.7.2) and Emacs 28 with eglot attach
the server to a buffer, show the samples' diagnostics at their culprit lines, and apply the quick
fix themselves (the configs of docs/editors.md)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import manifest
from conftest import ROOT

NVIM = shutil.which("nvim")
SAMPLES = {s.name: s for s in manifest.samples()}


@pytest.mark.skipif(NVIM is None, reason="needs nvim (scripts/setup.sh installs Debian's neovim)")
@pytest.mark.parametrize("name, code", [("rnn_hidden_chunks", "BX001"), ("gan_fake_reuse", "BX006")])
def test_neovim_shows_the_diagnostic_and_applies_the_quick_fix(tmp_path, name, code):
    sample = SAMPLES[name]
    script = tmp_path / f"{name}.py"
    shutil.copy(sample.path, script)
    out = tmp_path / "report.txt"
    env = {**os.environ, "EXPLAINER_SERVER": str(Path(sys.executable).with_name("backward-explainer-lsp")), "EXPLAINER_OUT": str(out)}
    subprocess.run([NVIM, "--headless", "--clean", "-c", f"luafile {ROOT / 'tests' / 'editors' / 'nvim_check.lua'}",
                    str(script)], cwd=tmp_path, env=env, timeout=120, check=True, capture_output=True)
    report = out.read_text().splitlines()
    before = [line for line in report if line.startswith("before ")]
    assert any(line.startswith(f"before {sample.culprit_row}:") and line.endswith(f" {code} backward-explainer")
               for line in before), report
    assert any(line.startswith("applied ") for line in report), report
    assert not [line for line in report if line.startswith(f"after {sample.culprit_row}:") and f" {code} " in line]
    # Neovim wrote the fix into the buffer; the file on disk is unchanged.
    assert script.read_text() == sample.path.read_text()


@pytest.mark.skipif(NVIM is None, reason="needs nvim (scripts/setup.sh installs Debian's neovim)")
def test_neovim_shows_one_diagnostic_for_a_bug_the_run_confirmed(tmp_path):
    """After `explainer run` explained the sample's error, Neovim shows the bug once, at the
    culprit line, marked as confirmed when it ran, with one quick fix (not the checker's
    diagnostic and the runtime's side by side)."""
    sample = SAMPLES["rnn_hidden_chunks"]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    script = tmp_path / "train.py"
    shutil.copy(sample.path, script)
    shutil.copy(sample.path.parent / "_device.py", tmp_path / "_device.py")
    env = {**os.environ, "EXPLAINER_HANDOFF": "1"}
    ran = subprocess.run([sys.executable, "-m", "explainer", "run", str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and (tmp_path / ".explainer" / "findings.json").exists(), ran.stderr
    out = tmp_path / "report.txt"
    env.update(EXPLAINER_SERVER=str(Path(sys.executable).with_name("backward-explainer-lsp")), EXPLAINER_OUT=str(out),
               EXPLAINER_EXPECT="confirmed when it ran")
    subprocess.run([NVIM, "--headless", "--clean", "-c", f"luafile {ROOT / 'tests' / 'editors' / 'nvim_check.lua'}",
                    str(script)], cwd=tmp_path, env=env, timeout=120, check=True, capture_output=True)
    report = out.read_text().splitlines()
    before = [line for line in report if line.startswith("before ")]
    messages = [line for line in report if line.startswith("before-message ")]
    assert before == [f"before {sample.culprit_row}:10 BX001 backward-explainer"], report
    assert len(messages) == 1 and messages[0].endswith("(confirmed when it ran)"), report
    assert "`loss.backward()` in the previous iteration freed that graph" in messages[0], report
    # The fix, and "Ignore BX001 on this line"; the first is applied.
    assert "quickfixes 2" in report and any(line.startswith("applied Detach hidden") for line in report), report


EMACS = shutil.which("emacs")
HAS_EGLOT = bool(EMACS) and (any(Path("/usr/share/emacs/site-lisp/elpa").glob("eglot-*"))
                             or subprocess.run([EMACS, "--batch", "-Q", "--eval", "(require 'eglot)"],
                                               capture_output=True).returncode == 0)


@pytest.mark.skipif(not HAS_EGLOT, reason="needs emacs with eglot (scripts/setup.sh installs emacs-nox elpa-eglot)")
def test_emacs_eglot_shows_the_diagnostic_and_applies_the_quick_fix(tmp_path):
    sample = SAMPLES["rnn_hidden_chunks"]
    script = tmp_path / "rnn_hidden_chunks.py"
    shutil.copy(sample.path, script)
    out = tmp_path / "report.txt"
    env = {**os.environ, "EXPLAINER_SERVER": str(Path(sys.executable).with_name("backward-explainer-lsp")), "EXPLAINER_OUT": str(out)}
    subprocess.run([EMACS, "--batch", "-Q", "-l", str(ROOT / "tests" / "editors" / "eglot_check.el"), script.name],
                   cwd=tmp_path, env=env, timeout=180, check=True, capture_output=True)
    report = out.read_text().splitlines()
    assert report[0].startswith(f"before {sample.culprit_row}:10 backward-explainer [BX001]"), report
    assert report[1].startswith("applied Detach hidden where it re-enters the next step (BX001)"), report
    assert not [line for line in report if line.startswith(f"after {sample.culprit_row} ")], report
    assert report[-1] == "text     out, hidden = model(x, hidden.detach())  # culprit"
