"""The language server on TCP (`llada-lsp serve --tcp HOST:PORT --token-file PATH`): the listener, the
token each connection sends first, and one session per connection, one connection at a time.

Owns sockets and the token rule. A session is a fresh LladaServer (language_server.py: its own documents,
settings and model), which knows nothing of how its client arrived. No connection ends the listener.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from contextlib import suppress
from typing import Any, NoReturn

from lsprotocol import types

from ..address import parse_address
from ..runtime.loop import run as run_loop
from .handlers import create_server
from .language_server import Launch, LladaServer
from .protocol import REQUEST_FAILED, exit_now
from .transport import FrameReader, serve_stream

logger = logging.getLogger(__name__)

LIMIT = 2**20  # bytes a connection buffers before reading pauses: the longest token line
TOKEN_SECONDS = 10.0  # a peer that sends no token line within this is dropped
TAKEOVER_SECONDS = 5.0  # an editor restarting the server closes its old connection just before the new one
NO_TOKEN = "wrong or missing token: send the token of the server's --token-file as the first line (docs/protocol.md)"
BUSY = "this server already serves a client over TCP, and serves one at a time: close that one first"


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (loopback); port 0 lets the system pick (it is printed).
    ValueError otherwise."""
    try:
        address = parse_address("tcp://" + text)
    except ValueError:
        raise ValueError(f"--tcp wants HOST:PORT, got {text!r}") from None
    return address.host, address.port


def serve(host: str, port: int, launch: Launch, token: str) -> NoReturn:
    """Serves until SIGINT or SIGTERM, then ends the process: 0, or 1 if it cannot listen."""
    code = run_loop(TcpListener(launch, token).serve(host, port))
    # As stdio's `exit` does: a session's model thread may still be in a step or a load (which stops
    # only at its next tensor), and an interpreter finalizing under it aborts. Every answer has been written.
    exit_now(code)


class TcpSession(LladaServer):
    """The session of a client that came over TCP. Its `model` setting, and an `engine` that is an
    address, may name only what the command line did: a peer must not make the server read whatever
    folder it names (and so learn which exist), nor connect, carrying the server's token, to an
    address of its choosing."""

    def configure(self, raw: Any) -> bool:
        return super().configure(self._screened(raw))

    def _screened(self, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        allowed_model, allowed_engine = self.launch.defaults.model, self.launch.engine
        out = dict(raw)
        model, engine = raw.get("model"), raw.get("engine")
        if model not in (None, "", allowed_model):
            if isinstance(model, str) and allowed_model and _same_path(model, allowed_model):
                out["model"] = allowed_model
            else:
                del out["model"]
                self.tell(f"setting model: over TCP this server loads only the model of its command line "
                          f"({allowed_model or 'the embedded one'}); {model!r} refused", types.MessageType.Error)  # fmt: skip
        if engine not in (None, "", "auto", "local", allowed_engine):
            del out["engine"]
            self.tell(f"setting engine: over TCP this server uses only the engine of its command line "
                      f"({allowed_engine}); {engine!r} refused", types.MessageType.Error)  # fmt: skip
        return out


def _same_path(a: str, b: str) -> bool:
    """Textually, without asking the file system: the answer must not depend on what exists."""
    return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))


