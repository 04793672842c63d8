"""The language server's state (`LladaServer`, one per client): the client's settings, its open
documents (open_documents.py), where completions come from (a `Completer`: completers.py), the
model's load (load_progress.py), the status pushed to the client, feedback to the user, the context
of other files (cross_file.py) and the model jobs the handlers start (handlers.py, inline.py,
next_edit_requests.py).

Knows nothing of tensors or token ids, nor of a backend: the model in this process is loaded by the
loader the starting command hands in (`Launch.loader`) on the model thread, never here.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcException
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import default_converter

from .. import __version__
from ..completion.generation import ModelSpec
from ..completion.jobs import Job, Outcome
from ..runtime.loop import run as run_loop
from ..runtime.worker import Loader, Ticket
from .completers import Completer, CompletionFailed, DraftCallback, choose, next_edit_key, warm_key
from .context_files import ContextFiles
from .cross_file import CrossFile
from .load_progress import LoadProgress
from .open_documents import OpenDocuments
from .positions import UTF16
from .protocol import REQUEST_FAILED, LladaProtocol
from .settings import Settings, parse_settings
from .transport import is_pipe, serve_pipe

logger = logging.getLogger(__name__)

STATUS_PUSH = "llada/status"  # the llada.status result, pushed once per change of state
STATUS_WATCH_SECONDS = 1.0  # how often the state is looked at (a dict built: cheap)
FAILED = ("error", "unavailable", "not responding")  # states said with window/showMessage too


@dataclass(frozen=True)
class Launch:
    """What the command that starts the server sets, and clients cannot: `defaults` are what a bad or
    absent setting falls back to; `loader` loads the model in this process (backends/native.py: `load`,
    wired by commands/serve.py), None for a server that only uses an engine service."""

    defaults: Settings = Settings()
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    engine: str = "local"  # "local" | "auto" (the default socket if a service answers, else local) | an address
    token: str | None = None  # for a service on TCP
    loader: Loader | None = None
    edit_ids: tuple[int, int] | None = None  # --edit-ids: LLaDA2.2's (DELETE, INSERT) over config.json's


class LladaServer(LanguageServer):
    def __init__(self, launch: Launch):
        super().__init__("llada-lsp", __version__, protocol_cls=LladaProtocol, converter_factory=default_converter,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)  # fmt: skip
        self.launch, self.settings = launch, launch.defaults
        self.documents = OpenDocuments()
        self.context = ContextFiles(log=self.log)  # snippets of the client's other files (server/context_files.py)
        self.completer: Completer | None = None
        settings, completer = (lambda: self.settings), (lambda: self.completer)
        self.cross_file = CrossFile(self.context, self.documents, settings, completer, self.log)
        self._reconnect: asyncio.Task | None = None
        self._engine_error: str | None = None  # the named service did not answer
        self._told: list[tuple[str, types.MessageType]] | None = []  # messages held until initialize is answered
        self.drafts = False  # the client opted in to llada/draft notifications
        self.ale = False  # the client is Vim's ALE, which cuts completion items at `(` (server/ale.py)
        self.shutdown_requested = False
        self.loading = LoadProgress(self, self.log, lambda: self.status()["state"])
        self._tasks: set[asyncio.Task] = set()
        self._pushed: tuple | None = None  # (engine, model, state) last sent as llada/status
        self.inline_waiting: dict[str, Any] = {}  # uri -> id of the latest inline request waiting for the load

    def start_io(self, stdin=None, stdout=None) -> None:
        """stdio, read by the event loop itself (on uvloop where installed) and framed by
        `transport.serve_pipe` (limits, recovery from broken frames). A stdin that is not a pipe, a
        socket or a terminal (a file) goes through pygls' reader."""
        stdin, stdout = stdin or sys.stdin.buffer, stdout or sys.stdout.buffer
        if not is_pipe(stdin):
            return super().start_io(stdin, stdout)
        self._stop_event = threading.Event()  # what pygls' shutdown() sets to end the read loop
        self.protocol.set_writer(StdoutWriter(stdout))
        try:
            run_loop(serve_pipe(stdin, self.protocol, self._stop_event, self.report_server_error))
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
        if self.completer is not None and self.settings.model != before.model:
            if self.start_load() is not None:
                return True
            self.show(f"the model is the engine service's ({self.completer.address}); the model setting is ignored",
                      types.MessageType.Warning)  # fmt: skip
        return False

    @property
    def engine_choice(self) -> str:
        """ "local", "auto" or a service's address: the setting, else the command line's --engine."""
        return self.settings.engine or self.launch.engine

    async def start_engine(self) -> None:
        """The completer the engine setting asks for (`completers.choose`); its model loads, if it has
        one of its own. Not found, it is said once (the status watch tries again every second)."""
        completer, error = await choose(self.engine_choice, self.launch.token, self.launch.loader, self.log)
        if completer is None:
            if error != self._engine_error:
                self.tell(error, types.MessageType.Error)
            self._engine_error = error
            return
        self.completer, self._engine_error = completer, None
        if self.start_load() is None and self.settings.model:
            self.tell("the model is the engine service's; the model setting is ignored", types.MessageType.Warning)

    async def reach_engine(self) -> None:
        """Tries again to reach a named service that did not answer, or that went away (at most once
        a second: see RemoteCompleter)."""
        if self.completer is not None:
            await self.completer.refresh()
        elif self.engine_choice not in ("local", "auto"):
            if self._reconnect is None or self._reconnect.done():
                self._reconnect = asyncio.ensure_future(self.start_engine())
            await asyncio.shield(self._reconnect)

    async def completer_for_request(self) -> Completer:
        if self.completer is None:
            await self.reach_engine()
        if self.completer is None:
            raise JsonRpcException("no engine: the server is not initialized or the service is unreachable",
                                   code=REQUEST_FAILED)  # fmt: skip
        return self.completer

    def start_load(self) -> Ticket | None:
        """Loads the model the settings name, where the completer loads one (None: a service's)."""
        spec = ModelSpec(self.settings.model, self.launch.device, self.launch.dtype, self.launch.threads,
                         edit_ids=self.launch.edit_ids)  # fmt: skip
        ticket = self.completer.load(spec, self.loading.report) if self.completer is not None else None
        if ticket is not None:
            self.loading.ticket = ticket
            ticket.when_done(lambda future: self._on_loaded(future, spec))
            self.push_status()
        return ticket

    def _on_loaded(self, future, spec: ModelSpec) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.show(f"cannot load the model {spec.name}: {future.exception()}")
        self.push_status()

    def status(self) -> dict[str, Any]:
        if self.completer is not None:
            out = self.completer.status()
        elif self._engine_error is not None:
            out = {"engine": self.engine_choice, "model": "", "state": "unavailable", "error": self._engine_error}
        else:
            out = {"engine": self.engine_choice, "model": ModelSpec(self.settings.model).name, "state": "loading"}
        out = {**out, "inlineMode": self.settings.inline_mode, "rewriteMode": self.settings.rewrite_mode,
               "revise": self.revising}  # fmt: skip
        if self.settings.revise and not self.revising and self.completer is not None:
            out["reviseNote"] = "the engine service's backend (SGLang) starts every generation from masks: cold starts"
        return out

    @property
    def revising(self) -> bool:
        """Typing through a suggestion revises it (warm starts): the setting, where the engine can."""
        return self.settings.revise and (self.completer is None or self.completer.revises)

    def push_status(self) -> None:
        """`llada/status` (what llada.status answers) when the engine, the model or the state changed
        since the last one, and a window/showMessage when the engine service is lost or found again
        or its model cannot load (the model in this process: shown by `_on_loaded`; what failed before
        initialize: by `tell`).
        Nothing before the initialize result is out: some clients fail on an early notification."""
        if self._told is not None or self.shutdown_requested:
            return
        now = self.status()
        key = (now.get("engine"), now.get("model"), now["state"])
        if key == self._pushed:
            return
        before, self._pushed = self._pushed, key
        self.protocol.notify(STATUS_PUSH, now)
        if before is None or before[0] != key[0] or now.get("engine") == "local":
            return  # said already: at initialize (`tell`), or by `_on_loaded` for the model in this process
        if now["state"] in FAILED and now["state"] != before[2]:
            why = f": {now['error']}" if now.get("error") else ""
            what = "cannot load its model" if now["state"] == "error" else f"is {now['state']}"
            self.show(f"the engine service at {now['engine']} {what}{why}")
        elif before[2] in FAILED and now["state"] not in FAILED:
            self.show(f"the engine service at {now['engine']} is back ({now['state']})", types.MessageType.Info)

    async def watch_status(self) -> None:
        """Pushes every change of state as it happens, not on the next request: a service that went
        away or stopped answering, one that is back (tried again at most once a second), a load's end.
        Ends with the session (a TCP session's loop goes on serving the next one)."""
        while not self.shutdown_requested and not (self._stop_event and self._stop_event.is_set()):
            if self.status()["state"] == "unavailable":
                await self.reach_engine()
            self.push_status()
            await asyncio.sleep(STATUS_WATCH_SECONDS)

    # --- documents ----------------------------------------------------------------------------
    @property
    def encoding(self) -> str:
        chosen = self.workspace.position_encoding
        return str(getattr(chosen, "value", chosen) or UTF16)

    def open_document(self, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        self.documents.open(doc.uri, doc.version, doc.text, doc.language_id)
        self.cross_file.warm_later()  # a new document may change the snippets the last completion's line would get

    def change_document(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = params.text_document
        for problem in self.documents.change(doc.uri, doc.version, params.content_changes, self.encoding):
            self.log(problem, types.MessageType.Warning)

    def close_document(self, params: types.DidCloseTextDocumentParams) -> None:
        """Forgets the document and cancels its completion and next edit (a rewrite runs on: its
        answer says the document is not open)."""
        uri = params.text_document.uri
        self.documents.close(uri)
        self.context.forget(uri)
        for key in (uri, next_edit_key(uri), warm_key(uri)) if self.completer is not None else ():
            self.completer.cancel_key(key)
        self.cross_file.warm_later()

    def workspace_changed(self) -> None:
        """The workspace folders as pygls holds them (after `initialize`, and after each
        workspace/didChangeWorkspaceFolders, which pygls applies first): where imported files may
        be read from. Resolved here, not per completion (each resolves every folder's real path)."""
        self.context.set_roots([*(f.uri for f in self.workspace.folders.values()), self.workspace.root_uri])

    async def run_job(self, key: str, label: str, job: Job, on_draft: DraftCallback | None = None) -> Outcome:
        """`job` on the engine; it supersedes the running job of `key`. A failure's message has no
        "llada:" of its own: clients name the server ("llada: rewrite failed: ..."), and it was said twice."""
        completer = await self.completer_for_request()
        try:
            return await completer.run(key, label, job, on_draft)
        except CompletionFailed as err:
            self.push_status()  # a service found gone: the editor hears it now, not at the next tick
            raise JsonRpcException(str(err), code=REQUEST_FAILED) from None
