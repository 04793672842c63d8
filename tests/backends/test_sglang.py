"""The engine service with its SGLang backend, against an SGLang stand-in on 127.0.0.1 that speaks the
part of SGLang's native HTTP interface the backend uses. Requests go the real service path: an
EngineClient (as an editor's front) over a Unix socket to EngineService, whose worker is SGLangWorker.

The stand-in's request and response shapes are SGLang's own (sgl-project/sglang, read via its source):
- python/sglang/srt/entrypoints/http_server.py: `POST /generate` takes a GenerateReqInput; with
  `stream: true` it answers `text/event-stream`, one `data: <json>\\n\\n` per output, an error as
  `data: {"error": {"message": ...}}`, then `data: [DONE]\\n\\n`; `POST /abort_request` takes an AbortReq
  and answers 200 with no body; `GET /health` answers 503 while the server is Starting (warm-up), then
  200; `GET /get_model_info` answers {"model_path", ...}; a non-streamed error is an ErrorResponse
  ({"object": "error", "message", "type", "code"}) or {"error": {"message"}}.
- python/sglang/srt/managers/io_struct.py: GenerateReqInput(rid, text | input_ids, sampling_params,
  stream, ...); AbortReq(rid, abort_all).
- python/sglang/srt/managers/tokenizer_manager.py (_handle_batch_output): each output is {"text",
  "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "cached_tokens", ...}}; streamed output_ids are every id so far, or only the new ones with
  --incremental-streaming-output (intermediate "text" may be null).
- python/sglang/srt/managers/schedule_batch.py: finish_reason is null while generating, else
  FINISH_MATCHED_TOKEN {"type": "stop", "matched": id}, FINISH_LENGTH {"type": "length", "length"},
  FINISH_ABORT {"type": "abort", "message", "status_code", "err_type"}.
- python/sglang/srt/utils/auth.py (older: add_api_key_middleware in srt/utils.py): with --api-key,
  every path but /health*, /ready*, /metrics* needs `Authorization: Bearer KEY`, else 401
  {"error": "Unauthorized"}.
- python/sglang/srt/dllm/config.py: LLaDA2MoeModelLM's block is 32 tokens; a dLLM server runs
  max_running_requests (1 by default) at once, so streamed outputs are whole finished blocks.
Ids are the embedded tiny model's (llada_lsp/data/tiny). Waits are on answers and pushed status frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llada_lsp import wire
from llada_lsp.address import Address
from llada_lsp.backends.sglang import SGLangWorker, load_remote_model
from llada_lsp.backends.sglang_config import MODES, SGLangBackend, parse_backend
from llada_lsp.backends.sglang_http import merge_output
from llada_lsp.commands import engine
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill
from llada_lsp.completion.pipeline import InfillPlan
from llada_lsp.service.client import EngineClient, EngineFailure
from llada_lsp.service.listener import Listener
from llada_lsp.service.sessions import EngineService

WAIT = 15.0  # seconds any one answer may take before a test fails (none takes near that)
HOLD = 10.0  # the longest the stand-in holds an answer open (a test's teardown releases it sooner)


# --- the SGLang stand-in -------------------------------------------------------------------------------------
@dataclass
class Stream:
    """Streams `blocks` (each a list of ids) as SGLang streams a dLLM's finished blocks; the last one
    carries `finish`. `hold_after=k`: after k blocks, nothing more until this request is aborted (then
    SGLang's abort finish) or the test ends."""

    blocks: list[list[int]]
    finish: dict[str, Any] = field(default_factory=lambda: {"type": "length", "length": 0})
    incremental: bool = False  # --incremental-streaming-output: only the new ids in each object
    hold_after: int | None = None
    # First-done-first-out (0.5.23's default): an object per denoising step, before each block the
    # steps that did not finish it, their output ids unchanged
    fdfo_steps: int = 0


@dataclass
class Status:
    """A plain HTTP answer to /generate (an error)."""

    code: int
    body: dict[str, Any]


@dataclass
class Silent:
    """Headers, then nothing: a server that hangs mid-answer."""


@dataclass
class StreamError:
    """An error inside the stream, as http_server.generate_request sends a ValueError."""

    message: str


class FakeSGLang:
    """`/health`, `/get_model_info`, streamed `/generate` and `/abort_request` on 127.0.0.1, answering
    /generate with `answer(body)`; every request body and abort is kept for the test to check."""

    def __init__(self, answer: Callable[[dict], Any], api_key: str | None = None):
        self.answer, self.api_key = answer, api_key
        self.health = 200
        self.generated: list[dict[str, Any]] = []  # /generate bodies
        self.headers: list[dict[str, str]] = []
        self.aborts: list[str] = []
        self.aborted = threading.Condition()
        self.release = threading.Event()  # ends every held answer
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-sglang", daemon=True)

    def __enter__(self) -> FakeSGLang:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        with self.aborted:
            self.aborted.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def wait_abort(self, rid: str, timeout: float = WAIT) -> bool:
        with self.aborted:
            self.aborted.wait_for(lambda: rid in self.aborts or self.release.is_set(), timeout)
            return rid in self.aborts


def _handler(fake: FakeSGLang) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: the test's output is the test's
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/health"):  # never needs the key
                self._reply(fake.health, None)
            elif self._authorized() and self.path == "/get_model_info":
                self._reply(200, {"model_path": "inclusionAI/LLaDA2.1-mini", "is_generation": True})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/abort_request":
                with fake.aborted:
                    fake.aborts.append(body["rid"])
                    fake.aborted.notify_all()
                self._reply(200, None)
            elif self.path == "/generate":
                fake.generated.append(body)
                fake.headers.append(dict(self.headers))
                self._generate(body, fake.answer(body))
            else:
                self._reply(404, {"detail": "Not Found"})

        def _authorized(self) -> bool:
            if fake.api_key is None or self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return True
            self._reply(401, {"error": "Unauthorized"})
            return False

        def _reply(self, code: int, body: dict | None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _generate(self, body: dict, answer: Any) -> None:
            if isinstance(answer, Status):
                self._reply(answer.code, answer.body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            with contextlib.suppress(OSError):  # the backend may close first (a cancel, an early stop)
                if isinstance(answer, Silent):
                    fake.release.wait(HOLD)
                elif isinstance(answer, StreamError):
                    self._event({"error": {"message": answer.message}})
                else:
                    self._stream(body, answer)
                self.wfile.write(b"data: [DONE]\n\n")

        def _stream(self, body: dict, answer: Stream) -> None:
            ids: list[int] = []
            for n, block in enumerate(answer.blocks, 1):
                if answer.hold_after is not None and n > answer.hold_after:
                    if fake.wait_abort(body["rid"], HOLD):
                        abort = {"type": "abort", "message": "Abort in waiting queue", "status_code": None,
                                 "err_type": None}  # fmt: skip
                        self._event(self._output(body, ids, [], abort, answer))
                    return
                last = n == len(answer.blocks)
                for _ in range(answer.fdfo_steps):
                    self._event(self._output(body, ids, [], None, answer))
                ids += block
                self._event(self._output(body, ids, block, answer.finish if last else None, answer))

        @staticmethod
        def _output(body: dict, ids: list[int], new: list[int], finish: dict | None, answer: Stream) -> dict:
            meta = {"id": body["rid"], "finish_reason": finish, "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(ids), "cached_tokens": 0}  # fmt: skip
            return {"text": None, "output_ids": list(new if answer.incremental else ids), "meta_info": meta}

        def _event(self, obj: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


# --- the service over it -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """The embedded model's tokenizer and length, loaded as the backend loads them."""
    return load_remote_model(ModelSpec(None))


@pytest.fixture
def short_dir():
    """A socket folder under /tmp: AF_UNIX paths end at ~107 bytes, which pytest's tmp_path can pass."""
    folder = tempfile.mkdtemp(prefix="ll", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def service_on(backend: SGLangBackend, folder: Path, spec: ModelSpec | None = None):
    """The engine service on a Unix socket in `folder`, generating on `backend` with `spec`'s tokenizer;
    its log lines too."""
    lines: list[str] = []
    worker = SGLangWorker(asyncio.get_running_loop(), lines.append, backend, probe_every=(0.05, 30.0))
    service = EngineService(worker, MODES, None)
    listener = Listener.claim(Address("unix", str(folder / "e.sock")))
    try:
        await listener.bind(service.handle)
        service.load(spec or ModelSpec(None))
        yield listener.address, lines
    finally:
        listener.close()
        await service.close()
        assert worker.stop()
        await asyncio.wait_for(worker.aclose(), WAIT)


async def wait_status(client: EngineClient, ok: Callable[[wire.Status], bool]) -> wire.Status:
    """The first status (asked now, or pushed later) for which `ok` holds, within WAIT seconds in all."""
    pushed: asyncio.Queue[wire.Status] = asyncio.Queue()
    client.on_status = pushed.put_nowait

    async def first() -> wire.Status:
        status = await client.status()
        while not ok(status):
            status = await pushed.get()
        return status

    return await asyncio.wait_for(first(), WAIT)


def infill(client: EngineClient, before: str, after: str = "\n", mode: str = "speed", max_tokens: int = 64,
           drafts: bool = False) -> wire.Infill:  # fmt: skip
    return wire.Infill(client.next_id(), "a.py", before, after, mode, max_tokens, 1024, drafts)


async def ask(client: EngineClient, request: wire.Infill, drafts: list[str] | None = None) -> wire.Done:
    on_draft = (lambda step, text: drafts.append(text)) if drafts is not None else None
    return await asyncio.wait_for(client.request(request, on_draft), WAIT)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


RETURN = "def add(a, b):\n    return a +"


# --- completion, drafts, cancel --------------------------------------------------------------------------------
async def test_a_completion_sends_the_plans_prompt_ids_and_answers_the_post_processed_text(short_dir, tiny):
    codec = tiny.codec
    eos = codec.special.eos
    answer = Stream([codec.encode(" b  # the sum") + [eos]], {"type": "stop", "matched": eos})
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, lines):
            async with await EngineClient.connect(address, "editor") as client:
                assert client.welcome.modes == list(MODES)
                status = await wait_status(client, lambda s: s.state == "ready")
                assert "sglang+" + fake.url in status.model
                done = await ask(client, infill(client, RETURN))
    assert (done.text, done.stopped, done.step) == (" b  # the sum", "done", 1)
    body = fake.generated[0]
    plan = InfillPlan(tiny, Infill.at(RETURN + "\n", len(RETURN), "speed", 64, 1024), _Never())
    assert body["input_ids"] == plan.request.prompt_ids  # the same pipeline's prompt, as ids
    assert body["stream"] is True and body["rid"].startswith("llada-")
    assert body["sampling_params"]["max_new_tokens"] == plan.request.gen_length == 32
    assert body["sampling_params"]["stop_token_ids"] == [eos]
    assert "Authorization" not in fake.headers[0]  # no key was given
    assert any(line.startswith("infill editor#1:1: 1 blocks in") for line in lines)


class _Never:
    def is_set(self) -> bool:
        return False


async def test_a_revision_is_a_cold_start_and_the_welcome_says_so(short_dir, tiny):
    """SGLang starts every generation from masks: the welcome tells the front (its status says cold
    starts), and an infill carrying a draft is served exactly as one without (the same prompt, answer)."""
    codec = tiny.codec
    answer = Stream(
        [codec.encode(" b  # the sum") + [codec.special.eos]], {"type": "stop", "matched": codec.special.eos}
    )
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                assert client.welcome.revise is False
                await wait_status(client, lambda s: s.state == "ready")
                cold = await ask(client, infill(client, RETURN))
                warm = replace(infill(client, RETURN + " b"), draft="  # the sum", typed=2)
                revised = await ask(client, warm)
    assert cold.text == " b  # the sum" and revised.text == "  # the sum"
    plan = InfillPlan(tiny, Infill.at(RETURN + " b\n", len(RETURN) + 2, "speed", 64, 1024), _Never())
    assert fake.generated[1]["input_ids"] == plan.request.prompt_ids and plan.request.init_ids is None


BODY = (
    "total = 0\n    for i in range(10):\n        total += i\n        total *= 2\n    for j in range(3):\n"
    "        total -= j\n    print(total)\n    return total\n"
)  # 40 ids: two blocks


@pytest.mark.parametrize("incremental, fdfo_steps", [(False, 0), (True, 0), (False, 5), (True, 5)],
                         ids=["cumulative", "incremental", "cumulative-fdfo", "incremental-fdfo"])  # fmt: skip
async def test_streamed_blocks_arrive_as_drafts_then_the_answer(short_dir, tiny, incremental, fdfo_steps):
    """One draft per block, never an empty one, in both stream shapes: one object per block
    (--no-dllm-fdfo), or one per denoising step whose ids change only when a block finishes (FDFO)."""
    codec = tiny.codec
    ids = codec.encode(BODY)
    assert len(ids) > 32, "the body must span two blocks"
    blocks = [ids[:32], ids[32:] + [codec.special.eos]]
    answer = Stream(blocks, {"type": "stop", "matched": codec.special.eos}, incremental=incremental,
                    fdfo_steps=fdfo_steps)  # fmt: skip
    drafts: list[str] = []
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, lines):
            async with await EngineClient.connect(address, "editor") as client:
                done = await ask(client, infill(client, "def f():\n    ", "\n", "quality", drafts=True), drafts)
    assert fake.generated[0]["sampling_params"]["max_new_tokens"] == 64  # an empty line: two blocks
    first = codec.text_of(blocks[0])[0]
    assert len(drafts) == 2 and drafts[0] != drafts[1]
    assert first.startswith(drafts[0]) and drafts[0].startswith("total = 0\n")  # only what the first block holds
    assert drafts[-1] == done.text == BODY.rstrip()
    assert done.step == 2
    assert any(": 2 blocks in" in line for line in lines), lines


async def test_cancel_answers_at_once_and_asks_sglang_to_abort_the_request(short_dir, tiny):
    codec = tiny.codec
    ids = codec.encode(BODY)
    answer = Stream([ids[:32], ids[32:] + [codec.special.eos]], hold_after=1)
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, lines):
            async with await EngineClient.connect(address, "editor", totals=True) as client:  # `running`: a total
                first = asyncio.Event()
                request = infill(client, "def f():\n    ", "\n", drafts=True)
                task = asyncio.ensure_future(client.request(request, lambda step, text: first.set()))
                await asyncio.wait_for(first.wait(), WAIT)
                client.cancel(request.id)
                with pytest.raises(EngineFailure) as failure:
                    await asyncio.wait_for(task, WAIT)
                assert failure.value.kind == "cancelled"
                rid = fake.generated[0]["rid"]
                assert await asyncio.to_thread(fake.wait_abort, rid), "no /abort_request for the cancelled request"
                assert fake.aborts == [rid]
                assert (await wait_status(client, lambda s: s.running == 0)).state == "ready"
    assert any("1 blocks in" in line and "cancelled" in line for line in lines)


async def test_a_complete_unit_stops_early_and_aborts_the_rest(short_dir, tiny):
    """The rest of a line fits in a block, but a request on an empty line asks two: once the block at
    the cursor is complete, the second block is not waited for."""
    codec = tiny.codec
    unit = codec.encode("return a + b\n\nprint(add(1, 2))\n")
    answer = Stream([unit + codec.encode("x") * (32 - len(unit)), codec.encode("y") * 32], hold_after=1)
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                done = await ask(client, infill(client, "def add(a, b):\n    ", "\n"))
                assert await asyncio.to_thread(fake.wait_abort, fake.generated[0]["rid"])
    assert (done.text, done.stopped) == ("return a + b", "unit")


# --- token healing without a first-token constraint ---------------------------------------------------------------
@pytest.mark.parametrize("generated, expected", [("assertEqual(x, 1)", "qual(x, 1)"), ("print(x)", "")],
                         ids=["extends-the-word", "leaves-the-word"])  # fmt: skip
async def test_a_partial_word_is_cut_from_the_prompt_and_must_be_rewritten(short_dir, tiny, generated, expected):
    codec = tiny.codec
    answer = Stream([codec.encode(generated) + [codec.special.eos]], {"type": "stop", "matched": codec.special.eos})
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                done = await ask(client, infill(client, "self.assertE", "\n"))
    sent = codec.decode(fake.generated[0]["input_ids"])
    assert sent.endswith("self.") and "assertE" not in sent  # the word's start is where the prompt ends
    assert done.text == expected


# --- which server ---------------------------------------------------------------------------------------------
async def test_quality_requests_go_to_the_quality_server(short_dir, tiny):
    eos = tiny.codec.special.eos
    answer = Stream([tiny.codec.encode(" b") + [eos]], {"type": "stop", "matched": eos})
    with FakeSGLang(lambda body: answer) as speed, FakeSGLang(lambda body: answer) as quality:
        backend = parse_backend(f"sglang+{speed.url},quality={quality.url}")
        async with service_on(backend, short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                await ask(client, infill(client, RETURN, mode="quality"))
                assert (len(speed.generated), len(quality.generated)) == (0, 1)
                await ask(client, infill(client, RETURN, mode="speed"))
                assert (len(speed.generated), len(quality.generated)) == (1, 1)


# --- failures -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer, kind, says",
    [
        (Status(500, {"error": {"message": "CUDA error: out of memory"}}), "internal",
         "failed (500): CUDA error: out of memory"),
        (Status(400, {"object": "error", "message": "The input (900 tokens) is longer than the model's context "
                      "length (512 tokens).", "type": "BadRequest", "code": 400}), "too_long", "longer than"),
        (StreamError("Invalid input_ids"), "internal", "Invalid input_ids"),
        (Stream([[5, 6]], {"type": "abort", "message": "KV cache pool is full", "status_code": 503}), "internal",
         "aborted the request: KV cache pool is full"),
    ],
    ids=["http-500", "http-400-too-long", "error-in-stream", "aborted-by-sglang"],
)  # fmt: skip
async def test_a_server_error_is_a_failure_that_says_what_sglang_said(short_dir, answer, kind, says):
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, infill(client, RETURN))
                assert (await client.status()).state == "ready"  # one request failed, the server is fine
    assert failure.value.kind == kind and says in failure.value.message and fake.url in failure.value.message


async def test_a_stream_cut_short_asks_the_server_at_once_and_the_status_says_so(short_dir, tiny):
    def dying(body: dict) -> Stream:  # the server goes down under the request: its stream ends unfinished
        fake.health = 503
        return Stream([tiny.codec.encode(" b")], finish=None)

    with FakeSGLang(dying) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, infill(client, RETURN))
                assert failure.value.kind == "no_model" and "ended the stream" in failure.value.message
                status = await client.status()  # known now, not at the next probe (15 s while ready)
                assert status.state == "loading" and "503" in status.message, status


async def test_a_server_that_stops_answering_is_a_timeout_not_a_hang(short_dir):
    with FakeSGLang(lambda body: Silent()) as fake:
        backend = SGLangBackend(fake.url).configured(None, 0.3)
        async with service_on(backend, short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, infill(client, RETURN))
    assert failure.value.kind == "busy" and "sent nothing for 0.3 s" in failure.value.message


async def test_a_loading_server_is_said_in_status_and_refused_until_it_is_up(short_dir, tiny):
    eos = tiny.codec.special.eos
    answer = Stream([tiny.codec.encode(" b") + [eos]], {"type": "stop", "matched": eos})
    with FakeSGLang(lambda body: answer) as fake:
        fake.health = 503
        async with service_on(SGLangBackend(fake.url), short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                status = await wait_status(client, lambda s: s.message is not None and "503" in s.message)
                assert status.state == "loading" and status.progress == 0
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, infill(client, RETURN))
                assert failure.value.kind == "no_model" and "loading" in failure.value.message
                assert fake.generated == []  # refused here, not queued behind the warm-up
                fake.health = 200
                await wait_status(client, lambda s: s.state == "ready")
                assert (await ask(client, infill(client, RETURN))).text == " b"


async def test_a_server_that_is_not_there_is_said_in_status_and_fails_at_once(short_dir):
    url = f"http://127.0.0.1:{closed_port()}"
    async with service_on(SGLangBackend(url), short_dir) as (address, _):
        async with await EngineClient.connect(address, "editor") as client:
            status = await wait_status(client, lambda s: s.message is not None and "cannot be reached" in s.message)
            assert status.state == "loading" and url in status.message
            with pytest.raises(EngineFailure) as failure:
                await ask(client, infill(client, RETURN))
    assert failure.value.kind == "no_model" and "cannot be reached" in failure.value.message


@pytest.mark.parametrize("key, says", [("wrong", "refused the API key"), (None, "wants an API key")],
                         ids=["wrong-key", "no-key"])  # fmt: skip
async def test_a_wrong_api_key_is_an_auth_error_in_status_and_answers(short_dir, key, says):
    with FakeSGLang(lambda body: Status(500, {}), api_key="right") as fake:
        backend = SGLangBackend(fake.url, api_key=key)
        async with service_on(backend, short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                status = await wait_status(client, lambda s: s.state == "error")
                assert says in status.error and "401" in status.error
                with pytest.raises(EngineFailure) as failure:
                    await ask(client, infill(client, RETURN))
    assert failure.value.kind == "auth" and says in failure.value.message
    assert fake.generated == []


async def test_the_right_api_key_is_sent_as_a_bearer_token(short_dir, tiny, tmp_path):
    eos = tiny.codec.special.eos
    answer = Stream([tiny.codec.encode(" b") + [eos]], {"type": "stop", "matched": eos})
    key_file = tmp_path / "key"
    key_file.write_text("right\n")
    key_file.chmod(0o600)
    with FakeSGLang(lambda body: answer, api_key="right") as fake:
        backend = SGLangBackend(fake.url).configured(str(key_file), 30)
        async with service_on(backend, short_dir) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                assert (await ask(client, infill(client, RETURN))).text == " b"
    assert fake.headers[0]["Authorization"] == "Bearer right"


# --- the real process ---------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_the_engine_command_serves_with_the_sglang_backend_and_stops_cleanly(short_dir, tiny, tmp_path):
    """`llada-lsp engine --backend sglang+URL` as a user starts it: it serves, sends the key, and on
    SIGTERM aborts what is in flight and exits 0."""
    eos = tiny.codec.special.eos
    key_file = tmp_path / "key"
    key_file.write_text("right")
    key_file.chmod(0o600)
    answers = iter([Stream([tiny.codec.encode(" b") + [eos]], {"type": "stop", "matched": eos}),
                    Stream([tiny.codec.encode(BODY)[:32], [eos]], hold_after=1)])  # fmt: skip
    with FakeSGLang(lambda body: next(answers), api_key="right") as fake:
        address = Address("unix", str(short_dir / "e.sock"))
        log = tmp_path / "engine.log"
        command = [sys.executable, "-m", "llada_lsp", "engine", "--listen", str(address), "--backend",
                   f"sglang+{fake.url}", "--backend-token-file", str(key_file)]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stderr=out, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client = await EngineClient.connect(address, "editor")
                    break
                except EngineFailure:
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                    await asyncio.sleep(0.05)  # the process is importing: nothing to await but its socket
            async with client:
                assert (await ask(client, infill(client, RETURN))).text == " b"
                first = asyncio.Event()
                held = asyncio.ensure_future(client.request(infill(client, "def f():\n    ", drafts=True),
                                                           lambda step, text: first.set()))  # fmt: skip
                await asyncio.wait_for(first.wait(), WAIT)
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(proc.wait, WAIT) == 0, log.read_text()
                with pytest.raises(EngineFailure):
                    await asyncio.wait_for(held, WAIT)
            assert fake.aborts == [fake.generated[1]["rid"]], log.read_text()
            assert all(h["Authorization"] == "Bearer right" for h in fake.headers)
            assert "Traceback" not in log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# --- pure parts -------------------------------------------------------------------------------------------------
def test_a_backend_is_native_or_sglang_urls():
    assert parse_backend("native") is None
    both = parse_backend("sglang+http://gpu1:30000/,quality=https://gpu2:30001")
    assert (both.url("speed"), both.url("quality")) == ("http://gpu1:30000", "https://gpu2:30001")
    alone = parse_backend("sglang+http://gpu1:30000")
    assert alone.url("quality") == "http://gpu1:30000" and alone.urls == {"http://gpu1:30000": "speed and quality"}
    assert str(both) == "sglang+http://gpu1:30000,quality=https://gpu2:30001"
    assert "right" not in repr(SGLangBackend("http://h:1", api_key="right"))  # a key never reaches a log
    for bad in ["sglang", "sglang+gpu1:30000", "sglang+ftp://gpu1", "sglang+http://gpu1:30000/generate",
                "sglang+http://a:1,fast=http://b:2", "sglang+http://a:1,quality=http://b:2,quality=http://c:3",
                "sglang+http://a:99999", "vllm+http://a:1"]:  # fmt: skip
        with pytest.raises(ValueError):
            parse_backend(bad)


def test_the_command_line_refuses_a_bad_backend_before_starting(capsys):
    for argv, says in [(["--backend", "sglang+ftp://x"], "not a server's address"),
                       (["--backend-token-file", "/nonexistent"], "is for --backend"),
                       (["--backend", "sglang+http://h:1", "--backend-token-file", "/nonexistent"], "nonexistent"),
                       (["--backend", "sglang+http://h:1", "--backend-timeout", "0"], "above 0")]:  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            engine.engine_main(argv)
        assert exited.value.code == 2 and says in capsys.readouterr().err
    args = engine.parser().parse_args(["--backend", "sglang+http://h:1,quality=http://h:2"])
    assert args.backend == parse_backend("sglang+http://h:1,quality=http://h:2")
    assert engine.parser().parse_args([]).backend is None


def test_streamed_ids_are_read_whole_or_incremental_by_their_count():
    cumulative = [{"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}},
                  {"output_ids": [1, 2, 3, 4], "meta_info": {"completion_tokens": 4}}]  # fmt: skip
    incremental = [{"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}},
                   {"output_ids": [3, 4], "meta_info": {"completion_tokens": 4}}]  # fmt: skip
    for chunks in (cumulative, incremental):
        ids: list[int] = []
        for chunk in chunks:
            ids = merge_output(ids, chunk)
        assert ids == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        merge_output([], {"output_ids": ["a"]})


def test_the_documented_server_configs_are_the_native_presets():
    """docs/sglang.md's two YAML files give each SGLang server the thresholds of the native mode it stands for."""
    from llada_lsp.engine.policy import PRESETS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sglang.md").read_text()
    for mode in MODES:
        block = re.search(rf"```yaml\n# sglang-{mode}.yaml\n(.*?)```", doc, re.S)
        assert block, f"docs/sglang.md has no sglang-{mode}.yaml"
        config = dict(re.findall(r"^(\w+): ([\d.]+)", block.group(1), re.M))
        assert float(config["threshold"]) == PRESETS[mode].threshold
        assert float(config["edit_threshold"]) == PRESETS[mode].editing_threshold
        assert int(config["block_size"]) == 32


# --- LLaDA2.2 ------------------------------------------------------------------------------------------------
def test_the_algorithm_files_hold_the_native_presets_thresholds():
    from llada_lsp.backends.sglang_config import THRESHOLDS
    from llada_lsp.engine.policy import PRESETS

    assert {mode: (PRESETS[mode].threshold, PRESETS[mode].editing_threshold) for mode in MODES} == THRESHOLDS


@pytest.mark.parametrize(
    ("raw", "edit_ids", "algorithm", "override", "block"),
    [
        ({}, None, "JointThreshold", None, 32),
        ({"expert_capacity": 48, "block_size": 32, "delete_token_id": 5, "split_token_id": 6}, None,
         "JointThresholdInDel", None, 32),
        ({"expert_capacity": 48, "block_size": 64}, None, "JointThresholdInDel", [156930, 156931], 64),
        ({"expert_capacity": 48, "block_size": 32, "delete_token_id": 5, "split_token_id": 6}, (7, 8),
         "JointThresholdInDel", [7, 8], 32),
    ],
    ids=["llada2.1", "llada2.2-config", "llada2.2-default", "llada2.2-override"],
)  # fmt: skip
def test_a_checkpoints_sglang_launch_names_its_algorithm_edit_ids_and_block(raw, edit_ids, algorithm, override, block):
    """LLaDA2.2 decodes with JointThresholdInDel; edit ids its config does not declare travel as
    SGLang's model override; the algorithm file's block is the checkpoint's routing block."""
    from llada_lsp.backends.sglang_config import sglang_algorithm_config, sglang_instructions, sglang_launch
    from llada_lsp.model.family import family_of

    family = family_of({"vocab_size": 157184, "num_experts": 256, "num_experts_per_tok": 8, **raw}, edit_ids)
    argv = sglang_launch("inclusionAI/LLaDA2.2-flash", family, "quality", 30001)
    assert argv[argv.index("--dllm-algorithm") + 1] == algorithm
    assert argv[argv.index("--dllm-algorithm-config") + 1] == "sglang-quality.yaml"
    assert argv[argv.index("--port") + 1] == "30001"
    given = argv[argv.index("--json-model-override-args") + 1] if "--json-model-override-args" in argv else None
    assert given == (
        None if override is None else json.dumps(dict(zip(("delete_token_id", "split_token_id"), override)))
    )
    config = sglang_algorithm_config(family, "quality")
    assert "threshold: 0.7\nedit_threshold: 0.5\n" in config and f"block_size: {block}\n" in config
    text = sglang_instructions("inclusionAI/LLaDA2.2-flash", family)
    assert text.count("python -m sglang.launch_server") == 2 and "sglang-speed.yaml" in text
    # the version whose flags these are, and what it does that changes answers
    assert "SGLang 0.5.23" in text and "--no-dllm-fdfo" in text and "156895" in text
    assert "routed_scaling_factor" in text


@pytest.fixture(scope="module")
def llada22_tokenizer(tmp_path_factory) -> Path:
    """What the SGLang backend reads of a LLaDA2.2 checkpoint (config.json and the tokenizer; never
    weights): the embedded model's, with LLaDA2.2's keys and two of its tokens as the edit ids."""
    from conftest import LLADA22_EDIT_IDS

    from llada_lsp.model import EMBEDDED_MODEL

    folder = tmp_path_factory.mktemp("llada22-sglang")
    raw = json.loads((EMBEDDED_MODEL / "config.json").read_text())
    raw.update(
        expert_capacity=4, block_size=32, delete_token_id=LLADA22_EDIT_IDS[0], split_token_id=LLADA22_EDIT_IDS[1]
    )
    (folder / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_MODEL / name, folder / name)
    return folder


async def test_edit_ids_in_sglangs_output_never_reach_an_answer_or_a_draft(short_dir, llada22_tokenizer):
    """A server whose output still holds DELETE and INSERT ids (in any block, the last one too): the
    drafts and the answer are the text without them, and status names the family."""
    from conftest import LLADA22_EDIT_IDS

    delete, split = LLADA22_EDIT_IDS
    spec = ModelSpec(str(llada22_tokenizer))
    codec = load_remote_model(spec).codec
    edit_texts = [codec.text_of([t])[0] for t in LLADA22_EDIT_IDS]
    ids = codec.encode(BODY)
    blocks = [[delete, *ids[:30], split], [split, *ids[30:], delete, codec.special.eos]]
    answer = Stream(blocks, {"type": "stop", "matched": codec.special.eos})
    drafts: list[str] = []
    with FakeSGLang(lambda body: answer) as fake:
        async with service_on(SGLangBackend(fake.url), short_dir, spec) as (address, _):
            async with await EngineClient.connect(address, "editor") as client:
                status = await wait_status(client, lambda s: s.state == "ready")
                done = await ask(client, infill(client, "def f():\n    ", "\n", "quality", drafts=True), drafts)
    assert (status.family, status.decoding) == ("LLaDA2.2", "JointThresholdInDel")
    assert done.text == BODY.rstrip() and len(drafts) == 2
    assert not [text for text in [*drafts, done.text] if any(edit.strip() in text for edit in edit_texts)]
