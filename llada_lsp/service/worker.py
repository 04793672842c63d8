"""The model thread: one thread owns the model; jobs queue up, a new job supersedes the pending or
running one with the same key, cancel flags are checked between denoising steps, and drafts, progress
and results are handed back to the event loop thread-safely.

Knows nothing of the LSP or of what a job computes: jobs are callables, results are their values.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from ..completion.pipeline import LoadedModel, ModelSpec, load
from ..errors import CheckpointError, Refused
from .loop import call_on_loop

logger = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """The model is not loaded (it failed to load, or the worker has stopped)."""


LOAD_KEY = "\0load"  # a newer load supersedes a queued one; no request key (a URI, "conn:key") is like it


class Ticket:
    """One queued job: its result future, its cancel flag and its step count (for the log)."""

    def __init__(self, key: str | None, label: str, job: Callable, on_draft: Callable | None, loop,
                 step_delay: float = 0.0, loads: bool = False):  # fmt: skip
        self.key, self.label, self.job, self.on_draft, self.loop = key, label, job, on_draft, loop
        self.step_delay, self.loads = step_delay, loads  # loads: a model load, run without a model
        self.future: Future = Future()  # never set running, so cancel() always wins until a result is set
        self._cancelled = threading.Event()
        self.steps = 0
        self.steps_at_cancel: int | None = None

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
        if self.step_delay:
            time.sleep(self.step_delay)

    def _deliver(self, step: int, payload: Any) -> None:
        if not self.is_set():  # a cancel that arrived meanwhile drops the draft
            self.on_draft(step, payload)

    def when_done(self, fn: Callable[[Future], None]) -> None:
        """`fn(future)` on the loop once the ticket is answered or cancelled (futures complete on the
        model thread); after the drafts the job queued before it returned."""
        self.future.add_done_callback(lambda future: call_on_loop(self.loop, fn, future))

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        try:
            self.future.set_exception(error) if error is not None else self.future.set_result(value)
        except InvalidStateError:  # cancelled meanwhile: nobody waits for it
            pass


def step_delay_from_env() -> float:
    """The test hook LLADA_LSP_TEST_STEP_DELAY_MS (see ModelWorker), in seconds; 0 when unset."""
    return float(os.environ.get("LLADA_LSP_TEST_STEP_DELAY_MS", "0") or 0) / 1000


class ModelWorker:
    """`load()` and `submit()` from the event loop; everything they queue runs on one thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: Callable[[str], None], step_delay: float = 0.0,
                 loader: Callable[[ModelSpec, Callable[[str, int], None]], Any] = load):  # fmt: skip
        """`log(line)` runs on the loop after every job. `step_delay`: seconds slept after every
        denoising step, a test hook that makes a tiny model as slow as a big one
        (LLADA_LSP_TEST_STEP_DELAY_MS); 0 in normal use. `loader(spec, report)` reads a model."""
        self.loop, self.log, self.step_delay, self.loader = loop, log, step_delay, loader
        self.model: LoadedModel | None = None
        self.state, self.error, self.spec = "loading", None, ModelSpec(None)
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._latest: dict[str, Ticket] = {}
        self._thread = threading.Thread(target=self._serve, name="llada-model", daemon=True)
        self._thread.start()

    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> Ticket:
        """Replaces the model; `report(message, percent)` runs on the loop."""
        self.state, self.error, self.spec = "loading", None, spec

        def job(ticket: Ticket) -> LoadedModel:
            return self.loader(spec, lambda msg, pct: call_on_loop(self.loop, report, msg, pct))

        return self._enqueue(Ticket(LOAD_KEY, f"load {spec.name}", job, None, self.loop, loads=True))

    def submit(self, key: str | None, label: str, job: Callable[[LoadedModel, Ticket], Any],
               on_draft: Callable[[int, Any], None] | None = None) -> Ticket:  # fmt: skip
        """`job(model, ticket)` runs on the model thread; it reports steps with `ticket.emit`."""
        return self._enqueue(Ticket(key, label, job, on_draft, self.loop, self.step_delay))

    def cancel_key(self, key: str) -> None:
        ticket = self._latest.get(key)
        if ticket is not None:
            ticket.cancel()

    def cancel_all(self) -> None:
        for ticket in list(self._latest.values()):
            ticket.cancel()

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancels everything, ends the thread and waits for it (a load cannot be interrupted: after
        `timeout` the daemon thread is left to die with the process); False if it did not end in time."""
        if self._thread.is_alive():
            self.cancel_all()
            self._queue.put(None)
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _enqueue(self, ticket: Ticket) -> Ticket:
        if ticket.key is not None:
            previous = self._latest.get(ticket.key)
            if previous is not None:
                previous.cancel()
            self._latest[ticket.key] = ticket
            # _latest is only touched on the loop; the future may complete on the model thread.
            ticket.when_done(lambda _: self._forget(ticket))
        self._queue.put(ticket)
        return ticket

    def _forget(self, ticket: Ticket) -> None:
        if self._latest.get(ticket.key) is ticket:
            self._latest.pop(ticket.key, None)

    def _serve(self) -> None:
        while (ticket := self._queue.get()) is not None:
            if ticket.is_set():
                continue
            started = time.perf_counter()
            self._run_load(ticket) if ticket.loads else self._run_job(ticket)
            self._log_job(ticket, time.perf_counter() - started)

    def _run_load(self, ticket: Ticket) -> None:
        self.model, self.state = None, "loading"  # the old model's memory is freed before the new one is read
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
        ticket.resolve(model)

    def _run_job(self, ticket: Ticket) -> None:
        if self.model is None:
            ticket.resolve(error=ModelUnavailable(self.error or "no model is loaded"))
            return
        try:
            ticket.resolve(ticket.job(self.model, ticket))
        except Refused as err:  # expected: the user is told why
            logger.info("%s refused: %s", ticket.label, err)
            ticket.resolve(error=err)
        except Exception as err:  # a failed job answers its request; the thread serves the next one
            logger.exception("%s failed", ticket.label)
            ticket.resolve(error=err)

    def _log_job(self, ticket: Ticket, seconds: float) -> None:
        """One log line per job; for a cancelled one, how many steps ran after the cancel (at most one)."""
        if ticket.loads:
            failed = not ticket.future.cancelled() and ticket.future.exception()
            line = f"{ticket.label}: {f'failed: {failed}' if failed else 'done'} in {seconds * 1000:.0f} ms"
        else:
            line = f"{ticket.label}: {ticket.steps} steps in {seconds * 1000:.1f} ms"
            if ticket.steps_at_cancel is not None:
                line += f", cancelled ({ticket.steps - ticket.steps_at_cancel} steps after the cancel)"
        # Queued behind the answer: the request's task wakes on the loop's next turn, the log after it.
        call_on_loop(self.loop, self.loop.call_soon, self.log, line)
