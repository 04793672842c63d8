"""The engine service's SGLang backend: requests are planned by the completion pipeline as for the
native engine, their prompt ids go to an SGLang server's native `/generate` (streamed over HTTP with
httpx), each finished block comes back as a draft, and a cancel becomes `/abort_request`.

Owns the HTTP dialogue with SGLang and the mapping of its failures onto the wire's failure kinds. Knows
nothing of the LSP or of the service's sockets, and imports no torch itself (the tokenizer's loader
does, on a thread). What SGLang cannot do is done as closely as it can be (docs/sglang.md): thresholds
are a server's, so speed and quality are two servers; the first generated token cannot be constrained,
so token healing cuts the prompt at the word's start and a completion that does not begin with that
word is dropped; a rewrite's selection is not an initial draft; drafts are whole blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable

import httpx

from ..completion.pipeline import Flag, LoadedModel, ModelSpec, Plan, load_codec
from ..errors import Busy, CheckpointError, Refused, TooLong
from .backend import MODES, BackendFailure, SGLangBackend
from .backend import backend_argument, parse_backend  # noqa: F401 - re-exported: sglang's names, as before
from .worker import LOAD_KEY, KeyedJobs, ModelUnavailable, Ticket

logger = logging.getLogger(__name__)

BLOCK_SIZE = 32  # LLaDA2's block: SGLang's default for LLaDA2MoeModelLM (srt/dllm/config.py)
CONNECT_TIMEOUT = 5.0  # seconds to open a connection to a server
ABORT_TIMEOUT = 5.0
PROBE_EVERY = (2.0, 15.0)  # seconds between health probes: while a server is not ready, and once all are


# --- the model as plans see it ----------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteSettings:
    """What a plan asks of its generation (Engine.settings' arguments), as far as SGLang can be told: a
    rewrite's selection (init_ids) is not sent, SGLang starting from masks; token healing's constraint
    (first_allowed) it cannot apply (see _breaks_word); nor a priority."""

    prompt: list[int]
    gen_length: int
    mode: str
    eos_id: int | None
    cancel: Flag | None


class RemoteEngine:
    """Engine.settings for plans whose generation runs on SGLang: the same checks, no tensors."""

    def __init__(self, max_positions: int, block_size: int = BLOCK_SIZE):
        self.max_positions, self.block_size = max_positions, block_size

    def settings(self, prompt_ids: list[int], gen_length: int = 64, policy: str = "speed", max_post_steps: int = 16,
                 eos_early_stop: bool = False, mask_id: int | None = None, eos_id: int | None = None,
                 cancel: Flag | None = None, init_ids: list[int] | None = None, first_allowed: list[int] | None = None,
                 priority: int = 0) -> RemoteSettings:  # fmt: skip
        """`max_post_steps` and `eos_early_stop` are the server's (its YAML), whatever a plan asks;
        `init_ids`, `first_allowed` and `priority` SGLang cannot be told (RemoteSettings)."""
        if policy not in MODES:
            raise ValueError(f"unknown mode {policy!r}; choose one of {', '.join(MODES)}")
        if gen_length < 1:
            raise ValueError(f"gen_length must be at least 1, got {gen_length}")
        if len(prompt_ids) + gen_length > self.max_positions:
            raise TooLong(f"a prompt of {len(prompt_ids)} tokens and {gen_length} to generate exceed the model's "
                          f"{self.max_positions} positions")  # fmt: skip
        return RemoteSettings(list(prompt_ids), gen_length, policy, eos_id, cancel)


class RemoteModel(LoadedModel):
    """A LoadedModel whose engine is a RemoteEngine: the tokenizer and the model's length, no weights."""

    @property
    def max_positions(self) -> int:
        return self.engine.max_positions


@dataclass(frozen=True)
class RemoteDraft:
    """What plans read of an engine.Draft: the step, and the ids generated so far (whole blocks)."""

    step: int
    generated: list[int]


@dataclass(frozen=True)
class RemoteResult:
    """What plans read of an engine.GenerationResult."""

    tokens: list[int]
    steps: int  # blocks received: SGLang does not report its denoising steps
    seconds: float
    cancelled: bool = False


@dataclass(frozen=True)
class RemoteSpec:
    """The service's `model`: whose tokenizer, and which servers generate."""

    tokenizer: ModelSpec
    backend: SGLangBackend

    @property
    def name(self) -> str:
        return f"{self.tokenizer.name} on {self.backend}"


def load_remote_model(spec: ModelSpec) -> RemoteModel:
    """The tokenizer and the length of the model SGLang serves, from its local folder (`--model`; never
    its weights). Prompts go over the wire as ids: this must be the model the servers load."""
    from ..model.loader import load_config, resolve_path  # torch: on the loading thread

    folder = resolve_path(spec.path)
    config = load_config(folder)
    codec = load_codec(folder, spec.name, where=f"in {folder}")
    return RemoteModel(spec, RemoteEngine(config.max_position_embeddings), codec)


# --- one server ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Health:
    state: str = "unknown"  # "unknown" | "unreachable" | "loading" | "refused" | "broken" | "ready"
    detail: str = "was not asked yet"  # in words, after "SGLang at URL", for status and errors
    model: str | None = None  # what it serves (/get_model_info's model_path)


class SGLangServer:
    """One SGLang server's native HTTP API as this backend uses it: /health (never needs the key),
    /get_model_info (checks the key), streamed /generate and /abort_request. Request failures raise
    BackendFailure; `health` is what the last exchange said about the server."""

    def __init__(self, url: str, http: httpx.AsyncClient, api_key: str | None, timeout: float):
        self.url, self.http, self.has_key = url, http, api_key is not None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # read: the longest silence inside an answer (between two blocks); the other phases are short
        self.timeout = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT)
        self.health = Health()

    async def probe(self) -> Health:
        """Asks /health, then (if up) /get_model_info, which needs the key: `health` afterwards."""
        try:
            answer = await self.http.get(f"{self.url}/health", timeout=CONNECT_TIMEOUT)
            if answer.status_code == 200:
                info = await self.http.get(f"{self.url}/get_model_info", headers=self.headers, timeout=CONNECT_TIMEOUT)
                if info.status_code in (401, 403):
                    raise _status_failure(self.url, info.status_code, info.content, self.has_key)
                served = _json_field(info.content, "model_path") if info.status_code == 200 else None
                self.health = Health("ready", "is ready", served)
            elif answer.status_code == 503:
                self.health = Health("loading", "is loading (its /health answers 503: warming up, or shutting down)")
            else:
                self.health = Health("broken", f"answers /health with {answer.status_code}: is it an SGLang server?")
        except BackendFailure as err:
            self._learn(err)
        except httpx.HTTPError as err:
            self._learn(_exception_failure(self.url, err, self.timeout.read))
        return self.health

    async def generate(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The objects of a streamed /generate, in order, up to `data: [DONE]` (an `error` object
        raises). Closing the iterator early closes the stream."""
        try:
            async with self.http.stream("POST", f"{self.url}/generate", json=payload, headers=self.headers,
                                        timeout=self.timeout) as answer:  # fmt: skip
                if answer.status_code != 200:
                    raise _status_failure(self.url, answer.status_code, await answer.aread(), self.has_key)
                self.health = replace(self.health, state="ready", detail="is ready")
                async for line in answer.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # the blank line after each event
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        return
                    chunk = _json_object(self.url, data)
                    if "error" in chunk:
                        raise _error_failure(self.url, _message_of(chunk))
                    yield chunk
        except BackendFailure as err:
            self._learn(err)
            raise
        except httpx.HTTPError as err:
            failure = _exception_failure(self.url, err, self.timeout.read)
            self._learn(failure)
            raise failure from None

    async def abort(self, rid: str) -> None:
        """Asks the server to stop request `rid`. A failure is logged, never raised: the stream is
        closed anyway, which SGLang also takes as an abort once it notices."""
        try:
            answer = await self.http.post(f"{self.url}/abort_request", json={"rid": rid}, headers=self.headers,
                                          timeout=ABORT_TIMEOUT)  # fmt: skip
        except httpx.HTTPError as err:
            logger.warning("could not ask SGLang at %s to abort %s: %s", self.url, rid, err or type(err).__name__)
            return
        if answer.status_code != 200:
            logger.warning("SGLang at %s answered the abort of %s with %d: %s", self.url, rid, answer.status_code,
                           _message_of(_json_or_text(answer.content)))  # fmt: skip

    def _learn(self, failure: BackendFailure) -> None:
        """What a failure says about the server (a request's own failure says nothing)."""
        state = {"no_model": "unreachable", "auth": "refused"}.get(failure.kind)
        if state == "unreachable" and "503" in failure.message:
            state = "loading"
        if state is not None:
            self.health = Health(state, failure.message.removeprefix(f"SGLang at {self.url} "), self.health.model)


# --- failures in words ------------------------------------------------------------------------------
def _status_failure(url: str, status: int, body: bytes, has_key: bool) -> BackendFailure:
    message = _message_of(_json_or_text(body))
    if status == 401 and has_key:
        return BackendFailure("auth", f"SGLang at {url} refused the API key (401 Unauthorized): the file of "
                              "--backend-token-file must hold the key the server got with --api-key")
    if status == 401:
        return BackendFailure("auth", f"SGLang at {url} wants an API key (401 Unauthorized): put the key of its "
                              "--api-key in a file of mode 0600 and pass it with --backend-token-file")
    if status == 403:
        return BackendFailure("auth", f"SGLang at {url} forbids this request (403 Forbidden): {message}")
    if status == 503:
        return BackendFailure("no_model", f"SGLang at {url} is not ready (503): still loading, or shutting down")
    if status == 404:
        return BackendFailure("internal", f"SGLang at {url} has no such endpoint (404): is it an SGLang server?")
    if status in (400, 422):
        return _error_failure(url, f"refused the request ({status}): {message}")
    return BackendFailure("internal", f"SGLang at {url} failed ({status}): {message}")


def _error_failure(url: str, message: str) -> BackendFailure:
    """An error SGLang reported about a request: too long for its context, or anything else."""
    lowered = message.lower()
    kind = "too_long" if "context length" in lowered or "longer than" in lowered else "internal"
    return BackendFailure(kind, f"SGLang at {url}: {message}")


def _exception_failure(url: str, err: httpx.HTTPError, read_timeout: float | None) -> BackendFailure:
    said = str(err) or type(err).__name__
    if isinstance(err, httpx.ConnectTimeout):
        return BackendFailure("no_model", f"SGLang at {url} did not accept a connection within {CONNECT_TIMEOUT:.0f} s")
    if isinstance(err, httpx.ConnectError):
        return BackendFailure("no_model", f"SGLang at {url} cannot be reached ({said}): it is not started, or still "
                                          "loading its weights (it opens its port once they are loaded)")  # fmt: skip
    if isinstance(err, httpx.TimeoutException):
        return BackendFailure("busy", f"SGLang at {url} sent nothing for {read_timeout:g} s (--backend-timeout): it "
                                      "is busy with other requests (a dLLM server runs --max-running-requests at once, "
                                      "1 by default) or stuck")  # fmt: skip
    if isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return BackendFailure("no_model", f"SGLang at {url} cut the connection: {said}")
    return BackendFailure("internal", f"talking to SGLang at {url} failed: {said}")


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def _json_object(url: str, data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise BackendFailure("internal", f"SGLang at {url} streamed something that is no JSON object: {data[:120]!r}")
    return chunk


def _json_field(body: bytes, name: str) -> str | None:
    value = _json_or_text(body)
    return str(value[name]) if isinstance(value, dict) and value.get(name) is not None else None


def _message_of(value: Any) -> str:
    """The words of SGLang's error bodies: {"error": {"message"}}, {"error": "Unauthorized"},
    {"message": ...} (its ErrorResponse) or plain text; at most 300 characters."""
    if isinstance(value, dict):
        inner = value.get("error", value)
        if isinstance(inner, dict):
            inner = inner.get("message", inner.get("detail", inner))
        value = inner
    text = value if isinstance(value, str) else json.dumps(value)
    return text.strip()[:300] or "no details"


# --- the stream's contents -----------------------------------------------------------------------------
def merge_output(ids: list[int], chunk: dict[str, Any]) -> list[int]:
    """The output ids so far after one streamed object. SGLang sends every id so far by default and
    only the new ones with --incremental-streaming-output; meta_info.completion_tokens (the total so far)
    tells them apart."""
    new = chunk.get("output_ids") or []
    if not isinstance(new, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in new):
        raise ValueError(f"output_ids must be a list of ids, not {str(new)[:80]}")
    total = (chunk.get("meta_info") or {}).get("completion_tokens")
    if total == len(new) or (total is None and new[: len(ids)] == ids):
        return list(new)
    return ids + new


def finish_of(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """meta_info.finish_reason: None while generating, else {"type": "stop" | "length" | "abort", ...}."""
    finish = (chunk.get("meta_info") or {}).get("finish_reason")
    if finish is None or isinstance(finish, dict):
        return finish
    return {"type": str(finish)}


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
    """ModelWorker's interface to the service (load, submit, state, error, spec, model, stats, stop)
    over SGLang servers. Everything runs on the event loop as tasks; plans are made on a thread (they
    tokenize); generation happens on the servers. `log(line)`: one line per job."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: Callable[[str], None], backend: SGLangBackend,
                 probe_every: tuple[float, float] = PROBE_EVERY):  # fmt: skip
        self.loop, self.log, self.backend, self.probe_every = loop, log, backend, probe_every
        # trust_env=False: a proxy set for the outside world must not carry requests to the cluster's servers
        self.http = httpx.AsyncClient(trust_env=False)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP request; the jobs' lines say enough
        self.servers = {url: SGLangServer(url, self.http, backend.api_key, backend.timeout) for url in backend.urls}
        self.model: RemoteModel | None = None
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
               on_draft: Callable[[int, Any], None] | None = None) -> Ticket:  # fmt: skip
        """As ModelWorker.submit: `job(model, ticket)` returns the Plan; a newer job of `key` cancels this one."""
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
        settings: RemoteSettings = plan.settings
        server = self.servers[self.backend.url(settings.mode)]
        if server.health.state != "ready":  # known to be down: asked again rather than failed on old news
            await server.probe()
            self._publish()
            if server.health.state != "ready":
                kind = "auth" if server.health.state == "refused" else "no_model"
                raise BackendFailure(kind, f"SGLang at {server.url} {server.health.detail}")
        return await self._stream(ticket, plan, settings, server)

    async def _stream(self, ticket: RemoteTicket, plan: Plan, settings: RemoteSettings, server: SGLangServer) -> Any:
        """Sends the prompt ids; each streamed block becomes a draft; the plan finishes the result. Stops
        early (and aborts the rest) when the plan has enough or the completion leaves the healed word."""
        # SGLang aborts every request whose rid *starts with* the one given: ids of one length stay apart.
        rid = f"llada-{uuid.uuid4().hex}"
        sampling: dict[str, Any] = {"max_new_tokens": settings.gen_length, "temperature": 0.0}
        if settings.eos_id is not None:
            sampling["stop_token_ids"] = [settings.eos_id]
        payload = {"rid": rid, "input_ids": settings.prompt, "sampling_params": sampling, "stream": True}
        codec = self.model.codec
        healed = getattr(plan, "healed", None)
        word = healed.text if healed is not None else ""
        ids: list[int] = []
        blocks, started, finished, early = 0, time.perf_counter(), False, False
        stream = server.generate(payload)
        try:
            async for chunk in stream:
                try:
                    ids = merge_output(ids, chunk)
                except ValueError as err:
                    raise BackendFailure("internal", f"SGLang at {server.url} sent {err}") from None
                blocks += 1
                finish = finish_of(chunk)
                if finish is not None:
                    finished = True
                    if finish.get("type") == "abort":
                        raise _error_failure(server.url, f"aborted the request: {finish.get('message') or 'no reason'}")
                    matched = finish.get("matched")
                    if isinstance(matched, int) and matched not in ids:  # the stop id, where SGLang trimmed it
                        ids.append(matched)
                if word and _breaks_word(codec, ids, word):
                    logger.debug("%s: the completion does not begin with %r; dropped", ticket.label, word)
                    ids, early = ([settings.eos_id] if settings.eos_id is not None else []), not finished
                draft = RemoteDraft(blocks, ids[: settings.gen_length])
                ticket.emit(blocks, plan.on_draft(draft)[1])
                if finished or early:
                    break
                # A streamed block is final: shown to the plan again it is a step that changed nothing,
                # which is how a plan learns that its unit is complete (InfillPlan then stops).
                plan.on_draft(draft)
                if settings.cancel is not None and settings.cancel.is_set():  # the plan has enough
                    early = True
                    break
        except asyncio.CancelledError:
            self._abort(server, rid)
            raise
        finally:
            await stream.aclose()
        if early:
            self._abort(server, rid)
        elif not finished:
            raise BackendFailure("no_model", f"SGLang at {server.url} ended the stream before the generation ended")
        result = RemoteResult(ids[: settings.gen_length], blocks, time.perf_counter() - started, ticket.is_set())
        return await asyncio.to_thread(plan.finish, result)

    def _abort(self, server: SGLangServer, rid: str) -> None:
        task = self.loop.create_task(server.abort(rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _log_job(self, ticket: Ticket, outcome: str) -> None:
        seconds = time.perf_counter() - ticket.started
        more = f", {outcome}" if outcome else ""
        self.log(f"{ticket.label}: {ticket.steps} blocks in {seconds * 1000:.1f} ms{more}")
