"""LSP's base protocol on a byte stream: `Content-Length` framing with limits, recovery from broken
frames, the JSON-RPC envelope checks made before pygls sees a message, and stdin read by the event loop.

Hands each message to a pygls protocol; knows no LSP method, handler or document.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MAX_HEADER_LINE = 8 * 1024  # bytes of one header line, its line end included
MAX_CONTENT_LENGTH = 64 * 1024 * 1024  # bytes of one message body: refused before a byte of it is read
# JSON-RPC's codes (lsprotocol's ErrorCodes): numbers here, so that the headless client, which reads
# frames with this module, imports neither lsprotocol (half a second) nor pygls.
PARSE_ERROR, INVALID_REQUEST = -32700, -32600

# A Content-Length header at the end of a line (header names are case-insensitive; blanks around the
# value are tolerated). A raw line end cannot occur inside a JSON string, so a line that ends so is
# where a message starts, even after bytes no header explains (the rest of a body sent with too
# short a length, say): reading picks the stream up there.
_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Frame:
    """One message as framed: its body (None when it was not read) and, for a frame that cannot be
    trusted, why."""

    body: bytes | None
    problem: str | None = None


class FrameReader:
    """Reads framed messages from an asyncio stream. Memory stays bounded whatever arrives: a header
    line longer than MAX_HEADER_LINE is dropped as it is read (only its end is kept, to find a header
    there), and a body over MAX_CONTENT_LENGTH is never read, only skipped line by line."""

    def __init__(self, stream: asyncio.StreamReader):
        self.stream = stream

    async def next(self) -> Frame | None:
        """The next frame; None at the end of the input."""
        length: int | None = None
        problems: list[str] = []
        lines = 0
        while True:
            line = await self._line()
            if line is None:
                return None
            raw, size = line
            text, overlong = raw.strip(), size > MAX_HEADER_LINE
            if not text:
                if not lines:
                    continue  # blank lines between messages
                break
            lines += 1
            found = _CONTENT_LENGTH.search(text)
            if found and (found.start() > 0 or overlong):
                skipped = size - len(raw.lstrip()) + found.start()
                logger.warning("skipped %d bytes that are no message, up to the next header", skipped)
                length, problems = int(found[1]), []
            elif found:
                length = int(found[1])
            elif overlong:
                problems.append(f"a header line of {size} bytes (at most {MAX_HEADER_LINE})")
            elif b":" not in text:
                problems.append(f"{_show(text)} is not a header")
            # else another header (Content-Type): the body is UTF-8 whatever it says
        if length is None:
            return Frame(None, "; ".join(problems + ["no Content-Length header"]))
        if length > MAX_CONTENT_LENGTH:
            return Frame(None, f"a message of {length} bytes (Content-Length), over the limit of {MAX_CONTENT_LENGTH}")
        try:
            body = await self.stream.readexactly(length)
        except asyncio.IncompleteReadError:
            return None
        return Frame(body, "; ".join(problems) or None)

    async def _line(self) -> tuple[bytes, int] | None:
        """(the line's last MAX_HEADER_LINE bytes, its whole length), or None at the end of the input."""
        tail, dropped = b"", 0
        while True:
            try:
                line = await self.stream.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                return None  # a last line without its end cannot complete a message
            except asyncio.LimitOverrunError as err:  # longer than the stream's buffer: drop what is there
                chunk = await self.stream.readexactly(err.consumed)
                tail, dropped = (tail + chunk)[-MAX_HEADER_LINE:], dropped + len(chunk)
                continue
            return (tail + line)[-MAX_HEADER_LINE:], dropped + len(line)


async def serve_stream(stream: asyncio.StreamReader, protocol, stop_event: threading.Event,
                       on_error: Callable[[Exception, type], Any] | None = None) -> None:  # fmt: skip
    """Reads messages until the end of the input (or `stop_event`) and hands each to `protocol`, a
    pygls JsonRPCProtocol. What cannot be handed on is answered with an error, never dropped in silence."""
    frames = FrameReader(stream)
    while not stop_event.is_set():
        frame = await frames.next()
        if frame is None:
            return
        if frame.body is None:
            refuse(protocol, None, PARSE_ERROR, frame.problem)
            continue
        try:
            data = json.loads(frame.body)
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            refuse(protocol, None, PARSE_ERROR, f"a body that is not JSON ({_one_line(err)})")
            continue
        msg_id = data.get("id") if isinstance(data, dict) and _is_id(data.get("id")) else None
        if frame.problem:
            refuse(protocol, msg_id, PARSE_ERROR, frame.problem)
        elif (problem := envelope_problem(data)) is not None:
            refuse(protocol, msg_id, INVALID_REQUEST, problem)
        else:
            _hand_on(protocol, data, msg_id, on_error)


def is_pipe(stream) -> bool:
    """A pipe, a socket or a terminal: streams the event loop can read. A terminal too, so that the
    server started by hand stops on Ctrl-C at once (pygls' reader thread would sit in read())."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no file descriptor (an in-memory stream)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


async def serve_pipe(pipe, protocol, stop_event: threading.Event,
                     on_error: Callable[[Exception, type], Any] | None = None) -> None:  # fmt: skip
    """`serve_stream` over a pipe (`is_pipe`: stdin), read by the event loop itself: pygls reads stdin on
    a thread pool, a hop to another thread and back for each header line and body of every keystroke."""
    stream = asyncio.StreamReader(limit=2**20)  # buffered before reading pauses: a big didOpen in few reads
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
    await serve_stream(stream, protocol, stop_event, on_error)


def _hand_on(protocol, data: dict[str, Any], msg_id, on_error) -> None:
    try:
        message = protocol.structure_message(data)
    except Exception as err:  # a request that answered nothing would leave its client waiting
        logger.exception("cannot read %s", data.get("method", "a response"))
        if msg_id is not None and "method" in data:
            refuse(protocol, msg_id, INVALID_REQUEST, f"cannot read the message ({type(err).__name__})")
        return
    try:
        protocol.handle_message(message)
    except Exception as err:
        logger.exception("cannot handle %s", data.get("method", "a response"))
        if on_error is not None:
            from pygls.exceptions import JsonRpcException

            on_error(err, JsonRpcException)


def envelope_problem(data: Any) -> str | None:
    """Why `data` is not a JSON-RPC 2.0 message LSP allows, or None."""
    if isinstance(data, list):
        return "a batch (a JSON array): LSP sends one message at a time"
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__} where a message object was expected"
    if data.get("jsonrpc") != "2.0":
        return 'no "jsonrpc": "2.0"'
    if "method" in data and not isinstance(data["method"], str):
        return "method is not a string"
    if "method" in data and "id" in data and not _is_id(data["id"]):
        return "id is neither an integer nor a string"
    if "method" not in data and "id" not in data:
        return "neither a request, a notification nor a response"
    return None


def refuse(protocol, msg_id: int | str | None, code: int, reason: str) -> None:
    """Logs why a message was refused and tells the client, with the message's id where it is known
    (else null, as JSON-RPC asks)."""
    logger.warning("refused a message (%s): %s", int(code), reason)
    error = {"code": int(code), "message": f"llada: {reason}"}
    protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": error})


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _show(text: bytes) -> str:
    return repr(text[:40].decode("utf-8", "replace")) + ("..." if len(text) > 40 else "")


def _one_line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
