"""The language server: pygls handlers over `explainer.static.editor`.

Handlers only translate. The checker runs in a worker thread after a short debounce; a newer
edit cancels the pending check, and a result is published only if its document version is still
the latest. Positions go through pygls's codec, so columns are in the client's units (UTF-16
unless the client negotiated another encoding).

Where pygls leaves a client waiting or the process hanging, `ExplainerProtocol` and `Resync`
answer instead (tests/test_lsp_abuse.py): a request pygls cannot read gets InvalidParams, one
after `shutdown` (or a second `initialize`) gets InvalidRequest, `exit` ends the process at
once, and a bad Content-Length costs one message rather than the rest of the stream. pygls's
per-notification futures are let go (tests/test_lsp_load.py), and documents over
MAX_CHECK_CHARS are not checked.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import unquote

from lsprotocol import types
from pygls import uris
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import RPCRequest
from pygls.protocol.language_server import lsp_method
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange
from pygls.workspace.text_document import TextDocument

from explainer import __version__, handoff
from explainer.model import Edit, Location
from explainer.static import editor
from explainer.static.diagnostic import Diagnostic

SECTION = "backwardExplainer"
SOURCE = "backward-explainer"
FIX_ALL_KIND = types.CodeActionKind.SourceFixAll + ".backward-explainer"
# VS Code asks for `notebook.`-prefixed kinds once per notebook and lets their edits span cells;
# a plain kind it asks of every cell on save, and drops an edit that touches another cell.
NOTEBOOK_FIX_ALL_KIND = "notebook." + FIX_ALL_KIND
DEBOUNCE_S = 0.005
FINDINGS_POLL_S = 0.5
# Larger documents are not checked (their diagnostics are cleared, and the log says why): parsing
# holds the GIL, about 0.5 s per MB of code, so a 20 MB file left every request waiting 10 s and
# took the server to 2.8 GB. 1,000,000 characters is some 45,000 lines of ordinary code.
MAX_CHECK_CHARS = 1_000_000
# Checks run one at a time, in this thread. The checker links and then clears attributes on AST
# nodes, and CPython shares some nodes (Load, Store, Add, ...) between every tree: two checks at
# once (asyncio.to_thread's pool ran up to six, most of them for versions already superseded)
# failed with "'Load' object has no attribute '_owner'" and published nothing. One thread also
# lets a superseded check that has not started be cancelled, instead of competing for the GIL.
CHECKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backward-explainer-check")
_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}
log = logging.getLogger(__name__)


@dataclass
class Checked:
    """The last diagnostics published for a document or notebook cell."""

    version: int | None
    diagnostics: list[Diagnostic]


class ExplainerProtocol(LanguageServerProtocol):
    """pygls's protocol, answering where pygls stays silent."""

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as error:
            # pygls logs a request whose params it cannot read and drops it: the client would
            # wait for the answer forever. Answer it (InvalidParams) when it has a usable id.
            if "method" in data and type(data.get("id")) in (int, str):
                self._send_response(data["id"], error=error.to_response_error())
            raise

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None) -> None:
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        # pygls files the future of a generator or async handler under `msg_id` (for a
        # notification, a made-up one) and forgets it there unless it answers a request: one
        # Future per didChange, 1,000 more every 20 s of typing. A finished one can't be
        # cancelled, so it goes when it is done.
        future = self._request_futures.get(msg_id)
        if future is not None:
            future.add_done_callback(
                lambda done: self._request_futures.pop(msg_id) if self._request_futures.get(msg_id) is done else None)

    def handle_message(self, message) -> None:
        # After `shutdown` pygls ignores requests; LSP says they get InvalidRequest. So does a
        # second `initialize` (LSP: "only once"), which pygls obeyed by forgetting every document.
        if isinstance(message, RPCRequest) and message.method != types.EXIT and (
                self._shutdown or (message.method == types.INITIALIZE and self._workspace is not None)):
            why = "the server is shutting down" if self._shutdown else "the server is already initialized"
            self._send_response(message.id, error=JsonRpcInvalidRequest(f"{message.method}: {why}").to_response_error())
            return
        super().handle_message(message)

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args):
        # pygls 2.1 cancels the pending requests while iterating over `_request_futures`, and a
        # cancelled future's done-callback (ours above, pygls's own) removes it from there:
        # "dictionary changed size during iteration", the client gets an error and exit code 1
        # (pygls issue #606). Cancelled from a snapshot first, pygls then finds them all done.
        current_id = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        return (yield from super().lsp_shutdown(*args))

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args) -> None:
        # End now: sys.exit (pygls's way) waits for checks still running in worker threads
        # (3.6 s after a 150,000-line file). Every message is flushed as it is written.
        os._exit(0 if self._shutdown else 1)


