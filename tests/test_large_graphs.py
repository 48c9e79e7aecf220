"""Huge graphs: the explanation stays bounded, and the user's process survives freeing the graph
afterwards (wrapping too many nodes makes torch free them recursively and overflow the stack)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

SCRIPT = textwrap.dedent("""
    import re
    import sys
    import torch
    import explainer

    explainer.install()
    nodes, stale_first = int(sys.argv[1]), sys.argv[2] == "stale"

    def train():
        state = torch.ones(1, requires_grad=True) * 1.0
        for iteration in range(2):
            steps = nodes if (iteration == 0) == stale_first else 10
            for _ in range(steps):
                state = state * 1.0001
            loss = state.sum()
            loss.backward()

    try:
        train()
    except RuntimeError as error:  # the graph is freed when the except block ends
        note = error.__notes__[0]
        print("explained" if "`state`" in note else "unnamed", "likely" if "likely" in note else "certain",
              "freed-by-shown" if re.search(r"loss\\.backward\\(\\) +frees its graph", note) else "freed-by-missing")
    print("survived")
""")


def run(tmp_path, nodes: int, where: str) -> str:
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(nodes), where], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_huge_current_graph_is_explained_and_the_process_survives(tmp_path):
    """The walk stops short of the earlier backward's mark; that call was recorded, so the
    boundary picture still shows it freeing the graph."""
    assert run(tmp_path, 150_000, "current").split("\n")[:2] == ["explained likely freed-by-shown", "survived"]


def test_huge_stale_graph_is_explained_with_certainty(tmp_path):
    assert run(tmp_path, 150_000, "stale").split("\n")[:2] == ["explained certain freed-by-shown", "survived"]


UNROLL = textwrap.dedent("""
    import sys
    import torch
    import explainer

    explainer.install()
    steps = int(sys.argv[1])

    def train():
        w = torch.full((1,), 0.5, requires_grad=True)
        hidden = torch.zeros(1)
        for iteration in range(2):
            states = []
            for _ in range(steps):
                hidden = torch.tanh(hidden * w + 0.1)
                states.append(hidden)
            loss = torch.stack(states).sum()
            loss.backward()

    try:
        train()
    except RuntimeError as error:  # the graph is freed when the except block ends
        note = error.__notes__[0]
        print("explained" if "`hidden`" in note else "unnamed", "likely" if "likely" in note else "certain")
    print("survived")
""")


def test_a_stack_wider_than_the_walk_budget_is_not_opened_and_the_process_survives(tmp_path):
    """Reading `next_functions` of `torch.stack(states)` wraps all 60,000 states at once, and
    torch frees a chain of that many wrapped nodes recursively (a segfault before the width was
    read first). The carrier is then read from the source, through the tensors the frame holds."""
    script = tmp_path / "unroll.py"
    script.write_text(UNROLL)
    proc = subprocess.run([sys.executable, str(script), "60000"], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["explained likely", "survived"]
