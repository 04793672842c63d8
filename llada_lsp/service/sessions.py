"""The engine service's sessions: the connections of many LSP fronts, each from hello to close, and
their requests (infill, rewrite, cancel, status in the llada_lsp.wire protocol; drafts, done, failed
back) over one Backend.

Knows nothing of the LSP, documents or positions: text windows in, texts out. Model work runs on the
backend (the model thread, or SGLang), never on the loop; a connection's requests are keyed to it, so
fronts never supersede or cancel each other, and a bad frame closes only the connection that sent it.

Supersede: a newer request with the same key on the same connection cancels the older one, which
answers `failed{kind: "cancelled"}` at once (as does a `cancel`); its job stops within one step.

No connection may stall, bloat or read the others: before hello only a small frame is read, and only
MAX_UNGREETED connections may be waiting to say it; `busy` is decided here, before any work, with a fair
share per connection; a connection whose answers are not read is not read either (a write high-water
mark); error texts and log lines are bounded and printable; each connection is told its own figures
(the service's totals only to its own user, over the Unix socket, on request); status is pushed on
every change, at most every STATUS_INTERVAL; after a half-close, what was received is still answered.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from .. import wire
from ..backends.base import Backend
from ..backends.sglang_config import BackendFailure
from ..completion import next_edit, snippets
from ..completion.generation import ModelSpec
from ..completion.jobs import Infill, done_of, from_wire
from ..completion.pipeline import InstructionUnsupported, make_plan
from ..completion.prompt import SelectionTooLong
from ..errors import Busy, TooLong
from ..runtime.worker import ModelUnavailable, Ticket
from .peers import TEXT_MAX, linger, peer_gone, printable, same_user

logger = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0  # seconds a new connection has to say hello before it is closed
HELLO_MAX = 4096  # bytes a frame may have before the hello is taken (and the token checked)
MAX_UNGREETED = 128  # connections that may be waiting to say hello; more are closed at once
WRITE_HIGH = 2**18  # unsent bytes past which a connection is no longer read until its peer reads
DRAFT_BACKLOG = 2**20  # unsent bytes past which a connection's drafts are dropped (a front that is not reading)
FRAMES_PER_TURN = 32  # frames one connection may have handled before the loop serves the others
STATUS_INTERVAL = 0.25  # seconds between two status pushes to one connection, at least
TOTALS = ("running", "queued", "steps", "batch_mean", "batch_max", "cache_blocks_used", "cache_blocks_free",
          "cache_hit_rate")  # the backend's figures: every client's work together  # fmt: skip
FAILURES = ((ModelUnavailable, "no_model"), (SelectionTooLong, "too_long"), (InstructionUnsupported, "unsupported"),
            (next_edit.NotSupported, "unsupported"),
            (TooLong, "too_long"), (Busy, "busy"))  # fmt: skip


class Rejected(Exception):
    """Ends a connection: sent as `failed{id: None, kind, message}` before it closes."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(eq=False)
class Connection:
    """One connection that said hello: who it is, and its requests in flight (wire id -> ticket)."""

    id: int
    client: str
    writer: asyncio.StreamWriter
    totals: bool = False  # told the service's totals (its own user, who asked for them)
    pending: dict[int, Ticket] = field(default_factory=dict)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set while nothing is pending
    pushed: tuple | None = None  # the last status pushed, as its key
    pushed_at: float = float("-inf")
    push_later: asyncio.TimerHandle | None = None
    asked_at: float = float("-inf")  # when a status ask was last answered
    ask_later: asyncio.TimerHandle | None = None
    throttled: int = 0  # frames read while a status ask waited for its interval

    @property
    def name(self) -> str:
        return f"{self.client}#{self.id}"

    def send(self, message: wire.Message) -> None:
        if not self.writer.is_closing():
            wire.write(self.writer, message)

    def backlogged(self) -> bool:
        return self.writer.transport.get_write_buffer_size() > DRAFT_BACKLOG

    def track(self) -> None:
        """`settled` follows `pending` (call after every change of it)."""
        self.settled.clear() if self.pending else self.settled.set()


