"""Where the engine service listens: for a Unix path, a folder closed to others, a lock held while
the service lives (naming its PID), a stale socket replaced, the socket made 0600, made again if it is
deleted while the service lives, and both removed at exit; for TCP, the port.

Sockets and files only; knows nothing of the protocol spoken on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from ..address import Address, private_folder

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BACKLOG = 1024  # connects not yet accepted (asyncio's 100 refuses a burst of editors starting at once)
WATCH_SECONDS = 1.0  # how often the socket file is looked at (is it still there, still ours?)

logger = logging.getLogger(__name__)


class AlreadyServing(RuntimeError):
    """Another engine holds the socket path."""


class Listener:
    """Where the service listens. For a Unix path: a folder closed to others, a lock held while the
    service lives (a second service on the path refuses to start, even while the first still loads),
    a stale socket file replaced, the socket made 0600, and removed at exit. For TCP: the port."""

    def __init__(self, address: Address, lock: int | None):
        self.address, self.lock = address, lock
        self.server: asyncio.AbstractServer | None = None
        self._handle: Handler | None = None
        self._inode: int | None = None  # the socket file this service made

    @classmethod
    def claim(cls, address: Address) -> Listener:
        """Takes the path (AlreadyServing if another engine has it; ValueError for an unsafe folder or
        a path that is not a socket); binds nothing yet. Cheap: run before the model is imported."""
        if address.kind == "tcp":
            return cls(address, None)
        path = Path(address.path)
        # Whoever may write in the folder could swap the socket or the lock for their own: any folder,
        # not only the default one in the shared temporary folder, must be ours alone.
        private_folder(path.parent, create=True)
        try:  # never through a symlink someone planted: it would make us lock (and write) their file
            lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise ValueError(f"cannot open the lock file {path}.lock (a symlink is refused): {err.strerror}") from None
        try:
            info = os.fstat(lock)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise ValueError(f"{path}.lock is not a file of yours")
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                moved = os.stat(f"{path}.lock", follow_symlinks=False).st_ino != info.st_ino
            except FileNotFoundError:
                moved = True
            if moved:  # a stopping engine removed the file between our open and our lock: a lock on nothing
                os.close(lock)
                return cls.claim(address)  # the file at the path now, or a new one
            _remove_stale(path)
            os.ftruncate(lock, 0)
            os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the next one's refusal
        except BlockingIOError:
            holder = os.pread(lock, 32, 0).decode(errors="replace").strip()
            os.close(lock)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise AlreadyServing(f"another engine{who} is serving on {path}") from None
        except BaseException:
            os.close(lock)
            raise
        return cls(address, lock)

    async def bind(self, handle: Handler) -> None:
        self._handle = handle
        if self.address.kind == "tcp":
            self.server = await asyncio.start_server(handle, self.address.host, self.address.port, backlog=BACKLOG)
            self.address = replace(self.address, port=self.server.sockets[0].getsockname()[1])
            return
        self.server = await self._bind_unix()

    async def _bind_unix(self) -> asyncio.AbstractServer:
        umask = os.umask(0o177)  # the socket is born 0600: no moment when others could connect
        try:
            server = await asyncio.start_unix_server(self._handle, path=self.address.path, backlog=BACKLOG)
        finally:
            os.umask(umask)
        self._inode = os.lstat(self.address.path).st_ino
        return server

    async def watch(self, lost: Callable[[str], None]) -> None:
        """Until cancelled, looks at the socket file every WATCH_SECONDS: deleted (the connections made
        keep working, but no new one could reach us), it is made again; replaced by something else, we
        stop being reachable there: `lost(why)` is called once and the watch ends."""
        if self.address.kind != "unix":
            return
        path = self.address.path
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                inode = os.lstat(path).st_ino
            except FileNotFoundError:
                try:
                    old, self.server = self.server, await self._bind_unix()  # we hold the lock: the path is ours
                except OSError as err:
                    lost(f"{path} was deleted and cannot be made again: {err}")
                    return
                old.close()  # stops listening on the deleted file; its connections go on
                logger.warning("%s was deleted: the socket is made again", path)
                continue
            if inode != self._inode:
                lost(f"{path} was replaced by another file: this engine can no longer be reached there")
                return

    def close(self) -> None:
        """Stops accepting; removes the socket file, then lets the path go."""
        if self.server is not None:
            self.server.close()
        if self.lock is not None:
            with contextlib.suppress(FileNotFoundError):
                if self._inode is not None and os.lstat(self.address.path).st_ino == self._inode:
                    os.unlink(self.address.path)  # ours only: a file someone put in its place stays
            # The lock file goes while it is still locked: an engine that opened it just before locks a
            # file no longer at the path, sees so (claim compares the inodes) and takes the new one.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(f"{self.address.path}.lock", follow_symlinks=False).st_ino == os.fstat(self.lock).st_ino:
                    os.unlink(f"{self.address.path}.lock")
            os.close(self.lock)
            self.lock = None


def holder(address: Address) -> int | None:
    """The PID in the lock file beside a Unix socket when that process lives: an engine that has the
    path, listening or not yet (it takes the lock before importing the model's libraries, and removes
    the lock file when it stops). Only reads: taking the lock, even shared, could make a starting engine
    think the path is taken."""
    if address.kind != "unix":
        return None
    try:
        with open(f"{address.path}.lock", "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as lock:
            text = lock.read(32).decode(errors="replace").strip()
        pid = int(text)
        os.kill(pid, 0)  # raises if no such process
    except (OSError, ValueError):  # no lock file, no PID in it, or its process is gone (a killed engine's)
        return None
    return pid


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
