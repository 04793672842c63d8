"""The event loop both processes run (the LSP front and the engine service): uvloop where installed,
and calls onto it from the model thread that stay harmless once it has closed.

Standard library (and uvloop) only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:  # optional (not on Windows): the standard loop
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable, *args: Any) -> None:
    """`fn(*args)` on `loop`, from any thread; nothing if the loop has closed (the process is exiting
    under a job being cancelled: nobody is listening)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
