from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import forkserver

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
sys.path.insert(0, str(SAMPLES))
# Runs explained by the tests must not hand findings to editors through this checkout's
# .explainer/ (the language-server tests open the samples from here). The hand-off's own tests
# turn it back on for their processes, in their own folders.
os.environ["EXPLAINER_HANDOFF"] = "0"

import manifest  # noqa: E402


@dataclass(frozen=True)
class Workspace:
    """A copy of the samples in a project of its own: a language server or an editor opening
    them reads no state (`.explainer/findings.json`) that an earlier command left in this
    checkout, so the README's two commands pass in either order."""

    root: Path

    def sample(self, name: str) -> manifest.Sample:
        return manifest.load(self.root / "samples" / f"{name}.py")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, name: str, timeout: float = 120) -> None:
    """Poll `url` until it answers; fail if `server` exits or `timeout` passes first."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, f"{name} did not start"
            time.sleep(0.5)


def isolated_samples(root: Path) -> Workspace:
    (root / "samples").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'isolated-samples'\n")
    for path in SAMPLES.glob("*.py"):
        shutil.copy(path, root / "samples" / path.name)
    return Workspace(root)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    return isolated_samples(tmp_path_factory.mktemp("workspace"))


def without_and_with_hooks(scenario) -> list:
    """`scenario()` run twice, seeded alike: without the explainer's hooks, then with them. Each
    outcome is what it returned, or the exception it raised."""
    import torch

    import explainer

    outcomes = []
    for hooked in (False, True):
        torch.manual_seed(0)
        if hooked:
            explainer.install()
        try:
            outcomes.append(scenario())
        except Exception as error:  # noqa: BLE001 - the outcome being compared
            outcomes.append(error)
        finally:
            explainer.uninstall()
    return outcomes


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    findings: list


def run_explainer(script: Path, *args: str, tmp_path: Path, cwd: Path = ROOT, env=None, svg: Path | None = None,
                  fresh: bool = False) -> Run:
    """`python -m explainer run --json` on `script`, forked from a process that has imported torch
    (tests/forkserver.py), or, `fresh`, in an interpreter that has not."""
    out = tmp_path / f"{script.stem}.findings.json"
    proc = (subprocess.run if fresh else forkserver.run)(
        [sys.executable, "-m", "explainer", "run", "--json", str(out), *(["--svg", str(svg)] if svg else []),
         str(script), *args],
        capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    document = json.loads(out.read_text())
    assert document["version"] == 1
    return Run(proc.returncode, proc.stdout, proc.stderr, document["findings"])


@pytest.fixture
def explain_run(tmp_path):
    def runner(script: Path, *args: str, **kwargs) -> Run:
        return run_explainer(script, *args, tmp_path=tmp_path, **kwargs)

    return runner
