"""The engine service's client: one connection (hello, welcome), then requests that each await their
`done`, with drafts through a callback, and raise a typed EngineFailure for anything else.

Knows the wire protocol and the socket; nothing of the LSP, documents or models. Imports no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .. import wire
from ..address import Address, parse_address

logger = logging.getLogger(__name__)

DraftCallback = Callable[[int, str], None]  # (step, text), as the worker's drafts
StatusCallback = Callable[[wire.Status], None]
SILENCE = 5.0  # seconds without a frame from the engine, pinged meanwhile, after which it is not responding


class EngineFailure(Exception):
    """A request or a connection the engine did not serve. `kind` is a wire `failed` kind
    ("cancelled", "no_model", "too_long", "unsupported", "bad_request", "version", "auth", "internal"),
    or "engine_gone" (the connection dropped or was closed) or "unreachable" (nothing answered)."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


class EngineClient:
    """One connection to an engine service. Use from one event loop; `connect` makes one. Requests
    carry their own ids (`next_id()` hands out fresh ones); drafts and status arrive on the loop.

    A live engine answers a `status` ask at once, even while its model is busy: one is sent after
    `silence / 2` seconds without a frame, and after `silence` the engine is not `responding` (a stopped
    or hung process); `on_responding(bool)` is called on each change, the first frame after it included."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, welcome: wire.Welcome,
                 on_status: StatusCallback | None = None, silence: float = SILENCE):  # fmt: skip
        self.welcome, self.on_status = welcome, on_status
        self.on_responding: Callable[[bool], None] | None = None
        self.responding, self.silence, self._heard = True, silence, time.monotonic()
        self._reader, self._writer = reader, writer
        self._pending: dict[int, tuple[asyncio.Future[wire.Done], DraftCallback | None]] = {}
        self._status_waiters: list[asyncio.Future[wire.Status]] = []
        self._ids = itertools.count(1)
        self._gone: EngineFailure | None = None
        self._last_word = ""  # a connection-level `failed` the engine sent before closing
        self._reading = asyncio.ensure_future(self._read_loop())
        self._watching = asyncio.ensure_future(self._watch())

    @classmethod
    async def connect(cls, address: str | Address | None, client_name: str, token: str | None = None,
                      on_status: StatusCallback | None = None, timeout: float = 10.0,
                      totals: bool = False, silence: float = SILENCE) -> EngineClient:  # fmt: skip
        """Connects and says hello (None: the default socket). EngineFailure "unreachable" if nothing
        answers, or the engine's refusal ("version", "auth"). `totals`: ask for the service's totals in
        status (every client's work together; granted to the service's own user on a Unix socket)."""
        where = address if isinstance(address, Address) else parse_address(address)
        try:
            reader, writer = await asyncio.wait_for(_open(where), timeout)
        except (OSError, TimeoutError) as err:
            raise EngineFailure("unreachable", f"nothing answers on {where}: {err or 'timed out'}") from None
        try:
            wire.write(writer, wire.Hello(wire.VERSION, client_name, token, totals))
            answer = await asyncio.wait_for(wire.read(reader), timeout)
        except (OSError, TimeoutError, wire.WireError, asyncio.IncompleteReadError) as err:
            writer.close()
            raise EngineFailure("unreachable", f"{where} did not answer hello: {err or 'timed out'}") from None
        if isinstance(answer, wire.Welcome):
            return cls(reader, writer, answer, on_status, silence)
        writer.close()
        if isinstance(answer, wire.Failed):
            raise EngineFailure(answer.kind, answer.message)
        raise EngineFailure("unreachable", f"{where} answered hello with {answer.type if answer else 'nothing'}")

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def gone(self) -> EngineFailure | None:
        """Why the connection ended, or None while it lives."""
        return self._gone

    def next_id(self) -> int:
        return next(self._ids)

    # --- requests -------------------------------------------------------------------------------
    async def request(self, request: wire.Infill | wire.Rewrite, on_draft: DraftCallback | None = None) -> wire.Done:
        """The engine's `done` for the request; `on_draft(step, text)` per draft if `request.drafts`.
        Cancelling the awaiting task sends a cancel."""
        return await self._request(request, on_draft)

    def cancel(self, request_id: int) -> None:
        """Asks the engine to stop a request: its awaiter then gets EngineFailure "cancelled" (or its
        `done`, if it finished first). An id not in flight is ignored."""
        if request_id in self._pending:
            self._send_now(wire.Cancel(request_id))

    async def status(self) -> wire.Status:
        """The engine's status now (the next status frame it sends)."""
        self._check_alive()
        future: asyncio.Future[wire.Status] = asyncio.get_running_loop().create_future()
        self._status_waiters.append(future)
        try:
            await self._send(wire.Status())
            return await future
        finally:
            with contextlib.suppress(ValueError):
                self._status_waiters.remove(future)

    async def close(self, linger: float = 1.0) -> None:
        """Ends the connection: requests still pending fail with "engine_gone"; the engine cancels them.
        With none pending, the close is orderly: the sending side shut first, then what the engine still
        sends read until it closes (`linger` seconds at most). A Unix socket closed with frames unread
        (a status push that crossed the close) resets its peer, and the engine logged `dropped:
        Connection lost` for every `engine status`."""
        self._watching.cancel()
        if not self._pending and self._gone is None and self._writer.can_write_eof():
            try:
                self._writer.write_eof()
                await asyncio.wait_for(asyncio.shield(self._reading), linger)
            except (OSError, RuntimeError, TimeoutError):
                pass  # gone already, or slow to close: closed as below
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        if self._gone is None:  # the reader was cancelled before it ever ran: its `finally` did not
            self._end("this client closed the connection")
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def wait_closed(self) -> EngineFailure:
        """Waits until the connection ends; why it did."""
        await asyncio.shield(self._reading)
        assert self._gone is not None
        return self._gone

    async def _request(self, request: wire.Infill | wire.Rewrite, on_draft: DraftCallback | None) -> wire.Done:
        self._check_alive()
        if request.id in self._pending:
            raise ValueError(f"request {request.id} is already in flight")
        future: asyncio.Future[wire.Done] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = (future, on_draft)
        try:
            await self._send(request)
            return await future
        except asyncio.CancelledError:
            self.cancel(request.id)
            raise
        finally:
            self._pending.pop(request.id, None)

    def _check_alive(self) -> None:
        if self._gone is not None:
            raise EngineFailure(self._gone.kind, self._gone.message)

    async def _send(self, message: wire.Message) -> None:
        try:
            frame = wire.encode(message)
        except wire.WireError as err:
            raise EngineFailure("bad_request", str(err)) from None
        self._check_alive()
        try:
            self._writer.write(frame)
            await self._writer.drain()
        except OSError as err:
            raise EngineFailure("engine_gone", f"the connection to the engine broke: {err}") from None

    def _send_now(self, message: wire.Message) -> None:
        if self._gone is None and not self._writer.is_closing():
            wire.write(self._writer, message)

    # --- what the engine sends ------------------------------------------------------------------
    async def _read_loop(self) -> None:
        reason = "this client closed the connection"
        try:
            while (message := await wire.read(self._reader)) is not None:
                self._heard = time.monotonic()
                if not self.responding:
                    self._set_responding(True)
                self._dispatch(message)
            reason = "the engine closed the connection"
        except (wire.WireError, asyncio.IncompleteReadError, OSError) as err:
            reason = f"the connection to the engine broke: {err}"
        finally:
            self._end(reason + (f" ({self._last_word})" if self._last_word else ""))

    async def _watch(self) -> None:
        """Pings a quiet engine, and says when it stays silent past `silence` (see the class)."""
        pinged = 0.0
        while self._gone is None:
            await asyncio.sleep(self.silence / 4)
            quiet = time.monotonic() - self._heard
            if quiet > self.silence / 2 and time.monotonic() - pinged > self.silence / 2:
                pinged = time.monotonic()
                self._send_now(wire.Status())  # a live engine answers it from its loop, busy model or not
            if quiet > self.silence and self.responding:
                self._set_responding(False)

    def _set_responding(self, responding: bool) -> None:
        self.responding = responding
        if self.on_responding is not None:
            _callback(self.on_responding, responding)

    def _dispatch(self, message: wire.Message) -> None:
        if isinstance(message, wire.Draft):
            _, on_draft = self._pending.get(message.id, (None, None))
            if on_draft is not None:
                _callback(on_draft, message.step, message.text)
        elif isinstance(message, (wire.Done, wire.Failed)) and message.id is not None:
            future, _ = self._pending.get(message.id, (None, None))
            if future is not None and not future.done():
                if isinstance(message, wire.Done):
                    future.set_result(message)
                else:
                    future.set_exception(EngineFailure(message.kind, message.message))
        elif isinstance(message, wire.Failed):  # about the connection: the engine closes it next
            self._last_word = f"{message.kind}: {message.message}"
        elif isinstance(message, wire.Status):
            for future in self._status_waiters:
                if not future.done():
                    future.set_result(message)
            if self.on_status is not None:
                _callback(self.on_status, message)
        else:
            raise wire.WireError(f"an engine does not send {message.type}")

    def _end(self, reason: str) -> None:
        """Everything still waiting fails with "engine_gone", at once."""
        if self._gone is not None:
            return
        self._gone = EngineFailure("engine_gone", reason)
        self._watching.cancel()
        waiting = [future for future, _ in self._pending.values()] + self._status_waiters
        for future in waiting:
            if not future.done():
                future.set_exception(EngineFailure("engine_gone", reason))
        self._writer.close()


async def _open(where: Address) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if where.kind == "tcp":
        return await asyncio.open_connection(where.host, where.port)
    # A socket is ours only if we made it: in a shared folder, another user's could be waiting for our code.
    if os.stat(where.path).st_uid != os.getuid():
        raise PermissionError(f"{where.path} belongs to another user")
    return await asyncio.open_unix_connection(where.path)


def _callback(fn: Callable, *args: Any) -> None:
    """A callback's failure is logged; it must not end the connection that every request shares."""
    try:
        fn(*args)
    except Exception:
        logger.exception("an engine client callback failed")