class Resync:
    """stdin as pygls reads it, but finding its place again after a bad Content-Length: a header
    line that follows the leftovers of a message is read as that header. pygls only accepts a
    header at the start of a line, so one wrong length lost every later message."""

    HEADER = re.compile(rb"Content-Length: \d+\r\n$")

    def __init__(self, stream) -> None:
        self.stream = stream

    def readline(self) -> bytes:
        line = self.stream.readline()
        found = self.HEADER.search(line)
        return found.group(0) if found else line

    def read(self, size: int) -> bytes:
        return self.stream.read(size)


class ExplainerServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            SOURCE, __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[types.NotebookDocumentFilterWithCells(
                    notebook="jupyter-notebook", cells=[types.NotebookCellLanguage(language="python")])],
                save=True,
            ),
            protocol_cls=ExplainerProtocol,
        )
        self.too_large: set[str] = set()  # documents not checked for their size, logged once
        self.settings = editor.Settings()
        self.checked: dict[str, Checked] = {}  # by same_uri() of a document or cell
        self.pending: dict[str, asyncio.Task] = {}  # by document or notebook URI
        self.runtime_entries: list[dict] = []  # from explainer.handoff's findings files
        self.findings_seen: dict[str, float | None] = {}  # findings file -> mtime last read
        self.watcher: asyncio.Task | None = None

    def start_io(self, stdin=None, stdout=None) -> None:
        super().start_io(Resync(stdin or sys.stdin.buffer), stdout)

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self, uri: str, delay: float = DEBOUNCE_S) -> None:
        """Check `uri` (a text document or a notebook) after `delay`, replacing a pending check."""
        previous = self.pending.pop(uri, None)
        if previous is not None:
            previous.cancel()
        self.pending[uri] = asyncio.get_running_loop().create_task(self._check_later(uri, delay))

    async def _check_later(self, uri: str, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            notebook = self.workspace.get_notebook_document(notebook_uri=uri)
            if notebook is not None:
                await self._check_notebook(notebook)
            else:
                await self._check_text(uri)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - one bad document must not stop the server
            self.log(types.MessageType.Error, f"checking {uri} failed: {type(error).__name__}: {error}")
        finally:
            if self.pending.get(uri) is asyncio.current_task():
                del self.pending[uri]

    def opened(self, uri: str) -> TextDocument | None:
        """The open document or notebook cell at `uri`, however the client escaped it. pygls
        keys its documents by the unescaped URI while notebook cells keep the client's spelling
        (VS Code sends `...#W2sdnNjb2Rl...%3D%3D`), so a plain dict lookup misses cells."""
        return self.workspace.text_documents.get(same_uri(uri))

    async def _check_text(self, uri: str) -> None:
        document = self.opened(uri)
        if document is None:
            return
        version, text, settings = document.version, document.source, self.settings
        path = document.path or uri
        if self.over_limit(uri, len(text)):
            self.publish(document, [], settings)
            return
        found = await in_checker(editor.check_document, text, path, settings)
        current = self.opened(uri)
        if found is None or current is None or current.version != version:
            return  # mid-typing syntax error: keep what is shown; or a newer edit wins
        found = found + editor.runtime_diagnostics(self.runtime_entries, path, text)
        self.publish(document, found, settings)

    async def _check_notebook(self, notebook: types.NotebookDocument) -> None:
        documents = [self.opened(cell_uri) for cell_uri in code_cell_uris(notebook)]
        documents = [d for d in documents if d is not None]
        versions = [d.version for d in documents]
        settings = self.settings
        path = notebook_path(notebook)
        sources = [d.source for d in documents]
        if self.over_limit(notebook.uri, sum(map(len, sources))):
            for document in documents:
                self.publish(document, [], settings)
            return
        found = await in_checker(editor.check_cells, sources, path, settings)
        latest = [getattr(self.opened(d.uri), "version", None) for d in documents]
        if latest != versions:
            return  # a cell changed meanwhile: its own check is scheduled
        runtime = editor.runtime_cell_diagnostics(self.runtime_entries, sources, path)
        for document, diagnostics, from_runs in zip(documents, found, runtime):
            self.publish(document, diagnostics + from_runs, settings)

    def over_limit(self, uri: str, size: int) -> bool:
        if size <= MAX_CHECK_CHARS:
            self.too_large.discard(uri)
            return False
        if uri not in self.too_large:
            self.too_large.add(uri)
            self.log(types.MessageType.Warning, f"{uri} is not checked: {size:,} characters, more than "
                     f"{MAX_CHECK_CHARS:,} (`explainer check` checks it)")
        return True

    def publish(self, document: TextDocument, found: list[Diagnostic], settings: editor.Settings) -> None:
        self.checked[same_uri(document.uri)] = Checked(document.version, found)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=document.uri, version=document.version,
            diagnostics=[to_lsp(document, d, settings) for d in found]))

    def recheck_all(self) -> None:
        notebooks = list(self.workspace.notebook_documents.values())
        cell_uris = {same_uri(c.document) for nb in notebooks for c in nb.cells}
        for notebook in notebooks:
            self.schedule(notebook.uri, 0)
        for document in list(self.workspace.text_documents.values()):
            if same_uri(document.uri) not in cell_uris:  # a cell is checked with its notebook
                self.schedule(document.uri, 0)

    async def watch_findings(self, interval: float = FINDINGS_POLL_S) -> None:
        """Re-read the runtime findings files of the open projects when they change, and
        re-publish: a script explained at runtime shows its finding in the editor."""
        while True:
            try:
                roots = {handoff.project_root(p) for p in self.project_paths()}
                files = {str(root / handoff.FILE) for root in roots}
                stamps = {f: _mtime(f) for f in files}
                if stamps != {f: self.findings_seen.get(f) for f in files}:
                    self.findings_seen.update(stamps)
                    self.runtime_entries = [e for f in sorted(files) for e in handoff.read(f)]
                    self.recheck_all()
            except Exception as error:  # noqa: BLE001 - keep watching; say once per failure
                self.log(types.MessageType.Warning, f"reading runtime findings failed: {error}")
            await asyncio.sleep(interval)

    def project_paths(self) -> list[str]:
        folders = [uris.to_fs_path(f.uri) for f in self.workspace.folders.values()]
        documents = [d.path for d in self.workspace.text_documents.values() if d.path]
        return [p for p in [*folders, *documents] if p]

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def apply_settings(self, raw, origin: str) -> None:
        self.settings = editor.Settings.from_client(raw, self.settings)
        for problem in self.settings.problems:
            self.log(types.MessageType.Warning, f"{origin}: {problem}; keeping the previous value")

    def diagnostics_at(self, uri: str) -> list[Diagnostic]:
        checked = self.checked.get(same_uri(uri))
        return checked.diagnostics if checked is not None else []


