"""The engine service's SGLang backend: requests are planned by the completion pipeline as for the
native engine, their prompt ids go to an SGLang server's native `/generate` (streamed over HTTP with
httpx), each finished block comes back as a draft, and a cancel becomes `/abort_request`.

Owns the requests' life on SGLang (sglang_http.py speaks to each server). Knows nothing of the LSP or
of the service's sockets, and imports no torch itself (the tokenizer's loader
does, on a thread). What SGLang cannot do is done as closely as it can be (docs/sglang.md): thresholds
are a server's, so speed and quality are two servers; the first generated token cannot be constrained,
so token healing cuts the prompt at the word's start and a completion that does not begin with that
word is dropped; a rewrite's selection is not an initial draft; drafts are whole blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..completion.generation import Draft, LoadedModel, ModelSpec, Result
from ..completion.next_edit import NextEditPlan, NotSupported
from ..completion.pipeline import Plan
from ..errors import Busy, CheckpointError, Refused
from ..runtime.worker import LOAD_KEY, KeyedJobs, ModelUnavailable, Ticket
from .base import load_codec
from .sglang_config import BLOCK_SIZE, BackendFailure, SGLangBackend
from .sglang_http import SGLangServer, error_failure, finish_of, merge_output

logger = logging.getLogger(__name__)

PROBE_EVERY = (2.0, 15.0)  # seconds between health probes: while a server is not ready, and once all are


# --- the model as plans see it ----------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteSpec:
    """The service's `model`: whose tokenizer, and which servers generate."""

    tokenizer: ModelSpec
    backend: SGLangBackend

    @property
    def name(self) -> str:
        return f"{self.tokenizer.name} on {self.backend}"


def load_remote_model(spec: ModelSpec) -> LoadedModel:
    """The tokenizer and the length of the model SGLang serves, from its local folder (`--model`; never
    its weights). Prompts go over the wire as ids: this must be the model the servers load."""
    from ..model.loader import load_config, resolve_path  # torch: on the loading thread

    folder = resolve_path(spec.path)
    config = load_config(folder, spec.edit_ids)
    codec = load_codec(folder, spec.name, where=f"in {folder}")
    return LoadedModel(spec, codec, config.max_position_embeddings, config.block_size or BLOCK_SIZE,
                       family=config.family)  # fmt: skip


def _breaks_word(codec: Any, ids: list[int], word: str) -> bool:
    """Whether generated ids, as text, leave the partial word token healing took from the prompt: the
    native engine's first token must extend it; SGLang's is free to go elsewhere."""
    text, _ = codec.text_of(ids)
    return not (text.startswith(word) or word.startswith(text))


class RemoteTicket(Ticket):
    """A ticket whose cancel also cancels its task, which then asks SGLang to abort. Cancelled on the
    event loop only (the service's requests and connections live there)."""

    task: asyncio.Task | None = None

    def cancel(self) -> None:
        super().cancel()
        if self.task is not None:
            self.task.cancel()


