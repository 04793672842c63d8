"""Context beyond the file through the real server over stdio, as an editor drives it: the snippets a
completion's prompt starts with come from the workspace files the document imports and the other open
documents, never from outside the workspace; the set stays while the user types on one line; a closed
document is never used again; `llada/context` chunks are taken (and refused when too large); a set that
changes while the user is idle is prefilled; and two editors of one engine service never see each
other's documents in their prompts. What the server chose is read from its log (window/logMessage),
what the service was sent from the service's log."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llada_lsp.lsp_client import LspClient, position

pytestmark = pytest.mark.slow

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
GEOMETRY = "def rectangle_area(width, height):\n    return width * height\n\n\ndef triangle_area(base, height):\n" \
           "    return base * height / 2\n"  # fmt: skip
NETWORK = (
    "import socket\n\n\ndef open_connection(host, port, timeout):\n    return socket.create_connection((host, port))\n"
)
MAIN = "from pkg.geometry import rectangle_area\nfrom pkg import escape\n\n\ndef total(width, height):\n    return "


class Editor:
    """One `llada-lsp` over stdio and the context lines of its log."""

    def __init__(self, client: LspClient):
        self.client, self.logs = client, []
        client.on("window/logMessage", lambda params: self.logs.append(params["message"]))

    @classmethod
    async def start(cls, workspace: Path, options: dict | None = None, engine: str = "local") -> Editor:
        command = [sys.executable, "-m", "llada_lsp", "--engine", engine, "--threads", "1"]
        editor = cls(await LspClient.start(command, stderr="discard"))
        await editor.client.initialize(options={"maxCompletionTokens": 8, **(options or {})},
                                       workspace=workspace.as_uri(), timeout=TIMEOUT)  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        while (await editor.status())["state"] != "ready":
            assert time.monotonic() < deadline, "the model did not load"
            await asyncio.sleep(0.2)
        return editor

    async def status(self) -> dict:
        return await self.client.request("workspace/executeCommand", {"command": "llada.status"}, TIMEOUT)

    def context(self) -> list[str]:
        return [line for line in self.logs if line.startswith("llada: context for ")]

    def send(self, doc, offset: int):
        params = {"textDocument": {"uri": doc.uri}, "position": position(doc, offset, self.client.encoding),
                  "context": {"triggerKind": 1}}  # fmt: skip
        return self.client.send("textDocument/inlineCompletion", params)

    async def complete(self, doc, offset: int):
        return await self.client.result(self.send(doc, offset), TIMEOUT)


def paths(line: str) -> list[str]:
    """The paths of a context log line's snippets (each said as PATH:FIRST-LAST), in its order."""
    return re.findall(r"([^\s,]+):\d+-\d+", line.rpartition(": ")[2])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "geometry.py").write_text(GEOMETRY)
    secret = tmp_path / "secret.py"  # outside the workspace, reached through a link inside it
    secret.write_text("def rectangle_area_secret(width, height):\n    return width\n")
    (ws / "pkg" / "escape.py").symlink_to(secret)
    return ws


async def test_snippets_come_from_imports_and_open_documents_and_stay_within_a_line(workspace: Path):
    editor = await Editor.start(workspace)
    try:
        main = editor.client.did_open((workspace / "pkg" / "main.py").as_uri(), MAIN)
        notes = editor.client.did_open((workspace / "notes.py").as_uri(), NETWORK)
        await editor.complete(main, len(MAIN))
        first = editor.context()
        assert len(first) == 1 and re.search(r"at line 6: pkg/geometry\.py:1-\d+$", first[0]), editor.logs
        # typing on the line: each keystroke asks at once (each supersedes the one before); the words
        # typed are the other document's, yet the set stays until the cursor leaves the line
        requests = []
        for word in ("open_connection(", "host, ", "port, timeout)"):
            editor.client.did_change(main, len(main.text), len(main.text), word)
            requests.append(editor.send(main, len(main.text)))
        await asyncio.gather(*(editor.client.result(r, TIMEOUT) for r in requests), return_exceptions=True)
        assert editor.context() == first, "the set changed while the user typed within a line"
        editor.client.did_change(main, len(main.text), len(main.text), "\n    conn = open_connection(host, port, ")
        await editor.complete(main, len(main.text))
        assert "at line 7: " in editor.context()[-1], editor.context()
        assert sorted(paths(editor.context()[-1])) == ["notes.py", "pkg/geometry.py"], editor.context()
        # a closed document's text is never used again
        editor.client.did_close(notes)
        editor.client.did_change(main, len(main.text), len(main.text), "timeout)\n    again = open_connection(")
        await editor.complete(main, len(main.text))
        assert "at line 8: " in editor.context()[-1] and paths(editor.context()[-1]) == ["pkg/geometry.py"]
        assert not any("secret" in line or "escape" in line for line in editor.logs), "read outside the workspace"
        # a workspace folder the client adds later is read from, as the ones it gave at initialize
        extra = workspace.parent / "extra"
        (extra / "shapes").mkdir(parents=True)
        (extra / "shapes" / "circle.py").write_text("def circle_area_of(radius):\n    return 3.14159 * radius**2\n")
        text = "from shapes.circle import circle_area_of\n\n\ndef disc(radius):\n    return circle_area_of("
        disc = editor.client.did_open((extra / "disc.py").as_uri(), text)
        await editor.complete(disc, len(text))
        assert "shapes/circle.py" not in paths(editor.context()[-1]), "read before it was a workspace folder"
        added = {"added": [{"uri": extra.as_uri(), "name": "extra"}], "removed": []}
        editor.client.notify("workspace/didChangeWorkspaceFolders", {"event": added})
        editor.client.did_change(disc, len(text), len(text), "radius)\n    again = circle_area_of(")
        await editor.complete(disc, len(disc.text))
        assert paths(editor.context()[-1])[0] == "shapes/circle.py", editor.context()  # its definition first
    finally:
        assert await editor.client.shutdown() == 0


