"""The language server's handlers, a few lines each: they translate between LSP and
`explainer.editor`, through the session (session.py), the conversions (convert.py) and the
protocol patches (protocol.py)."""
from __future__ import annotations

import asyncio

from lsprotocol import types

from explainer import __version__, editor
from explainer.model import Edit

from .convert import SOURCE, from_position, same_uri, text_edit, to_lsp, to_range, whole
from .session import ExplainerServer, in_checker, notebook_path

SECTION = "backwardExplainer"
FIX_ALL_KIND = types.CodeActionKind.SourceFixAll + ".backward-explainer"
# VS Code asks for `notebook.`-prefixed kinds once per notebook and lets their edits span cells;
# a plain kind it asks of every cell on save, and drops an edit that touches another cell.
NOTEBOOK_FIX_ALL_KIND = "notebook." + FIX_ALL_KIND

server = ExplainerServer()


@server.feature(types.INITIALIZE)
def initialize(ls: ExplainerServer, params: types.InitializeParams) -> None:
    options = params.initialization_options
    if isinstance(options, dict) and SECTION in options:
        options = options[SECTION]
    ls.apply_settings(options, "initializationOptions")


@server.feature(types.INITIALIZED)
async def initialized(ls: ExplainerServer, params: types.InitializedParams) -> None:
    ls.log(types.MessageType.Info, f"{SOURCE} {__version__} started")
    ls.watcher = asyncio.get_running_loop().create_task(ls.watch_findings())
    await pull_configuration(ls)


async def pull_configuration(ls: ExplainerServer) -> None:
    workspace = ls.client_capabilities.workspace
    if workspace is None or not workspace.configuration:
        return
    try:
        (raw,) = await ls.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)]))
    except Exception as error:  # noqa: BLE001 - a client that can't answer keeps the defaults
        ls.log(types.MessageType.Warning, f"workspace/configuration failed: {error}")
        return
    ls.apply_settings(raw, "workspace/configuration")
    ls.recheck_all()


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: ExplainerServer, params: types.DidChangeConfigurationParams) -> None:
    settings = params.settings
    if isinstance(settings, dict) and SECTION in settings:
        ls.apply_settings(settings[SECTION], "didChangeConfiguration")
        ls.recheck_all()
    else:
        await pull_configuration(ls)


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: ExplainerServer, params: types.DidOpenTextDocumentParams) -> None:
    if ls.notebook_of(params.text_document.uri) is None:
        ls.schedule(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: ExplainerServer, params: types.DidChangeTextDocumentParams) -> None:
    notebook = ls.notebook_of(params.text_document.uri)
    ls.schedule(notebook.uri if notebook is not None else params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: ExplainerServer, params: types.DidSaveTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: ExplainerServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.closed(uri)
    ls.checked.pop(same_uri(uri), None)
    ls.too_large.discard(uri)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
def notebook_did_open(ls: ExplainerServer, params: types.DidOpenNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri, 0)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
def notebook_did_change(ls: ExplainerServer, params: types.DidChangeNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
def notebook_did_save(ls: ExplainerServer, params: types.DidSaveNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri, 0)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
def notebook_did_close(ls: ExplainerServer, params: types.DidCloseNotebookDocumentParams) -> None:
    ls.closed(params.notebook_document.uri)
    ls.too_large.discard(params.notebook_document.uri)
    for cell in params.cell_text_documents:
        ls.checked.pop(same_uri(cell.uri), None)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[]))


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
    code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND, NOTEBOOK_FIX_ALL_KIND], resolve_provider=False))
async def code_action(ls: ExplainerServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    document = ls.opened(uri)
    if document is None:
        return []  # a document the client never opened: nothing checked, nothing to fix
    wanted = params.context.only
    actions = quick_fixes(ls, uri, document, params.range) if _asked_for(types.CodeActionKind.QuickFix, wanted) else []
    if any(a.is_preferred for a in actions):
        actions += await _fix_all_as_quick_fix(ls, uri)
    if wanted is None and params.context.trigger_kind == types.CodeActionTriggerKind.Automatic:
        # The light bulb after a cursor move: clients show source actions only when asked for
        # them, so the whole-document fixes below would be computed for nothing.
        return actions
    notebook = ls.notebook_of(uri)
    if _asked_for(FIX_ALL_KIND, wanted):
        action = await (_fix_all_in_cell(ls, notebook, uri) if notebook is not None else _fix_all_in_file(ls, uri))
        actions += [action] if action is not None else []
    if notebook is not None and _asked_for(NOTEBOOK_FIX_ALL_KIND, wanted):
        action = await _fix_all_in_notebook(ls, notebook)
        actions += [action] if action is not None else []
    return actions


def quick_fixes(ls: ExplainerServer, uri: str, document, at: types.Range) -> list[types.CodeAction]:
    """Per finding under the range: its preferred fix, then `# noqa: CODE` on its line."""
    actions = []
    start, end = from_position(document, at.start), from_position(document, at.end)
    for finding in editor.overlapping(ls.diagnostics_at(uri), start, end):
        diagnostic = to_lsp(document, finding, ls.settings)
        edit = workspace_edit(ls, uri, finding.fix.edits) if finding.fix is not None else None
        if edit is not None:
            actions.append(types.CodeAction(title=editor.fix_title(finding), kind=types.CodeActionKind.QuickFix,
                                            diagnostics=[diagnostic], is_preferred=True, edit=edit))
        row = finding.location.row
        noqa = editor.noqa_edit(finding, document.lines[row - 1]) if row <= len(document.lines) else None
        if noqa is not None:
            actions.append(types.CodeAction(
                title=f"Ignore {finding.code} on this line", kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic], edit=types.WorkspaceEdit(changes={uri: [text_edit(document, noqa)]})))
    return actions


