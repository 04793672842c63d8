"""The engine service's sessions: the connections of many LSP fronts, each from hello to close, and
their requests (infill, rewrite, cancel, status in the llada_lsp.wire protocol; drafts, done, failed
back) over one Backend.

Knows nothing of the LSP, documents or positions: text windows in, texts out. Model work runs on the
backend (the model thread, or SGLang), never on the loop; a connection's requests are keyed to it, so
fronts never supersede or cancel each other, and a bad frame closes only the connection that sent it.

Supersede: a newer request with the same key on the same connection cancels the older one, which
answers `failed{kind: "cancelled"}` at once (as does a `cancel`); its job stops within one step.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Sequence

from .. import wire
from ..backends.base import Backend
from ..backends.sglang_config import BackendFailure
from ..completion.generation import ModelSpec
from ..completion.jobs import Infill, done_of, from_wire
from ..completion.pipeline import InstructionUnsupported, make_plan
from ..completion.prompt import SelectionTooLong
from ..errors import Busy, TooLong
from ..runtime.worker import ModelUnavailable, Ticket

logger = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0  # seconds a new connection has to say hello before it is closed
DRAFT_BACKLOG = 2**20  # unsent bytes past which a connection's drafts are dropped (a front that is not reading)
FAILURES = ((ModelUnavailable, "no_model"), (SelectionTooLong, "too_long"), (InstructionUnsupported, "unsupported"),
            (TooLong, "too_long"), (Busy, "busy"))  # fmt: skip


class Rejected(Exception):
    """Ends a connection: sent as `failed{id: None, kind, message}` before it closes."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(eq=False)
class Session:
    """One connection that said hello: who it is, and its requests in flight (wire id -> ticket)."""

    id: int
    client: str
    writer: asyncio.StreamWriter
    pending: dict[int, Ticket] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.client}#{self.id}"

    def send(self, message: wire.Message) -> None:
        if not self.writer.is_closing():
            wire.write(self.writer, message)

    def backlogged(self) -> bool:
        return self.writer.transport.get_write_buffer_size() > DRAFT_BACKLOG


