"""The model thread: one thread owns the model; jobs queue up, a new job supersedes the pending or
running one with the same key, cancel flags are checked between denoising steps, and drafts, progress
and results are handed back to the event loop thread-safely.

A job is a callable run on the thread. One that returns a completion Plan joins the loaded model's
batch (backends/native.NativeBatch): every running plan's request advances in the same batched
forward, and the thread keeps taking new jobs between steps. Any other return value is the job's result. A model load waits until
no sequence runs.

Fair and interleaved: jobs wait here, one queue per `group` (a connection of the engine service),
and are started round-robin across the groups, only while the batch has a free row, a group past its
share of the rows (the batch's rows / the groups with work) waiting while another has work, and for
at most START_BUDGET seconds between two steps: one group's burst neither starves another's single
request, nor fills the batch it shares, nor holds up the running ones' next step with its prompt
building. Knows nothing of the LSP or of
what a plan computes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from ..completion.generation import LoadedModel, ModelSpec
from ..completion.pipeline import Plan
from ..errors import BadLogits, CheckpointError, Refused
from .loop import call_on_loop
from .memory import release_freed_memory, settle, unsettle

logger = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """The model is not loaded (it failed to load, or the worker has stopped)."""


# loader(spec, report(message, percent), cancelled()) -> the loaded model
Loader = Callable[[ModelSpec, Callable[[str, int], None], Callable[[], bool]], Any]
START_BUDGET = 0.05  # seconds of job starts (prompt building) between two denoising steps, at most
TRIM_AFTER = 1.0  # idle seconds after work before the freed memory is given back (runtime/memory.py)
_NO_TURN = object()  # _next_group's "no group may start a job now"
LOAD_KEY = "\0load"  # a newer load supersedes a queued one; no request key (a URI, "conn:key") is like it


class Ticket:
    """One queued job: its result future, its cancel flag and its step count (for the log)."""

    def __init__(self, key: str | None, label: str, job: Callable, on_draft: Callable | None, loop,
                 loads: bool = False, group: Any = None):  # fmt: skip
        self.key, self.label, self.job, self.on_draft, self.loop = key, label, job, on_draft, loop
        self.loads = loads  # a model load, run without a model
        self.group = LOAD_KEY if loads else group  # whose turn it is (round-robin between groups)
        self.future: Future = Future()  # never set running, so cancel() always wins until a result is set
        self._cancelled = threading.Event()
        self.steps = 0
        self.steps_at_cancel: int | None = None
        self.started = 0.0  # perf_counter when the model thread took it

    def is_set(self) -> bool:  # the engine's cancel flag protocol
        return self._cancelled.is_set()

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self.steps_at_cancel = self.steps
            self._cancelled.set()
        self.future.cancel()

    def emit(self, step: int, payload: Any = None) -> None:
        """Called on the model thread after each step; a payload other than None goes to the draft
        callback, on the loop."""
        self.steps = step
        if payload is not None and self.on_draft is not None and not self.is_set():
            call_on_loop(self.loop, self._deliver, step, payload)

    def _deliver(self, step: int, payload: Any) -> None:
        if not self.is_set():  # a cancel that arrived meanwhile drops the draft
            self.on_draft(step, payload)

    def when_done(self, fn: Callable[[Future], None]) -> None:
        """`fn(future)` on the loop once the ticket is answered or cancelled (futures complete on the
        model thread); after the drafts the job queued before it returned."""
        self.future.add_done_callback(lambda future: call_on_loop(self.loop, fn, future))

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        # The future sits in a reference cycle (its done callbacks name this ticket), freed only by the
        # cyclic collector: it must not keep the job (a request's whole text) or, through an error's
        # traceback, the frames that held it. Errors are logged before they get here.
        self.job = None
        if error is not None:
            error = error.with_traceback(None)
        try:
            self.future.set_exception(error) if error is not None else self.future.set_result(value)
        except InvalidStateError:  # cancelled meanwhile: nobody waits for it
            pass


class KeyedJobs:
    """Supersede by key, for a worker whose tickets are handed out on the loop: a newer ticket of a key
    cancels the one before it. The worker sets `_latest = {}` (key -> its newest ticket)."""

    _latest: dict[str, Ticket]

    def _supersede(self, ticket: Ticket) -> Ticket:
        if ticket.key is not None:
            previous = self._latest.get(ticket.key)
            if previous is not None:
                previous.cancel()
            self._latest[ticket.key] = ticket
            # _latest is only touched on the loop; the future may complete on the model thread.
            ticket.when_done(lambda _: self._forget(ticket))
        return ticket

    def _forget(self, ticket: Ticket) -> None:
        if self._latest.get(ticket.key) is ticket:
            del self._latest[ticket.key]

    def cancel_key(self, key: str) -> None:
        ticket = self._latest.get(key)
        if ticket is not None:
            ticket.cancel()


class ModelWorker(KeyedJobs):
    """`load()` and `submit()` from the event loop; everything they queue runs on one thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: Callable[[str], None], loader: Loader):
        """`log(line)` runs on the loop after every job. `loader(spec, report, cancelled)` reads a model
        (backends/native.load), stopping when `cancelled()` turns true; the model's `batch` decodes.
        Jobs taken but not started are `held` (per group, in turn order); plans decoding are `live` by sequence id."""
        self.loop, self.log, self.loader = loop, log, loader
        self.model: LoadedModel | None = None
        self.state, self.error, self.spec = "loading", None, ModelSpec(None)
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._latest: dict[str, Ticket] = {}
        self.held: dict[Any, deque[Ticket]] = {}  # group -> its jobs; the first group's turn is next
        self._held_count = 0
        self.live: dict[int, tuple[Ticket, Plan]] = {}
        self._rows: Counter = Counter()  # group -> its live sequences
        self._worked = False  # a job came since the freed memory was last given back
        self._thread = threading.Thread(target=self._serve, name="llada-model", daemon=True)
        self._thread.start()

    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> Ticket:
        """Replaces the model; `report(message, percent)` runs on the loop."""
        self.state, self.error, self.spec = "loading", None, spec

        def job(ticket: Ticket) -> LoadedModel:
            # The ticket's cancel flag reaches the loader: a superseded load, or one the thread is
            # stopped in, ends at its next tensor instead of reading the rest.
            return self.loader(spec, lambda msg, pct: call_on_loop(self.loop, report, msg, pct), ticket.is_set)

        return self._enqueue(Ticket(LOAD_KEY, f"load {spec.name}", job, None, self.loop, loads=True))

    def submit(self, key: str | None, label: str, job: Callable[[LoadedModel, Ticket], Any],
               on_draft: Callable[[int, Any], None] | None = None, group: Any = None) -> Ticket:  # fmt: skip
        """`job(model, ticket)` runs on the model thread: it returns a Plan (decoded with the others
        running, its drafts to `on_draft`), or its result (reporting steps with `ticket.emit`). Jobs
        of different `group`s take turns."""
        return self._enqueue(Ticket(key, label, job, on_draft, self.loop, group=group))

    def cancel_all(self) -> None:
        for ticket in list(self._latest.values()):
            ticket.cancel()

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancels everything, ends the thread and waits for it (a load stops at its next tensor; a step
        that hangs past `timeout` leaves the daemon thread to die with the process); False if it did not
        end in time."""
        if self._thread.is_alive():
            self.cancel_all()
            self._queue.put(None)
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _enqueue(self, ticket: Ticket) -> Ticket:
        self._queue.put(self._supersede(ticket))
        return ticket

    def _serve(self) -> None:
        while True:
            try:  # wait for a job only when nothing else is to be done
                while True:
                    idle = not self.live and not self._held_count
                    # Idle after work: the memory it freed goes back to the system once nothing comes for a while.
                    ticket = self._queue.get(block=idle, timeout=TRIM_AFTER if idle and self._worked else None)
                    if ticket is None:
                        return
                    self.held.setdefault(ticket.group, deque()).append(ticket)
                    self._held_count += 1
                    self._worked = True
            except queue.Empty:
                if not self.live and not self._held_count and self._worked:
                    self._worked = False
                    release_freed_memory()
            self._start_some()
            if self.live:
                self._step()

    def _start_some(self) -> None:
        """Starts held jobs, one per group in turn, while the batch has a free row and (with sequences
        decoding) for at most START_BUDGET seconds: the next step is never held up for long."""
        deadline = time.perf_counter() + START_BUDGET
        while self.held:
            if self.live and time.perf_counter() > deadline:
                return
            group = self._next_group()
            if group is _NO_TURN:
                return
            tickets = self.held[group]
            ticket = tickets[0]
            if not ticket.is_set():
                if ticket.loads and self.live:
                    return  # the running sequences finish on the model they started with
                if not ticket.loads and not self._has_room():
                    return
            tickets.popleft()
            self._held_count -= 1
            del self.held[group]
            if tickets:
                self.held[group] = tickets  # to the back: the next group's turn
            if ticket.is_set():
                continue
            ticket.started = time.perf_counter()
            if ticket.loads:
                self._run_load(ticket)
                self._log_job(ticket)
            else:
                self._start(ticket)

    def _next_group(self):
        """The first group in turn that may start its next job: one under its share of the rows (or
        whose next job is cancelled or a load); _NO_TURN if every group with jobs has its share running
        (a group may be None: the in-process front's jobs have no connection)."""
        rows = getattr(getattr(self.model, "batch", None), "max_rows", None)
        if rows is None:
            return next(iter(self.held))
        busy = set(self.held) | {group for group, n in self._rows.items() if n}
        share = max(1, rows // len(busy))
        for group, tickets in self.held.items():
            if tickets[0].is_set() or tickets[0].loads or self._rows[group] < share:
                return group
        return _NO_TURN

    def _has_room(self) -> bool:
        """Whether a started plan would get a row soon: jobs wait here, in turn order, rather than in the
        batch's own queue, where a burst that came first would be served first."""
        batch = getattr(self.model, "batch", None)
        return batch is None or not hasattr(batch, "has_room") or batch.has_room()

    def _start(self, ticket: Ticket) -> None:
        if self.model is None:
            ticket.resolve(error=ModelUnavailable(self.error or "no model is loaded"))
            return
        try:
            out = ticket.job(self.model, ticket)
            if isinstance(out, Plan):
                self.live[self.model.batch.add(out.request)] = (ticket, out)
                self._rows[ticket.group] += 1
                return
            ticket.resolve(out)
        except Exception as err:
            self._failed(ticket, err)
        self._log_job(ticket)

    def _step(self) -> None:
        """One batched forward of every live plan; drafts to their tickets, ends answered."""
        batch = self.model.batch
        try:
            events = batch.step()
        except Exception as err:  # the forward failed: every sequence in it is answered, the thread goes on
            logger.exception("a batched step failed")
            for seq_id, (ticket, _) in self.live.items():
                batch.abort(seq_id)
                ticket.resolve(error=err)
            batch.drain()
            self.live.clear()
            self._rows.clear()
            return
        for seq_id, draft, result, error in events:
            ticket, plan = self.live[seq_id]
            try:
                if draft is not None:
                    ticket.emit(*plan.on_draft(draft))
                    continue
                self._unlive(seq_id)
                if error is not None:
                    raise error
                ticket.resolve(plan.finish(result))
            except Exception as err:  # a plan's own failure answers its request only
                if self._unlive(seq_id):
                    batch.abort(seq_id)
                self._failed(ticket, err)
            self._log_job(ticket)

    def _unlive(self, seq_id: int) -> bool:
        """Forgets a sequence that ended; whether it was live."""
        entry = self.live.pop(seq_id, None)
        if entry is not None:
            self._rows[entry[0].group] -= 1
        return entry is not None

    def _failed(self, ticket: Ticket, err: Exception) -> None:
        if isinstance(err, Refused):  # expected: the user is told why
            logger.info("%s refused: %s", ticket.label, err)
        elif isinstance(err, BadLogits):  # the model's fault, not the code's: one line says it
            logger.error("%s failed: %s", ticket.label, err)
        else:  # a failed job answers its request; the thread serves the next one
            logger.exception("%s failed", ticket.label, exc_info=err)
        ticket.resolve(error=err)

    def stats(self) -> dict[str, Any]:
        """The backend's counts, jobs held behind a load among the queued (read on the loop: plain numbers)."""
        model = self.model
        if model is None or model.batch is None:
            return {}
        stats = model.batch.stats()
        return stats | {"queued": stats.get("queued", 0) + self._held_count}

    async def aclose(self) -> None:
        """Nothing is owed once `stop` has returned (the Backend protocol)."""

    def _run_load(self, ticket: Ticket) -> None:
        self.model, self.state = None, "loading"  # the old model's memory is freed before the new one is read
        unsettle()
        try:
            model = ticket.job(ticket)
        except Exception as err:  # whatever stops a model from loading is reported, never kills the thread
            if not isinstance(err, CheckpointError):
                logger.exception("loading %s failed", ticket.label)
            message = (str(err).splitlines() or [type(err).__name__])[0]
            if not ticket.is_set():  # a newer load is queued: its outcome is the one to report
                self.state, self.error = "error", message
            ticket.resolve(error=ModelUnavailable(message))
            return
        if not ticket.is_set():
            self.model, self.state, self.error = model, "ready", None
        settle()
        ticket.resolve(model)

    def _log_job(self, ticket: Ticket) -> None:
        """One log line per job; for a cancelled one, how many steps ran after the cancel (at most one)."""
        seconds = time.perf_counter() - ticket.started
        if ticket.loads:
            failed = not ticket.future.cancelled() and ticket.future.exception()
            outcome = "abandoned" if ticket.future.cancelled() else f"failed: {failed}" if failed else "done"
            line = f"{ticket.label}: {outcome} in {seconds * 1000:.0f} ms"
        else:
            line = f"{ticket.label}: {ticket.steps} steps in {seconds * 1000:.1f} ms"
            if ticket.steps_at_cancel is not None:
                line += f", cancelled ({ticket.steps - ticket.steps_at_cancel} steps after the cancel)"
        # Queued behind the answer: the request's task wakes on the loop's next turn, the log after it.
        call_on_loop(self.loop, self.loop.call_soon, self.log, line)
