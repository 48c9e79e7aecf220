"""The server's state and scheduling: open documents and notebooks, the user's settings, the
runtime findings handed over by `explainer run` and `%load_ext explainer`, and the checks.

The checker runs in a worker thread after a short debounce; a newer edit cancels the pending
check, and a result is published only if its document version is still the latest. Documents
over MAX_CHECK_CHARS are not checked.
"""
from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lsprotocol import types
from pygls import uris
from pygls.lsp.server import LanguageServer
from pygls.workspace.text_document import TextDocument

from explainer import __version__, editor, handoff
from explainer.model import Finding

from .convert import SOURCE, same_uri, to_lsp
from .protocol import ExplainerProtocol, Resync

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


@dataclass
class Checked:
    """The last findings published for a document or notebook cell."""

    version: int | None
    findings: list[Finding]


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
        # Each open document's and notebook's parsed statements, by URI: an edit re-parses
        # only what it changed. Used and closed in the CHECKER thread only.
        self.reparsers: dict[str, editor.Reparser] = {}
        self.pending: dict[str, asyncio.Task] = {}  # by document or notebook URI
        self.runtime_entries: list[handoff.Entry] = []  # from explainer.handoff's findings files
        self.findings_seen: dict[str, float | None] = {}  # findings file -> mtime last read
        self.watcher: asyncio.Task | None = None

    def start_io(self, stdin=None, stdout=None) -> None:
        super().start_io(Resync(stdin or sys.stdin.buffer), stdout)

    # -- documents ------------------------------------------------------------------------------

    def opened(self, uri: str) -> TextDocument | None:
        """The open document or notebook cell at `uri`, however the client escaped it. pygls
        keys its documents by the unescaped URI while notebook cells keep the client's spelling
        (VS Code sends `...#W2sdnNjb2Rl...%3D%3D`), so a plain dict lookup misses cells."""
        return self.workspace.text_documents.get(same_uri(uri))

    def notebook_of(self, cell_uri: str) -> types.NotebookDocument | None:
        return self.workspace.get_notebook_document(cell_uri=cell_uri)

    def cells(self, notebook: types.NotebookDocument) -> list[TextDocument | None]:
        """The notebook's cells in order: the open document of each code cell, None for a
        markdown cell (as `explainer.editor` numbers cells)."""
        return [self.opened(c.document) if c.kind == types.NotebookCellKind.Code else None for c in notebook.cells]

    def diagnostics_at(self, uri: str) -> list[Finding]:
        checked = self.checked.get(same_uri(uri))
        return checked.findings if checked is not None else []

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self, uri: str, delay: float = DEBOUNCE_S) -> None:
        """Check `uri` (a text document or a notebook) after `delay`, replacing a pending check."""
        previous = self.pending.pop(uri, None)
        if previous is not None:
            previous.cancel()
        self.pending[uri] = asyncio.get_running_loop().create_task(self._check_later(uri, delay))

    def cancel(self, uri: str) -> None:
        pending = self.pending.pop(uri, None)
        if pending is not None:
            pending.cancel()

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

    async def _check_text(self, uri: str) -> None:
        document = self.opened(uri)
        if document is None:
            return
        version, text, settings = document.version, document.source, self.settings
        path = document.path or uri
        if self.over_limit(uri, len(text)):
            self.publish(document, [], settings)
            return
        found = await in_checker(editor.check_document, text, path, settings, self.reparser(uri))
        current = self.opened(uri)
        if found is None or current is None or current.version != version:
            return  # mid-typing syntax error: keep what is shown; or a newer edit wins
        self.publish(document, editor.one_per_bug(found, editor.runtime_findings(self.runtime_entries, path, text)),
                     settings)

    async def _check_notebook(self, notebook: types.NotebookDocument) -> None:
        documents = self.cells(notebook)
        code = [(i, d) for i, d in enumerate(documents) if d is not None]
        versions = [d.version for _, d in code]
        settings = self.settings
        path = notebook_path(notebook)
        sources = [d.source if d is not None else None for d in documents]
        if self.over_limit(notebook.uri, sum(len(s) for s in sources if s is not None)):
            for _, document in code:
                self.publish(document, [], settings)
            return
        found = await in_checker(editor.check_cells, sources, path, settings, self.reparser(notebook.uri))
        if [getattr(self.opened(d.uri), "version", None) for _, d in code] != versions:
            return  # a cell changed meanwhile: its own check is scheduled
        ran = editor.runtime_cell_findings(self.runtime_entries, sources, path)
        for index, document in code:
            self.publish(document, editor.one_per_bug(found[index], ran[index]), settings)

    def reparser(self, uri: str) -> editor.Reparser:
        return self.reparsers.setdefault(uri, editor.Reparser())

    def closed(self, uri: str) -> None:
        """`uri` (a document or notebook) was closed: free its parsed statements after any check
        of it that is running (checks run one at a time, in order)."""
        self.cancel(uri)
        reparser = self.reparsers.pop(uri, None)
        if reparser is not None:
            CHECKER.submit(reparser.close)

    def over_limit(self, uri: str, size: int) -> bool:
        if size <= MAX_CHECK_CHARS:
            self.too_large.discard(uri)
            return False
        if uri not in self.too_large:
            self.too_large.add(uri)
            self.log(types.MessageType.Warning, f"{uri} is not checked: {size:,} characters, more than "
                     f"{MAX_CHECK_CHARS:,} (`explainer check` checks it)")
        return True

    def publish(self, document: TextDocument, found: list[Finding], settings: editor.Settings) -> None:
        self.checked[same_uri(document.uri)] = Checked(document.version, found)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=document.uri, version=document.version,
            diagnostics=[to_lsp(document, f, settings) for f in found]))

    def recheck_all(self) -> None:
        notebooks = list(self.workspace.notebook_documents.values())
        cell_uris = {same_uri(c.document) for nb in notebooks for c in nb.cells}
        for notebook in notebooks:
            self.schedule(notebook.uri, 0)
        for document in list(self.workspace.text_documents.values()):
            if same_uri(document.uri) not in cell_uris:  # a cell is checked with its notebook
                self.schedule(document.uri, 0)

    # -- runtime findings -----------------------------------------------------------------------

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

    # -- settings and the log -------------------------------------------------------------------

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def apply_settings(self, raw, origin: str) -> None:
        self.settings = editor.Settings.from_client(raw, self.settings)
        for problem in self.settings.problems:
            self.log(types.MessageType.Warning, f"{origin}: {problem}; keeping the previous value")


def in_checker(function, *args):
    return asyncio.get_running_loop().run_in_executor(CHECKER, function, *args)


def notebook_path(notebook: types.NotebookDocument) -> str:
    return uris.to_fs_path(notebook.uri) or notebook.uri


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
