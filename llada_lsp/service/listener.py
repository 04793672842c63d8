"""Where the engine service listens: for a Unix path, a folder closed to others, a lock held while
the service lives, a stale socket replaced, the socket made 0600 and removed at exit; for TCP, the port.

Sockets and files only; knows nothing of the protocol spoken on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import stat
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable

from ..address import Address, default_socket_path, private_folder

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class AlreadyServing(RuntimeError):
    """Another engine holds the socket path."""


class Listener:
    """Where the service listens. For a Unix path: a folder closed to others, a lock held while the
    service lives (a second service on the path refuses to start, even while the first still loads),
    a stale socket file replaced, the socket made 0600, and removed at exit. For TCP: the port."""

    def __init__(self, address: Address, lock: int | None):
        self.address, self.lock = address, lock
        self.server: asyncio.AbstractServer | None = None

    @classmethod
    def claim(cls, address: Address) -> Listener:
        """Takes the path (AlreadyServing if another engine has it; ValueError for an unsafe folder or
        a path that is not a socket); binds nothing yet. Cheap: run before the model is imported."""
        if address.kind == "tcp":
            return cls(address, None)
        path = Path(address.path)
        if path == default_socket_path():  # in a shared temporary folder: it must be ours alone
            private_folder(path.parent, create=True)
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _remove_stale(path)
        except BlockingIOError:
            os.close(lock)
            raise AlreadyServing(f"another engine is serving on {path}") from None
        except BaseException:
            os.close(lock)
            raise
        return cls(address, lock)

    async def bind(self, handle: Handler) -> None:
        if self.address.kind == "tcp":
            self.server = await asyncio.start_server(handle, self.address.host, self.address.port)
            self.address = replace(self.address, port=self.server.sockets[0].getsockname()[1])
            return
        umask = os.umask(0o177)  # the socket is born 0600: no moment when others could connect
        try:
            self.server = await asyncio.start_unix_server(handle, path=self.address.path)
        finally:
            os.umask(umask)

    def close(self) -> None:
        """Stops accepting; removes the socket file, then lets the path go."""
        if self.server is not None:
            self.server.close()
        if self.lock is not None:
            if self.server is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.address.path)
            os.close(self.lock)  # the lock file stays: removing it would race with a new service's lock
            self.lock = None


def _remove_stale(path: Path) -> None:
    """Removes a socket file nobody answers on (its engine died); refuses to touch anything else."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ValueError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise AlreadyServing(f"something already answers on {path}")
