"""The language server: pygls handlers for docs/protocol.md, the holes of pygls closed, the command line.

Handlers fetch the document, queue a model job or call a pure function, and convert to lsprotocol
types. Knows nothing of tensors or token ids; model work runs on the worker's thread (the local
completer) or in an engine service (the remote one), never here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import stat
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import cattrs
from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcException, JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter, lsp_method

from .. import __version__
from ..completion.pipeline import Infill, ModelSpec, Outcome, Rewrite, add_model_arguments
from ..completion.syntax import is_python
from ..service.address import parse_address, read_token
from ..service.client import EngineFailure
from ..service.loop import run as run_loop
from ..service.worker import ModelWorker, Ticket, step_delay_from_env
from .completers import CompletionFailed, LocalCompleter, RemoteCompleter
from .documents import Document, Documents
from .positions import UTF8, UTF16
from .settings import MODES, Settings, parse_settings, settings_section
from .transport import serve_stream

logger = logging.getLogger(__name__)

DRAFT = "llada/draft"
REWRITE, STATUS = "llada.rewriteSelection", "llada.status"
REQUEST_FAILED = -32803  # LSP ErrorCodes.RequestFailed: the request was valid but could not be served
INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32600, -32602, -32603
_CONVERTER = default_converter()  # stateless: structures command arguments


@dataclass(frozen=True)
class Launch:
    """What only the command line sets; `defaults` are what a bad or absent setting falls back to."""

    defaults: Settings = Settings()
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    step_delay: float = 0.0  # test hook, see ModelWorker
    engine: str = "local"  # "local" | "auto" (the default socket if a service answers, else local) | an address
    token: str | None = None  # for a service on TCP


@dataclass(frozen=True)
class MalformedRequest:
    """A request whose params did not parse: answered with InvalidParams instead of dropped."""

    id: int | str
    method: str
    reason: str
    jsonrpc: str = "2.0"


class LladaProtocol(LanguageServerProtocol):
    """pygls' protocol with its gaps closed: malformed requests, requests before initialize and after
    shutdown are answered; internal errors reach the client as one line (the traceback goes to the
    log); documents are kept by `Documents` (edits through the one position conversion); UTF-8 is
    chosen when the client offers it; commands receive their whole ExecuteCommandParams."""

    _server: "LladaServer"
    _initialize_seen = False

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as err:
            if not isinstance(data, dict) or not isinstance(data.get("id"), (int, str)) or isinstance(data["id"], bool):
                raise
            reason = _why(err.__cause__) or err.message
            if "method" in data:
                return MalformedRequest(data["id"], str(data["method"]), reason)
            # A malformed response to one of our requests still settles it, so nothing waits forever.
            return types.ResponseErrorMessage(id=data["id"], error=types.ResponseError(INVALID_PARAMS, reason))

    def handle_message(self, message):
        if self._refused_before_initialize(message):
            return
        if isinstance(message, MalformedRequest):
            text = f"invalid params for {message.method}: {message.reason}"
            self._server.log(text, types.MessageType.Error)
            self._send_response(message.id, error=types.ResponseError(INVALID_PARAMS, text))
        elif self._shutdown and hasattr(message, "method") and hasattr(message, "id") and message.method != types.EXIT:
            self._send_response(message.id, error=types.ResponseError(INVALID_REQUEST, "the server is shutting down"))
        else:
            super().handle_message(message)

    def _refused_before_initialize(self, message) -> bool:
        """The LSP: before `initialize`, a request answers ServerNotInitialized and a notification
        other than `exit` is dropped."""
        method = getattr(message, "method", None)
        if method == types.INITIALIZE and not isinstance(message, MalformedRequest):
            self._initialize_seen = True
        if self._initialize_seen or method in (None, types.INITIALIZE, types.EXIT):
            return False
        if hasattr(message, "id"):
            error = types.ResponseError(types.ErrorCodes.ServerNotInitialized, f"{method} before initialize")
            self._send_response(message.id, error=error)
        else:
            logger.warning("%s before initialize: dropped", method)
        return True

    def _send_response(self, msg_id, result=None, error=None):
        if error is not None and error.code == INTERNAL_ERROR and error.data is not None:
            # pygls sends the exception's traceback (absolute paths, library internals) as `data`; it
            # has logged it already. The client gets one line.
            lines = error.message.strip().splitlines()  # format_exception_only: its last line is "Type: text"
            kind = lines[-1].partition(":")[0].strip() if lines else ""
            kind = kind if kind.replace(".", "").replace("_", "").isalnum() else "an exception"
            error = types.ResponseError(INTERNAL_ERROR, f"llada: internal error ({kind}); the server's log says more")
        super()._send_response(msg_id, result, error)

    def _send_handler_result(self, future, *, msg_id):
        """A request answered with an error the server chose (unknown command, no model, bad params)
        is logged as one line; pygls would print a traceback for each, as for a crash."""
        error = None if future.cancelled() else future.exception()
        if not isinstance(error, JsonRpcException):
            return super()._send_handler_result(future, msg_id=msg_id)
        self._request_futures.pop(msg_id, None)
        logger.info("request %s answered with error %s: %s", msg_id, error.code, error.message)
        self._send_response(msg_id, error=error.to_response_error())

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        offered = params.capabilities.general and params.capabilities.general.position_encodings
        if offered and UTF8 in offered:  # pygls takes the client's first choice; the issue asks for UTF-8
            params.capabilities.general.position_encodings = [UTF8]
        return (yield from super().lsp_initialize(params))

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args):
        """pygls' shutdown, cancelling the pending requests from a copy: a cancel can take a request
        out of the dict while pygls walks it, and then shutdown failed and `exit` said 1."""
        if (handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield handler, args, None
        current = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()
        self._shutdown = True

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args):
        if not isinstance(self.writer, asyncio.StreamWriter):
            # stdio: at once. Clients give a server ~0.1 s before they kill it; an orderly interpreter
            # exit with torch loaded and a model thread mid-step takes over a second. Nothing is left
            # to save: every answer has been written and flushed.
            if (handler := self.fm.features.get(types.EXIT)) is not None:
                yield handler, args, None
            exit_now(0 if self._shutdown else 1)
        # TCP: pygls would raise SystemExit inside asyncio's connection callback; closing the connection
        # ends its read loop instead: the session ends, the listener goes on (tcp.py).
        if (handler := self.fm.features.get(types.EXIT)) is not None:
            yield handler, args, None
        self.writer.close()

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        doc = params.text_document
        self._server.documents.open(doc.uri, doc.version, doc.text, doc.language_id)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        self._server.apply_changes(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        self._server.documents.close(params.text_document.uri)
        if self._server.completer is not None:
            self._server.completer.cancel_key(params.text_document.uri)

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams):
        handler = self.fm.commands.get(params.command)
        if handler is None:
            raise JsonRpcInvalidParams(f"unknown command {params.command!r}")
        return (yield handler, (params,), None)


def _is_pipe(stream) -> bool:
    """A pipe, a socket or a terminal: streams the event loop can read. A terminal too, so that the
    server started by hand stops on Ctrl-C at once (pygls' reader thread would sit in read())."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no file descriptor (an in-memory stream)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


def _why(error: BaseException | None) -> str:
    if isinstance(error, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(error))
    return str(error or "")


class LladaServer(LanguageServer):
    def __init__(self, launch: Launch):
        super().__init__("llada-lsp", __version__, protocol_cls=LladaProtocol, converter_factory=default_converter,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)  # fmt: skip
        self.launch, self.settings = launch, launch.defaults
        self.documents = Documents()
        self.completer: LocalCompleter | RemoteCompleter | None = None
        self._reconnect: asyncio.Task | None = None
        self._engine_error: str | None = None  # the named service did not answer
        self._told: list[tuple[str, types.MessageType]] | None = []  # messages held until initialize is answered
        self.drafts = False  # the client opted in to llada/draft notifications
        self.shutdown_requested = False
        self._load_ticket: Ticket | None = None
        self._load_token: str | None = None
        self._load_message = "starting"
        self._tasks: set[asyncio.Task] = set()

    def start_io(self, stdin=None, stdout=None) -> None:
        """stdio, read by the event loop itself (on uvloop where installed) and framed by
        `transport.serve_stream` (limits, recovery from broken frames). pygls reads stdin on a
        thread pool, a hop to another thread and back for each header line and body; this takes
        those hops off every keystroke's didChange and request. A stdin that is not a pipe, a socket
        or a terminal (a file) goes through pygls' reader."""
        stdin, stdout = stdin or sys.stdin.buffer, stdout or sys.stdout.buffer
        if not _is_pipe(stdin):
            return super().start_io(stdin, stdout)
        self._stop_event = threading.Event()  # what pygls' shutdown() sets to end the read loop
        self.protocol.set_writer(StdoutWriter(stdout))

        async def serve() -> None:
            stream = asyncio.StreamReader(limit=2**20)  # buffered before reading pauses: a big didOpen in few reads
            await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), stdin)
            await serve_stream(stream, self.protocol, self._stop_event, self.report_server_error)

        try:
            run_loop(serve())
        except BrokenPipeError:
            logger.error("the client closed the connection")
        except KeyboardInterrupt:
            print("llada-lsp: interrupted", file=sys.stderr)
        except SystemExit:
            pass
        finally:
            self.shutdown()

    def background(self, coroutine) -> None:
        """Runs a coroutine on the loop, holding a reference until it ends."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- feedback -------------------------------------------------------------------------------
    def log(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        logger.log(logging.ERROR if kind == types.MessageType.Error else logging.DEBUG, "%s", message)
        self.window_log_message(types.LogMessageParams(type=kind, message=f"llada: {message}"))

    def show(self, message: str, kind: types.MessageType = types.MessageType.Error) -> None:
        self.log(message, kind)
        self.window_show_message(types.ShowMessageParams(type=kind, message=f"llada: {message}"))

    def tell(self, message: str, kind: types.MessageType) -> None:
        """`show`, or, during `initialize`, once it is answered: some clients (eglot 1.9) fail to
        connect when a message arrives before the initialize result, though the LSP allows it."""
        if self._told is None:
            self.show(message, kind)
        else:
            logger.log(logging.ERROR if kind == types.MessageType.Error else logging.WARNING, "%s", message)
            self._told.append((message, kind))

    def flush_told(self) -> None:
        told, self._told = self._told or [], None
        for message, kind in told:
            self.window_show_message(types.ShowMessageParams(type=kind, message=f"llada: {message}"))

    def report_server_error(self, error: Exception, source) -> None:
        """pygls' out-of-band errors (a notification that failed) go to the log, not to a popup; a
        failed request already carries its error in the response."""
        if source is not FeatureRequestError:
            self.log(f"{source.__name__}: {error}", types.MessageType.Error)

    # --- settings and the model -----------------------------------------------------------------
    def configure(self, raw: Any) -> bool:
        """Applies settings; True when the model changed and a new one is loading."""
        before = self.settings
        self.settings, errors = parse_settings(raw, self.settings, self.launch.defaults)
        for error in errors:
            self.show(error, types.MessageType.Warning)
        if self.completer is not None and self.settings.engine != before.engine:
            self.show("the engine setting takes effect when the server starts again", types.MessageType.Warning)
        if self.settings.model != before.model and isinstance(self.completer, RemoteCompleter):
            self.show(f"the model is the engine service's ({self.completer.address}); the model setting is ignored",
                      types.MessageType.Warning)  # fmt: skip
        elif self.completer is not None and self.settings.model != before.model:
            self.start_load()
            return True
        return False

    @property
    def engine_choice(self) -> str:
        """"local", "auto" or a service's address: the setting, else the command line's --engine."""
        return self.settings.engine or self.launch.engine

    async def start_engine(self) -> None:
        """The engine service if one is asked for (or, with `auto`, answers at the default socket),
        else the model in this process."""
        choice = self.engine_choice
        if choice != "local":
            address = None if choice == "auto" else choice
            try:
                self.completer = await RemoteCompleter.connect(address, self.launch.token, self.log)
            except EngineFailure as err:
                if choice != "auto":
                    self._engine_error = f"cannot use the engine service at {choice}: {err.message}"
                    self.tell(self._engine_error, types.MessageType.Error)
                    return  # requests try again (see completer_for_request)
                logger.info("no engine service at the default socket (%s): the model runs in this process", err.message)
            else:
                self._engine_error = None
                logger.info("using the engine service at %s (model %s)", self.completer.address,
                            self.completer.status()["model"])  # fmt: skip
                if self.settings.model:
                    self.tell("the model is the engine service's; the model setting is ignored", types.MessageType.Warning)
                return
        self.completer = LocalCompleter(ModelWorker(asyncio.get_running_loop(), self.log, self.launch.step_delay))
        self.start_load()

    async def reach_engine(self) -> None:
        """Tries again to reach a named service that did not answer, or that went away (at most once
        a second: see RemoteCompleter)."""
        if isinstance(self.completer, RemoteCompleter):
            await self.completer.refresh()
        elif self.completer is None and self.engine_choice not in ("local", "auto"):
            if self._reconnect is None or self._reconnect.done():
                self._reconnect = asyncio.ensure_future(self.start_engine())
            await asyncio.shield(self._reconnect)

    async def completer_for_request(self) -> LocalCompleter | RemoteCompleter:
        if self.completer is None:
            await self.reach_engine()
        if self.completer is None:
            raise JsonRpcException("llada: no engine: the server is not initialized or the service is unreachable",
                                   code=REQUEST_FAILED)  # fmt: skip
        return self.completer

    def start_load(self) -> Ticket:
        assert isinstance(self.completer, LocalCompleter)
        spec = ModelSpec(self.settings.model, self.launch.device, self.launch.dtype, self.launch.threads)
        self._load_ticket = ticket = self.completer.load(spec, self._on_load_report)
        ticket.when_done(lambda future: self._on_loaded(future, spec))
        return ticket

    def _on_load_report(self, message: str, percent: int) -> None:
        self._load_message = message
        if self._load_token is not None:
            report = types.WorkDoneProgressReport(message=message, percentage=percent)
            self.work_done_progress.report(self._load_token, report)

    def _on_loaded(self, future, spec: ModelSpec) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.show(f"cannot load the model {spec.name}: {future.exception()}")

    async def show_load_progress(self) -> None:
        """$/progress while the model loads, if the client supports server-initiated progress."""
        ticket = self._load_ticket
        window = self.client_capabilities.window
        if ticket is None or not (window and window.work_done_progress):
            return
        token = f"llada-load-{uuid.uuid4()}"
        try:
            await self.work_done_progress.create_async(token)
        except Exception as err:  # the client refused the token: no progress bar, nothing else changes
            self.log(f"no progress bar for loading: {err}")
            return
        self._load_token = token
        begin = types.WorkDoneProgressBegin(title="llada: loading the model", message=self._load_message, percentage=0)
        self.work_done_progress.begin(token, begin)
        await asyncio.wait([asyncio.wrap_future(ticket.future)])
        self._load_token = None
        state = self.completer.status()["state"] if self.completer else ""
        self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=state))

    def status(self) -> dict[str, Any]:
        if self.completer is not None:
            out = self.completer.status()
        elif self._engine_error is not None:
            out = {"engine": self.engine_choice, "model": "", "state": "unavailable", "error": self._engine_error}
        else:
            out = {"engine": self.engine_choice, "model": ModelSpec(self.settings.model).name, "state": "loading"}
        return {**out, "inlineMode": self.settings.inline_mode, "rewriteMode": self.settings.rewrite_mode}

    # --- documents and positions ----------------------------------------------------------------
    @property
    def encoding(self) -> str:
        chosen = self.workspace.position_encoding
        return str(getattr(chosen, "value", chosen) or UTF16)

    def apply_changes(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            self.log(f"didChange for {params.text_document.uri}, which is not open: ignored", types.MessageType.Warning)
            return
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                a, b = change.range.start, change.range.end
                if not doc.edit((a.line, a.character), (b.line, b.character), change.text, self.encoding):
                    self.log(f"{doc.uri}: an edit past the end was clamped to its end", types.MessageType.Warning)
            else:
                doc.replace(change.text)
        doc.version = params.text_document.version

    def locate(self, uri: str, position: types.Position) -> tuple[Document, int, types.Position] | None:
        """(document, str offset, the position normalized) or None for an unknown document or a line
        past the end; a character past the end of its line means the line's end, as the LSP says."""
        doc = self.documents.get(uri)
        offset = doc.offset(position.line, position.character, self.encoding) if doc else None
        if offset is None:
            return None
        return doc, offset, types.Position(*doc.position(offset, self.encoding))

    def span(self, doc: Document, rng: types.Range) -> tuple[int, int, types.Range]:
        """str offsets of a range and the range normalized; InvalidParams if it is not in the document."""
        start = doc.offset(rng.start.line, rng.start.character, self.encoding)
        end = doc.offset(rng.end.line, rng.end.character, self.encoding)
        if start is None or end is None or end < start:
            raise JsonRpcInvalidParams(f"the range {rng} is outside the document or ends before it starts")
        a, b = doc.position(start, self.encoding), doc.position(end, self.encoding)
        return start, end, types.Range(types.Position(*a), types.Position(*b))

    # --- model jobs -----------------------------------------------------------------------------
    async def complete(self, doc: Document, offset: int, at: types.Position, method: str) -> str:
        """The inline completion at `offset`, with drafts to clients that asked for them. A newer request
        for the same document supersedes this one (it then answers RequestCancelled)."""
        s, request_id = self.settings, self.protocol.msg_id
        job = Infill(doc.text, offset, s.inline_mode, s.max_completion_tokens, s.context_tokens)
        send = self._draft_sender(doc, request_id, at) if self.drafts else None
        outcome = await self.run_job(doc.uri, f"{method} {request_id}", job, send)
        if send is not None:
            send(outcome.steps, outcome.text, final=True)
        return outcome.text

    def _draft_sender(self, doc: Document, request_id, at: types.Position) -> Callable:
        uri, version = doc.uri, doc.version
        where = {"line": at.line, "character": at.character}

        def send(step: int, text: str, final: bool = False) -> None:
            params = {"uri": uri, "version": version, "requestId": request_id, "step": step, "final": final,
                      "range": {"start": where, "end": where}, "text": text}  # fmt: skip
            self.protocol.notify(DRAFT, params)

        return send

    async def run_job(self, key: str, label: str, job: Infill | Rewrite, on_draft: Callable | None = None) -> Outcome:
        completer = await self.completer_for_request()
        try:
            return await completer.run(key, label, job, on_draft)
        except CompletionFailed as err:
            raise JsonRpcException(f"llada: {err}", code=REQUEST_FAILED) from None

    async def apply_rewrite(self, arg: "RewriteArgument", target: types.Range, text: str) -> dict[str, Any]:
        """workspace/applyEdit of the rewrite, versioned: a document that moved on is left alone."""
        doc = self.documents.get(arg.uri)
        if doc is None or doc.version != arg.version:
            return self.not_applied(arg, text)
        change = types.TextDocumentEdit(
            types.OptionalVersionedTextDocumentIdentifier(arg.uri, arg.version), [types.TextEdit(target, text)]
        )  # fmt: skip
        edit = types.ApplyWorkspaceEditParams(types.WorkspaceEdit(document_changes=[change]), label="llada: rewrite")
        answer = await self.workspace_apply_edit_async(edit)
        if answer.applied:
            return {"applied": True, "changed": True, "text": text}
        reason = answer.failure_reason or "the client did not apply the edit"
        return {"applied": False, "changed": True, "text": text, "reason": reason}

    def not_applied(self, arg: "RewriteArgument", text: str = "") -> dict[str, Any]:
        doc = self.documents.get(arg.uri)
        if doc is None:
            reason = f"{arg.uri} is not open"
        else:
            reason = f"the document is at version {doc.version}, the rewrite was asked for version {arg.version}"
        return {"applied": False, "text": text, "reason": reason}