async def _fix_all_as_quick_fix(ls: ExplainerServer, uri: str) -> list[types.CodeAction]:
    """Beside a finding's own fix in the Ctrl+. menu (as ESLint's "Fix all auto-fixable
    problems"), every safe fix of the file, or of the whole notebook from a cell, when there are
    at least two: the source action alone is found only under "Source Action...", which a
    notebook cell does not offer."""
    notebook = ls.notebook_of(uri)
    uris = [cell.document for cell in notebook.cells] if notebook is not None else [uri]
    safe = [f for u in uris for f in ls.diagnostics_at(u) if f.fix is not None and f.fix.applicability == "safe"]
    if len(safe) < 2:
        return []
    action = await (_fix_all_in_notebook(ls, notebook) if notebook is not None else _fix_all_in_file(ls, uri))
    return [types.CodeAction(title=action.title, kind=types.CodeActionKind.QuickFix, edit=action.edit)] \
        if action is not None else []


async def _fix_all_in_file(ls: ExplainerServer, uri: str) -> types.CodeAction | None:
    document = ls.opened(uri)
    version = document.version
    fixed = await in_checker(editor.fix_all, document.source, document.path or uri, ls.settings)
    if fixed is None or getattr(ls.opened(uri), "version", None) != version:  # else it's stale
        return None
    return types.CodeAction(title="Fix all backward-explainer problems in this file", kind=FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes={uri: [whole(document, fixed)]}))


async def _fix_all_in_cell(ls: ExplainerServer, notebook: types.NotebookDocument, uri: str) -> types.CodeAction | None:
    """The fixes that lie inside this cell. Other cells may change meanwhile (VS Code fixes every
    cell at once on save): a fix that stays in one cell does not depend on another's text."""
    cells = ls.cells(notebook)
    spelled = [same_uri(c.document) for c in notebook.cells]
    if same_uri(uri) not in spelled or any(c is None and n.kind == types.NotebookCellKind.Code
                                           for c, n in zip(cells, notebook.cells)):
        return None  # a cell not yet opened, or one the notebook doesn't list
    number = spelled.index(same_uri(uri)) + 1
    document = cells[number - 1]
    if document is None:
        return None  # a markdown cell
    version = document.version
    fixed = await in_checker(editor.fix_all_in_cell, [c.source if c else None for c in cells], number,
                             notebook_path(notebook), ls.settings)
    if fixed is None or getattr(ls.opened(uri), "version", None) != version:
        return None
    return types.CodeAction(title="Fix all backward-explainer problems in this cell", kind=FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes={notebook.cells[number - 1].document:
                                                              [whole(document, fixed)]}))


async def _fix_all_in_notebook(ls: ExplainerServer, notebook: types.NotebookDocument) -> types.CodeAction | None:
    """Every code cell fixed as one module: the edit replaces the cells that change, named as the
    client names them."""
    cells = ls.cells(notebook)
    code = [(n, c) for n, c in zip(notebook.cells, cells) if n.kind == types.NotebookCellKind.Code]
    if any(c is None for _, c in code):
        return None
    versions = [c.version for _, c in code]
    fixed = await in_checker(editor.fix_all_cells, [c.source if c else None for c in cells], notebook_path(notebook),
                             ls.settings)
    if fixed is None or [getattr(ls.opened(n.document), "version", None) for n, _ in code] != versions:
        return None  # nothing to fix, or the notebook changed meanwhile
    changes = {n.document: [whole(c, text)] for n, c, text in zip(notebook.cells, cells, fixed)
               if c is not None and text != c.source}
    return types.CodeAction(title="Fix all backward-explainer problems in this notebook", kind=NOTEBOOK_FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes=changes))


def _asked_for(kind: str, only: list[str] | None) -> bool:
    """Whether a code action of `kind` passes the client's `only` filter (kinds are
    hierarchical: `source` admits `source.fixAll.backward-explainer`)."""
    return not only or any(kind == k or kind.startswith(k + ".") for k in only)


def workspace_edit(ls: ExplainerServer, uri: str, edits: tuple[Edit, ...]) -> types.WorkspaceEdit | None:
    """Edits for `uri`, or, in a notebook, for the cells they name."""
    notebook = ls.notebook_of(uri)
    changes: dict[str, list[types.TextEdit]] = {}
    for edit in edits:
        target = notebook.cells[edit.cell - 1].document if notebook is not None and edit.cell else uri
        document = ls.opened(target)
        if document is None:
            return None  # the client closed that cell: half a fix would be wrong
        changes.setdefault(target, []).append(text_edit(document, edit))
    return types.WorkspaceEdit(changes=changes)


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: ExplainerServer, params: types.HoverParams) -> types.Hover | None:
    document = ls.opened(params.text_document.uri)
    if document is None:
        return None
    at = from_position(document, params.position)
    found = editor.overlapping(ls.diagnostics_at(params.text_document.uri), at, at)
    if not found:
        return None
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown,
                                     value="\n\n---\n\n".join(editor.hover_markdown(f) for f in found)),
        range=to_range(document, found[0].location, found[0].end_location))