def in_checker(function, *args):
    return asyncio.get_running_loop().run_in_executor(CHECKER, function, *args)


def same_uri(uri: str) -> str:
    """One spelling for every escaping of a URI, as pygls keys its documents."""
    return unquote(uri)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


# -- translation ------------------------------------------------------------------------------


def to_range(document: TextDocument, start: Location, end: Location) -> types.Range:
    return document.range_to_client_units(ServerTextRange(
        ServerTextPosition(start.row - 1, start.column - 1), ServerTextPosition(end.row - 1, end.column - 1)))


def from_position(document: TextDocument, position: types.Position) -> tuple[int, int]:
    """A client position as our (row, column), 1-based code points."""
    server = document.position_from_client_units(position)
    return server.line + 1, server.character + 1


def to_lsp(document: TextDocument, diagnostic: Diagnostic, settings: editor.Settings) -> types.Diagnostic:
    return types.Diagnostic(
        range=to_range(document, diagnostic.location, diagnostic.end_location),
        message=diagnostic.message,
        severity=_SEVERITY[settings.severity],
        code=diagnostic.code,
        code_description=types.CodeDescription(href=diagnostic.url),
        source=SOURCE,
    )


def text_edit(document: TextDocument, edit: Edit) -> types.TextEdit:
    return types.TextEdit(range=to_range(document, edit.location, edit.end_location), new_text=edit.content)


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
    if ls.workspace.get_notebook_document(cell_uri=params.text_document.uri) is None:
        ls.schedule(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: ExplainerServer, params: types.DidChangeTextDocumentParams) -> None:
    notebook = ls.workspace.get_notebook_document(cell_uri=params.text_document.uri)
    ls.schedule(notebook.uri if notebook is not None else params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: ExplainerServer, params: types.DidSaveTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: ExplainerServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    pending = ls.pending.pop(uri, None)
    if pending is not None:
        pending.cancel()
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
    start = from_position(document, params.range.start)
    end = from_position(document, params.range.end)
    actions = []
    wanted = params.context.only
    if _asked_for(types.CodeActionKind.QuickFix, wanted):
        for diagnostic in editor.overlapping(ls.diagnostics_at(uri), start, end):
            edit = workspace_edit(ls, uri, diagnostic.fix.edits) if diagnostic.fix is not None else None
            if edit is None:
                continue
            actions.append(types.CodeAction(
                title=f"{diagnostic.fix.message} ({diagnostic.code})",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[to_lsp(document, diagnostic, ls.settings)],
                is_preferred=True,
                edit=edit))
    if wanted is None and params.context.trigger_kind == types.CodeActionTriggerKind.Automatic:
        # The light bulb after a cursor move: clients show source actions only when asked for
        # them, so the whole-document fixes below would be computed for nothing.
        return actions
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    if _asked_for(FIX_ALL_KIND, wanted):
        action = await (_fix_all_in_cell(ls, notebook, uri) if notebook is not None else _fix_all_in_file(ls, uri))
        if action is not None:
            actions.append(action)
    if notebook is not None and _asked_for(NOTEBOOK_FIX_ALL_KIND, wanted):
        action = await _fix_all_in_notebook(ls, notebook)
        if action is not None:
            actions.append(action)
    return actions


async def _fix_all_in_file(ls: ExplainerServer, uri: str) -> types.CodeAction | None:
    document = ls.opened(uri)
    version = document.version
    fixed = await in_checker(editor.fix_all, document.source, document.path or uri, ls.settings)
    if fixed is None or getattr(ls.opened(uri), "version", None) != version:  # else it's stale
        return None
    return types.CodeAction(title="Fix all backward-explainer problems in this file", kind=FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes={uri: [_whole(document, fixed)]}))