async def test_client_chunks_idle_prefill_and_the_setting(workspace: Path):
    editor = await Editor.start(workspace)
    try:
        main = editor.client.did_open((workspace / "pkg" / "main.py").as_uri(), MAIN + "frobnicate_widget(")
        await editor.complete(main, len(main.text))
        assert paths(editor.context()[-1]) == ["pkg/geometry.py"], editor.context()
        # a chunk sent while the user is idle: chosen again after the pause and prefilled (said once)
        chunk = "def frobnicate_widget(widget, level):\n    return widget.frobnicate(level)\n"
        editor.client.notify("llada/context", {"text": chunk, "uri": (workspace / "tools.py").as_uri()})
        editor.client.notify("llada/context", {"text": "x" * 9000})
        deadline = time.monotonic() + TIMEOUT
        while not any("(idle)" in line for line in editor.context()):
            assert time.monotonic() < deadline, editor.logs
            await asyncio.sleep(0.1)
        assert "tools.py" in paths(editor.context()[-1]), editor.context()
        assert any("llada/context: a chunk of 9000 characters" in line for line in editor.logs)
        # the next request on that line uses the set chosen in idle time: it is not chosen again
        said = len(editor.context())
        await editor.complete(main, len(main.text))
        assert len(editor.context()) == said
        # off: no snippets, nothing chosen
        editor.client.notify("workspace/didChangeConfiguration", {"settings": {"llada": {"contextFiles": False}}})
        editor.client.did_change(main, len(main.text), len(main.text), ")\nframe = frobnicate_widget(")
        await editor.complete(main, len(main.text))
        assert len(editor.context()) == said
    finally:
        assert await editor.client.shutdown() == 0


def start_service(socket: str, log_path: str) -> subprocess.Popen:
    with open(log_path, "a") as log:
        process = subprocess.Popen([sys.executable, "-m", "llada_lsp", "engine", "--listen", f"unix:{socket}",
                                    "--threads", "1", "--log-level", "debug"], stderr=log)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while "load embedded: done" not in Path(log_path).read_text():
        assert process.poll() is None and time.monotonic() < deadline, Path(log_path).read_text()
        time.sleep(0.2)
    return process


async def test_two_editors_of_one_service_never_see_each_others_documents(tmp_path: Path):
    folder = tempfile.mkdtemp(prefix="ll")  # a Unix socket path must be short
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    service = start_service(socket, log)
    editors = []
    try:
        for name, module in (("alpha", GEOMETRY), ("beta", NETWORK)):
            ws = tmp_path / name
            (ws / name).mkdir(parents=True)
            (ws / name / f"{name}_only.py").write_text(module)
            editors.append((name, ws, await Editor.start(ws, engine=f"unix:{socket}")))
        for name, ws, editor in editors:
            text = f"from {name}.{name}_only import *\n\n\nvalue = rectangle_area(width, height) + open_connection("
            doc = editor.client.did_open((ws / name / "main.py").as_uri(), text)
            await editor.complete(doc, len(text))
            at = {
                "textDocument": {"uri": doc.uri, "version": doc.version},
                "position": position(doc, 0, editor.client.encoding),
            }
            await editor.client.request("llada/nextEdit", at, TIMEOUT)  # its job carries the snippets too
        # a chunk sent while alpha's user is idle changes its set: the service prefills the new one
        chunk = "def rectangle_area_scaled(width, height, scale):\n    return rectangle_area(width, height) * scale\n"
        editors[0][2].client.notify("llada/context", {"text": chunk, "uri": (tmp_path / "alpha" / "tools.py").as_uri()})
        deadline = time.monotonic() + TIMEOUT
        while "(warm): context" not in Path(log).read_text():
            assert time.monotonic() < deadline, Path(log).read_text()
            await asyncio.sleep(0.1)
        sent: dict[str, set[str]] = {}  # per connection, the paths of the snippets its requests carried
        said = re.findall(r"(infill|next_edit) llada-lsp#(\d+):\d+(?: \(warm\))?: context (.*)", Path(log).read_text())
        for kind, connection, paths in said:
            sent.setdefault(connection, set()).update(paths.split(", "))
        assert {kind for kind, _, _ in said} == {"infill", "next_edit"}, said
        assert sorted(map(sorted, sent.values())) == [["alpha/alpha_only.py", "tools.py"], ["beta/beta_only.py"]], sent
    finally:
        for _, _, editor in editors:
            assert await editor.client.shutdown() == 0
        service.terminate()
        assert service.wait(timeout=30) == 0


async def test_a_huge_open_document_costs_the_prompt_no_more_than_its_share(workspace: Path):
    editor = await Editor.start(workspace, {"contextFilesShare": 75})
    try:
        huge = "def rectangle_area(width, height):\n    return width * height\n\n" * 40_000  # 2.6 MB
        editor.client.did_open((workspace / "huge.py").as_uri(), huge)
        main = editor.client.did_open((workspace / "pkg" / "main.py").as_uri(), MAIN + "rectangle_area(")
        answer = await editor.complete(main, len(main.text))  # a prompt past the model's positions fails the request
        assert isinstance(answer, dict) and "items" in answer
        assert "huge.py:" in editor.context()[-1], editor.context()
    finally:
        assert await editor.client.shutdown() == 0
