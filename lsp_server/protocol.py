"""Where pygls leaves a client waiting or the process hanging, these answer instead
(tests/test_lsp_abuse.py): a request pygls cannot read gets InvalidParams, one after `shutdown`
(or a second `initialize`) gets InvalidRequest, `exit` ends the process at once, and a bad
Content-Length costs one message rather than the rest of the stream. pygls's per-notification
futures are let go (tests/test_lsp_load.py)."""
from __future__ import annotations

import os
import re

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import RPCRequest
from pygls.protocol.language_server import lsp_method


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
