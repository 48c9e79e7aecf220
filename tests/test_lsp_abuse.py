"""The language server against a hostile or broken client, at the wire (tests/lsp_wire.py):
malformed JSON-RPC, bad frames, wrong params, unknown methods, documents never opened, a 20 MB
message, `shutdown` in the middle of a big check. After every case the server must still answer
an ordinary request correctly: the client sees errors, never a dead server.

test_lsp.py already covers `{not json`, an unterminated array, one request with a wrong param
type, an unknown request, a didChange with no changes for a document never opened, and a hover
on a document never opened; these go further."""
from __future__ import annotations

import json
import sys
import time

import pytest
from lsp_wire import WireClient

from conftest import ROOT, Workspace

sys.path.insert(0, str(ROOT / "benchmarks"))
from lsp_latency import training_file  # noqa: E402

SAMPLE_NAME = "rnn_hidden_chunks"
INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32600, -32601, -32602


class Server(WireClient):
    """A server with the buggy sample open and checked; `alive()` asks it about that sample."""

    def __init__(self, workspace: Workspace) -> None:
        super().__init__()
        self.seen: list[dict] = []  # every message wait_for has looked at
        self.next_id = 100
        self.sample = workspace.sample(SAMPLE_NAME)
        self.uri = self.sample.path.as_uri()
        self.initialize(workspace.root.as_uri())
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": self.uri, "languageId": "python", "version": 1, "text": self.sample.path.read_text()}})
        assert self.published(self.uri, 1) is not None

    def wait_for(self, accept, timeout: float = 60.0):
        """As WireClient's, but a message an earlier wait passed over still counts."""
        for message in self.seen:
            if accept(message):
                return 0.0, message
        return super().wait_for(lambda m: self.seen.append(m) or accept(m), timeout)

    def notify(self, method: str, params) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def ask(self, method: str, params, timeout: float = 10.0) -> dict | None:
        self.next_id += 1
        return self.request(self.next_id, method, params, timeout=timeout)

    def published(self, uri: str, version: int | None, timeout: float = 30.0) -> list | None:
        found = self.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                              and m["params"]["uri"] == uri and m["params"].get("version") == version, timeout)
        return found[1]["params"]["diagnostics"] if found else None

    def hover_at_culprit(self, timeout: float = 10.0) -> dict | None:
        return self.ask("textDocument/hover", {"textDocument": {"uri": self.uri},
                                               "position": {"line": self.sample.culprit_row - 1, "character": 10}},
                        timeout)

    def alive(self) -> None:
        """The server answers an ordinary request, and answers it right."""
        assert self.process.poll() is None, "the server died"
        answer = self.hover_at_culprit()
        assert answer is not None, "the server did not answer"
        assert "BX001" in answer["result"]["contents"]["value"], answer


@pytest.fixture
def server(workspace):
    running = Server(workspace)
    yield running
    running.close()
    assert running.process.returncode == 0


def test_bodies_that_are_not_requests_are_dropped_and_the_server_lives(server):
    for body in [b"[1, 2, 3]", b"42", b'"initialize"', b"null", b"{}", b"",
                 b'[{"jsonrpc": "2.0", "id": 7, "method": "shutdown"}]',  # a batch: not LSP
                 json.dumps({"jsonrpc": "2.0", "params": {}}).encode(),  # no method, no id
                 json.dumps({"jsonrpc": "2.0", "id": 8, "params": {}}).encode(),  # no method: a response?
                 json.dumps({"id": 9, "method": "textDocument/hover", "params": {}}).encode(),  # no "jsonrpc"
                 json.dumps({"jsonrpc": "2.0", "id": {"x": 1}, "method": "textDocument/hover"}).encode(),
                 "{\"jsonrpc\": \"2.0\", \"method\": \"\udcff\"}".encode("utf-8", "surrogatepass"),  # not UTF-8
                 b"\xef\xbb\xbf{}"]:  # a byte-order mark
        server.send_bytes(body)
        server.alive()
    # A method that is not a string: an error answer, not silence.
    server.send({"jsonrpc": "2.0", "id": 10, "method": 5, "params": {}})
    found = server.wait_for(lambda m: m.get("id") == 10, 10)
    assert found is not None and "error" in found[1]
    server.alive()