# --- handlers ---------------------------------------------------------------------------------------
async def initialize(ls: LladaServer, params: types.InitializeParams) -> None:
    experimental = params.capabilities.experimental
    ls.drafts = isinstance(experimental, dict) and experimental.get("lladaDrafts") is True
    ls.configure(params.initialization_options)
    await ls.start_engine()


async def initialized(ls: LladaServer, params: types.InitializedParams) -> None:
    ls.flush_told()
    await ls.show_load_progress()


def did_change_configuration(ls: LladaServer, params: types.DidChangeConfigurationParams) -> None:
    if ls.configure(settings_section(params.settings)):
        ls.background(ls.show_load_progress())


async def inline_completion(ls: LladaServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    found = ls.locate(params.text_document.uri, params.position)
    if found is None:
        return types.InlineCompletionList(items=[])
    doc, offset, at = found
    text = await ls.complete(doc, offset, at, "inline")
    items = [types.InlineCompletionItem(insert_text=text, range=types.Range(at, at))] if text else []
    return types.InlineCompletionList(items=items)


async def completion(ls: LladaServer, params: types.CompletionParams) -> types.CompletionList:
    found = ls.locate(params.text_document.uri, params.position)
    if found is None:
        return types.CompletionList(is_incomplete=True, items=[])
    doc, offset, at = found
    text = await ls.complete(doc, offset, at, "completion")
    if not text:
        return types.CompletionList(is_incomplete=True, items=[])
    # The item replaces the word typed so far with that word completed (`val|` -> `values(values):`):
    # clients filter items by the text from the word's start, and insert the edit's range whole.
    word = _word_before(doc.text, offset)
    start = types.Position(*doc.position(offset - len(word), ls.encoding))
    label = (word + text).strip().splitlines()[0]
    item = types.CompletionItem(
        label=label, filter_text=word + text.split("\n", 1)[0], kind=types.CompletionItemKind.Text, detail="llada",
        text_edit=types.TextEdit(types.Range(start, at), word + text),
        insert_text_format=types.InsertTextFormat.PlainText, sort_text="0",
    )  # fmt: skip
    return types.CompletionList(is_incomplete=True, items=[item])


def _word_before(text: str, offset: int) -> str:
    """The identifier characters right before `offset` on its line."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:offset]


@dataclass(frozen=True)
class RewriteArgument:
    """The one argument of llada.rewriteSelection (docs/protocol.md)."""

    uri: str
    version: int
    range: types.Range
    instruction: str | None

    @classmethod
    def parse(cls, arguments: Any) -> "RewriteArgument":
        usage = f"{REWRITE} takes one argument {{textDocument: {{uri, version}}, range, instruction?}}"
        if not isinstance(arguments, (list, tuple)) or len(arguments) != 1 or not isinstance(arguments[0], dict):
            raise JsonRpcInvalidParams(usage)
        arg = arguments[0]
        doc, instruction = arg.get("textDocument"), arg.get("instruction")
        if not isinstance(doc, dict) or not isinstance(doc.get("uri"), str) or type(doc.get("version")) is not int:
            raise JsonRpcInvalidParams(f"{usage}: textDocument needs a string uri and an integer version")
        if instruction is not None and not isinstance(instruction, str):
            raise JsonRpcInvalidParams(f"{usage}: instruction must be a string")
        try:
            rng = _CONVERTER.structure(arg.get("range"), types.Range)
        except (cattrs.BaseValidationError, TypeError, ValueError) as err:
            raise JsonRpcInvalidParams(f"{usage}: range: {_why(err) or err}") from None
        return cls(doc["uri"], doc["version"], rng, instruction or None)


async def rewrite_selection(ls: LladaServer, params: types.ExecuteCommandParams) -> dict[str, Any]:
    arg = RewriteArgument.parse(params.arguments)
    doc = ls.documents.get(arg.uri)
    if doc is None or doc.version != arg.version:
        return ls.not_applied(arg)
    start, end, target = ls.span(doc, arg.range)
    job = Rewrite(doc.text, start, end, ls.settings.rewrite_mode, ls.settings.context_tokens, arg.instruction,
                  is_python(doc.language, doc.uri))  # fmt: skip
    with WorkDone(ls, params.work_done_token, "llada: rewriting the selection") as progress:
        outcome = await ls.run_job(f"rewrite:{arg.uri}", f"rewrite {ls.protocol.msg_id}", job, progress.step)
    if outcome.stopped in ("unchanged", "refused"):  # nothing to apply: the client is told why
        ls.log(f"rewrite of {arg.uri} not applied: {outcome.reason}", types.MessageType.Info)
        return {"applied": False, "changed": outcome.stopped != "unchanged", "text": outcome.text, "reason": outcome.reason}
    return await ls.apply_rewrite(arg, target, outcome.text)


class WorkDone:
    """Work-done progress on a client-given token: begin, one report per denoising step, end."""

    def __init__(self, ls: LladaServer, token, title: str):
        self.ls, self.token, self.title = ls, token, title

    def __enter__(self) -> "WorkDone":
        if self.token is not None:
            self.ls.work_done_progress.begin(self.token, types.WorkDoneProgressBegin(title=self.title))
        return self

    def step(self, step: int, _payload: Any) -> None:
        if self.token is not None:
            self.ls.work_done_progress.report(self.token, types.WorkDoneProgressReport(message=f"step {step}"))

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            self.ls.work_done_progress.end(self.token, types.WorkDoneProgressEnd())


async def status(ls: LladaServer, params: types.ExecuteCommandParams) -> dict[str, Any]:
    """Also where a front whose service went away finds it back: clients ask while it is unavailable."""
    await ls.reach_engine()
    return ls.status()


def shutdown(ls: LladaServer, params: None) -> None:
    """Answers at once: a step in flight is cancelled, not waited for."""
    ls.shutdown_requested = True
    if ls.completer is not None:
        ls.completer.stop()


def exit_(ls: LladaServer, params: None) -> None:
    if ls.completer is not None:
        ls.completer.stop()


def create_server(launch: Launch, server: type[LladaServer] = LladaServer) -> LladaServer:
    ls = server(launch)
    ls.feature(types.INITIALIZE)(initialize)
    ls.feature(types.INITIALIZED)(initialized)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)
    ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(inline_completion)
    # Non-empty options: Vim's ALE reads an empty object as "no completion support".
    options = types.CompletionOptions(trigger_characters=["."], resolve_provider=False)
    ls.feature(types.TEXT_DOCUMENT_COMPLETION, options)(completion)
    ls.feature(types.SHUTDOWN)(shutdown)
    ls.feature(types.EXIT)(exit_)
    ls.command(REWRITE)(rewrite_selection)
    ls.command(STATUS)(status)
    return ls


# --- command line -----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llada-lsp",
        description="The llada-lsp language server: inline code completions from a LLaDA2.1 block-diffusion "
        "model, over stdio (what editors start) or TCP. Clients can override the model and modes with "
        "initializationOptions and workspace/didChangeConfiguration (see docs/protocol.md).",
    )
    ap.add_argument("--tcp", metavar="HOST:PORT", help="serve LSP over TCP instead of stdio, one client at a "
                    "time, each sending the token of --token-file first (docs/protocol.md)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH", help="the token for TCP (a file only you can read, mode 0600): "
                    "what clients of --tcp send first, and what is sent to an engine service on tcp://")  # fmt: skip
    add_model_arguments(ap)
    ap.add_argument("--inline-mode", choices=MODES, default="speed",
                    help="decoding preset of inline completions (default: speed)")  # fmt: skip
    ap.add_argument("--rewrite-mode", choices=MODES, default="quality",
                    help="decoding preset of rewrites (default: quality)")  # fmt: skip
    ap.add_argument("--engine", default="auto", metavar="auto|local|unix:PATH|tcp://HOST:PORT",
                    help="where the model runs: an engine service (`llada-lsp engine`) at an address, `local` (in this "
                    "process), or `auto` (default): the service at the default socket if one answers, else local. "
                    "With a service, --model/--device/--dtype/--threads are the service's own")  # fmt: skip
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="what the server logs on stderr (default: warning)")  # fmt: skip
    return ap


def serve_main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log_format = "llada-lsp %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format=log_format)
    defaults = Settings(model=args.model, inline_mode=args.inline_mode, rewrite_mode=args.rewrite_mode)
    token = None
    try:
        if args.engine not in ("auto", "local"):
            parse_address(args.engine)
        if args.token_file:
            token = read_token(args.token_file)
    except (ValueError, OSError) as err:
        parser().error(str(err))
    launch = Launch(defaults, args.device, args.dtype, max(1, args.threads), step_delay_from_env(), args.engine, token)
    if args.tcp:
        from . import tcp  # here: tcp builds on this module

        try:
            host, port = tcp.parse_listen(args.tcp)
        except ValueError as err:
            parser().error(str(err))
        if token is None:
            parser().error("--tcp needs --token-file: anyone who can reach the port could use the server")
        return tcp.serve(host, port, launch, token)
    ls = create_server(launch)
    ls.start_io()
    return _end(ls)


def _end(ls: LladaServer) -> int:
    """The exit code once the client has gone without `exit` (the end of stdin). The model thread is
    told to stop, not waited for (a load stops only at its next tensor, a step may be stuck); while it
    still runs the process ends at once: an interpreter tearing down under a thread inside torch wrote
    `I/O operation on closed file` tracebacks by the thousand."""
    code = 0 if ls.shutdown_requested else 1
    if isinstance(ls.completer, LocalCompleter) and not ls.completer.worker.stop(timeout=0):
        exit_now(code)
    return code


def exit_now(code: int) -> NoReturn:
    """Ends the process at once, the log flushed, without the interpreter's teardown (which, under a
    model thread still inside torch, aborts or floods stderr). For when every answer has been written."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)
