"""`%load_ext explainer` in terminal IPython: rich text for explained errors, nothing else changed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

IPYTHON = str(Path(sys.executable).with_name("ipython"))

BUGGY = """\
import torch
model = torch.nn.GRU(3, 5, batch_first=True)
hidden = torch.zeros(1, 2, 5)
for step in range(3):
    out, hidden = model(torch.randn(2, 4, 3), hidden)
    out.pow(2).mean().backward()
"""


def ipython(tmp_path, name: str, code: str) -> str:
    script = tmp_path / name
    script.write_text(code)
    proc = subprocess.run([IPYTHON, "--no-banner", "--colors=NoColor", str(script)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    return re.sub(r"<ipython-input-\d+-[0-9a-f]+>", "<cell>", proc.stdout + proc.stderr)


def test_terminal_shows_a_rich_panel_with_the_fix(tmp_path):
    output = ipython(tmp_path, "buggy.ipy", "%load_ext explainer\n" + BUGGY)
    assert "explainer: second-backward" in output
    assert "╭" in output and "hidden.detach()" in output
    assert "Trying to backward through the graph a second time" in output


def test_terminal_output_of_other_errors_is_unchanged(tmp_path):
    code = "def f():\n    return 1 / 0\nf()\n"
    plain = ipython(tmp_path, "plain.ipy", "pass\n" + code)
    loaded = ipython(tmp_path, "loaded.ipy", "%load_ext explainer\n" + code)
    assert "ZeroDivisionError" in plain
    assert loaded == plain
