"""`llada-lsp serve --tcp`: the real server process, spoken to over raw sockets as an editor would.

Every connection sends the token first; a session is the connection's own (documents, settings), one
at a time; no connection, finished or broken, ends the listener. Nothing here sleeps: tests read until
an answer, a notification, the server's log line or the end of the connection.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
TOKEN = b"s3cret-token-of-the-test"
SECRET = "API_KEY = 'only-in-the-document-of-client-a'\n"
pytestmark = pytest.mark.slow  # each test talks to a real server process


class ServerLog:
    """The server's stderr, read on a thread; `wait_for` blocks until a line matches."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, pattern: str, after: int = 0) -> re.Match:
        with self._changed:
            found: list[re.Match] = []

            def seen() -> bool:
                found[:] = [m for line in self.lines[after:] if (m := re.search(pattern, line))]
                return bool(found)

            assert self._changed.wait_for(seen, TIMEOUT), f"no {pattern!r} in the server's log:\n{self.text()}"
            return found[0]

    def text(self) -> str:
        return "".join(self.lines)


class Server:
    def __init__(self, process: subprocess.Popen, log: ServerLog, port: int):
        self.process, self.log, self.port = process, log, port


@contextmanager
def tcp_server(token_file: Path, listen: str = "127.0.0.1:0", *args: str) -> Iterator[Server]:
    command = [sys.executable, "-m", "llada_lsp", "serve", "--tcp", listen, "--token-file", str(token_file),
               "--engine", "local", "--threads", "1", *args]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    log = ServerLog(process.stderr)
    try:
        port = int(log.wait_for(r"listening on \S+:(\d+)").group(1))  # port 0: the system picked it
        yield Server(process, log, port)
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(TIMEOUT)


class Peer:
    """One TCP connection speaking LSP: what it received, raw and as messages."""

    def __init__(self, port: int, token: bytes | None = TOKEN):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.raw = b""  # everything the server sent
        self._buffer = b""
        self.messages: list[dict] = []  # notifications and requests from the server, in order
        self._ids = 0
        if token is not None:
            self.sock.sendall(token + b"\n")

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def receive(self) -> dict | None:
        """The next message, or None once the server has closed the connection."""
        while b"\r\n\r\n" not in self._buffer:
            if not self._recv():
                return None
        header, _, rest = self._buffer.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
        while len(rest) < length:
            if not self._recv():
                return None
            rest = self._buffer.partition(b"\r\n\r\n")[2]
        self._buffer = rest[length:]
        return json.loads(rest[:length])

    def _recv(self) -> bool:
        chunk = self.sock.recv(65536)
        self.raw += chunk
        self._buffer += chunk
        return bool(chunk)

    def request(self, method: str, params: Any = None) -> dict:
        """The response (result or error) to a new request; the server's own requests get a null result."""
        self._ids += 1
        self.send({"id": self._ids, "method": method, "params": params})
        while (message := self.receive()) is not None:
            if "method" not in message and message.get("id") == self._ids:
                return message
            self.messages.append(message)
            if "method" in message and "id" in message:
                self.send({"id": message["id"], "result": None})
        raise AssertionError(f"the server closed the connection before answering {method}")

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"method": method, "params": params})

    def initialize(self, options: Any = None) -> dict:
        params = {"processId": None, "rootUri": None, "capabilities": {}, "initializationOptions": options}
        answer = self.request("initialize", params)
        assert "result" in answer, answer
        self.notify("initialized", {})
        return answer["result"]

    def status(self) -> dict:
        return self.request("workspace/executeCommand", {"command": "llada.status", "arguments": []})["result"]

    def wait_message(self, predicate: Callable[[dict], bool]) -> dict:
        for message in self.messages:
            if predicate(message):
                return message
        while (message := self.receive()) is not None:
            self.messages.append(message)
            if predicate(message):
                return message
        raise AssertionError(f"the connection closed without the message awaited; got {self.messages}")

    def until_closed(self) -> list[dict]:
        """Every message until the server closes the connection."""
        while (message := self.receive()) is not None:
            self.messages.append(message)
        return self.messages

    def close(self) -> None:
        self.sock.close()