async def _fix_all_in_cell(ls: ExplainerServer, notebook: types.NotebookDocument, uri: str) -> types.CodeAction | None:
    """The fixes that lie inside this cell. Other cells may change meanwhile (VS Code fixes every
    cell at once on save): a fix that stays in one cell does not depend on another's text."""
    cell_uris = code_cell_uris(notebook)
    cells = [ls.opened(cell_uri) for cell_uri in cell_uris]
    spelled = [same_uri(cell_uri) for cell_uri in cell_uris]
    if any(cell is None for cell in cells) or same_uri(uri) not in spelled:
        return None  # a cell not yet opened, or a markdown cell
    index = spelled.index(same_uri(uri))
    version = cells[index].version
    fixed = await in_checker(editor.fix_all_in_cell, [cell.source for cell in cells], index, notebook_path(notebook),
                             ls.settings)
    if fixed is None or getattr(ls.opened(uri), "version", None) != version:
        return None
    return types.CodeAction(title="Fix all backward-explainer problems in this cell", kind=FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes={cell_uris[index]: [_whole(cells[index], fixed)]}))


async def _fix_all_in_notebook(ls: ExplainerServer, notebook: types.NotebookDocument) -> types.CodeAction | None:
    """Every code cell fixed as one module: the edit replaces the cells that change, named as the
    client names them."""
    cell_uris = code_cell_uris(notebook)
    cells = [ls.opened(cell_uri) for cell_uri in cell_uris]
    if any(cell is None for cell in cells):
        return None
    versions = [cell.version for cell in cells]
    fixed = await in_checker(editor.fix_all_cells, [cell.source for cell in cells], notebook_path(notebook), ls.settings)
    if fixed is None or [getattr(ls.opened(u), "version", None) for u in cell_uris] != versions:
        return None  # nothing to fix, or the notebook changed meanwhile
    changes = {cell_uri: [_whole(cell, text)]
               for cell_uri, cell, text in zip(cell_uris, cells, fixed) if text != cell.source}
    return types.CodeAction(title="Fix all backward-explainer problems in this notebook", kind=NOTEBOOK_FIX_ALL_KIND,
                            edit=types.WorkspaceEdit(changes=changes))


