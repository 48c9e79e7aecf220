"""Static diagnostics as SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

Columns are Unicode code points (`columnKind`), as in our data model. Notebook diagnostics point
at the notebook file, at the rows of its JSON text that hold the cell's source lines (a SARIF
region is rows of the file's text, not of a cell); the cell is named in the message too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import __version__
from ..causes import CAUSES, Cause
from ..model import Finding, Location
from ..reading.notebook import source_lines_in_file

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render_sarif(diagnostics: list[Finding], root: str | None = None) -> str:
    root = os.path.abspath(root or os.getcwd())
    index = {cause.code: i for i, cause in enumerate(CAUSES)}
    docs = docs_site()
    notebooks: dict[str, dict[int, list[int]]] = {}
    run = {
        "tool": {"driver": {
            "name": "backward-explainer",
            "semanticVersion": __version__,
            "informationUri": "https://pypi.org/project/backward-explainer/",
            "rules": [_rule(cause, docs) for cause in CAUSES],
        }},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri() + "/"}},
        "columnKind": "unicodeCodePoints",
        "results": [_result(d, index, root, notebooks) for d in diagnostics],
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _rule(cause: Cause, docs: str | None) -> dict:
    # A SARIF file is uploaded and read elsewhere: the docs pages' `file://` paths on the machine
    # that ran the check would be broken links there. The whole page goes in `help` instead,
    # and `helpUri` only where the package names a documentation site.
    return {
        "id": cause.code,
        "name": cause.name,
        "shortDescription": {"text": cause.title},
        "fullDescription": {"text": cause.title},
        **({"helpUri": f"{docs.rstrip('/')}/{cause.code}.md"} if docs else {}),
        "help": {"text": cause.doc_page(), "markdown": cause.doc_page()},
        "defaultConfiguration": {"level": _LEVEL[cause.severity]},
    }


def docs_site() -> str | None:
    """The package's `Documentation` project URL (pyproject.toml's `[project.urls]`), if any."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = metadata("backward-explainer").get_all("Project-URL") or []
    except PackageNotFoundError:
        return None
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("documentation", "docs") and url.strip().startswith("https://"):
            return url.strip()
    return None


_LEVEL = {"error": "error", "warning": "warning"}


def _artifact(filename: str, root: str) -> dict:
    absolute = os.path.abspath(filename)
    relative = os.path.relpath(absolute, root)
    if relative.startswith(os.pardir):
        return {"uri": Path(absolute).as_uri()}
    return {"uri": Path(relative).as_posix(), "uriBaseId": "%SRCROOT%"}


def _region(start: Location, end: Location) -> dict:
    return {"startLine": start.row, "startColumn": start.column, "endLine": end.row, "endColumn": end.column}


def _cell_region(diagnostic: Finding, notebooks: dict) -> dict | None:
    """The rows of the notebook file that hold the diagnostic's lines of its cell (whole rows:
    a row there is a JSON string, whose columns are not the cell's)."""
    if diagnostic.filename not in notebooks:
        try:
            raw = Path(diagnostic.filename).read_text(encoding="utf-8")
        except (OSError, UnicodeError):
            raw = ""
        notebooks[diagnostic.filename] = source_lines_in_file(raw)
    rows = notebooks[diagnostic.filename].get(diagnostic.cell, [])
    start, end = diagnostic.location.row, diagnostic.end_location.row
    if not 0 < start <= end <= len(rows):
        return None
    return {"startLine": rows[start - 1], "endLine": rows[end - 1]}


def _result(diagnostic: Finding, index: dict[str, int], root: str, notebooks: dict) -> dict:
    message = diagnostic.message
    region = _region(diagnostic.location, diagnostic.end_location)
    if diagnostic.cell is not None:
        message = f"cell {diagnostic.cell}, line {diagnostic.location.row}: {message}"
        region = _cell_region(diagnostic, notebooks)
    result = {
        "ruleId": diagnostic.code,
        "ruleIndex": index[diagnostic.code],
        "level": _LEVEL[diagnostic.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {
            "artifactLocation": _artifact(diagnostic.filename, root),
            **({"region": region} if region is not None else {}),
        }}],
    }
    fix = diagnostic.fix
    if fix is not None and diagnostic.cell is None:
        result["fixes"] = [{
            "description": {"text": fix.message},
            "artifactChanges": [{
                "artifactLocation": _artifact(filename, root),
                "replacements": [{"deletedRegion": _region(e.location, e.end_location),
                                  "insertedContent": {"text": e.content}}
                                 for e in fix.edits if e.filename == filename],
            } for filename in dict.fromkeys(e.filename for e in fix.edits)],
        }]
    return result