# --- the worker -------------------------------------------------------------------------------------------
class SGLangWorker(KeyedJobs):
    """The Backend (backends/base.py) over SGLang servers. Everything runs on the event loop as tasks; plans are made on a thread (they
    tokenize); generation happens on the servers. `log(line)`: one line per job."""

    revises = False  # SGLang starts every generation from masks: a revision is a cold start

    def __init__(self, loop: asyncio.AbstractEventLoop, log: Callable[[str], None], backend: SGLangBackend,
                 probe_every: tuple[float, float] = PROBE_EVERY):  # fmt: skip
        self.loop, self.log, self.backend, self.probe_every = loop, log, backend, probe_every
        # trust_env=False: a proxy set for the outside world must not carry requests to the cluster's servers
        self.http = httpx.AsyncClient(trust_env=False)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP request; the jobs' lines say enough
        self.servers = {url: SGLangServer(url, self.http, backend.api_key, backend.timeout) for url in backend.urls}
        self.model: LoadedModel | None = None
        self.state, self.error = "loading", None
        self.spec = RemoteSpec(ModelSpec(None), backend)
        self._report: Callable[[str, int], None] = lambda message, percent: None
        self._shown: tuple | None = None  # the state last reported
        self._loading: asyncio.Task | None = None
        self._probing: asyncio.Task | None = None
        self._latest: dict[str, Ticket] = {}
        self._jobs: set[RemoteTicket] = set()
        self._aborts: set[asyncio.Task] = set()

    # --- the service's interface ----------------------------------------------------------------
    def load(self, spec: ModelSpec, report: Callable[[str, int], None]) -> Ticket:
        """Reads the tokenizer (`spec.path`, else the embedded model's) and asks every server how it is;
        `report(message, percent)` then tells of every change of the servers' state."""
        self.spec, self._report = RemoteSpec(spec, self.backend), report
        self.state, self.error, self.model, self._shown = "loading", None, None, None
        ticket = Ticket(LOAD_KEY, f"load {spec.name}", None, None, self.loop, loads=True)
        self._loading = self.loop.create_task(self._load(spec, ticket))
        return ticket

    def submit(self, key: str | None, label: str, job: Callable[[LoadedModel, Ticket], Any],
               on_draft: Callable[[int, Any], None] | None = None, group: Any = None) -> Ticket:  # fmt: skip
        """As ModelWorker.submit: `job(model, ticket)` returns the Plan; a newer job of `key` cancels this
        one. `group` is not used: every request is its own task on the loop, which takes turns already."""
        ticket = self._supersede(RemoteTicket(key, label, job, on_draft, self.loop))
        ticket.task = self.loop.create_task(self._run(ticket))
        return ticket

    @property
    def max_queue(self) -> int:
        """Requests that may wait for SGLang; more are answered busy (the ModelSpec's, as the native engine's)."""
        return self.spec.tokenizer.max_queue

    def cancel_all(self) -> None:
        for ticket in list(self._jobs):
            ticket.cancel()

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancels every request (each asks its server to abort) and the probes; `aclose` finishes."""
        self.cancel_all()
        for task in (self._loading, self._probing):
            if task is not None:
                task.cancel()
        return True

    async def aclose(self) -> None:
        """Waits for the aborts sent (a few seconds at most), then closes the connections."""
        pending = [t for t in (self._loading, self._probing) if t is not None] + [t.task for t in self._jobs if t.task]
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*self._aborts, return_exceptions=True)  # those the requests just ended posted
        await self.http.aclose()

    def stats(self) -> dict[str, Any]:
        return {"running": len(self._jobs), "queued": 0} if self.model is not None else {}

    # --- loading and health ---------------------------------------------------------------------
    async def _load(self, spec: ModelSpec, ticket: Ticket) -> None:
        started = time.perf_counter()
        self._report(f"reading the tokenizer of {spec.name}", 10)
        try:
            model = await asyncio.to_thread(load_remote_model, spec)
        except Exception as err:  # whatever stops the tokenizer from loading is reported, never raised
            if not isinstance(err, CheckpointError):
                logger.exception("reading the tokenizer of %s failed", spec.name)
            self.state, self.error = "error", (str(err).splitlines() or [type(err).__name__])[0]
            ticket.resolve(error=ModelUnavailable(self.error))
            return
        self.model = model
        self._report(f"asking {self.backend} how it is", 50)
        await self._probe_all()
        for url, modes in self.backend.urls.items():
            served = self.servers[url].health.model
            if served:  # prompts are ids of our tokenizer: the server must load the same model
                logger.info("SGLang at %s (%s) serves %s; prompts are tokenized as %s", url, modes, served, spec.name)
        self.log(f"load {spec.name}: tokenizer in {(time.perf_counter() - started) * 1000:.0f} ms; {self.backend}: "
                 f"{self.state}")  # fmt: skip
        ticket.resolve(model)
        self._probing = self.loop.create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            settled = self.state == "ready"
            await asyncio.sleep(self.probe_every[1] if settled else self.probe_every[0])
            await self._probe_all()

    async def _ask_again(self, server: SGLangServer) -> None:
        """One server's health asked now (not at the next probe), and the status it adds up to."""
        await server.probe()
        self._publish()

    async def _probe_all(self) -> None:
        await asyncio.gather(*(server.probe() for server in self.servers.values()))
        self._publish()

    def _publish(self) -> None:
        """The state the servers add up to (ready: all are; error: one refuses us or is no SGLang; else
        loading), and a status to every connection when it changed."""
        if self.model is None:
            return
        urls = self.backend.urls
        lines = [f"{modes}: SGLang at {url} {self.servers[url].health.detail}" for url, modes in urls.items()]
        states = [self.servers[url].health.state for url in urls]
        if all(state == "ready" for state in states):
            self.state, self.error = "ready", None
        elif any(state in ("refused", "broken") for state in states):
            self.state, self.error = "error", "; ".join(lines)
        else:
            self.state, self.error = "loading", None
        shown = (self.state, tuple(lines))
        if shown != self._shown:
            self._shown = shown
            if self.state != "ready":
                logger.warning("%s: %s", self.backend, "; ".join(lines))
            ready = sum(state == "ready" for state in states)
            self._report("; ".join(lines), ready * 100 // len(states))

    # --- requests ---------------------------------------------------------------------------------
    async def _run(self, ticket: RemoteTicket) -> None:
        ticket.started = time.perf_counter()
        self._jobs.add(ticket)
        try:
            outcome = await self._generate(ticket)
        except asyncio.CancelledError:  # a cancel, a newer request of the key, a closed connection, stopping
            ticket.future.cancel()  # already, unless the loop itself is closing
            self._log_job(ticket, "cancelled")
            return
        except (BackendFailure, Refused, ModelUnavailable) as err:  # expected: the user is told why (one line)
            ticket.resolve(error=err)
            self._publish()
            self._log_job(ticket, f"failed: {err}")
            return
        except Exception as err:  # a bug: answered `internal`, the service goes on
            logger.exception("%s failed", ticket.label)
            ticket.resolve(error=err)
            self._log_job(ticket, f"failed: {type(err).__name__}")
            return
        finally:
            self._jobs.discard(ticket)
        ticket.resolve(outcome)
        self._log_job(ticket, "")

    async def _generate(self, ticket: RemoteTicket) -> Any:
        if len(self._jobs) > self.max_queue:
            raise Busy(f"the engine is busy: {len(self._jobs) - 1} requests are already waiting for SGLang")
        if self._loading is not None:
            await asyncio.shield(self._loading)  # shielded: a cancelled request must not cancel the load
        if self.model is None:
            raise ModelUnavailable(self.error or "no tokenizer is loaded")
        plan: Plan = await asyncio.to_thread(ticket.job, self.model, ticket)
        if isinstance(plan, NextEditPlan):  # its window is the draft to revise, and SGLang starts from masks
            raise NotSupported("next-edit suggestions are not supported on the SGLang backend: they start the "
                               "generated blocks from the window's text, and SGLang starts them from masks")  # fmt: skip
        server = self.servers[self.backend.url(plan.request.mode)]
        if server.health.state != "ready":  # known to be down: asked again rather than failed on old news
            await self._ask_again(server)
            if server.health.state != "ready":
                kind = "auth" if server.health.state == "refused" else "no_model"
                raise BackendFailure(kind, f"SGLang at {server.url} {server.health.detail}")
        return await self._stream(ticket, plan, server)

    async def _stream(self, ticket: RemoteTicket, plan: Plan, server: SGLangServer) -> Any:
        """Sends the prompt ids; each block the stream adds becomes a final draft; the plan finishes the
        result. Stops early (and aborts the rest) when the plan has enough or the completion leaves the
        healed word. What SGLang cannot be told: `init_ids` (it starts from masks), `first_allowed` (see
        _breaks_word), `priority`, and the thresholds (a server's own).

        The stream has two shapes (docs/sglang.md, "What SGLang streams"): without first-done-first-out
        (`--no-dllm-fdfo`) one object per finished block; with it (0.5.23's default) one object per
        denoising step of the batch, whose output ids stay the same until a block finishes. Blocks are
        therefore counted by the output's growth, and an object that adds nothing shows nothing."""
        request = plan.request
        # SGLang aborts every request whose rid *starts with* the one given: ids of one length stay apart.
        rid = f"llada-{uuid.uuid4().hex}"
        sampling: dict[str, Any] = {"max_new_tokens": request.gen_length, "temperature": 0.0}
        if request.eos_id is not None:
            sampling["stop_token_ids"] = [request.eos_id]
        payload = {"rid": rid, "input_ids": request.prompt_ids, "sampling_params": sampling, "stream": True}
        codec, word = self.model.codec, plan.heal_text
        # LLaDA2.2's DELETE and INSERT never reach a plan: SGLang's rule removes them within its steps,
        # and an id that slipped through a server's output would be shown to the user as text.
        edit_ids = set(self.model.edit_ids or ())
        raw: list[int] = []  # the server's output ids, as merge_output counts them
        ids: list[int] = []
        blocks, objects, started, finished, early = 0, 0, time.perf_counter(), False, False
        stream = server.generate(payload)
        try:
            async for chunk in stream:
                objects += 1
                try:
                    merged = merge_output(raw, chunk)
                except ValueError as err:
                    raise BackendFailure("internal", f"SGLang at {server.url} sent {err}") from None
                grew, raw = len(merged) > len(raw), merged
                ids = [t for t in raw if t not in edit_ids]
                finish = finish_of(chunk)
                if finish is not None:
                    finished = True
                    if finish.get("type") == "abort":
                        raise error_failure(server.url, f"aborted the request: {finish.get('message') or 'no reason'}")
                    matched = finish.get("matched")
                    if isinstance(matched, int) and matched not in ids and matched not in edit_ids:
                        ids.append(matched)  # the stop id, where SGLang trimmed it
                        grew = True
                if grew:
                    blocks += 1
                    if word and _breaks_word(codec, ids, word):
                        logger.debug("%s: the completion does not begin with %r; dropped", ticket.label, word)
                        ids, early = ([request.eos_id] if request.eos_id is not None else []), not finished
                    if ids:  # a block of edit ids only is no text to show
                        # A streamed block is final; the last one ends the generation, whose result answers.
                        draft = Draft(blocks, ids[: request.gen_length], final=not (finished or early))
                        ticket.emit(blocks, plan.on_draft(draft)[1])
                if finished or early:
                    break
                if request.cancel is not None and request.cancel.is_set():  # the plan has enough
                    early = True
                    break
        except asyncio.CancelledError:
            self._abort(server, rid)
            raise
        finally:
            await stream.aclose()
        if early:
            self._abort(server, rid)
        elif not finished:  # a cut stream is news about the server: asked at once, not at the next probe
            await self._ask_again(server)
            raise BackendFailure("no_model", f"SGLang at {server.url} ended the stream before the generation ended")
        logger.debug("%s: %d blocks in %d streamed objects", ticket.label, blocks, objects)
        result = Result(ids[: request.gen_length], blocks, time.perf_counter() - started, ticket.is_set())
        return await asyncio.to_thread(plan.finish, result)

    def _abort(self, server: SGLangServer, rid: str) -> None:
        task = self.loop.create_task(server.abort(rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _log_job(self, ticket: Ticket, outcome: str) -> None:
        seconds = time.perf_counter() - ticket.started
        more = f", {outcome}" if outcome else ""
        self.log(f"{ticket.label}: {ticket.steps} blocks in {seconds * 1000:.1f} ms{more}")
