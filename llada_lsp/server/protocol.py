"""pygls' protocol with its gaps closed, and the JSON-RPC error codes the server answers with:
malformed requests, requests before initialize and after shutdown are answered; internal errors reach
the client as one line; UTF-8 is chosen when offered; `exit` ends a stdio process at once.

Knows pygls and lsprotocol, and the server only as `Server` (what it calls on it); nothing of models,
completions or how documents are kept (the server's state is language_server.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol, lsp_method

from .positions import UTF8

logger = logging.getLogger(__name__)

REQUEST_FAILED = -32803  # LSP ErrorCodes.RequestFailed: the request was valid but could not be served
INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32600, -32602, -32603


@dataclass(frozen=True)
class MalformedRequest:
    """A request whose params did not parse: answered with InvalidParams instead of dropped."""

    id: int | str
    method: str
    reason: str
    jsonrpc: str = "2.0"


class Server(Protocol):
    """The server as the protocol knows it: where a refused message is logged, and one method per
    document notification, which keeps every store of the document in step."""

    def log(self, message: str, kind: types.MessageType = ...) -> None: ...

    def open_document(self, params: types.DidOpenTextDocumentParams) -> None: ...

    def change_document(self, params: types.DidChangeTextDocumentParams) -> None: ...

    def close_document(self, params: types.DidCloseTextDocumentParams) -> None: ...


class LladaProtocol(LanguageServerProtocol):
    """pygls' protocol with its gaps closed: malformed requests, requests before initialize and after
    shutdown are answered; internal errors reach the client as one line (the traceback goes to the
    log); documents are handed to the server (pygls' workspace keeps no copy of its own); UTF-8 is
    chosen when the client offers it; commands receive their whole ExecuteCommandParams."""

    _server: Server
    _initialize_seen = False

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as err:
            if not isinstance(data, dict) or not isinstance(data.get("id"), (int, str)) or isinstance(data["id"], bool):
                raise
            reason = why(err.__cause__) or err.message
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
        self._server.open_document(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        self._server.change_document(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        self._server.close_document(params)

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams):
        handler = self.fm.commands.get(params.command)
        if handler is None:
            raise JsonRpcInvalidParams(f"unknown command {params.command!r}")
        return (yield handler, (params,), None)


def why(error: BaseException | None) -> str:
    if isinstance(error, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(error))
    return str(error or "")


def exit_now(code: int) -> NoReturn:
    """Ends the process at once, the log flushed, without the interpreter's teardown (which, under a
    model thread still inside torch, aborts or floods stderr). For when every answer has been written."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)
