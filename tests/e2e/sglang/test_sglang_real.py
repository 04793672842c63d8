"""The SGLang backend against a real SGLang 0.5.23 on this CPU (tests/backends/test_sglang.py has the fake one).

One module, two servers for all of it (each start is 20-60 s and ~3.5 GB): the speed server with
first-done-first-out on (0.5.23's default: an object per denoising step) and the quality server with
`--no-dllm-fdfo` (an object per finished block), both on a checkpoint made from the embedded model
(sglang_harness.py says why it is not the embedded model itself). `llada-lsp engine --backend
sglang+SPEED,quality=QUALITY` serves them to an EngineClient and to two `llada-lsp` fronts over stdio.
The last test kills the speed server mid-request and starts it again.

Skipped, with the install's reason, where tests/e2e/sglang/install.sh has not installed SGLang.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from lsprotocol import types as t
from sglang_harness import Server, make_checkpoint, sglang_python, start_server
from test_engine_service_e2e import Front as ServiceFront

from llada_lsp import wire
from llada_lsp.service.client import EngineClient, EngineFailure

PYTHON, WHY = sglang_python()
if PYTHON is None:
    pytest.skip(WHY, allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
WAIT = 600.0  # seconds one answer may take: SGLang's CPU path on a loaded 2-core machine can take minutes
# (threshold, edit_threshold) of each server: the native presets (engine/policy.py), as plan --sglang
THRESHOLDS = {"speed": (0.5, 0.0), "quality": (0.7, 0.5)}
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n",
]


class Cluster:
    """The checkpoint, the two servers and the engine service in front of them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.model = make_checkpoint(folder / "model")
        self.servers: dict[str, Server] = {}
        self.engine: subprocess.Popen | None = None
        self.socket = Path(tempfile.mkdtemp(prefix="ll", dir="/tmp")) / "e.sock"  # AF_UNIX paths are short
        self.engine_log = folder / "engine.log"

    def start_server(self, mode: str, port: int | None = None) -> Server:
        threshold, edit = THRESHOLDS[mode]
        server = start_server(PYTHON, self.model, self.folder, threshold=threshold, edit_threshold=edit,
                              fdfo=mode == "speed", port=port, name=mode)  # fmt: skip
        self.servers[mode] = server
        return server

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    def start_engine(self) -> None:
        backend = f"sglang+{self.servers['speed'].url},quality={self.servers['quality'].url}"
        with self.engine_log.open("ab") as log:
            self.engine = subprocess.Popen(
                [sys.executable, "-m", "llada_lsp", "engine", "--listen", self.address, "--model", str(self.model),
                 "--backend", backend, "--backend-timeout", str(WAIT), "--log-level", "info"],
                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def log(self) -> str:
        return self.engine_log.read_text(errors="replace")

    def stop(self) -> None:
        if self.engine is not None and self.engine.poll() is None:
            self.engine.terminate()
            try:
                self.engine.wait(30)
            except subprocess.TimeoutExpired:
                self.engine.kill()
        for server in self.servers.values():
            server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("sglang"))
    try:
        for mode in THRESHOLDS:  # both load at once
            cluster.start_server(mode)
        for server in cluster.servers.values():
            server.wait_ready()
        cluster.start_engine()
        yield cluster
    finally:
        cluster.stop()


async def connect(cluster: Cluster) -> EngineClient:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await EngineClient.connect(cluster.address, "sglang-e2e")
        except Exception:
            if time.monotonic() > deadline or cluster.engine.poll() is not None:
                raise AssertionError(f"the engine service did not come up:\n{cluster.log()[-3000:]}") from None
            await asyncio.sleep(0.5)


async def wait_state(client: EngineClient, state: str, timeout: float = WAIT) -> wire.Status:
    deadline = time.monotonic() + timeout
    while True:
        status = await client.status()
        if status.state == state:
            return status
        assert time.monotonic() < deadline, f"the service stayed {status.state}: {status.error or status.message}"
        await asyncio.sleep(0.5)


def infill(client: EngineClient, before: str, after: str, mode: str, max_tokens: int = 64) -> wire.Infill:
    return wire.Infill(client.next_id(), f"{mode}.py", before, after, mode, max_tokens, 1024, True)


async def ask(client: EngineClient, request: wire.Infill) -> tuple[wire.Done, list[tuple[int, str]]]:
    drafts: list[tuple[int, str]] = []
    done = await asyncio.wait_for(client.request(request, lambda step, text: drafts.append((step, text))), WAIT)
    return done, drafts


