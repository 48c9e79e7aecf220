"""Static diagnostics as SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

Columns are Unicode code points (`columnKind`), as in our data model. Notebook diagnostics point
at the notebook file; the cell is named in the message, because SARIF regions are rows of the
file's text and a notebook's cells are not.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import __version__
from ..causes import CAUSES, Cause
from ..model import Finding, Location

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render_sarif(diagnostics: list[Finding], root: str | None = None) -> str:
    root = os.path.abspath(root or os.getcwd())
    index = {cause.code: i for i, cause in enumerate(CAUSES)}
    docs = docs_site()
    run = {
        "tool": {"driver": {
            "name": "backward-explainer",
            "semanticVersion": __version__,
            "informationUri": "https://pypi.org/project/backward-explainer/",
            "rules": [_rule(cause, docs) for cause in CAUSES],
        }},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri() + "/"}},
        "columnKind": "unicodeCodePoints",
        "results": [_result(d, index, root) for d in diagnostics],
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


def _result(diagnostic: Finding, index: dict[str, int], root: str) -> dict:
    message = diagnostic.message
    if diagnostic.cell is not None:
        message = f"cell {diagnostic.cell}, line {diagnostic.location.row}: {message}"
    result = {
        "ruleId": diagnostic.code,
        "ruleIndex": index[diagnostic.code],
        "level": _LEVEL[diagnostic.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {
            "artifactLocation": _artifact(diagnostic.filename, root),
            **({} if diagnostic.cell is not None else
               {"region": _region(diagnostic.location, diagnostic.end_location)}),
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
