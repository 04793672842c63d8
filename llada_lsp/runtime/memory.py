"""Memory the process freed, given back to the system.

Two things keep a long-running process large after one huge request (a megabyte-long rewrite, a
frame of a million fields). Objects in reference cycles (a future and its callbacks, an exception
and its frames) wait for Python's cyclic collector, whose full passes are rare in a process of
200,000 objects, so the text they reach stays alive long after its request; `gc.collect()` frees
them (cheap once `settle()` has moved what a model load made into the permanent generation, which
the collector no longer scans). Then glibc's malloc keeps freed heap pages for reuse;
`malloc_trim(0)` returns every whole free page, in every arena."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def _trim_function():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:  # no C library to load (not expected on Linux or macOS)
        return None


_MALLOC_TRIM = _trim_function()


def settle() -> None:
    """After a model load: what exists now (modules, the model, its tokenizer) lives as long as the
    process, so the collector stops scanning it (a full pass: ~80 ms -> a few ms here)."""
    gc.collect()
    gc.freeze()


def unsettle() -> None:
    """Before a model load: the model it replaces must be collectable again."""
    gc.unfreeze()


def release_freed_memory() -> bool:
    """Collects garbage cycles, then gives free pages back: True where the C library did (glibc);
    elsewhere (musl, macOS) only the collection, False."""
    gc.collect()
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False