def shown(peer: Peer) -> list[str]:
    return [m["params"]["message"] for m in peer.messages if m.get("method") == "window/showMessage"]


def is_shown(text: str) -> Callable[[dict], bool]:
    return lambda m: m.get("method") == "window/showMessage" and text in m["params"]["message"]


def open_secret(peer: Peer, uri: str) -> None:
    doc = {"uri": uri, "languageId": "python", "version": 1, "text": SECRET}
    peer.notify("textDocument/didOpen", {"textDocument": doc})


def rewrite_of(peer: Peer, uri: str, version: int) -> dict:
    """llada.rewriteSelection's answer where it needs no model: the document is not open, or is at
    another version."""
    argument = {"textDocument": {"uri": uri, "version": version},
                "range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}}}  # fmt: skip
    return peer.request("workspace/executeCommand", {"command": "llada.rewriteSelection", "arguments": [argument]})


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tcp") / "token"
    path.write_bytes(TOKEN + b"\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def server(token_file: Path) -> Iterator[Server]:
    with tcp_server(token_file) as running:
        yield running


@pytest.fixture
def peers(server: Server) -> Iterator[list[Peer]]:
    """Connections a test opens; closed after it, so the next test's session is not refused."""
    opened: list[Peer] = []
    yield opened
    for peer in opened:
        peer.close()


def connect(server: Server, peers: list[Peer], token: bytes | None = TOKEN) -> Peer:
    peer = Peer(server.port, token)
    peers.append(peer)
    return peer


def test_a_second_connection_is_refused_and_sees_nothing_of_the_first(server: Server, peers: list[Peer]):
    a = connect(server, peers)
    a.initialize()
    open_secret(a, "file:///a/secret.py")
    assert a.status()["engine"] == "local", "the session works: the status comes back on its connection"

    b = connect(server, peers)  # the token, but a session is running: told why, then closed
    b.send({"id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    got = b.until_closed()
    assert [m.get("error", {}).get("code") for m in got if "id" in m] == [-32803], got
    assert "one at a time" in got[-1]["error"]["message"] and any("one at a time" in text for text in shown(b))
    assert SECRET.split("'")[1].encode() not in b.raw

    # A was not taken over: its answers still come to it, and its document is still there.
    reason = rewrite_of(a, "file:///a/secret.py", 2)["result"]["reason"]
    assert reason == "the document is at version 1, the rewrite was asked for version 2"
    a.close()

    # The next connection is a new session: the first one's document is not in it.
    c = connect(server, peers)
    c.initialize()
    result = rewrite_of(c, "file:///a/secret.py", 1)["result"]
    assert result == {"applied": False, "text": "", "reason": "file:///a/secret.py is not open"}
    assert SECRET.split("'")[1].encode() not in c.raw


def test_no_token_or_a_wrong_one_is_refused_before_any_message_is_read(server: Server, peers: list[Peer]):
    initialize = {"id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}}
    for token in (None, b"wrong", TOKEN + b"x", TOKEN[:-1], b""):
        peer = connect(server, peers, token)
        peer.send(initialize)  # an editor without the token starts with this
        peer.send({"method": "exit"})
        got = peer.until_closed()
        assert [m["method"] for m in got] == ["window/showMessage"], (token, got)  # no answer: nothing was read
        assert "wrong or missing token" in got[0]["params"]["message"]
    assert server.process.poll() is None, "not even `exit` after a bad token reaches the server"
    good = connect(server, peers)
    assert good.initialize()["serverInfo"]["name"] == "llada-lsp"


def test_a_bare_connect_and_close_leaves_the_server_listening(server: Server, peers: list[Peer]):
    before = len(server.log.lines)
    socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT).close()
    half = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    half.sendall(TOKEN + b"\nContent-Length: 80\r\n\r\n{")  # a session, cut off mid-message
    half.close()
    server.log.wait_for(r"TCP connection from \S+ closed: no token", before)
    assert server.process.poll() is None
    peer = connect(server, peers)  # an editor reconnecting
    peer.initialize()
    assert peer.status()["engine"] == "local"


def test_shutdown_and_exit_end_the_session_not_the_server(server: Server, peers: list[Peer]):
    a = connect(server, peers)
    a.initialize()
    assert a.request("shutdown")["result"] is None
    a.notify("exit")
    a.until_closed()  # the server closes the connection
    b = connect(server, peers)  # an editor restarting its server reconnects at once
    b.initialize()
    assert b.status()["engine"] == "local"
    assert server.process.poll() is None


def test_a_session_is_framed_as_on_stdio(server: Server, peers: list[Peer]):
    """The transport's limits and recovery hold on TCP too: a lowercase header name is read, a length
    over the limit is refused before its body is read, and the session goes on."""
    peer = connect(server, peers)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"processId": None, "rootUri": None, "capabilities": {}}}).encode()  # fmt: skip
    peer.sock.sendall(b"content-length: %d\r\n\r\n%s" % (len(body), body))
    assert "result" in peer.wait_message(lambda m: m.get("id") == 1)
    peer.sock.sendall(b"Content-Length: 99999999999\r\n\r\n")
    refused = peer.wait_message(lambda m: "error" in m)
    assert refused["id"] is None and refused["error"]["code"] == -32700, refused
    assert peer.status()["engine"] == "local"


def test_a_model_or_engine_setting_other_than_the_command_line_s_is_refused(server: Server, peers: list[Peer],
                                                                          tmp_path: Path):  # fmt: skip
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    peer = connect(server, peers)
    peer.initialize({"model": str(folder), "engine": "unix:/tmp/elsewhere.sock", "inlineMode": "quality"})
    peer.wait_message(is_shown("setting model: over TCP this server loads only the model of its command line"))
    peer.wait_message(is_shown("setting engine: over TCP"))
    status = peer.status()
    assert status["model"] == "embedded" and status["engine"] == "local"
    assert status["inlineMode"] == "quality", "the other settings apply"

    peer.notify("workspace/didChangeConfiguration", {"settings": {"llada": {"model": "/"}}})
    peer.wait_message(is_shown("'/' refused"))
    assert peer.status()["model"] == "embedded"
    # The server's default model, asked for as the protocol says, is allowed.
    told = len(shown(peer))
    peer.notify("workspace/didChangeConfiguration", {"settings": {"model": None}})
    assert peer.status()["model"] == "embedded"
    assert len(shown(peer)) == told, shown(peer)[told:]


def test_loopback_is_listened_on_quietly_and_anything_else_with_a_warning(server: Server, token_file: Path):
    assert "not a loopback address" not in server.log.text()
    with tcp_server(token_file, "0.0.0.0:0") as exposed:
        warning = exposed.log.wait_for(r"WARNING: (\S+) is not a loopback address")
        assert warning.group(1).startswith("0.0.0.0:")
        exposed.process.terminate()
        assert exposed.process.wait(TIMEOUT) == 0, exposed.log.text()


def test_tcp_without_a_private_token_file_does_not_start(tmp_path: Path):
    def serve(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "llada_lsp", "serve", "--tcp", "127.0.0.1:0", "--engine", "local", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    done = serve()
    assert done.returncode == 2 and "--tcp needs --token-file" in done.stderr
    shared = tmp_path / "token"
    shared.write_text("secret\n")
    shared.chmod(0o644)
    done = serve("--token-file", str(shared))
    assert done.returncode == 2 and "must belong to you and have mode 0600" in done.stderr