class EngineService:
    """The connections and their requests over one Backend. `handle` is the stream server's
    callback; all of this runs on the loop, the jobs on the backend. Knows nothing of sockets or files
    (see listener.py)."""

    def __init__(self, worker: Backend, modes: Sequence[str], token: str | None = None):
        """`modes`: the decoding presets requests may name; `token`: the secret every hello must carry
        (None: no check, for a socket only its owner can open)."""
        self.worker, self.modes, self.token = worker, tuple(modes), token
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._load_report: tuple[str, int] | None = None
        self._connections: set[asyncio.Task] = set()

    # --- the model and its status ---------------------------------------------------------------
    def load(self, spec: ModelSpec) -> Ticket:
        """Loads the model on the worker; every connection is told how it goes (status frames)."""
        ticket = self.worker.load(spec, self._on_load_report)
        ticket.when_done(lambda _: self._on_loaded(spec))
        return ticket

    def _on_load_report(self, message: str, percent: int) -> None:
        self._load_report = (message, percent)
        self.push_status()

    def _on_loaded(self, spec: ModelSpec) -> None:
        self._load_report = None
        if self.worker.error:
            logger.error("cannot load the model %s: %s", spec.name, self.worker.error)
        self.push_status()

    def status(self) -> wire.Status:
        worker = self.worker
        message, progress = self._load_report if worker.state == "loading" and self._load_report else (None, None)
        queue = sum(len(s.pending) for s in self.sessions.values())
        return wire.Status(worker.state, worker.spec.name, progress, message, worker.error, len(self.sessions), queue,
                           **worker.stats())  # fmt: skip

    def push_status(self) -> None:
        status = self.status()
        for session in self.sessions.values():
            session.send(status)

    @property
    def revises(self) -> bool:
        return getattr(self.worker, "revises", True)

    def limits(self) -> dict[str, int]:
        limits = {"max_frame": wire.MAX_FRAME}
        model = self.worker.model
        if model is not None:
            limits |= {"max_positions": model.max_positions, "block_size": model.block_size}
        return limits

    # --- connections ----------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from hello to close. Whatever goes wrong here closes this one only."""
        task = asyncio.current_task()
        self._connections.add(task)
        session, name, reason, level = None, "a connection", "closed by the client", logging.INFO
        try:
            session = await self._greet(reader, writer)
            name = session.name
            while (message := await wire.read(reader)) is not None:
                self._dispatch(session, message)
        except (Rejected, wire.WireError) as err:
            kind = err.kind if isinstance(err, Rejected) else "bad_request"
            reason, level = f"refused ({kind}): {err}", logging.WARNING
            if not writer.is_closing():
                wire.write(writer, wire.Failed(None, kind, str(err)))
        except TimeoutError:
            reason = f"no hello within {HELLO_TIMEOUT:.0f} s"
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            reason = f"dropped: {err or type(err).__name__}"
        except asyncio.CancelledError:
            reason = "the engine is stopping"
        finally:
            self._connections.discard(task)
            cancelled = self._drop(session) if session is not None else 0
            writer.close()
            more = f"; {cancelled} requests cancelled" if cancelled else ""
            logger.log(level, "%s: %s%s", name, reason, more)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Session:
        hello = await asyncio.wait_for(wire.read(reader), HELLO_TIMEOUT)
        if hello is None:
            raise ConnectionResetError("closed before hello")
        if not isinstance(hello, wire.Hello):
            raise Rejected("bad_request", f"the first frame must be hello, not {hello.type}")
        # The token first, in constant time: a peer without it learns nothing, not even the version.
        if self.token is not None and not hmac.compare_digest((hello.token or "").encode(), self.token.encode()):
            raise Rejected("auth", "wrong or missing token")
        if hello.version != wire.VERSION:
            raise Rejected("version", f"this engine speaks protocol version {wire.VERSION}, the client {hello.version}")
        session = Session(next(self._ids), hello.client[:80] or "client", writer)
        self.sessions[session.id] = session
        worker = self.worker
        session.send(wire.Welcome(wire.VERSION, worker.spec.name, worker.state, list(self.modes), self.limits(),
                                  None if self.revises else False))  # fmt: skip
        logger.info("%s: connected", session.name)
        return session

    def _dispatch(self, session: Session, message: wire.Message) -> None:
        if isinstance(message, (wire.Infill, wire.Rewrite)):
            self._submit(session, message)
        elif isinstance(message, wire.Cancel):
            ticket = session.pending.get(message.id)
            if ticket is not None:
                ticket.cancel()  # answered by _answer, on the loop's next turn
        elif isinstance(message, wire.Status):
            session.send(self.status())
        else:
            raise wire.WireError(f"a client does not send {message.type}")

    def _drop(self, session: Session) -> int:
        """Forgets a closed connection and cancels its requests; how many there were."""
        self.sessions.pop(session.id, None)
        tickets = list(session.pending.values())
        session.pending.clear()  # before the cancels: their answers have nowhere to go
        for ticket in tickets:
            ticket.cancel()
        return len(tickets)

    async def close(self) -> None:
        """Closes every connection (their requests are cancelled)."""
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- requests -------------------------------------------------------------------------------
    def _submit(self, session: Session, request: wire.Infill | wire.Rewrite) -> None:
        problem = self._problem(session, request)
        if problem is not None:
            session.send(wire.Failed(request.id, "bad_request", problem))
            return
        def send_draft(step: int, text: str) -> None:
            if not session.backlogged():  # a later draft or the done says it all anyway
                session.send(wire.Draft(request.id, step, text))

        job, on_draft = from_wire(request), send_draft if request.drafts else None
        if isinstance(job, Infill) and job.draft is not None and not self.revises:
            job = replace(job, draft=None, typed=0)  # the backend starts from masks: a cold start, said in welcome
        label = f"{request.type} {session.name}:{request.id}"
        plan = lambda model, ticket: make_plan(model, job, ticket)  # noqa: E731 - run on the backend
        ticket = self.worker.submit(f"{session.id}:{request.key}", label, plan, on_draft)
        session.pending[request.id] = ticket
        ticket.when_done(lambda _: self._answer(session, request.id, ticket))  # after its drafts

    def _problem(self, session: Session, request: wire.Infill | wire.Rewrite) -> str | None:
        if request.id in session.pending:
            return f"request {request.id} is already in flight"
        if request.mode not in self.modes:
            return f"unknown mode {request.mode!r}; this engine has {', '.join(self.modes)}"
        if request.context_tokens < 1 or (isinstance(request, wire.Infill) and request.max_tokens < 1):
            return "max_tokens and context_tokens must be positive"
        return None

    def _answer(self, session: Session, request_id: int, ticket: Ticket) -> None:
        if session.pending.get(request_id) is not ticket:  # the connection closed: nobody to tell
            return
        del session.pending[request_id]
        session.send(_answer_of(request_id, ticket.future))


def _answer_of(request_id: int, future: Future) -> wire.Message:
    if future.cancelled():
        return wire.Failed(request_id, "cancelled", "cancelled, or superseded by a newer request with the same key")
    error = future.exception()
    if error is None:
        return done_of(request_id, future.result())
    kind = error.kind if isinstance(error, BackendFailure) else next(
        (kind for cls, kind in FAILURES if isinstance(error, cls)), "internal")
    return wire.Failed(request_id, kind, str(error) or type(error).__name__)
