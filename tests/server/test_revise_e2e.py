"""Revisions end to end (issue 26): the real server over stdio, and two fronts on one engine service,
typing as an editor sends it (didChange, then inlineCompletion). The engine's canvases are read from
the test hook's log (tests/hooks/sitecustomize.py): a warm start's sequence begins with the rest of
the suggestion, a cold one with masks. With `revise: false` every answer is the cold-start answer."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

import pytest
from lsprotocol import types as t
from pygls.lsp.client import LanguageClient

from llada_lsp.backends.base import load_codec
from llada_lsp.backends.native import load
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill
from llada_lsp.completion.pipeline import run_infill

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
SOURCE = "def average(values):\n    return sum\n\n\ndef add(a, b):\n    return a + b\n"
URI = "file:///tmp/llada-revise/calc.py"
AT = (1, 14)  # after "return sum": the embedded model answers "(values)"


class Front:
    """One `llada-lsp` process over stdio, as one editor starts it, and its open document."""

    def __init__(self, *flags: str, options: dict | None = None, env: dict | None = None):
        self.flags, self.options, self.env = flags, options, env
        self.client = LanguageClient("revise-e2e", "1")
        self.client.feature(t.WINDOW_LOG_MESSAGE)(lambda params: None)
        self.text, self.version = SOURCE, 1

    async def start(self) -> Front:
        await self.client.start_io(sys.executable, "-m", "llada_lsp", "--threads", "1", *self.flags,
                                   env={**os.environ, **(self.env or {})})  # fmt: skip
        params = t.InitializeParams(capabilities=t.ClientCapabilities(), initialization_options=self.options)
        await asyncio.wait_for(self.client.initialize_async(params), TIMEOUT)
        self.client.initialized(t.InitializedParams())
        self.client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(URI, "python", 1, SOURCE)))
        for _ in range(300):  # completions asked while the model loads answer nothing at once (issue 24)
            if (await self.status())["state"] != "loading":
                break
            await asyncio.sleep(0.2)
        return self

    def type(self, line: int, character: int, text: str) -> None:
        """Inserts `text` at (line, character), as one keystroke's didChange (no line ends in `text`)."""
        lines = self.text.split("\n")
        lines[line] = lines[line][:character] + text + lines[line][character:]
        self.text, self.version = "\n".join(lines), self.version + 1
        change = t.TextDocumentContentChangePartial(range=t.Range(t.Position(line, character), t.Position(line, character)),
                                                    text=text)  # fmt: skip
        document = t.VersionedTextDocumentIdentifier(version=self.version, uri=URI)
        self.client.text_document_did_change(t.DidChangeTextDocumentParams(document, [change]))

    async def inline(self, line: int, character: int) -> str:
        params = t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(URI), position=t.Position(line, character),
            context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Automatic),
        )  # fmt: skip
        answer = await asyncio.wait_for(self.client.text_document_inline_completion_async(params), TIMEOUT)
        return answer.items[0].insert_text if answer and answer.items else ""

    async def status(self) -> dict:
        return await self.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))

    async def stop(self) -> None:
        await asyncio.wait_for(self.client.shutdown_async(None), TIMEOUT)
        self.client.exit(None)
        await self.client.stop()


class Canvases:
    """The test hook's log: one line per sequence the engine took."""

    def __init__(self):
        self.path = os.path.join(tempfile.mkdtemp(prefix="llrev"), "canvas.jsonl")
        self.seen = 0
        self.codec = load_codec(None, "embedded")

    @property
    def env(self) -> dict:
        return {"LLADA_LSP_TEST_CANVAS_LOG": self.path}

    def new(self) -> list[str]:
        """The drafts of the sequences started since the last call ("" for a cold start: all masks)."""
        with open(self.path) as log:
            lines = log.read().splitlines()
        fresh, self.seen = lines[self.seen :], len(lines)
        out = []
        for line in fresh:
            entry = json.loads(line)
            ids = [i for i in entry["canvas"] if i != entry["mask"]]
            assert entry["canvas"][: len(ids)] == ids, "a draft comes first, the masks after it"
            out.append(self.codec.decode(ids))
        return out


async def type_through(front: Front, canvases: Canvases, first: str, keystrokes: int) -> list[tuple[str, str]]:
    """Types the first characters of `first` (the suggestion at AT) one by one; (answer, canvas) each."""
    out = []
    for k in range(1, keystrokes + 1):
        front.type(AT[0], AT[1] + k - 1, first[k - 1])
        answer = await front.inline(AT[0], AT[1] + k)
        (canvas,) = canvases.new()
        out.append((answer, canvas))
    return out