def test_requests_with_params_of_the_wrong_type_get_invalid_params(server):
    # pygls dropped these without an answer, so a client waited for ever (regression).
    hover = "textDocument/hover"
    cases = [(hover, [1, 2]), (hover, None), (hover, {"textDocument": {"uri": server.uri}}),
             (hover, {"textDocument": {"uri": server.uri}, "position": {"line": -1, "character": 0}}),
             (hover, {"textDocument": {"uri": server.uri}, "position": {"line": "three", "character": 0}}),
             ("textDocument/codeAction", {"textDocument": {"uri": server.uri}, "range": "all", "context": {}})]
    for method, params in cases:
        server.next_id += 1
        server.send({"jsonrpc": "2.0", "id": server.next_id, "method": method,
                     **({} if params is None else {"params": params})})
        found = server.wait_for(lambda m: m.get("id") == server.next_id, 10)
        assert found is not None, (method, params)
        assert found[1]["error"]["code"] == INVALID_PARAMS, (method, params, found[1])
        server.alive()
    # Notifications with bad params can't be answered: dropped, and nothing else changes.
    for method, params in [("textDocument/didOpen", {"textDocument": {"uri": 5}}),
                           ("textDocument/didChange", {"textDocument": {"uri": server.uri}, "contentChanges": "x"}),
                           ("textDocument/didClose", [server.uri]),
                           ("workspace/didChangeConfiguration", {"settings": [1, 2]}),
                           ("workspace/didChangeConfiguration", {"settings": {"backwardExplainer": "loud"}}),
                           ("$/cancelRequest", {"id": 999_999})]:
        server.notify(method, params)
        server.alive()
    # Positions far outside the document are answered, not errors.
    far = {"line": 1_000_000, "character": 1_000_000}
    assert server.ask("textDocument/hover", {"textDocument": {"uri": server.uri}, "position": far}) \
        == {"id": server.next_id, "jsonrpc": "2.0", "result": None}
    actions = server.ask("textDocument/codeAction", {"textDocument": {"uri": server.uri}, "context": {"diagnostics": []},
                                                     "range": {"start": {"line": 0, "character": 0}, "end": far}})
    assert [a["kind"] for a in actions["result"]] == ["quickfix", "quickfix", "source.fixAll.backward-explainer"]
    server.alive()


def test_unknown_methods(server):
    for method in ["$/backwardExplainer/unknown", "textDocument/notAThing", "workspace/notAThing"]:
        answer = server.ask(method, {"command": "x", "arguments": []})
        assert answer["error"]["code"] == METHOD_NOT_FOUND, answer
    server.alive()
    # An unknown notification is ignored: no answer of any kind (a `$/` one, LSP says, silently).
    server.seen.clear()
    for method in ["$/unknown", "backwardExplainer/unknown", "textDocument/notAThing"]:
        server.notify(method, {"x": 1})
    server.alive()
    assert [m["id"] for m in server.seen if "id" in m and "method" not in m] == [server.next_id]


def test_documents_never_opened(server, tmp_path):
    never = (tmp_path / "never.py").as_uri()
    document = {"textDocument": {"uri": never}}
    whole = {"start": {"line": 0, "character": 0}, "end": {"line": 5, "character": 0}}
    assert server.ask("textDocument/codeAction", {**document, "range": whole,
                                                  "context": {"diagnostics": []}})["result"] == []
    assert server.ask("textDocument/codeAction", {**document, "range": whole, "context": {
        "diagnostics": [], "only": ["source.fixAll"]}})["result"] == []
    assert server.ask("textDocument/hover", {**document, "position": {"line": 0, "character": 0}})["result"] is None
    # Incremental changes, a save and a close for it: nothing to apply them to, nothing breaks.
    server.notify("textDocument/didChange", {"textDocument": {"uri": never, "version": 7}, "contentChanges": [
        {"range": {"start": {"line": 3, "character": 2}, "end": {"line": 9, "character": 0}}, "text": "x = 1\n"}]})
    server.notify("textDocument/didSave", document)
    server.notify("textDocument/didClose", document)
    server.alive()
    # The document can still be opened afterwards, and is checked as it is then.
    server.notify("textDocument/didOpen", {"textDocument": {
        "uri": never, "languageId": "python", "version": 1, "text": server.sample.path.read_text()}})
    assert [d["code"] for d in server.published(never, 1)] == ["BX001"]


def probe_until_answered(server: Server, probes: int = 3) -> int:
    """Send hovers until one is answered; how many it took."""
    for sent in range(1, probes + 1):
        answer = server.hover_at_culprit(timeout=2)
        if answer is not None:
            assert "BX001" in answer["result"]["contents"]["value"]
            return sent
    raise AssertionError(f"{probes} requests after a bad frame, none answered: the stream never recovered")


