"""What the service can tell of a peer, and how it quotes one: its text made safe for a log line or a
message, whether it is a process of this user (a Unix socket's credentials), whether it is gone."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import struct

TEXT_MAX = 300  # characters of a peer's text (an error, a client name) in a message or a log line
LINGER_BYTES = 2**20  # what a refused peer may still be sending that is taken in and dropped, at most
LINGER_IDLE = 0.05  # seconds of silence after which a refused peer is taken to have stopped sending
LINGER_SECONDS = 1.0  # and the longest a refused connection is kept for it


def printable(text: str, limit: int = TEXT_MAX) -> str:
    """`text` safe for a log line or a message: control characters (line ends, ANSI escapes) written
    as escapes, at most `limit` characters, the rest counted."""
    head = text[:limit]
    safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    return safe if len(text) <= limit else f"{safe}... ({len(text) - limit} more characters)"


def same_user(writer: asyncio.StreamWriter) -> bool:
    """Whether the peer is a process of this service's user, as the kernel says (a Unix socket only:
    over TCP nobody is known to be anyone)."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return False
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


def peer_gone(writer: asyncio.StreamWriter) -> bool:
    """Whether a Unix socket's peer closed both ways (a half-close is only its sending side). TCP cannot
    tell them apart here: a write to a peer that closed both ways fails, and closes the writer."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(events & select.POLLHUP for _, events in poller.poll(0))


async def linger(reader: asyncio.StreamReader) -> None:
    """Takes in and drops what a refused peer is still sending (bounded in bytes and time), so that
    closing neither fails its writes nor resets the connection (unread input does) before it has read
    the refusal already sent to it."""
    loop = asyncio.get_running_loop()
    deadline, taken = loop.time() + LINGER_SECONDS, 0
    while taken < LINGER_BYTES and (left := deadline - loop.time()) > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(2**16), min(LINGER_IDLE, left))
        except (TimeoutError, OSError):
            return
        if not chunk:
            return
        taken += len(chunk)
