"""The server's transport against broken and hostile clients (issue 14): the real server process over
stdio, fed raw bytes. Framing tests never initialize the server, so no model loads: a request before
`initialize` answers -32002, and an answer carrying the request's id is all they need to see.

Replies are read by a thread and awaited with a timeout; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llada_lsp.model import EMBEDDED_MODEL
from llada_lsp.server.transport import MAX_CONTENT_LENGTH, MAX_HEADER_LINE

pytestmark = pytest.mark.slow  # each test starts the real server

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
PARSE_ERROR, INVALID_REQUEST, NOT_INITIALIZED = -32700, -32600, -32002
needs_model = pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="no embedded model")


class RawServer:
    """`llada-lsp serve --engine local` with raw bytes in; framed messages out, on a queue."""

    def __init__(self, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        command = [sys.executable, "-m", "llada_lsp", "serve", "--engine", "local", "--threads", "1", *args]
        pipe, env = subprocess.PIPE, {**os.environ, **(env or {})}
        self.process = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe, cwd=ROOT, env=env)
        self.messages: queue.Queue[dict | None] = queue.Queue()
        self.seen: list[dict] = []
        self._stderr = bytearray()
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]  # fmt: skip
        for thread in self._readers:
            thread.start()

    def _read_stdout(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if not line or length is None:
                self.messages.put(None)
                return
            self.messages.put(json.loads(out.read(length)))

    def _read_stderr(self) -> None:
        for chunk in iter(lambda: self.process.stderr.read1(65536), b""):
            self._stderr += chunk

    @property
    def stderr(self) -> str:
        return self._stderr.decode("utf-8", "replace")

    def send(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def reply(self, msg_id: int | str) -> dict:
        """The reply to request `msg_id` (or fails after TIMEOUT); what came before it is in `seen`."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            assert message is not None, f"the server closed stdout before answering {msg_id}:\n{self.stderr[-3000:]}"
            self.seen.append(message)
            if message.get("id") == msg_id and "method" not in message:
                return message

    def until(self, method: str) -> dict:
        """The next notification or request `method` from the server."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            assert message is not None, f"the server closed stdout before sending {method}:\n{self.stderr[-3000:]}"
            self.seen.append(message)
            if message.get("method") == method:
                return message

    def ready(self) -> dict:
        """The `llada/status` push that says the model is loaded (completions asked before it answer nothing)."""
        while (status := self.until("llada/status"))["params"]["state"] == "loading":
            pass
        assert status["params"]["state"] == "ready", status
        return status

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            pipe.close()


@pytest.fixture
def server():
    server = RawServer()
    yield server
    server.close()


def frame(message: Any, header: bytes = b"Content-Length: %d\r\n\r\n") -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return (header % len(body) if b"%d" in header else header) + body


def request(msg_id: int | str, method: str = "llada/probe", params: Any = None) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def notification(method: str, params: Any = None) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def code(reply: dict) -> int | None:
    return reply.get("error", {}).get("code")


def assert_served(reply: dict) -> None:
    """Answered as a request that arrived whole (before initialize: -32002), not refused by framing."""
    assert code(reply) not in (PARSE_ERROR, INVALID_REQUEST), reply


def assert_alive(server: RawServer) -> None:
    assert server.process.poll() is None, f"the server died:\n{server.stderr[-3000:]}"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("args", [("--stdio",), ("--stdio", "--clientProcessId=4242")])
def test_the_server_starts_as_lsp_client_frameworks_start_it(args):
    """vscode-languageclient appends `--stdio` (and other clients `--clientProcessId`) to the server's command:
    the server must serve stdio as it does without them, not exit on an unknown argument."""
    server = RawServer(args=args)
    try:
        server.send(frame(request(1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})))
        assert "capabilities" in server.reply(1)["result"]
        assert_alive(server)
    finally:
        server.close()


def test_stdio_and_tcp_together_are_refused_readably():
    done = subprocess.run([sys.executable, "-m", "llada_lsp", "--stdio", "--tcp", "127.0.0.1:1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert done.returncode == 2 and "choose one transport" in done.stderr, done.stderr


# --- limits (items 3, 4) ----------------------------------------------------------------------------
def test_a_header_line_over_a_mebibyte_refuses_its_message_and_the_server_reads_on(server):
    server.send(b"X-Padding: " + b"a" * (2**20 + 16) + b"\r\n" + frame(request(1)) + frame(request(2)))
    refused = server.reply(1)
    assert code(refused) == PARSE_ERROR and "header line" in refused["error"]["message"]
    assert_served(server.reply(2))
    assert_alive(server)
    assert f"at most {MAX_HEADER_LINE}" in server.stderr


def test_megabytes_without_a_line_end_are_skipped_up_to_the_next_header(server):
    """No line end for 3 MiB: the bytes are dropped as they come, and the message whose header ends
    the line is read."""
    pid = server.process.pid
    server.send(frame(request(1)))
    assert_served(server.reply(1))
    before = rss_kib(pid)
    server.send(b"x" * (3 * 2**20) + frame(request(2)))
    assert_served(server.reply(2))
    assert rss_kib(pid) - before < 8 * 1024, "the junk was dropped, not kept"


def test_a_content_length_over_the_limit_is_refused_before_its_body(server):
    """The body is never read: 32 MiB of it leave the memory where it was, and the next message
    (after the bytes the client did send) is served."""
    pid = server.process.pid
    server.send(frame(request(1)))
    assert_served(server.reply(1))
    before = rss_kib(pid)
    body = b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"text": "' + b"a" * (32 * 2**20)
    server.send(b"Content-Length: %d\r\n\r\n" % (MAX_CONTENT_LENGTH + 1) + body + frame(request(2)))
    assert_served(server.reply(2))
    refusals = [m for m in server.seen if code(m) == PARSE_ERROR]
    assert len(refusals) == 1 and refusals[0]["id"] is None
    assert f"over the limit of {MAX_CONTENT_LENGTH}" in refusals[0]["error"]["message"]
    assert rss_kib(pid) - before < 16 * 1024, "the body was skipped, not buffered"
    assert "over the limit" in server.stderr
    # A length the client never fills (it sends nothing more): the next header is still found.
    server.send(b"Content-Length: 2147483648\r\n\r\n" + frame(request(3)))
    assert_served(server.reply(3))


# --- framing (item 5) -------------------------------------------------------------------------------
TOLERATED = {
    "lowercase name": b"content-length: %d\r\n\r\n",
    "uppercase name": b"CONTENT-LENGTH: %d\r\n\r\n",
    "LF line ends": b"Content-Length: %d\n\n",
    "blanks around the value": b"Content-Length:   %d  \r\n\r\n",
    "no blank after the colon": b"Content-Length:%d\r\n\r\n",
    "Content-Type first": b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\nContent-Length: %d\r\n\r\n",
    "a blank line before": b"\r\nContent-Length: %d\r\n\r\n",
}


@pytest.mark.parametrize("header", TOLERATED.values(), ids=TOLERATED.keys())
def test_headers_the_spec_allows_are_read(server, header):
    server.send(frame(request(1), header) + frame(request(2)))
    assert_served(server.reply(1))
    assert_served(server.reply(2))


def _length_off_by(delta: int) -> bytes:
    body = json.dumps(request(1)).encode()
    return b"Content-Length: %d\r\n\r\n" % (len(body) + delta) + body


def _length_in_characters() -> bytes:
    text = json.dumps(request(1, params={"text": "naïve café ≠ ascii"}), ensure_ascii=False)
    return b"Content-Length: %d\r\n\r\n" % len(text) + text.encode()


BROKEN = {
    **{f"length {d:+d}": _length_off_by(d) for d in (-1, -3, -5, 1, 3, 5)},
    "length in characters": _length_in_characters(),
    "a header with no body": b"Content-Length: 60\r\n\r\n",
    "no Content-Length": frame(request(1), b"Content-Type: application/vscode-jsonrpc\r\n\r\n"),
    "a line that is no header": b"hello\r\n" + frame(request(1)),
    "a length that is no number": frame(request(1), b"Content-Length: twelve\r\n\r\n"),
}


@pytest.mark.parametrize("data", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_frame_is_answered_with_a_parse_error_and_the_next_ones_are_served(server, data):
    """What cannot be read is told (-32700), never met with silence; the stream is picked up again at
    the next header, so at most the message right after the broken one is lost with it."""
    server.send(data + frame(request(2)) + frame(request(3)))
    assert_served(server.reply(3))
    assert any(code(m) == PARSE_ERROR for m in server.seen), server.seen
    assert all("data" not in m.get("error", {}) for m in server.seen)
    assert_alive(server)


# --- JSON-RPC (item 11) -----------------------------------------------------------------------------
MALFORMED = {
    "not JSON": (b'{"jsonrpc": "2.0", "id": 1, "method":', PARSE_ERROR, None),
    "not UTF-8": (b'{"jsonrpc": "2.0", "id": 1, "method": "\xff"}', PARSE_ERROR, None),
    "a batch": (json.dumps([request(1), request(2)]).encode(), INVALID_REQUEST, None),
    "a number": (b"42", INVALID_REQUEST, None),
    "a string": (b'"shutdown"', INVALID_REQUEST, None),
    "null": (b"null", INVALID_REQUEST, None),
    "an id that is an object": (json.dumps(request({"a": 1}, "shutdown")).encode(), INVALID_REQUEST, None),
    "an id that is a boolean": (json.dumps(request(True, "shutdown")).encode(), INVALID_REQUEST, None),
    "no jsonrpc member": (json.dumps({"id": 7, "method": "shutdown"}).encode(), INVALID_REQUEST, 7),
    "a method that is no string": (json.dumps(request(8, 42)).encode(), INVALID_REQUEST, 8),
}


@pytest.mark.parametrize("body, expected, msg_id", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_is_answered_with_the_json_rpc_error(server, body, expected, msg_id):
    server.send(frame(body) + frame(request(2)))
    assert_served(server.reply(2))
    errors = [m for m in server.seen if code(m) in (PARSE_ERROR, INVALID_REQUEST)]
    assert len(errors) == 1 and code(errors[0]) == expected and errors[0]["id"] == msg_id, server.seen
    assert "\n" not in errors[0]["error"]["message"] and "data" not in errors[0]["error"]


def test_requests_before_initialize_answer_server_not_initialized(server):
    """-32002 and one line, for any request and for shutdown; notifications are dropped; then the
    session starts as usual and ends with exit code 0."""
    position = {"textDocument": {"uri": "file:///tmp/a.py"}, "position": {"line": 0, "character": 0}}
    doc = {"uri": "file:///tmp/a.py", "languageId": "python", "version": 1, "text": "x = 1\n"}
    server.send(frame(request(1, "textDocument/completion", position)) + frame(request(2, "shutdown"))
                + frame(notification("textDocument/didOpen", {"textDocument": doc})))  # fmt: skip
    for msg_id in (1, 2):
        reply = server.reply(msg_id)
        assert code(reply) == NOT_INITIALIZED, reply
        assert "data" not in reply["error"] and "\n" not in reply["error"]["message"]
        assert "Traceback" not in reply["error"]["message"]
    server.send(frame(request(3, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})))
    assert "capabilities" in server.reply(3)["result"]
    server.send(frame(request(4, "shutdown")) + frame(notification("exit")))
    assert server.reply(4)["result"] is None
    assert server.process.wait(TIMEOUT) == 0
    assert "Traceback" not in server.stderr


def test_an_internal_error_reaches_the_client_as_one_line_without_the_traceback(caplog):
    """In the process, with a command that fails as a bug would (no request of the real server fails
    so on purpose): the reply says what failed in one line; the traceback goes to the log."""
    from pygls.io_ import StdoutWriter

    from llada_lsp.server.handlers import create_server
    from llada_lsp.server.language_server import Launch
    from llada_lsp.server.transport import serve_stream

    ls = create_server(Launch(engine="unix:/nonexistent/llada-test.sock"))  # no model, no service: fails fast
    ls.command("llada.test.fail")(lambda ls, params: {}["missing"])
    written = _Sink()
    ls.protocol.set_writer(StdoutWriter(written))
    init = {"processId": None, "rootUri": None, "capabilities": {}}
    fail = {"command": "llada.test.fail"}
    data = frame(request(1, "initialize", init)) + frame(request(2, "workspace/executeCommand", fail))

    async def serve() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(data)
        stream.feed_eof()
        await serve_stream(stream, ls.protocol, threading.Event())
        await asyncio.gather(*(task for task in asyncio.all_tasks() if task is not asyncio.current_task()))

    asyncio.run(serve())
    replies = {m["id"]: m for m in written.messages() if "id" in m}
    error = replies[2]["error"]
    assert error["code"] == -32603 and "KeyError" in error["message"], error
    assert "data" not in error and "\n" not in error["message"] and "/" not in error["message"]
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records), "the traceback is logged"


class _Sink:
    """A binary stdout that keeps what is written."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        pass

    def messages(self) -> list[dict]:
        out, rest = [], bytes(self.data)
        while rest:
            header, _, rest = rest.partition(b"\r\n\r\n")
            length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
            out.append(json.loads(rest[:length]))
            rest = rest[length:]
        return out