def code_cell_uris(notebook: types.NotebookDocument) -> list[str]:
    """The notebook's code cells, in order, by the URIs the client names them with."""
    return [c.document for c in notebook.cells if c.kind == types.NotebookCellKind.Code]


def notebook_path(notebook: types.NotebookDocument) -> str:
    return uris.to_fs_path(notebook.uri) or notebook.uri


def _whole(document, new_text: str) -> types.TextEdit:
    """An edit that replaces all of `document`."""
    return types.TextEdit(range=types.Range(start=types.Position(0, 0), end=types.Position(len(document.lines), 0)),
                          new_text=new_text)


def _asked_for(kind: str, only: list[str] | None) -> bool:
    """Whether a code action of `kind` passes the client's `only` filter (kinds are
    hierarchical: `source` admits `source.fixAll.backward-explainer`)."""
    return not only or any(kind == k or kind.startswith(k + ".") for k in only)


def workspace_edit(ls: ExplainerServer, uri: str, edits: tuple[Edit, ...]) -> types.WorkspaceEdit | None:
    """Edits for `uri`, or, in a notebook, for the cells they name."""
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    cell_uris = code_cell_uris(notebook) if notebook else []
    changes: dict[str, list[types.TextEdit]] = {}
    for edit in edits:
        target = cell_uris[edit.cell - 1] if notebook is not None and edit.cell else uri
        document = ls.opened(target)
        if document is None:
            return None  # the client closed that cell: half a fix would be wrong
        changes.setdefault(target, []).append(text_edit(document, edit))
    return types.WorkspaceEdit(changes=changes)


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: ExplainerServer, params: types.HoverParams) -> types.Hover | None:
    uri = params.text_document.uri
    document = ls.opened(uri)
    if document is None or not ls.diagnostics_at(uri):
        return None
    at = from_position(document, params.position)
    found = editor.overlapping(ls.diagnostics_at(uri), at, at)
    if not found:
        return None
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown,
                                     value="\n\n---\n\n".join(editor.hover_markdown(d) for d in found)),
        range=to_range(document, found[0].location, found[0].end_location))
