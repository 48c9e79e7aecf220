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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .model import Finding, Fix, MalformedFinding

FILE = Path(".explainer") / "findings.json"
VERSION = 1
_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


@dataclass(frozen=True)
class Entry:
    """One run's findings: `run` is the script's path, or `ipython:<pid>`; `cells` holds the
    source of the kernel cells its culprits are in, by their file name."""

    run: str
    findings: tuple[Finding, ...]
    cells: Mapping[str, str]
    written: float = 0.0


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
        entries = [_entry_json(e) for e in read(path) if e.run != run]
        if findings:
            entries.append({"run": run, "written": time.time(),
                            "findings": [_with_absolute_paths(f).to_json() for f in findings],
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


def read(path: str | os.PathLike) -> list[Entry]:
    """The well-formed entries of a findings file; [] for a missing or unreadable one.

    The file sits in the workspace, so anyone who can commit to the repository can write it. An
    entry is kept only if each of its findings reads as `Finding.from_json` expects and every
    file it names (culprits, fix edits) is inside the project, or is one of the entry's own
    kernel cells: an editor applying its quick fix can then never touch a file outside the
    workspace."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return []
    raw = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(raw, list):
        return []
    root = Path(path).resolve().parent.parent
    entries = []
    for item in raw:
        entry = _entry(item)
        if entry is not None and _confined(entry, root):
            entries.append(entry)
    return entries


def _entry(item) -> Entry | None:
    if not isinstance(item, dict) or not isinstance(item.get("run"), str):
        return None
    cells, findings = item.get("cells", {}), item.get("findings")
    if not (isinstance(cells, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in cells.items())
            and isinstance(findings, list)):
        return None
    try:
        written = item.get("written", 0.0)
        return Entry(item["run"], tuple(Finding.from_json(f) for f in findings), cells,
                     written if isinstance(written, (int, float)) else 0.0)
    except (MalformedFinding, RecursionError):
        return None


def _entry_json(entry: Entry) -> dict:
    return {"run": entry.run, "written": entry.written, "findings": [f.to_json() for f in entry.findings],
            "cells": dict(entry.cells)}


def _confined(entry: Entry, root: Path) -> bool:
    names = [f.filename for f in entry.findings] + [c.filename for f in entry.findings for c in f.culprits]
    names += [e.filename for f in entry.findings for fix in f.fixes for e in fix.edits]
    return all(name in entry.cells or _inside(name, root) for name in names)


def _inside(name: str, root: Path) -> bool:
    """`name` is a file under `root`, symbolic links and `..` resolved."""
    if not name or name.startswith("<") or "\0" in name:
        return False
    try:
        resolved = Path(name).resolve() if os.path.isabs(name) else (root / name).resolve()
    except (OSError, ValueError, RuntimeError):
        return False
    return resolved == root or root in resolved.parents


def _with_absolute_paths(finding: Finding) -> Finding:
    """File names as the editor knows them (a script run as `train.py` is recorded relative)."""
    def absolute(name: str) -> str:
        return os.path.abspath(name) if name and not name.startswith("<") and os.path.exists(name) else name

    return replace(finding, filename=absolute(finding.filename),
                   culprits=tuple(replace(c, filename=absolute(c.filename)) for c in finding.culprits),
                   fixes=tuple(Fix(f.message, tuple(replace(e, filename=absolute(e.filename)) for e in f.edits),
                                   f.applicability) for f in finding.fixes))


def _cell_sources(findings: list[Finding]) -> dict[str, str]:
    """Source of the files the findings point into that exist only in linecache (IPython cells)."""
    sources = {}
    for finding in findings:
        for filename in (finding.filename, *(c.filename for c in finding.culprits)):
            if filename not in sources and not os.path.isfile(filename):
                lines = linecache.getlines(filename)
                if lines:
                    sources[filename] = "".join(lines)
    return sources