# --- shutdown (items 9, 10) -------------------------------------------------------------------------
INITIALIZE = {"processId": None, "rootUri": None, "capabilities": {"experimental": {"lladaDrafts": True}}}


@needs_model
def test_shutdown_answers_at_once_and_the_end_of_input_ends_the_process_while_a_step_is_stuck():
    """Every denoising step lasts 20 s more (the test hook): shutdown answers at once, the request in
    flight is cancelled, and the end of stdin ends the process without waiting for the model thread."""
    server = RawServer(env={"LLADA_LSP_TEST_STEP_DELAY_MS": "20000"})
    try:
        uri = "file:///tmp/llada-test/stuck.py"
        doc = {"uri": uri, "languageId": "python", "version": 1, "text": "def add(a, b):\n    return a +\n"}
        inline = {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 14}, "context": {"triggerKind": 2}}
        server.send(frame(request(1, "initialize", INITIALIZE)) + frame(notification("initialized", {}))
                    + frame(notification("textDocument/didOpen", {"textDocument": doc})))  # fmt: skip
        server.ready()
        server.send(frame(request(2, "textDocument/inlineCompletion", inline)))
        server.until("llada/draft")  # step 1 is done: the model thread now sleeps 20 s
        asked = time.monotonic()
        server.send(frame(request(3, "shutdown")))
        assert server.reply(3)["result"] is None
        assert time.monotonic() - asked < 2, "shutdown waited for the model thread"
        assert code(server.reply(2)) == -32800  # the completion in flight: cancelled
        server.process.stdin.close()
        assert server.process.wait(TIMEOUT) == 0
        assert time.monotonic() - asked < 5, "the end of input waited for the model thread"
        assert "Traceback" not in server.stderr
    finally:
        server.close()


@needs_model
@pytest.mark.parametrize("end", ["exit", "end of input"])
@pytest.mark.parametrize("initialize", ["with initialize", "once initialize is answered"])
def test_shutdown_while_the_model_loads_is_quiet(initialize, end):
    """initialize, initialized, shutdown and exit (or the end of stdin) at once, or once initialize is
    answered (the model then loads): exit code 0, and at most a line or two on stderr. (Sent at once,
    initialize is cancelled by the shutdown right behind it: the client did not wait for its answer.)"""
    server = RawServer()
    try:
        server.send(frame(request(1, "initialize", INITIALIZE)))
        if initialize != "with initialize":
            assert "capabilities" in server.reply(1)["result"]
        server.send(frame(notification("initialized", {})) + frame(request(2, "shutdown"))
                    + (frame(notification("exit")) if end == "exit" else b""))  # fmt: skip
        assert server.reply(2)["result"] is None
        if end != "exit":
            server.process.stdin.close()
        assert server.process.wait(TIMEOUT) == 0, server.stderr[-3000:]
        for thread in server._readers:
            thread.join(TIMEOUT)
        assert len(server.stderr) < 1000 and "Traceback" not in server.stderr, server.stderr[-3000:]
    finally:
        server.close()
