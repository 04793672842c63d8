"""One engine for every editor: `llada-lsp engine` on a Unix socket, and two `llada-lsp` fronts over
stdio (real processes, as two editors start them) that use it. Both get inline completions and
drafts, a rewrite is applied, the service loaded the model once, and the fronts never load torch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from lsprotocol import types as t
from pygls.lsp.client import LanguageClient

pytestmark = pytest.mark.slow

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\nprint(add(1, 2))\n"


def start_service(socket: str, log_path: str, env: dict | None = None) -> subprocess.Popen:
    """`llada-lsp engine` on `socket`, returned once its model is loaded (its log may be shared)."""
    loads = lambda: Path(log_path).read_text().count("load embedded: done") if os.path.exists(log_path) else 0  # noqa: E731
    before = loads()
    with open(log_path, "a") as log:
        process = subprocess.Popen([sys.executable, "-m", "llada_lsp", "engine", "--listen", f"unix:{socket}",
                                    "--threads", "1", "--log-level", "info"], stderr=log, env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while loads() == before:
        assert process.poll() is None and time.monotonic() < deadline, Path(log_path).read_text()
        time.sleep(0.2)
    return process


@pytest.fixture
def service():
    folder = tempfile.mkdtemp(prefix="ll")  # a Unix socket path must be short
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    process = start_service(socket, log)
    yield socket, log
    process.terminate()
    assert process.wait(timeout=30) == 0
    assert not os.path.exists(socket), "the service removes its socket when it stops"


class Front:
    """An editor's view of one `llada-lsp` front: its process, drafts and applied edits."""

    def __init__(self, socket: str, by_setting: bool = False):
        self.socket, self.by_setting = socket, by_setting
        self.client = LanguageClient("e2e", "1")
        self.drafts: list = []
        self.edits: list = []
        self.client.feature("llada/draft")(lambda params: self.drafts.append(params))
        self.client.feature(t.WORKSPACE_APPLY_EDIT)(lambda params: self._apply(params))

    def _apply(self, params):
        self.edits.append(params)
        return t.ApplyWorkspaceEditResult(applied=True)

    async def start(self) -> None:
        engine = f"unix:{self.socket}"
        flags = [] if self.by_setting else ["--engine", engine]  # the setting, or the command line's flag
        await self.launch(flags, {"engine": engine} if self.by_setting else None)

    async def launch(self, flags: list[str], options: dict | None) -> None:
        """`llada-lsp FLAGS` over stdio, initialized with drafts, applied edits and `options`."""
        await self.client.start_io(sys.executable, "-m", "llada_lsp", *flags)
        capabilities = t.ClientCapabilities(experimental={"lladaDrafts": True},
                                            workspace=t.WorkspaceClientCapabilities(apply_edit=True))  # fmt: skip
        await self.client.initialize_async(
            t.InitializeParams(capabilities=capabilities, initialization_options=options)
        )
        self.client.initialized(t.InitializedParams())

    @property
    def pid(self) -> int:
        return self.client._server.pid

    async def stop(self) -> None:
        await asyncio.wait_for(self.client.shutdown_async(None), 30)
        self.client.exit(None)
        await self.client.stop()


async def test_two_fronts_share_one_engine(service):
    socket, log = service
    fronts = [Front(socket), Front(socket, by_setting=True)]
    for front in fronts:
        await front.start()
    try:
        for i, front in enumerate(fronts):
            status = await front.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))
            assert status["engine"] == f"unix:{socket}" and status["state"] == "ready", status
            uri = f"file:///tmp/e2e/front{i}.py"
            item = t.TextDocumentItem(uri, "python", 1, "def average(values):\n    return sum\n")
            front.client.text_document_did_open(t.DidOpenTextDocumentParams(item))
        # Both ask at once: the service keys their requests apart, so neither supersedes the other.
        asks = [
            front.client.text_document_inline_completion_async(t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(f"file:///tmp/e2e/front{i}.py"), position=t.Position(1, 14),
                context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Invoked)))
            for i, front in enumerate(fronts)
        ]  # fmt: skip
        answers = await asyncio.wait_for(asyncio.gather(*asks), 120)
        for front, answer in zip(fronts, answers):
            assert answer.items and answer.items[0].insert_text == "(values)"
            assert front.drafts and front.drafts[-1].final and front.drafts[-1].text == "(values)"
        # A rewrite through the service, applied by the editor with the document's version.
        front = fronts[0]
        uri = "file:///tmp/e2e/calc.py"
        front.client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, SOURCE)))
        argument = {"textDocument": {"uri": uri, "version": 1},
                    "range": {"start": {"line": 5, "character": 0}, "end": {"line": 6, "character": 0}}}  # fmt: skip
        result = await front.client.workspace_execute_command_async(
            t.ExecuteCommandParams("llada.rewriteSelection", [argument]))  # fmt: skip
        assert result == {"applied": True, "changed": True, "text": "    return a + b\n"}
        assert len(front.edits) == 1
        # The fronts never loaded the model's libraries; the service loaded the model once.
        for front in fronts:
            maps = Path(f"/proc/{front.pid}/maps").read_text()
            assert "libtorch" not in maps and "torch/lib" not in maps
        assert Path(log).read_text().count("load embedded: done") == 1
    finally:
        for front in fronts:
            await front.stop()


