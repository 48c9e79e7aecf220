"""A language-server client at the wire: JSON-RPC over `python -m lsp_server`'s stdio, byte for
byte. The stress tests use it for messages no real client would send; the latency benchmark for
timestamps on every message."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class WireClient:
    def __init__(self, command: list[str] | None = None, cwd: Path = ROOT) -> None:
        self.started = time.perf_counter()
        self.process = subprocess.Popen(command or [sys.executable, "-m", "lsp_server"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd)
        self.messages: queue.Queue = queue.Queue()  # (arrival time, message)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while True:
                line = stream.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line in (b"\r\n", b"\n"):
                    break
            self.messages.put((time.perf_counter(), json.loads(stream.read(length))))

    def send_bytes(self, body: bytes) -> float:
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()
        return time.perf_counter()

    def send(self, message: dict) -> float:
        """Send a message; returns when it was sent (perf_counter)."""
        return self.send_bytes(json.dumps(message).encode())

    def wait_for(self, accept, timeout: float = 60.0) -> tuple[float, dict] | None:
        """The first message `accept` takes, with its arrival time; None after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                at, message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if accept(message):
                return at, message
        return None

    def request(self, id_: int, method: str, params: dict | None = None, timeout: float = 10.0) -> dict | None:
        """Send a request; its response, or None if none came within `timeout`."""
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}})
        found = self.wait_for(lambda m: m.get("id") == id_ and "method" not in m, timeout)
        return found[1] if found else None

    def initialize(self, root_uri: str | None = None) -> float:
        """The LSP handshake; returns the seconds from spawning to the initialize response."""
        self.request(1, "initialize", {"processId": None, "rootUri": root_uri, "capabilities": {}}, timeout=60)
        elapsed = time.perf_counter() - self.started
        self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return elapsed

    def kill_if_alive(self) -> None:
        """For tests that end the server themselves: whatever failed, leave no process behind."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        try:
            self.request(2, "shutdown", timeout=5)
            self.send({"jsonrpc": "2.0", "method": "exit"})
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
