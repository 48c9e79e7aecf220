"""Findings and their edits in LSP's terms. Positions go through pygls's codec, so columns are
in the client's units (UTF-16 unless the client negotiated another encoding); ours are 1-based
code points."""
from __future__ import annotations

from urllib.parse import unquote

from lsprotocol import types
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange
from pygls.workspace.text_document import TextDocument

from explainer.editor import Settings
from explainer.model import Edit, Finding, Location

SOURCE = "backward-explainer"
_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}


def same_uri(uri: str) -> str:
    """One spelling for every escaping of a URI, as pygls keys its documents."""
    return unquote(uri)


def to_range(document: TextDocument, start: Location, end: Location) -> types.Range:
    return document.range_to_client_units(ServerTextRange(
        ServerTextPosition(start.row - 1, start.column - 1), ServerTextPosition(end.row - 1, end.column - 1)))


def from_position(document: TextDocument, position: types.Position) -> tuple[int, int]:
    """A client position as our (row, column), 1-based code points."""
    server = document.position_from_client_units(position)
    return server.line + 1, server.character + 1


def message(finding: Finding) -> str:
    """The finding's message, saying when the explainer saw the bug happen."""
    if finding.confirmed:
        return f"{finding.message} (confirmed when it ran)"
    if finding.origin == "runtime":
        return f"{finding.message} (explained when it ran)"
    return finding.message


def severity(finding: Finding, settings: Settings) -> types.DiagnosticSeverity:
    """The user's severity; but an error the code really raised when it ran is an error."""
    if (finding.confirmed or finding.origin == "runtime") and finding.severity == "error":
        return types.DiagnosticSeverity.Error
    return _SEVERITY[settings.severity]


def to_lsp(document: TextDocument, finding: Finding, settings: Settings) -> types.Diagnostic:
    return types.Diagnostic(
        range=to_range(document, finding.location, finding.end_location),
        message=message(finding),
        severity=severity(finding, settings),
        code=finding.code,
        code_description=types.CodeDescription(href=finding.url),
        source=SOURCE,
    )


def text_edit(document: TextDocument, edit: Edit) -> types.TextEdit:
    return types.TextEdit(range=to_range(document, edit.location, edit.end_location), new_text=edit.content)


def whole(document: TextDocument, new_text: str) -> types.TextEdit:
    """An edit that replaces all of `document`."""
    return types.TextEdit(range=types.Range(start=types.Position(0, 0), end=types.Position(len(document.lines), 0)),
                          new_text=new_text)
