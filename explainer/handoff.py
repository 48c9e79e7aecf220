"""Runtime findings handed to editors.

`python -m explainer run` and `%load_ext explainer` write what they explained to
`.explainer/findings.json` at the root of the project they run in (the nearest folder with
`.git`, `pyproject.toml`, `setup.py` or `setup.cfg`, else the working directory). The language
server watches that file and shows each finding's culprit as a diagnostic with its quick fix.

The file holds one entry per run: `"run"` is the script's path, or `ipython:<pid>` for a
kernel. A new explanation replaces its run's entry; a run that ends without an explained error
removes it. An entry also keeps, for culprits in IPython cells (files that are not on disk),
the cell's source, so an editor can find that cell in an open notebook.

Writing is best effort: a failure costs one line on stderr, never the user's run.
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import time
from pathlib import Path

from .model import Finding

FILE = Path(".explainer") / "findings.json"
VERSION = 1
_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def project_root(start: str | os.PathLike) -> Path:
    start = Path(start).resolve()
    if start.is_file():
        start = start.parent
    return next((c for c in [start, *start.parents] if any((c / m).exists() for m in _MARKERS)), start)


def enabled() -> bool:
    """`EXPLAINER_HANDOFF=0` turns the hand-off off."""
    return os.environ.get("EXPLAINER_HANDOFF", "1") != "0"


def publish(run: str, findings: list[Finding], where: str | os.PathLike | None = None) -> Path | None:
    """Replace `run`'s entry in the project's findings file (remove it when `findings` is
    empty). Returns the file written, or None when nothing was written."""
    if not enabled():
        return None
    try:
        path = project_root(where or os.getcwd()) / FILE
        entries = [e for e in read(path) if e.get("run") != run]
        if findings:
            entries.append({"run": run, "written": time.time(),
                            "findings": [_absolute_paths(f.to_json()) for f in findings],
                            "cells": _cell_sources(findings)})
        elif not path.exists():
            return None  # nothing to clear, and no reason to create the folder
        path.parent.mkdir(exist_ok=True)
        ignore = path.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n", encoding="utf-8")
        temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
        temporary.write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, path)
        return path
    except Exception as error:  # noqa: BLE001 - an editor hand-off must never break a run
        print(f"[explainer] could not hand the findings to the editor ({type(error).__name__}: {error})",
              file=sys.stderr)
        return None


def read(path: str | os.PathLike) -> list[dict]:
    """The entries of a findings file; [] for a missing or unreadable one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    entries = document.get("entries") if isinstance(document, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _absolute_paths(finding: dict) -> dict:
    """File names as the editor knows them (a script run as `train.py` is recorded relative)."""
    def absolute(name: str) -> str:
        return os.path.abspath(name) if name and not name.startswith("<") and os.path.exists(name) else name

    for culprit in finding.get("culprits", []):
        culprit["filename"] = absolute(culprit["filename"])
    for fix in finding.get("fixes", []):
        for edit in fix.get("edits", []):
            edit["filename"] = absolute(edit["filename"])
    return finding


def _cell_sources(findings: list[Finding]) -> dict[str, str]:
    """Source of culprit files that exist only in linecache (IPython cells)."""
    sources = {}
    for finding in findings:
        for culprit in finding.culprits:
            if culprit.filename not in sources and not os.path.isfile(culprit.filename):
                lines = linecache.getlines(culprit.filename)
                if lines:
                    sources[culprit.filename] = "".join(lines)
    return sources
