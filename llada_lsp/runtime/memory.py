"""Memory the process freed, given back to the system. glibc's malloc keeps freed heap pages for reuse,
so after one huge request (a megabyte-long rewrite, a frame of a million fields) a long-running
process would stay that large; `malloc_trim(0)` returns every whole free page, in every arena."""

from __future__ import annotations

import ctypes
import ctypes.util


def _trim_function():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:  # no C library to load (not expected on Linux or macOS)
        return None


_MALLOC_TRIM = _trim_function()


def release_freed_memory() -> bool:
    """True where the C library gave pages back (glibc); elsewhere (musl, macOS) a no-op, False."""
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False
