"""Document and folder URIs as local paths: the one place a client's URI becomes a path, and where a URI
that names no usable local file (another scheme, a remote host, a relative path, a NUL, a bad
percent-escape, a `..` segment) becomes None, said in the log, never an error.

Knows strings; nothing of pygls or the disk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote_to_bytes, urlparse

_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def path_of(uri: str, log: Callable[[str], None] | None = None) -> str | None:
    """The absolute local path of a file: URI, else None (`log` hears why, for a file: URI)."""
    why = None
    if not isinstance(uri, str) or not uri.startswith("file:"):
        return None
    try:
        parsed = urlparse(uri)
    except ValueError:
        parsed, why = None, "not a URI"
    if parsed is not None:
        if parsed.netloc not in ("", "localhost"):
            why = f"a remote host ({parsed.netloc!r})"
        elif "\x00" in uri or _ESCAPE.search(parsed.path):
            why = "a NUL or a bad percent-escape"
        else:
            try:
                path = unquote_to_bytes(parsed.path).decode("utf-8")
            except UnicodeDecodeError:
                path, why = "", "an escape that is not UTF-8"
            if why is None:
                if "\x00" in path:
                    why = "an escaped NUL (%00)"
                elif not path.startswith("/"):
                    why = "a relative path"
                elif any(part in ("..", ".") for part in path.split("/")):
                    why = "a '..' or '.' segment"
                elif len(path) > 4096:
                    why = "a path over 4096 characters"
                else:
                    return path
    if log is not None and why is not None:
        log(f"the URI {uri[:200]!r} names no local file ({why}): not read, not used as context")
    return None