async def test_a_front_falls_back_to_its_own_model_when_no_service_answers(tmp_path):
    """`auto` with nothing at the default socket: the model runs in the front, as out of the box."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # an empty default socket folder
    p = subprocess.run([sys.executable, "-m", "llada_lsp", "complete", "examples/hello.py:12:15"], env=env,
                       capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert p.returncode == 0 and p.stdout == "(values)\n", p.stderr


async def test_the_front_survives_its_service_going_away(tmp_path):
    """The service killed mid-request: the request answers an error within 5 s, the status says the
    engine is unavailable, and once a service is back on the socket the front serves again."""
    folder = tempfile.mkdtemp(prefix="ll")
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    slow = {**os.environ, "LLADA_LSP_TEST_STEP_DELAY_MS": "3000"}
    process = start_service(socket, log, slow)
    front = Front(socket)
    await front.start()
    try:
        uri = "file:///tmp/e2e/gone.py"
        item = t.TextDocumentItem(uri, "python", 1, "def average(values):\n    return sum\n")
        front.client.text_document_did_open(t.DidOpenTextDocumentParams(item))
        params = t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(uri),
            position=t.Position(1, 14),
            context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Invoked),
        )
        asked = asyncio.ensure_future(front.client.text_document_inline_completion_async(params))
        await asyncio.sleep(2)  # the request is inside its first (3 s) step
        process.kill()
        killed = time.monotonic()
        with pytest.raises(Exception) as failure:
            await asyncio.wait_for(asked, 30)
        assert time.monotonic() - killed < 5
        assert "engine service" in str(failure.value) and "gone" in str(failure.value)
        status = await front.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))
        assert status["state"] == "unavailable" and status["engine"] == f"unix:{socket}"
        process.wait(timeout=10)

        process = start_service(socket, log)  # a new service on the leftover socket
        await asyncio.sleep(1.1)  # reconnection is tried at most once a second
        # Editors poll the status while it is unavailable: that is enough to find the service back.
        status = await front.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))
        assert status["state"] == "ready"
        answer = await asyncio.wait_for(front.client.text_document_inline_completion_async(params), 60)
        assert answer.items and answer.items[0].insert_text == "(values)"
    finally:
        await front.stop()
        process.terminate()
        process.wait(timeout=30)


async def test_a_named_service_that_does_not_answer(tmp_path):
    """The front still initializes (the message comes after the initialize result, which some
    clients need), says why in its status, and answers requests with the reason."""
    front = Front(str(tmp_path / "nothing.sock"))
    messages: list = []
    front.client.feature(t.WINDOW_SHOW_MESSAGE)(lambda params: messages.append(params.message))
    await front.start()
    try:
        status = await front.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))
        assert status["state"] == "unavailable" and "nothing.sock" in status["error"]
        uri = "file:///tmp/e2e/none.py"
        front.client.text_document_did_open(
            t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, "x = 1\n"))
        )
        with pytest.raises(Exception, match="service is unreachable"):
            await front.client.text_document_inline_completion_async(t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(uri), position=t.Position(0, 5),
                context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Invoked)))  # fmt: skip
        assert any("cannot use the engine service" in m for m in messages)
    finally:
        await front.stop()


async def test_the_editor_hears_the_service_go_and_come_back(tmp_path):
    """Two editors' statuslines said `ready` after the service was killed, and `unavailable` after it
    was back, until asked. The front pushes llada/status once per change of state, as it happens
    (no request needed), with one window/showMessage for the loss and one for the return. On the way:
    `engine status` counts no batches before any request (the load's warm-up is not served work)."""
    folder = tempfile.mkdtemp(prefix="ll")
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    process = start_service(socket, log)
    asked = subprocess.run([sys.executable, "-m", "llada_lsp", "engine", "status", "--listen", f"unix:{socket}"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert asked.returncode == 0 and "state: ready" in asked.stdout, asked.stderr
    assert "batches" not in asked.stdout, asked.stdout
    assert "kernels: CPU " in asked.stdout, asked.stdout  # the service's kernel backend, in one line
    front = Front(socket)
    pushed: list = []
    messages: list = []
    changed = asyncio.Event()

    def on_status(params) -> None:
        pushed.append(params.state)
        changed.set()

    async def until(state: str) -> None:
        while not pushed or pushed[-1] != state:
            changed.clear()
            await asyncio.wait_for(changed.wait(), 60)

    front.client.feature("llada/status")(on_status)
    front.client.feature(t.WINDOW_SHOW_MESSAGE)(lambda params: messages.append(params))
    await front.start()
    try:
        await until("ready")
        process.kill()
        process.wait(timeout=10)
        await until("unavailable")
        uri = "file:///tmp/e2e/push.py"
        front.client.text_document_did_open(
            t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, "x = 1\n"))
        )
        for _ in range(3):  # requests while it is gone fail, and change nothing more
            with pytest.raises(Exception, match="engine service"):
                await front.client.text_document_inline_completion_async(t.InlineCompletionParams(
                    text_document=t.TextDocumentIdentifier(uri), position=t.Position(0, 5),
                    context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Invoked)))  # fmt: skip
        lost = [m for m in messages if "engine service" in m.message]
        assert len(lost) == 1 and lost[0].type == t.MessageType.Error and "unavailable" in lost[0].message, messages
        process = start_service(socket, log)
        await until("ready")  # found back by the front itself: no request, no llada.status
        # Once per change: found back while the new service still loads, or once it has loaded.
        assert pushed in (["ready", "unavailable", "ready"], ["ready", "unavailable", "loading", "ready"]), pushed
        back = [m for m in messages if "engine service" in m.message][1:]
        assert len(back) == 1 and "back" in back[0].message and back[0].type == t.MessageType.Info, messages
        status = await front.client.workspace_execute_command_async(t.ExecuteCommandParams("llada.status"))
        assert status["state"] == "ready" and status["engine"] == f"unix:{socket}"
    finally:
        await front.stop()
        process.terminate()
        process.wait(timeout=30)
