"""The one LSP client of the project's own tools (`llada-lsp complete` and `rewrite`, the lab's
evaluations, the benchmarks, the soak): a language server process over stdio, spoken to as an editor would.

Owns the base protocol and JSON-RPC from the client's side: requests (with timeouts, and
`$/cancelRequest` when given up), notifications delivered as they are read, the server's own requests
answered, its stderr read (kept, forwarded or dropped), the position encoding negotiated, and the
documents the client holds (server/documents.py, positions through server/positions.py). Knows no
tool's purpose and nothing of the model; imports no torch.

Not pygls' LanguageClient, which cannot serve every tool: the soak sends what no library would (a body
that is not JSON, a batch, an object as an id) and counts the answers to ids it never numbered, which
pygls drops; the timing tools need the moment each answer is read, with no conversion of every message
(each live draft) into lsprotocol types on the loop that times them; the process is the caller's (its
pid for the RSS; its stderr, which pygls pipes but never reads, so a talkative server would block on a
full pipe); and a request given up on is not cancelled at the server by pygls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from .server.documents import Document
from .server.positions import UTF16
from .server.transport import FrameReader

STDERR_KEPT = 2**20  # bytes of the server's stderr kept (the end of it), with stderr="keep"
SERVER_ENDED = -32099  # the code of the error a request gets when the server can no longer answer it


class LspError(Exception):
    """A request answered with an error (`code`, `message`), or one the server can no longer answer."""

    def __init__(self, method: str, code: int | None, message: str):
        super().__init__(f"{method}: {message} ({code})")
        self.method, self.code, self.message = method, code, message


class Request:
    """One request sent: its id, when it was sent and when its answer was read (perf_counter), and the
    answer, the whole response message."""

    def __init__(self, request_id: int, method: str):
        self.id, self.method = request_id, method
        self.sent = time.perf_counter()
        self.arrived: float | None = None
        self.answer: asyncio.Future[dict] = asyncio.get_running_loop().create_future()

    def done(self) -> bool:
        return self.answer.done()


class LspClient:
    """A language server started as a child process, and the client's end of its stdio."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: str):
        self.process = process
        self.encoding = UTF16  # until the server picks one in its initialize result
        self.capabilities: dict[str, Any] = {}  # the server's, from its initialize result
        self.pending: dict[int, Request] = {}  # sent and not answered yet
        self.on_stray: Callable[[dict], None] | None = None  # answers to no request in flight (id null, say)
        self.stderr = bytearray()  # its end, with stderr="keep"
        self._ids = 0
        self._notifications: dict[str, Callable[[Any], None]] = {}
        self._requests: dict[str, Callable[[Any], Any]] = {}
        self._ended: Exception | None = None
        self.exited = asyncio.ensure_future(process.wait())  # its exit code, once it has ended
        self._reader = asyncio.ensure_future(self._read())
        self._stderr_reader = asyncio.ensure_future(self._read_stderr(stderr)) if process.stderr else None

    @classmethod
    async def start(cls, command: list[str], *, stderr: str = "keep", env: dict[str, str] | None = None) -> LspClient:
        """Starts `command`. Its stderr is kept (the end of it, in `.stderr`: "keep"), written to this
        process's stderr as it comes ("forward"), or dropped ("discard")."""
        if stderr not in ("keep", "forward", "discard"):
            raise ValueError(f"stderr: keep, forward or discard, not {stderr!r}")
        pipe = asyncio.subprocess.DEVNULL if stderr == "discard" else asyncio.subprocess.PIPE
        process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                       stdout=asyncio.subprocess.PIPE, stderr=pipe, env=env)  # fmt: skip
        return cls(process, stderr)

    # --- the wire ----------------------------------------------------------------------------------
    def write(self, body: bytes) -> None:
        """One frame with `body` as it is, well-formed or not."""
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def send_message(self, message: dict) -> None:
        """A JSON-RPC message as given (its "jsonrpc" added), numbered or not by the caller."""
        self.write(json.dumps({"jsonrpc": "2.0", **message}).encode())

    def notify(self, method: str, params: Any = None) -> None:
        self.send_message({"method": method, "params": params})

    def send(self, method: str, params: Any = None) -> Request:
        """Sends a request; its answer comes in `Request.answer` (or await `result`)."""
        self._ids += 1
        request = Request(self._ids, method)
        if self._ended is not None:
            request.answer.set_exception(self._ended_error(method))
            return request
        self.pending[request.id] = request
        self.send_message({"id": request.id, "method": method, "params": params})
        return request

    async def result(self, request: Request, timeout: float | None = None) -> Any:
        """The request's result: LspError for an error answer (or none possible), TimeoutError after
        `timeout` seconds without one (the request is cancelled at the server then)."""
        try:
            message = await asyncio.wait_for(asyncio.shield(request.answer), timeout)
        except TimeoutError:
            self.cancel(request)
            raise TimeoutError(f"{request.method}: no answer in {timeout:.0f} s") from None
        error = message.get("error")
        if error is not None:
            raise LspError(request.method, error.get("code"), str(error.get("message")))
        return message.get("result")

    async def request(self, method: str, params: Any = None, timeout: float | None = None) -> Any:
        return await self.result(self.send(method, params), timeout)

    def cancel(self, request: Request) -> None:
        """`$/cancelRequest` for a request still waiting for its answer (which still comes: an error)."""
        if not request.done():
            self.notify("$/cancelRequest", {"id": request.id})

    def on(self, method: str, handler: Callable[[Any], None]) -> None:
        """Calls `handler(params)` for each notification `method`, as it is read."""
        self._notifications[method] = handler

    def answer(self, method: str, handler: Callable[[Any], Any]) -> None:
        """Answers the server's requests `method` with `handler(params)`; others are answered null
        (work-done progress and registrations need no more)."""
        self._requests[method] = handler

    async def _read(self) -> None:
        frames = FrameReader(self.process.stdout)
        try:
            while (frame := await frames.next()) is not None:
                if frame.body is not None:  # a broken frame is no answer: a server's are well formed
                    self._dispatch(json.loads(frame.body), time.perf_counter())
        except Exception as err:  # a handler's failure, or a body that is not JSON: nothing more is read
            self._end(err)
            return
        self._end(None)

    def _dispatch(self, message: dict, now: float) -> None:
        method = message.get("method")
        if method is None:
            key = message.get("id")
            request = self.pending.pop(key, None) if isinstance(key, int) else None
            if request is None:
                if self.on_stray is not None:
                    self.on_stray(message)
                return
            request.arrived = now
            if not request.answer.done():
                request.answer.set_result(message)
        elif "id" in message:
            handler = self._requests.get(method)
            self.send_message({"id": message["id"], "result": handler(message.get("params")) if handler else None})
        elif (handler := self._notifications.get(method)) is not None:
            handler(message.get("params"))

    def _end(self, err: Exception | None) -> None:
        self._ended = err or EOFError("the server closed its output")
        for request in self.pending.values():
            if not request.done():
                request.answer.set_exception(self._ended_error(request.method))
        self.pending.clear()

    def _ended_error(self, method: str) -> Exception:
        if isinstance(self._ended, EOFError):
            return LspError(method, SERVER_ENDED, str(self._ended))
        return self._ended

    async def _read_stderr(self, how: str) -> None:
        while line := await self.process.stderr.readline():
            if how == "forward":
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
            else:
                self.stderr += line
                del self.stderr[:-STDERR_KEPT]

    # --- what every editor does --------------------------------------------------------------------
    async def initialize(self, capabilities: dict | None = None, options: dict | None = None,
                         encodings: Iterable[str] = (UTF16,), timeout: float | None = None,
                         workspace: str | None = None) -> dict:  # fmt: skip
        """initialize, offering `encodings` (in the order preferred), then initialized; the result. The
        position encoding the server chose is `encoding` from here on. `workspace`: a folder's file: URI,
        sent as the root and the one workspace folder (the server reads imported modules under it)."""
        capabilities = dict(capabilities or {})
        capabilities["general"] = {**capabilities.get("general", {}), "positionEncodings": list(encodings)}
        params: dict[str, Any] = {"processId": os.getpid(), "rootUri": workspace, "capabilities": capabilities}
        if workspace is not None:
            params["workspaceFolders"] = [{"uri": workspace, "name": workspace.rstrip("/").rsplit("/", 1)[-1]}]
        if options is not None:
            params["initializationOptions"] = options
        result = await self.request("initialize", params, timeout)
        self.capabilities = (result or {}).get("capabilities") or {}
        self.encoding = self.capabilities.get("positionEncoding") or UTF16
        self.notify("initialized", {})
        return result

    def did_open(self, uri: str, text: str, language: str = "python", version: int = 1) -> Document:
        """didOpen; the document as the client holds it from here on."""
        doc = Document(uri, version, text, language)
        self.notify("textDocument/didOpen",
                    {"textDocument": {"uri": uri, "languageId": language, "version": version, "text": text}})  # fmt: skip
        return doc

    def did_change(self, doc: Document, start: int, end: int, text: str) -> None:
        """Replaces doc.text[start:end] with `text`: one incremental didChange, at the next version."""
        a, b = position(doc, start, self.encoding), position(doc, end, self.encoding)
        doc.edit((a["line"], a["character"]), (b["line"], b["character"]), text, self.encoding)
        doc.version += 1
        change = {"range": {"start": a, "end": b}, "text": text}
        self.notify("textDocument/didChange",
                    {"textDocument": {"uri": doc.uri, "version": doc.version}, "contentChanges": [change]})  # fmt: skip

    def did_close(self, doc: Document) -> None:
        self.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})

    async def shutdown(self, timeout: float = 30.0) -> int:
        """shutdown and exit, then `wait`; the exit code."""
        try:
            if self._ended is None:
                await self.request("shutdown", None, timeout)
                self.notify("exit")
                await self.process.stdin.drain()
        except (LspError, TimeoutError, ConnectionError):
            pass
        return await self.wait(timeout)

    async def wait(self, timeout: float = 30.0) -> int:
        """The process's end (killed if it is not over in `timeout` seconds), its output read to the
        end; the exit code."""
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except TimeoutError:
            self.process.kill()
            await self.exited
        await asyncio.gather(*(t for t in (self._reader, self._stderr_reader) if t), return_exceptions=True)
        return self.exited.result()


# --- positions: str offsets in a document <-> LSP positions, through server/positions.py ---------------


def position(doc: Document, offset: int, encoding: str) -> dict[str, int]:
    """str offset in the document -> LSP Position (lines end at \\n, \\r\\n or \\r, as the LSP says)."""
    line, character = doc.position(offset, encoding)
    return {"line": line, "character": character}


def offset(doc: Document, position: dict, encoding: str) -> int:
    """LSP Position -> str offset; past the end of a line clamps to its end, past the last line to the
    document's end."""
    found = doc.offset(position["line"], position["character"], encoding)
    return len(doc.text) if found is None else found


def edited(doc: Document, edits: list[dict], encoding: str) -> str:
    """The document's text after LSP TextEdits, every range read against the text as it is (as the LSP
    specifies for the edits of one change); the document itself is left as it is."""
    spans = sorted(((offset(doc, e["range"]["start"], encoding), offset(doc, e["range"]["end"], encoding),
                     e["newText"]) for e in edits), key=lambda span: span[:2], reverse=True)  # fmt: skip
    text = doc.text
    for start, end, new in spans:
        text = text[:start] + new + text[max(start, end) :]
    return text