def generate(url: str, prompt_ids: list[int], max_new_tokens: int, stream: bool) -> list[dict]:
    """SGLang's /generate as the backend asks it (greedy), without the backend: every streamed object."""
    body = {"input_ids": prompt_ids, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}}  # fmt: skip
    request = urllib.request.Request(f"{url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=WAIT) as answer:
        if not stream:
            return [json.loads(answer.read())]
        objects = []
        for line in answer:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                objects.append(json.loads(line.removeprefix("data:")))
        return objects


# --- what SGLang streams, and the same tokens as the native engine ------------------------------------------
@pytest.mark.parametrize("mode", ["speed", "quality"], ids=["speed-fdfo-on", "quality-fdfo-off"])
def test_sglang_streams_the_native_engines_tokens(cluster, mode):
    """The same checkpoint, prompts and thresholds: SGLang's ids are the native engine's, over several
    blocks. The stream's shape is the server's: with FDFO (the speed server) objects repeat the output
    until a block finishes; without it (the quality server) every object but the first adds a block.
    Blocks are the model's, at absolute positions: the first ends where the prompt's last block does."""
    import torch

    from llada_lsp import generate as native_generate
    from llada_lsp import load_model
    from llada_lsp.model.loader import load_tokenizer

    tokenizer = load_tokenizer(cluster.model)
    model = load_model(cluster.model, device="cpu", dtype=torch.float32)
    threshold, edit = THRESHOLDS[mode]
    for prompt in PROMPTS[:2]:
        ids = tokenizer(prompt)["input_ids"]
        objects = generate(cluster.servers[mode].url, ids, 64, stream=True)
        lengths = [len(o["output_ids"]) for o in objects]
        assert objects[-1]["meta_info"]["finish_reason"] is not None, objects[-1]
        theirs = objects[-1]["output_ids"]
        ours = native_generate(model, ids, 64, threshold, edit, max_post_steps=16).tokens
        assert len(theirs) > 32 and theirs == ours[: len(theirs)], f"{prompt!r}\nSGLang: {theirs}\nnative: {ours}"
        grew = [b for a, b in zip([0, *lengths], lengths, strict=False) if b > a]
        assert lengths == sorted(lengths) and len(grew) >= 2, lengths
        assert all((len(ids) + n) % 32 == 0 for n in grew[:-1]), (len(ids), lengths)  # whole blocks
        repeats = len(lengths) - len(grew) - lengths.count(0)  # objects that added nothing to some output
        assert (repeats > 0) == (mode == "speed"), f"{mode}: {lengths}"


# --- through the engine service -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["speed", "quality"], ids=["fdfo-on", "fdfo-off"])
async def test_drafts_are_one_per_finished_block_and_never_empty(cluster, mode):
    async with await connect(cluster) as client:
        await wait_state(client, "ready")
        done, drafts = await ask(client, infill(client, "def total(values):\n    ", "\n", mode))
    assert done.text and drafts, (done, drafts)
    assert all(text for _, text in drafts), drafts
    steps = [step for step, _ in drafts]
    # 64 tokens: the rest of the prompt's block, one whole block, part of another
    assert steps == sorted(set(steps)) and len(drafts) <= done.step <= 3, (steps, done)
    assert drafts[-1][1] == done.text or done.text.startswith(drafts[-1][1]) or drafts[-1][1].startswith(done.text)
    blocks = [line for line in cluster.log().splitlines() if " blocks in " in line]
    assert blocks and f"{done.step} blocks in" in blocks[-1], blocks[-3:]


class Front(ServiceFront):
    """An editor's `llada-lsp` front over stdio on the service, in one inline mode."""

    def __init__(self, cluster: Cluster, mode: str):
        super().__init__(cluster.address)
        self.cluster, self.mode = cluster, mode

    async def start(self) -> Front:
        await self.launch(["--engine", self.cluster.address], {"inlineMode": self.mode})
        return self

    def open(self, name: str, text: str) -> str:
        uri = f"file:///tmp/sglang-e2e/{self.mode}/{name}"
        self.client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, text)))
        return uri

    async def inline(self, uri: str, line: int, character: int):
        params = t.InlineCompletionParams(t.InlineCompletionContext(t.InlineCompletionTriggerKind.Invoked),
                                          t.TextDocumentIdentifier(uri), t.Position(line, character))  # fmt: skip
        return await asyncio.wait_for(self.client.text_document_inline_completion_async(params), WAIT)

    async def status(self) -> dict:
        return await self.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))


SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\nprint(add(1, 2))\n"


