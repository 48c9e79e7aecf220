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
    """The well-formed entries of a findings file; [] for a missing or unreadable one.

    The file sits in the workspace, so anyone who can commit to the repository can write it. An
    entry is kept only if it has the shape `publish` writes and every file it names (culprits,
    fix edits) is inside the project, or is one of the entry's own kernel cells: an editor
    applying its quick fix can then never touch a file outside the workspace."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return []
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return []
    root = Path(path).resolve().parent.parent
    return [e for e in entries if isinstance(e, dict) and _well_formed(e) and _confined(e, root)]


def _well_formed(entry: dict) -> bool:
    def location(value) -> bool:
        return isinstance(value, dict) and all(type(value.get(k)) is int for k in ("row", "column"))

    def text(*values) -> bool:
        return all(isinstance(v, str) for v in values)

    cells = entry.get("cells", {})
    findings = entry.get("findings")
    if not (isinstance(cells, dict) and all(text(k, v) for k, v in cells.items()) and isinstance(findings, list)):
        return False
    for finding in findings:
        if not (isinstance(finding, dict) and text(finding.get("kind"), finding.get("message"))):
            return False
        culprits, fixes = finding.get("culprits", []), finding.get("fixes", [])
        if not (isinstance(culprits, list) and isinstance(fixes, list)):
            return False
        for culprit in culprits:
            if not (isinstance(culprit, dict) and text(culprit.get("filename"), culprit.get("name", ""),
                                                         culprit.get("source_line") or "")
                    and location(culprit.get("location"))):
                return False
        for fix in fixes:
            edits = fix.get("edits") if isinstance(fix, dict) else None
            if not (isinstance(edits, list) and text(fix.get("message"), fix.get("applicability"))):
                return False
            if not all(isinstance(e, dict) and text(e.get("filename"), e.get("content")) and location(e.get("location"))
                       and location(e.get("end_location")) for e in edits):
                return False
    return True


def _confined(entry: dict, root: Path) -> bool:
    cells = entry.get("cells", {})
    names = [c["filename"] for f in entry["findings"] for c in f.get("culprits", [])]
    names += [e["filename"] for f in entry["findings"] for fix in f.get("fixes", []) for e in fix["edits"]]
    return all(name in cells or _inside(name, root) for name in names)


def _inside(name: str, root: Path) -> bool:
    """`name` is a file under `root`, symbolic links and `..` resolved."""
    if not name or name.startswith("<") or "\0" in name:
        return False
    try:
        resolved = Path(name).resolve() if os.path.isabs(name) else (root / name).resolve()
    except (OSError, ValueError, RuntimeError):
        return False
    return resolved == root or root in resolved.parents


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
