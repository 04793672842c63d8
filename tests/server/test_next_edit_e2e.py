"""Next-edit suggestions end to end: the real server over stdio, with the model in its own process or
in an engine service, asked `llada/nextEdit`, `textDocument/copilotInlineEdit` and code actions after
a rename, as an editor would. The model is the scripted one of tests/hooks/scripted_next_edit.py (the
embedded model was not trained on edits): the history, prompt, wire, gates and ranges are the real ones."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile

import pytest
from lsprotocol import types as t
from pygls.lsp.client import LanguageClient
from test_engine_service_e2e import start_service

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
SOURCE = "def total(values):\n    count = 0\n    for v in values:\n        count += v\n    return count\n"
URI = "file:///tmp/llada-next/total.py"
SCRIPTED = {**os.environ, "LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT": "1"}


def rng(l1: int, c1: int, l2: int, c2: int) -> dict:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


async def start_front(engine: str | None) -> LanguageClient:
    client = LanguageClient("next-edit-e2e", "1")
    flags = ["--engine", engine] if engine else ["--engine", "local", "--threads", "1"]
    await client.start_io(sys.executable, "-m", "llada_lsp", *flags, env=SCRIPTED if engine is None else os.environ)
    await client.initialize_async(t.InitializeParams(capabilities=t.ClientCapabilities()))
    client.initialized(t.InitializedParams())
    return client


def rename(client: LanguageClient) -> int:
    """`count = 0` renamed to `acc = 0`, as typed: the name deleted, then three keystrokes. The version."""
    client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(URI, "python", 1, SOURCE)))
    edits = [((1, 4), (1, 9), "")] + [((1, 4 + i), (1, 4 + i), ch) for i, ch in enumerate("acc")]
    for version, (a, b, text) in enumerate(edits, start=2):
        change = t.TextDocumentContentChangePartial(range=t.Range(t.Position(*a), t.Position(*b)), text=text)
        client.text_document_did_change(t.DidChangeTextDocumentParams(t.VersionedTextDocumentIdentifier(version, URI),
                                                                      [change]))  # fmt: skip
    return len(edits) + 1


async def ask(client: LanguageClient, method: str, version: int, line: int = 1, character: int = 7):
    params = {"textDocument": {"uri": URI, "version": version}, "position": {"line": line, "character": character}}
    return await asyncio.wait_for(client.protocol.send_request_async(method, params), TIMEOUT)


def as_dict(value):
    """pygls hands results of custom methods back as namespaces: plain dicts and lists again."""
    if hasattr(value, "_asdict"):
        return {k: as_dict(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [as_dict(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: as_dict(v) for k, v in vars(value).items()}
    return value


async def code_actions(client: LanguageClient, trigger: t.CodeActionTriggerKind) -> list[t.CodeAction]:
    params = t.CodeActionParams(t.TextDocumentIdentifier(URI), t.Range(t.Position(1, 7), t.Position(1, 7)),
                                t.CodeActionContext([], trigger_kind=trigger))  # fmt: skip
    return await asyncio.wait_for(client.text_document_code_action_async(params), TIMEOUT)


async def check_front(client: LanguageClient) -> None:
    version = rename(client)
    # Any other client: a code action, a versioned edit. Asked on a cursor move (Automatic), it never
    # runs the model; asked by the user (Invoked), it does.
    assert not await code_actions(client, t.CodeActionTriggerKind.Automatic)
    actions = await code_actions(client, t.CodeActionTriggerKind.Invoked)
    assert [a.title for a in actions] == ["Apply suggested edit"]
    change = actions[0].edit.document_changes[0]
    assert change.text_document.version == version and [e.new_text for e in change.edits] == ["acc", "acc"]
    assert [a.title for a in await code_actions(client, t.CodeActionTriggerKind.Automatic)] == ["Apply suggested edit"]
    got = as_dict(await ask(client, "llada/nextEdit", version))
    assert got == {"version": version, "edits": [{"range": rng(3, 8, 3, 13), "newText": "acc"},
                                                 {"range": rng(4, 11, 4, 16), "newText": "acc"}]}  # fmt: skip
    copilot = as_dict(await ask(client, "textDocument/copilotInlineEdit", version))
    assert copilot == {"edits": [{"text": "acc += v\n    return acc", "range": rng(3, 8, 4, 16),
                                  "textDocument": {"uri": URI, "version": version}}]}  # fmt: skip
    # A version the document is no longer at gets no edit, whichever method asks.
    assert as_dict(await ask(client, "llada/nextEdit", version - 1)) == {"edits": []}
    assert as_dict(await ask(client, "textDocument/copilotInlineEdit", version + 1)) == {"edits": []}
    # The baseline without history has nothing to go on; the feature switched off answers nothing.
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams({"llada": {"nextEditHistory": False}}))
    assert as_dict(await ask(client, "llada/nextEdit", version)) == {"edits": []}
    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams({"nextEditHistory": True, "nextEdit": False})
    )
    assert as_dict(await ask(client, "llada/nextEdit", version)) == {"edits": []}


async def stop_front(client: LanguageClient) -> None:
    await asyncio.wait_for(client.shutdown_async(None), 30)
    client.exit(None)
    await client.stop()


async def test_next_edit_over_stdio_with_the_model_in_process():
    client = await start_front(None)
    try:
        await check_front(client)
    finally:
        await stop_front(client)


async def test_next_edit_through_the_engine_service():
    folder = tempfile.mkdtemp(prefix="ll")
    socket, log = os.path.join(folder, "engine.sock"), os.path.join(folder, "engine.log")
    service: subprocess.Popen = start_service(socket, log, env=SCRIPTED)
    try:
        client, other = await start_front(f"unix:{socket}"), await start_front(f"unix:{socket}")
        try:
            await check_front(client)
            maps = open(f"/proc/{client._server.pid}/maps").read()
            assert "libtorch" not in maps, "the front never ran the model: the service did"
            # Another editor on the same service, the same file as the first left it: its history is
            # its own (empty), so the first one's rename suggests nothing to it.
            renamed = SOURCE.replace("count", "acc", 1)
            other.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(URI, "python", 1, renamed)))
            assert as_dict(await ask(other, "llada/nextEdit", 1)) == {"edits": []}
        finally:
            await stop_front(client)
            await stop_front(other)
    finally:
        service.terminate()
        assert service.wait(timeout=30) == 0