class TcpListener:
    """Accepts connections, checks each one's token, and runs one session at a time."""

    def __init__(self, launch: Launch, token: str):
        self.launch, self.token = launch, token.encode()
        self._in_session = False
        self._ended = asyncio.Event()  # set each time a session ends
        self._writers: set[asyncio.StreamWriter] = set()

    async def serve(self, host: str, port: int) -> int:
        stop = asyncio.Event()  # set before the address is printed: whoever reads it may stop us at once
        for sig in (signal.SIGINT, signal.SIGTERM):
            with suppress(NotImplementedError):  # not on Windows: Ctrl-C then ends the loop instead
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            server = await asyncio.start_server(self.connected, host, port, limit=LIMIT)
        except OSError as err:
            print(f"llada-lsp: cannot listen on {host}:{port}: {err.strerror or err}", file=sys.stderr)
            return 1
        for sock in server.sockets:
            where = _show(sock.getsockname())
            print(f"llada-lsp: listening on {where} (LSP over TCP; a client sends the token first)", file=sys.stderr)
            if not _is_loopback(sock.getsockname()[0]):
                print(f"llada-lsp: WARNING: {where} is not a loopback address. Anyone who can reach it can try "
                      "the token, and the connection (the token, your documents) crosses the network "
                      "unencrypted. Listen on 127.0.0.1 unless you mean this.", file=sys.stderr)  # fmt: skip
        try:
            await stop.wait()
        finally:
            server.close()
            for writer in list(self._writers):  # ends each read loop; each session then stops its model
                writer.close()
        return 0

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _show(writer.get_extra_info("peername"))
        self._writers.add(writer)
        try:
            if not await self._authenticated(reader, writer, peer):
                return
            if not await self._claim():
                logger.warning("TCP client %s refused: another client is connected", peer)
                await _refuse(reader, writer, BUSY)
                return
            try:
                await self._session(reader, writer, peer)
            finally:
                self._in_session = False
                self._ended.set()
        except Exception:  # one connection's failure ends that connection only, never the listener
            logger.exception("the TCP connection of %s failed", peer)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _authenticated(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> bool:
        """Reads the first line, nothing more, and compares it with the token in constant time."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), TOKEN_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            line = b""
        if hmac.compare_digest(line.strip(), self.token):
            return True
        logger.warning("TCP connection from %s closed: no token, or a wrong one", peer)
        _show_message(writer, NO_TOKEN)
        await _linger(reader, writer)
        return False

    async def _claim(self) -> bool:
        """True once no other session runs (waiting a little for one that is ending), and this one counts."""
        deadline = asyncio.get_running_loop().time() + TAKEOVER_SECONDS
        while self._in_session:
            self._ended.clear()
            try:
                await asyncio.wait_for(self._ended.wait(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                return False
        self._in_session = True
        return True

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        ls = create_server(self.launch, TcpSession)
        ls._stop_event = threading.Event()  # what pygls' shutdown() sets to end the read loop
        # The stream's own writer: `exit` then closes this connection, where on stdio it ends the process.
        ls.protocol.set_writer(writer)
        logger.info("TCP session of %s begins", peer)
        try:
            await serve_stream(reader, ls.protocol, ls._stop_event, ls.report_server_error)
        finally:
            logger.info("TCP session of %s ends", peer)
            if ls.completer is not None:
                ls.completer.stop()  # its model thread ends; a reconnecting editor gets a new session
            ls.shutdown()


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Sends what was written and half-closes, then discards (never parses) what the peer still sends
    until it closes, for TOKEN_SECONDS and LIMIT bytes at most: a socket closed with unread bytes is
    reset, and a reset can destroy the refusal still in flight to the peer."""
    loop = asyncio.get_running_loop()
    deadline, discarded = loop.time() + TOKEN_SECONDS, 0
    try:
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        while discarded < LIMIT:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.0, deadline - loop.time()))
            if not chunk:
                return
            discarded += len(chunk)
    except (TimeoutError, ConnectionError):
        pass


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: str) -> None:
    """Tells the client why, and answers its first request (its `initialize`) with the reason: editors
    show a failed initialize to the user, where a closed connection looks like a crash."""
    _show_message(writer, text)
    try:
        frame = await asyncio.wait_for(FrameReader(reader).next(), TOKEN_SECONDS)
        message = json.loads(frame.body) if frame is not None and frame.body is not None else None
    except (TimeoutError, ConnectionError, ValueError):
        return
    if isinstance(message, dict) and "method" in message and "id" in message:
        error = {"code": REQUEST_FAILED, "message": f"llada: {text}", "data": {"retry": False}}
        writer.write(_frame({"jsonrpc": "2.0", "id": message["id"], "error": error}))
        await writer.drain()


def _show_message(writer: asyncio.StreamWriter, text: str) -> None:
    params = {"type": types.MessageType.Error.value, "message": f"llada: {text}"}
    writer.write(_frame({"jsonrpc": "2.0", "method": types.WINDOW_SHOW_MESSAGE, "params": params}))


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _show(address: Any) -> str:
    if not isinstance(address, tuple):
        return str(address)
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