@pytest.mark.parametrize("frame", ["short-length", "long-length", "header-without-body", "bad-length-header"])
def test_a_bad_frame_costs_at_most_the_next_message(server, frame):
    body = json.dumps({"jsonrpc": "2.0", "id": 50, "method": "textDocument/hover", "params": {
        "textDocument": {"uri": server.uri}, "position": {"line": 0, "character": 0}}}).encode()
    stdin = server.process.stdin
    if frame == "short-length":
        stdin.write(b"Content-Length: %d\r\n\r\n" % (len(body) - 20) + body)
    elif frame == "long-length":
        stdin.write(b"Content-Length: %d\r\n\r\n" % (len(body) + 20) + body)
    elif frame == "header-without-body":
        stdin.write(b"Content-Length: 40\r\n\r\n")
    else:
        stdin.write(b"Content-Length: lots\r\n\r\n" + body)
    stdin.flush()
    # pygls only reads a header at the start of a line: before Resync, the leftovers of a bad
    # frame swallowed every later header, and the server never answered again (regression).
    assert probe_until_answered(server) <= 2
    server.alive()


def test_a_20_mb_message(server, tmp_path):
    huge = (tmp_path / "generated.py").as_uri()
    text = training_file(920_000)  # some 20 MB of real code, with one BX001 at its end
    assert len(text) > 20_000_000
    sent = time.monotonic()
    server.notify("textDocument/didOpen", {"textDocument": {
        "uri": huge, "languageId": "python", "version": 1, "text": text}})
    server.alive()
    # Parsing it would hold the GIL ~10 s (every request waiting) and take 2.8 GB: too large to
    # check, so it is answered with no diagnostics and a line in the log (regression).
    assert time.monotonic() - sent < 8, "the server was unresponsive while it read the 20 MB message"
    assert server.published(huge, 1) == []
    logged = server.wait_for(lambda m: m.get("method") == "window/logMessage"
                             and "is not checked" in m["params"]["message"], 10)
    assert logged is not None and huge in logged[1]["params"]["message"]
    # Cut down to an ordinary size, it is checked again.
    server.notify("textDocument/didChange", {"textDocument": {"uri": huge, "version": 2},
                                             "contentChanges": [{"text": server.sample.path.read_text()}]})
    assert [d["code"] for d in server.published(huge, 2)] == ["BX001"]
    server.alive()


def test_a_second_initialize_is_refused_and_keeps_the_documents(server):
    answer = server.ask("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    assert answer["error"]["code"] == INVALID_REQUEST
    server.alive()  # pygls used to start a new workspace: every open document forgotten (regression)


def test_shutdown_during_a_big_check_then_exit(workspace):
    server = Server(workspace)
    try:
        # Eight 20,000-line files: checks that keep the worker threads busy for seconds.
        text = training_file(20_000)
        for n in range(8):
            server.notify("textDocument/didOpen", {"textDocument": {
                "uri": f"file:///big_{n}.py", "languageId": "python", "version": 1, "text": text}})
        time.sleep(0.3)
        asked = time.monotonic()
        assert server.ask("shutdown", None, timeout=10) == {"id": server.next_id, "jsonrpc": "2.0", "result": None}
        assert time.monotonic() - asked < 10
        # After shutdown, requests are errors (InvalidRequest), not silence (regression).
        assert server.hover_at_culprit()["error"]["code"] == INVALID_REQUEST
        assert server.ask("shutdown", None)["error"]["code"] == INVALID_REQUEST
        assert server.process.poll() is None
        server.notify("exit", None)
        exiting = time.monotonic()
        # pygls's sys.exit waited for the checks still running in worker threads (regression).
        assert server.process.wait(timeout=10) == 0
        assert time.monotonic() - exiting < 3
    finally:
        server.kill_if_alive()


def test_shutdown_while_the_server_waits_for_the_client():
    """A client that stops the server before answering its `workspace/configuration` request
    (VS Code restarting it twice in a row when a workspace becomes trusted) gets its `shutdown`
    answered, and exit code 0. pygls 2.1 cancelled the pending requests while iterating over the
    dict their cancellation removes them from: "dictionary changed size during iteration", exit 1,
    and the VS Code client never started a server again (regression)."""
    server = WireClient()
    try:
        server.request(1, "initialize", {"processId": None, "rootUri": None,
                                         "capabilities": {"workspace": {"configuration": True}}}, timeout=60)
        server.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        assert server.wait_for(lambda m: m.get("method") == "workspace/configuration", 10) is not None
        assert server.request(2, "shutdown", timeout=10) == {"id": 2, "jsonrpc": "2.0", "result": None}
        server.send({"jsonrpc": "2.0", "method": "exit"})
        assert server.process.wait(timeout=10) == 0
    finally:
        server.kill_if_alive()


def test_exit_without_shutdown_is_code_1():
    server = WireClient()
    try:
        server.initialize()
        server.send({"jsonrpc": "2.0", "method": "exit"})
        assert server.process.wait(timeout=10) == 1
    finally:
        server.kill_if_alive()