async def test_two_fronts_complete_rewrite_and_cancel_while_typing(cluster):
    async with await connect(cluster) as client:
        await wait_state(client, "ready")
    fronts = [await Front(cluster, "speed").start(), await Front(cluster, "quality").start()]
    try:
        # Inline completion on both at once: the speed server (FDFO) and the quality server (no FDFO).
        uris = [front.open("calc.py", "def average(values):\n    return sum\n") for front in fronts]
        answers = await asyncio.gather(*(front.inline(uri, 1, 14) for front, uri in zip(fronts, uris, strict=True)))
        for front, answer in zip(fronts, answers, strict=True):
            assert answer.items and answer.items[0].insert_text, answer
            assert front.drafts and all(d.text for d in front.drafts), front.drafts
            assert front.drafts[-1].final
        # A rewrite of a selection, applied by the editor at the document's version.
        front = fronts[0]
        uri = front.open("rewrite.py", SOURCE)
        argument = {"textDocument": {"uri": uri, "version": 1},
                    "range": {"start": {"line": 5, "character": 0}, "end": {"line": 6, "character": 0}}}  # fmt: skip
        result = await asyncio.wait_for(front.client.workspace_execute_command_async(
            t.ExecuteCommandParams("llada.rewriteSelection", [argument])), WAIT)  # fmt: skip
        print("rewrite answered", result)
        assert "text" in result and (result["applied"] or result.get("reason")), result
        assert len(front.edits) == (1 if result["applied"] else 0), result
        # Typing: each keystroke asks again; the older request is cancelled (and aborted on SGLang).
        front = fronts[1]
        uri = front.open("typing.py", "def average(values):\n    return s\n")
        asks = []
        for version, ch in enumerate("um", start=2):
            change = t.TextDocumentContentChangePartial(range=t.Range(t.Position(1, 12 + version - 2),
                                                                      t.Position(1, 12 + version - 2)), text=ch)  # fmt: skip
            front.client.text_document_did_change(
                t.DidChangeTextDocumentParams(t.VersionedTextDocumentIdentifier(version, uri), [change]))  # fmt: skip
            asks.append(asyncio.ensure_future(front.inline(uri, 1, 12 + version - 1)))
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*asks, return_exceptions=True)
        last = results[-1]
        assert not isinstance(last, BaseException) and last.items, results
        # The superseded keystroke's request answers nothing, or its cancellation; never another failure.
        first = results[0]
        assert not isinstance(first, BaseException) or "cancel" in str(first).lower(), first
        # Both fronts still answer.
        for front in fronts:
            assert (await front.status())["state"] == "ready"
    finally:
        for front in fronts:
            await front.stop()


async def test_next_edit_is_refused_in_words(cluster):
    """Next-edit suggestions start the blocks from the window's text, which SGLang cannot: the editor
    gets a readable refusal, not a hang or a crash, and the service goes on."""
    front = await Front(cluster, "speed").start()
    try:
        uri = front.open("next.py", "def total(values):\n    acc = 0\n    for v in values:\n        count += v\n")
        params = {"textDocument": {"uri": uri, "version": 1}, "position": {"line": 1, "character": 7}}
        try:
            answer = await asyncio.wait_for(front.client.protocol.send_request_async("llada/nextEdit", params), WAIT)
            said = str(answer)
        except Exception as err:  # an LSP error is a readable refusal too
            said = str(err)
        assert "edits" in said or "not supported" in said, said
        assert "not supported on the SGLang backend" in cluster.log() or "edits" in said
        assert (await front.status())["state"] == "ready"
    finally:
        await front.stop()


# --- SGLang killed mid-request, and back ----------------------------------------------------------------------
async def test_sglang_killed_mid_request_fails_in_words_and_the_service_recovers(cluster):
    speed = cluster.servers["speed"]
    front = await Front(cluster, "speed").start()
    try:
        async with await connect(cluster) as client:
            await wait_state(client, "ready")
            # Frozen right after the request leaves, then killed: the request is surely in flight.
            request = infill(client, "class Stack:\n    def __init__(self):\n        ", "\n", "speed", 128)
            asked = asyncio.ensure_future(client.request(request))
            await asyncio.sleep(0.2)
            os.killpg(speed.process.pid, signal.SIGSTOP)
            assert not asked.done(), "the request ended before SGLang could be killed under it"
            speed.kill()
            with pytest.raises(EngineFailure) as failure:
                await asyncio.wait_for(asked, WAIT)
            assert failure.value.kind == "no_model" and "SGLang at " + speed.url in str(failure.value), failure.value
            # The fronts keep working: a new request fails at once, in words; the status says why.
            uri = front.open("down.py", "def average(values):\n    return sum\n")
            try:  # the front answers nothing, or the failure in words
                answer = await front.inline(uri, 1, 14)
                assert answer is None or not answer.items, answer
            except Exception as err:
                assert "SGLang at" in str(err), err
            # Pushed to the front at most every 0.25 s (STATUS_INTERVAL), and known without waiting for
            # the next probe (15 s while ready): a second is plenty.
            deadline = time.monotonic() + 5
            while (status := await front.status())["state"] == "ready" and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert status["state"] != "ready", status
            # SGLang back on its port: the service finds it (it asks every 2 s) and answers again.
            cluster.start_server("speed", port=speed.port).wait_ready()
            await wait_state(client, "ready")
            answer = await front.inline(uri, 1, 14)
            assert answer.items and answer.items[0].insert_text
    finally:
        await front.stop()