class EngineService:
    """The connections and their requests over one Backend. `handle` is the stream server's
    callback; all of this runs on the loop, the jobs on the backend. Knows nothing of sockets or files
    (see listener.py)."""

    def __init__(self, worker: Backend, modes: Sequence[str], token: str | None = None):
        """`modes`: the decoding presets requests may name; `token`: the secret every hello must carry
        (None: no check, for a socket only its owner can open)."""
        self.worker, self.modes, self.token = worker, tuple(modes), token
        self.sessions: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self._load_report: tuple[str, int] | None = None
        self._connections: set[asyncio.Task] = set()
        self._ungreeted = 0
        self.capacity = ModelSpec(None).max_batch + ModelSpec(None).max_queue  # requests in flight, all together

    # --- the model and its status ---------------------------------------------------------------
    def load(self, spec: ModelSpec) -> Ticket:
        """Loads the model on the worker; every connection is told how it goes (status frames)."""
        self.capacity = spec.max_batch + spec.max_queue
        ticket = self.worker.load(spec, self._on_load_report)
        ticket.when_done(lambda _: self._on_loaded(spec))
        return ticket

    def _on_load_report(self, message: str, percent: int) -> None:
        self._load_report = (message, percent)
        self.push_status()

    def _on_loaded(self, spec: ModelSpec) -> None:
        if self.worker.state != "loading":  # a remote backend loaded may still wait for its server: its report stays
            self._load_report = None
        if self.worker.error:
            logger.error("cannot load the model %s: %s", spec.name, self.worker.error)
        self.push_status()

    def status(self, session: Connection | None = None) -> wire.Status:
        """The status as `session` may see it: its own requests in flight as `queue`, and the backend's
        figures (every client's work together: they would tell one client about another's text, as a
        prefix-cache hit does) only for a session granted the totals (None: the totals)."""
        worker = self.worker
        message, progress = self._load_report if worker.state == "loading" and self._load_report else (None, None)
        totals = session is None or session.totals
        queue = sum(len(s.pending) for s in self.sessions.values()) if totals else len(session.pending)
        figures = worker.stats() if totals else {}
        loaded = worker.model if worker.state == "ready" and worker.model is not None else None
        return wire.Status(worker.state, worker.spec.name, progress, message, worker.error, len(self.sessions), queue,
                           **{name: figures[name] for name in TOTALS if name in figures},
                           **(loaded.family_fields() if loaded is not None else {}))  # fmt: skip

    def push_status(self) -> None:
        """Tells every connection whose status changed (state, model, load progress, error, clients, its
        queue), at most once per STATUS_INTERVAL: a change within it is pushed at its end."""
        for session in list(self.sessions.values()):
            self._push(session)

    def _push(self, session: Connection) -> None:
        if self.sessions.get(session.id) is not session or session.push_later is not None:
            return
        status = self.status(session)
        key = (status.state, status.model, status.progress, status.message, status.error, status.clients, status.queue)
        if key == session.pushed:
            return
        wait = session.pushed_at + STATUS_INTERVAL - time.monotonic()
        if wait > 0 or session.backlogged():  # a peer that is not reading gets the latest once it reads

            def later() -> None:
                session.push_later = None
                self._push(session)

            session.push_later = asyncio.get_running_loop().call_later(max(wait, STATUS_INTERVAL), later)
            return
        session.pushed, session.pushed_at = key, time.monotonic()
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
        # Past the mark, drain() waits: this connection is not read while its peer does not read.
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH)
        try:
            session = await self._greet(reader, writer)
            name = session.name
            handled = 0
            while (message := await wire.read(reader)) is not None:
                self._dispatch(session, message)
                await writer.drain()
                if session.ask_later is not None:  # asking status too often: FRAMES_PER_TURN frames per interval
                    session.throttled += 1
                    if session.throttled % FRAMES_PER_TURN == 0:
                        await asyncio.sleep(STATUS_INTERVAL)
                handled += 1
                if handled % FRAMES_PER_TURN == 0:  # frames already buffered are read without a pause
                    await asyncio.sleep(0)
            if session.pending:  # a half-close: what was sent before it is still answered
                answered = await self._answer_after_half_close(session, writer)
                if answered:
                    reason = f"closed its sending side; {answered} requests answered after it"
        except (Rejected, wire.WireError) as err:
            kind = err.kind if isinstance(err, Rejected) else "bad_request"
            text = printable(str(err))
            reason, level = f"refused ({kind}): {text}", logging.WARNING
            if not writer.is_closing():
                wire.write(writer, wire.Failed(None, kind, text))
                await linger(reader)
        except TimeoutError:
            reason = f"no hello within {HELLO_TIMEOUT:.0f} s"
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            reason = f"dropped: {printable(str(err)) or type(err).__name__}"
        except asyncio.CancelledError:
            reason = "the engine is stopping"
        finally:
            self._connections.discard(task)
            cancelled = self._drop(session) if session is not None else 0
            writer.close()
            more = f"; {cancelled} requests cancelled" if cancelled else ""
            logger.log(level, "%s: %s%s", name, reason, more)

    async def _answer_after_half_close(self, session: Connection, writer: asyncio.StreamWriter) -> int:
        """Waits for the requests in flight to be answered, unless the peer is gone altogether (its
        answers would go nowhere: they are cancelled, as for any closed connection); how many were."""
        waiting = len(session.pending)
        if not peer_gone(writer):  # over TCP, a peer that closed both ways answers this with a reset
            session.send(self.status(session))
        while session.pending and not writer.is_closing() and not peer_gone(writer):
            try:
                await asyncio.wait_for(session.settled.wait(), 0.2)
            except TimeoutError:
                pass
        return waiting - len(session.pending)  # the answers are flushed as the writer closes

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Connection:
        if self._ungreeted >= MAX_UNGREETED:
            raise Rejected("busy", f"{MAX_UNGREETED} connections are already waiting to say hello")
        self._ungreeted += 1
        try:  # only a small frame before the token is checked: a stranger cannot make the service hold much
            hello = await asyncio.wait_for(wire.read(reader, HELLO_MAX), HELLO_TIMEOUT)
        finally:
            self._ungreeted -= 1
        if hello is None:
            raise ConnectionResetError("closed before hello")
        if not isinstance(hello, wire.Hello):
            raise Rejected("bad_request", f"the first frame must be hello, not {hello.type}")
        # The token first, in constant time: a peer without it learns nothing, not even the version.
        if self.token is not None and not hmac.compare_digest((hello.token or "").encode(), self.token.encode()):
            raise Rejected("auth", "wrong or missing token")
        if hello.version != wire.VERSION:
            raise Rejected("version", f"this engine speaks protocol version {wire.VERSION}, the client {hello.version}")
        totals = bool(hello.totals) and same_user(writer)
        session = Connection(next(self._ids), printable(hello.client, 80) or "client", writer, totals)
        session.track()
        self.sessions[session.id] = session
        worker = self.worker
        session.send(wire.Welcome(wire.VERSION, worker.spec.name, worker.state, list(self.modes), self.limits(),
                                  None if self.revises else False))  # fmt: skip
        logger.info("%s: connected", session.name)
        self.push_status()  # the others' client count
        return session

    def _dispatch(self, session: Connection, message: wire.Message) -> None:
        if isinstance(message, (wire.Infill, wire.Rewrite, wire.NextEdit)):
            self._submit(session, message)
        elif isinstance(message, wire.Cancel):
            ticket = session.pending.get(message.id)
            if ticket is not None:
                ticket.cancel()  # answered by _answer, on the loop's next turn
        elif isinstance(message, wire.Status):
            self._answer_status(session)
        else:
            raise wire.WireError(f"a client does not send {message.type}")

    def _answer_status(self, session: Connection) -> None:
        """A status ask; asks faster than one per STATUS_INTERVAL are answered once, at its end: a flood
        of asks costs the loop (shared with every client) one status per interval, not one per frame."""
        wait = session.asked_at + STATUS_INTERVAL - time.monotonic()
        if wait <= 0:
            session.asked_at = time.monotonic()
            session.send(self.status(session))
        elif session.ask_later is None:

            def later() -> None:
                session.ask_later = None
                self._answer_status(session)

            session.ask_later = asyncio.get_running_loop().call_later(wait, later)

    def _drop(self, session: Connection) -> int:
        """Forgets a closed connection and cancels its requests; how many there were."""
        self.sessions.pop(session.id, None)
        tickets = list(session.pending.values())
        session.pending.clear()  # before the cancels: their answers have nowhere to go
        session.track()
        for timer in (session.push_later, session.ask_later):
            if timer is not None:
                timer.cancel()
        for ticket in tickets:
            ticket.cancel()
        self.push_status()  # the others' client count
        return len(tickets)

    async def close(self) -> None:
        """Closes every connection (their requests are cancelled)."""
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- requests -------------------------------------------------------------------------------
    def _submit(self, session: Connection, request: wire.Infill | wire.Rewrite | wire.NextEdit) -> None:
        problem = self._problem(session, request)
        if problem is not None:
            session.send(wire.Failed(request.id, "bad_request", problem))
            return
        busy = self._busy(session)
        if busy is not None:  # decided before any work: the burst past the queue costs nothing
            session.send(wire.Failed(request.id, "busy", busy))
            return

        request_id = request.id  # the callbacks below name the id only, never the request's text

        def send_draft(step: int, text: str) -> None:
            if not session.backlogged():  # a later draft or the done says it all anyway
                session.send(wire.Draft(request_id, step, text))

        ours = isinstance(request, wire.NextEdit)
        job, on_draft = (next_edit.from_wire if ours else from_wire)(request), send_draft if request.drafts else None
        if isinstance(job, Infill) and job.draft is not None and not self.revises:
            job = replace(job, draft=None, typed=0)  # the backend starts from masks: a cold start, said in welcome
        label = f"{request.type} {session.name}:{request.id}"
        if request.context:  # the snippets' paths, never their text
            logger.debug("%s%s: context %s", label, " (warm)" if getattr(request, "warm", None) else "",
                         printable(", ".join(entry["path"] for entry in request.context)))  # fmt: skip
        planner = next_edit.NextEditPlan if ours else make_plan
        plan = lambda model, ticket: planner(model, job, ticket)  # noqa: E731 - run on the backend
        ticket = self.worker.submit(f"{session.id}:{request.key}", label, plan, on_draft, group=session.id)
        session.pending[request_id] = ticket
        session.track()
        ticket.when_done(lambda _: self._answer(session, request_id, ticket))  # after its drafts
        self._push(session)

    def _busy(self, session: Connection) -> str | None:
        """Why a new request of `session` is refused, or None. Past `capacity` requests in flight (all
        connections), a connection may still add up to its fair share (capacity / connections with
        requests in flight): a burst on one connection never makes another's single request busy."""
        in_flight = sum(len(s.pending) for s in self.sessions.values())
        if in_flight < self.capacity:
            return None
        asking = sum(1 for s in self.sessions.values() if s.pending or s is session)
        share = max(1, self.capacity // asking)
        if len(session.pending) < share:
            return None
        return (f"the engine is busy: {in_flight} requests are in flight, {len(session.pending)} of them this "
                f"connection's (its share is {share})")  # fmt: skip

    def _problem(self, session: Connection, request: wire.Infill | wire.Rewrite | wire.NextEdit) -> str | None:
        if request.id in session.pending:
            return f"request {request.id} is already in flight"
        if request.mode not in self.modes:
            return f"unknown mode {request.mode!r}; this engine has {', '.join(self.modes)}"
        if request.context_tokens < 1 or (isinstance(request, wire.Infill) and request.max_tokens < 1):
            return "max_tokens and context_tokens must be positive"
        if problem := snippets.wire_problem(request.context):
            return problem
        return None

    def _answer(self, session: Connection, request_id: int, ticket: Ticket) -> None:
        if session.pending.get(request_id) is not ticket:  # the connection closed: nobody to tell
            return
        del session.pending[request_id]
        session.track()
        session.send(_answer_of(request_id, ticket.future))
        self._push(session)


def _answer_of(request_id: int, future: Future) -> wire.Message:
    if future.cancelled():
        return wire.Failed(request_id, "cancelled", "cancelled, or superseded by a newer request with the same key")
    error = future.exception()
    if error is None:
        return done_of(request_id, future.result())
    kind = (
        error.kind
        if isinstance(error, BackendFailure)
        else next((kind for cls, kind in FAILURES if isinstance(error, cls)), "internal")
    )
    return wire.Failed(request_id, kind, printable(str(error), 4 * TEXT_MAX) or type(error).__name__)
