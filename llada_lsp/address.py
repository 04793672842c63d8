"""Where the engine service listens: `unix:PATH` (the default, a per-user socket) or `tcp://HOST:PORT`
(loopback unless told otherwise, and only with a token), and the token file's checks.

Shared by the service and its clients; stdlib only. Knows nothing of the protocol spoken there.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOCKET_NAME = "engine.sock"
UNIX_PATH_MAX = 107  # sun_path is 108 bytes on Linux (104 on macOS), the terminating NUL included


@dataclass(frozen=True)
class Address:
    kind: str  # "unix" | "tcp"
    path: str = ""  # unix
    host: str = ""  # tcp
    port: int = 0  # tcp; 0 when listening: the system picks one

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp://{self.host}:{self.port}"


def default_socket_path() -> Path:
    """$XDG_RUNTIME_DIR/llada-lsp/engine.sock (a per-user folder the system cleans at logout), else
    llada-lsp-<uid>/engine.sock in the temporary folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "llada-lsp" / SOCKET_NAME
    return Path(tempfile.gettempdir()) / f"llada-lsp-{os.getuid()}" / SOCKET_NAME


def parse_address(text: str | None) -> Address:
    """`unix:PATH`, `tcp://HOST:PORT` (`tcp://:PORT` is loopback), or None for the default socket;
    ValueError with a one-line reason otherwise."""
    if not text:
        return Address("unix", str(default_socket_path()))
    if text.startswith("unix:"):
        path = os.path.abspath(os.path.expanduser(text.removeprefix("unix:")))
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise ValueError(f"the socket path {path} is over {UNIX_PATH_MAX} bytes, the most a Unix socket takes")
        return Address("unix", path)
    if text.startswith("tcp://"):
        host, _, port = text.removeprefix("tcp://").rpartition(":")
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{text!r}: want tcp://HOST:PORT")
        return Address("tcp", host=host.strip("[]") or "127.0.0.1", port=int(port))
    raise ValueError(f"{text!r}: want unix:PATH or tcp://HOST:PORT")


def private_folder(path: Path, create: bool) -> None:
    """Makes sure `path` is a folder only this user can enter (created 0700 if `create`); ValueError
    if it belongs to someone else or others may read it: in a shared temporary folder, another user
    could have made it first to catch our socket."""
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{path} is not a folder")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ValueError(f"{path} must belong to you and be closed to others (chmod 700)")


def read_token(path: str) -> str:
    """The shared secret of a TCP service, from a file of the user's with mode 0600 (or stricter);
    ValueError if the file is open to others, belongs to someone else or is empty."""
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ValueError(f"the token file {path} must belong to you and have mode 0600")
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token