async def test_typing_through_warm_starts_and_anything_else_starts_cold():
    canvases = Canvases()
    front = await Front(env=canvases.env).start()
    try:
        status = await front.status()
        for _ in range(300):  # completions asked while the model loads answer nothing at once (issue 24)
            if status["state"] != "loading":
                break
            await asyncio.sleep(0.2)
            status = await front.status()
        assert status["revise"] is True and "reviseNote" not in status, status
        first = await front.inline(*AT)
        assert first == "(values)" and canvases.new() == [""], "the first request is a cold start"
        steps = await type_through(front, canvases, first, 3)
        for k, (answer, canvas) in enumerate(steps, start=1):
            assert canvas.startswith(first[k:]) or first[k:] in canvas, (k, canvas)
            assert answer == first[k:], "the model still agrees: the rest of the suggestion"
        assert front.text.split("\n")[1] == "    return sum" + first[:3]
        # A divergent keystroke: the suggestion does not go on with it.
        front.type(AT[0], AT[1] + 3, "Q")
        await front.inline(AT[0], AT[1] + 4)
        assert canvases.new() == [""], "a keystroke the suggestion does not begin with starts cold"
        # A cursor jump: the same document, elsewhere.
        await front.inline(5, 14)
        assert canvases.new() == [""], "the cursor moved elsewhere: a cold start"
    finally:
        await front.stop()


async def test_revise_false_answers_are_the_cold_start_answers():
    """The same typing with `revise: false` (the setting; `--no-revise` the same by the command line):
    every sequence starts from masks, and every answer is what a cold start computes."""
    canvases = Canvases()
    front = await Front("--no-revise", options={"revise": False}, env=canvases.env).start()
    typed_answers = []
    try:
        status = await front.status()
        assert status["revise"] is False, status
        first = await front.inline(*AT)
        assert first and canvases.new() == [""]
        steps = await type_through(front, canvases, first, 4)
        typed_answers = [answer for answer, _ in steps]
        assert [canvas for _, canvas in steps] == [""] * 4
        assert canvases.new() == [], "one sequence per request"
    finally:
        await front.stop()
    model = load(ModelSpec(None), lambda *_: None)
    line = SOURCE.split("\n")[1]
    offset = SOURCE.index(line) + AT[1]
    for k, answer in enumerate(typed_answers, start=1):
        text = SOURCE[:offset] + first[:k] + SOURCE[offset:]
        cold = run_infill(model, Infill.at(text, offset + k, "speed", 64, 1024), _Never(), lambda *_: None)
        assert answer == cold.text, k


class _Never:
    def is_set(self) -> bool:
        return False


def start_service(socket: str, log_path: str, env: dict):
    import subprocess
    import time
    from pathlib import Path

    with open(log_path, "a") as log:
        process = subprocess.Popen([sys.executable, "-m", "llada_lsp", "engine", "--listen", f"unix:{socket}",
                                    "--threads", "1", "--log-level", "info"], stderr=log, env={**os.environ, **env})  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while "load embedded: done" not in Path(log_path).read_text():
        assert process.poll() is None and time.monotonic() < deadline, Path(log_path).read_text()
        time.sleep(0.2)
    return process


async def test_through_the_service_a_suggestion_warms_only_its_own_client():
    """Two editors on the same file through one engine service: each front remembers what it showed,
    so the other's typing through the same characters starts cold."""
    canvases = Canvases()
    folder = tempfile.mkdtemp(prefix="ll")
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    service = start_service(socket, log, canvases.env)
    a, b = Front("--engine", f"unix:{socket}"), Front("--engine", f"unix:{socket}")
    try:
        await a.start()
        await b.start()
        shown = await a.inline(*AT)
        assert shown == "(values)" and canvases.new() == [""]
        # B types what A was shown, without ever being shown it: a cold start.
        b.type(AT[0], AT[1], shown[0])
        assert await b.inline(AT[0], AT[1] + 1) == shown[1:]
        assert canvases.new() == [""], "another client's suggestion never warms this one's request"
        # A types through its own suggestion: a warm start through the service.
        a.type(AT[0], AT[1], shown[0])
        assert await a.inline(AT[0], AT[1] + 1) == shown[1:]
        (canvas,) = canvases.new()
        assert shown[1:] in canvas, canvas
        # And B, now shown a suggestion, revises its own.
        b.type(AT[0], AT[1] + 1, shown[1])
        assert await b.inline(AT[0], AT[1] + 2) == shown[2:]
        (canvas,) = canvases.new()
        assert shown[2:] in canvas, canvas
    finally:
        for front in (a, b):
            await front.stop()
        service.terminate()
        assert service.wait(timeout=30) == 0
