"""End-to-end: the real server (`python -m llada_lsp`) over stdio with the embedded model, driven by
pytest-lsp as an editor would drive it. Nothing here sleeps: tests await responses and notifications.

One server (drafts on, UTF-16) serves most tests; a second one, slowed by a test hook, serves those
that need a request still running when the next message arrives; others start their own where the
initialization differs. Every server runs the model on one thread: its answers are then the same
from run to run, so tests ask where the embedded model does answer and check what a user would see.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from concurrent.futures import Future
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pygls.protocol import default_converter
from pygls.protocol.json_rpc import JsonRPCRequestMessage
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

from llada_lab.training.train import init_weights
from llada_lsp.backends.native import load
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill
from llada_lsp.completion.pipeline import run_infill
from llada_lsp.model import EMBEDDED_MODEL, LLaDA2, LLaDA2Config, save_model

pytestmark = [
    pytest.mark.slow,  # every test here talks to a real server process
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        not (EMBEDDED_MODEL / "config.json").is_file(), reason="no embedded model in llada_lsp/data/tiny"
    ),
]

TIMEOUT = float(os.environ.get("LLADA_TEST_TIMEOUT", "120"))
SERVER = [sys.executable, "-m", "llada_lsp"]
SOURCE = "def add(a, b):\n    return a + \n\n\ndef sub(a, b):\n    \n\nprint(add(1, 2))\n"
MID_LINE = t.Position(1, 15)  # after "return a + "
EMPTY_LINE = t.Position(5, 4)  # the indented empty line of sub(): the embedded model answers with a block
ANSWERED = t.Position(1, 14)  # after "return a +": the embedded model answers (" b"), at MID_LINE it does not
FILLER = "def f(x):\n    return x * 2  # filler filler filler\n\n"  # 51 characters, 3 lines


class Editor:
    """A pytest-lsp client plus what the server sent it: drafts, applied edits, log lines."""

    def __init__(self, client: LanguageClient):
        self.client = client
        self.drafts: list[Any] = []
        self.edits: list[t.ApplyWorkspaceEditParams] = []
        self.statuses: list[dict] = []  # llada/status pushes
        self.refuse_edits = False
        self.hold_edits = False  # answer workspace/applyEdit only once `released` (as Vim's ALE: never)
        self.released = asyncio.Event()
        self._waiters: list[tuple[Any, Future]] = []
        self._docs = 0
        client.feature("llada/draft")(lambda params: self._on_draft(params))

        async def on_apply_edit(params):  # pygls marks handlers with attributes: a plain function
            return await self._on_apply_edit(params)

        client.feature(t.WORKSPACE_APPLY_EDIT)(on_apply_edit)
        client.feature(t.WINDOW_LOG_MESSAGE)(lambda params: self._on_log(params))
        client.feature("llada/status")(lambda params: self._on_status(params))

    # --- what the server sends ----------------------------------------------------------------
    def _on_draft(self, params) -> None:
        self.drafts.append(params)
        self._wake(params)

    async def _on_apply_edit(self, params: t.ApplyWorkspaceEditParams) -> t.ApplyWorkspaceEditResult:
        self.edits.append(params)
        if self.hold_edits:
            await self.released.wait()
        if self.refuse_edits:
            return t.ApplyWorkspaceEditResult(applied=False, failure_reason="the user undid it")
        return t.ApplyWorkspaceEditResult(applied=True)

    def _on_status(self, params) -> None:
        self.statuses.append(params)
        self._wake(params)

    async def loaded(self) -> Any:
        """The first llada/status past loading (ready, or error)."""
        return await self.until(lambda p: getattr(p, "state", "loading") != "loading", self.statuses)

    def _on_log(self, params: t.LogMessageParams) -> None:
        self.client.log_messages.append(params)
        self._wake(params)

    def _wake(self, params) -> None:
        for predicate, future in list(self._waiters):
            if not future.done() and predicate(params):
                future.set_result(params)

    async def until(self, predicate, seen: list[Any] = ()) -> Any:
        """The first notification (draft or log message) for which `predicate` holds, past or future."""
        for params in seen:
            if predicate(params):
                return params
        future: Future = Future()
        self._waiters.append((predicate, future))
        return await asyncio.wait_for(asyncio.wrap_future(future), TIMEOUT)

    # --- what an editor sends -----------------------------------------------------------------
    def open(self, text: str = SOURCE) -> str:
        self._docs += 1
        uri = f"file:///tmp/llada-test/doc{self._docs}.py"
        self.client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "python", 1, text)))
        return uri

    def change(self, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
        change = t.TextDocumentContentChangePartial(range=t.Range(t.Position(*start), t.Position(*end)), text=text)
        document = t.VersionedTextDocumentIdentifier(version=version, uri=uri)
        self.client.text_document_did_change(t.DidChangeTextDocumentParams(document, [change]))

    async def request(self, method: str, params: Any, msg_id: int | str | None = None) -> Any:
        return await asyncio.wait_for(self.client.protocol.send_request_async(method, params, msg_id=msg_id), TIMEOUT)

    async def inline(self, uri: str, position: t.Position, msg_id: int | None = None) -> t.InlineCompletionList:
        params = t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(uri), position=position,
            context=t.InlineCompletionContext(t.InlineCompletionTriggerKind.Automatic),
        )  # fmt: skip
        return await self.request(t.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id)

    async def command(self, command: str, *arguments, token: str | None = None) -> Any:
        params = t.ExecuteCommandParams(command=command, arguments=list(arguments) or None, work_done_token=token)
        return await self.request(t.WORKSPACE_EXECUTE_COMMAND, params)

    async def raw(self, method: str, params: Any, msg_id: int) -> Any:
        """A request with params sent as given, past the client's own typing (pygls internals)."""
        protocol = self.client.protocol
        future: Future = Future()
        protocol._request_futures[msg_id] = future
        protocol._send_data(JsonRPCRequestMessage(id=msg_id, method=method, jsonrpc="2.0", params=params))
        return await asyncio.wait_for(asyncio.wrap_future(future), TIMEOUT)


def make_client() -> LanguageClient:
    """pytest-lsp's client, with its logMessage handler left for Editor to install (it wakes waiters)."""
    client = LanguageClient(converter_factory=default_converter)
    register_lsp_features(client, {m: f for m, f in DEFAULT_CLIENT_FEATURES.items() if m != t.WINDOW_LOG_MESSAGE})
    return client


async def start(*, drafts: bool = True, encodings: list[str] | None = None, options: dict | None = None,
                env: dict[str, str] | None = None, threads: int = 1, wait: bool = True,
                workspace: t.WorkspaceClientCapabilities | None = None) -> Editor:  # fmt: skip
    """One model thread by default: the answers do not depend on the machine's core count. Returned
    once the model has loaded (`wait`): completions asked before are answered with nothing."""
    command = SERVER + ["--threads", str(threads)]
    config = ClientServerConfig(command, client_factory=make_client, server_env={**os.environ, **(env or {})})
    client = await config.start()
    editor = Editor(client)
    capabilities = t.ClientCapabilities(
        general=t.GeneralClientCapabilities(position_encodings=encodings),
        window=t.WindowClientCapabilities(work_done_progress=True),
        workspace=workspace or t.WorkspaceClientCapabilities(
            apply_edit=True, workspace_edit=t.WorkspaceEditClientCapabilities(document_changes=True)),
        experimental={"lladaDrafts": True} if drafts else None,
    )  # fmt: skip
    options = {"maxCompletionTokens": 32, **(options or {})}
    params = t.InitializeParams(capabilities=capabilities, initialization_options=options)
    editor.result = await asyncio.wait_for(client.initialize_session(params), TIMEOUT)
    if wait:
        await editor.loaded()
    return editor


async def stop(editor: Editor) -> int:
    """shutdown + exit, as editors end a session; returns the server's exit code."""
    await asyncio.wait_for(editor.client.shutdown_session(), TIMEOUT)
    code = editor.client._server.returncode
    await editor.client.stop()
    return code


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor():
    editor = await start(options={"inlineMode": "fast"})
    yield editor
    assert await stop(editor) == 0, "shutdown + exit must end the server with exit code 0"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slow_editor():
    """Every denoising step lasts 150 ms more (the server's test hook): a request is surely still
    running when the next request or the cancel arrives, whatever the model does."""
    editor = await start(options={"maxCompletionTokens": 8}, env={"LLADA_LSP_TEST_STEP_DELAY_MS": "150"})
    yield editor
    assert await stop(editor) == 0


def error_code(outcome: BaseException | Any) -> int | None:
    return outcome.code if isinstance(outcome, JsonRpcException) else None


async def outcome(awaitable) -> Any:
    """The result, or the error the request was answered with."""
    return (await asyncio.gather(awaitable, return_exceptions=True))[0]


def span(l1: int, c1: int, l2: int, c2: int) -> dict:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


# --- tests ---------------------------------------------------------------------------------------
async def test_capabilities_and_bad_option_reported(editor: Editor):
    caps = editor.result.capabilities
    assert caps.inline_completion_provider is not None and caps.completion_provider is not None
    assert caps.text_document_sync.change == t.TextDocumentSyncKind.Incremental
    assert {"llada.rewriteSelection", "llada.status"} <= set(caps.execute_command_provider.commands)
    shown = [m.message for m in editor.client.messages]
    assert any("inlineMode" in m and "fast" in m for m in shown), shown
    status = await editor.command("llada.status")
    assert status["inlineMode"] == "speed" and status["state"] in ("loading", "ready")

    waiting = editor.client.wait_for_notification(t.WINDOW_SHOW_MESSAGE)
    editor.client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(settings={"llada": {"contextTokens": "lots", "rewriteMode": "speed"}})
    )
    shown = await asyncio.wait_for(waiting, TIMEOUT)
    assert "contextTokens" in shown.message
    status = await editor.command("llada.status")
    assert status["rewriteMode"] == "speed" and status["inlineMode"] == "speed"
    editor.client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(settings={"rewriteMode": "quality"})
    )


async def test_model_loaded_with_progress(editor: Editor):
    assert (await editor.command("llada.status"))["state"] == "ready"
    reports = [r for token, rs in editor.client.progress_reports.items() if "load" in str(token) for r in rs]
    assert reports and reports[0].kind == "begin" and reports[-1].kind == "end"
    # Pushed once per change of state, not per request: loading (unless the load was quicker than
    # `initialized`), then ready.
    assert [s.state for s in editor.statuses] in (["loading", "ready"], ["ready"]), editor.statuses


async def test_inline_mid_line_is_the_rest_of_the_line(editor: Editor):
    uri = editor.open()
    (item,) = (await editor.inline(uri, ANSWERED)).items
    assert item.range == t.Range(ANSWERED, ANSWERED)
    assert item.insert_text.strip() and "\n" not in item.insert_text


async def test_inline_on_an_empty_line_is_a_block(editor: Editor):
    (item,) = (await editor.inline(editor.open(), EMPTY_LINE)).items
    assert item.range == t.Range(EMPTY_LINE, EMPTY_LINE)
    lines = item.insert_text.split("\n")
    assert len(lines) > 1, "the embedded model writes several lines here"
    assert lines[0].strip(), "the block starts on the cursor line"
    assert all(line.strip() for line in lines), "a block ends at a blank line"
    indent = 4 + len(lines[0]) - len(lines[0].lstrip())
    assert all(len(line) - len(line.lstrip()) >= indent for line in lines[1:]), "a block ends at a dedent"


async def test_completion_fallback_inserts_with_a_text_edit(editor: Editor):
    """Clients without inline completions (eglot, lsp-mode, ALE) filter items by the word typed and
    insert the edit's range whole: mid-word, the item replaces `val` with `values:`, not `ues:` at
    the cursor (which eglot drops and lsp-mode inserts after deleting `val`)."""
    uri = editor.open("def total(values):\n    for v in val\n")
    cursor = t.Position(1, 16)
    params = t.CompletionParams(text_document=t.TextDocumentIdentifier(uri), position=cursor)
    result = await editor.request(t.TEXT_DOCUMENT_COMPLETION, params)
    assert isinstance(result, t.CompletionList) and len(result.items) == 1
    (item,) = result.items
    assert item.text_edit.range == t.Range(t.Position(1, 13), cursor)
    assert item.text_edit.new_text.startswith("val") and len(item.text_edit.new_text) > 3
    assert "\n" not in item.text_edit.new_text
    assert item.label.startswith("val") and item.filter_text.startswith("val")


async def test_a_document_with_lone_surrogates_gets_answers(editor: Editor):
    """A lone surrogate ("\\ud800" in the JSON, legal there, common after a bad paste) made every
    completion and rewrite on its document fail with -32603 (the tokenizer's TypeError). It counts as
    one UTF-16 unit, so an answer on its line lands where the client asked."""
    uri = editor.open("# pasted: \ud800\n" + SOURCE.replace("return a + \n", "return a + \udfff\n"))
    answered = t.Position(ANSWERED.line + 1, ANSWERED.character)
    (item,) = (await editor.inline(uri, answered)).items
    assert item.range == t.Range(answered, answered) and item.insert_text.strip()
    after_it = t.Position(answered.line, MID_LINE.character + 1)  # past the surrogate: the line's end
    result = await editor.inline(uri, after_it)
    assert all(i.range == t.Range(after_it, after_it) for i in result.items)
    params = t.CompletionParams(text_document=t.TextDocumentIdentifier(uri), position=answered)
    assert isinstance(await editor.request(t.TEXT_DOCUMENT_COMPLETION, params), t.CompletionList)
    argument = {"textDocument": {"uri": uri, "version": 1}, "range": span(0, 0, 3, 0)}
    result = await editor.command("llada.rewriteSelection", argument)
    assert set(result) >= {"applied", "changed", "text"} and "\ud800" not in result["text"]


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory) -> str:
    """The embedded model's architecture and tokenizer with seeded random weights: its answers are
    never empty, whatever stage the embedded model's training has reached."""
    folder = tmp_path_factory.mktemp("untrained")
    config = json.loads((EMBEDDED_MODEL / "config.json").read_text())
    config = LLaDA2Config(
        **{k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "dtype")}
    )
    network = LLaDA2(config)
    init_weights(network, seed=3)
    save_model(network, folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_MODEL / name, folder / name)
    return str(folder)


@pytest.mark.parametrize("which", ["embedded", "untrained"])
async def test_answers_are_what_the_pipeline_computes_directly(which: str, request, one_torch_thread):
    """The same requests through a fresh server and through `run_infill` in this process (the same
    functions, one engine each, fed the same sequence) give the same text: positions, document sync,
    settings and responses carry the pipeline's answer faithfully, and a non-empty one stays non-empty.
    Both run on one thread: thread counts change float sums, hence near-tie argmaxes."""
    path = request.getfixturevalue("untrained_model") if which == "untrained" else None
    # The embedded model answers at the first three, not at MID_LINE (an empty answer is carried too);
    # random weights answer everywhere: a block, and a word taken back by token healing ("return").
    spots = (EMPTY_LINE, t.Position(1, 10), ANSWERED, MID_LINE) if path is None else (EMPTY_LINE, t.Position(1, 10))
    editor = await start(options={"inlineMode": "quality", "model": path}, threads=1)
    try:
        uri = editor.open()
        served = [await editor.inline(uri, at) for at in spots]
    finally:
        assert await stop(editor) == 0
    model = load(ModelSpec(path), lambda *_: None)
    lines = SOURCE.split("\n")
    texts = []
    for answer, at in zip(served, spots):
        offset = sum(len(line) + 1 for line in lines[: at.line]) + at.character
        direct = run_infill(model, Infill.at(SOURCE, offset, "quality", 32, 1024), Never(), lambda *_: None)
        assert [item.insert_text for item in answer.items] == ([direct.text] if direct.text else []), at
        texts.append(direct.text)
    answering = texts if which == "untrained" else texts[:3]
    assert all(answering), f"answers expected at every one of {spots[: len(answering)]}: {texts}"


class Never:
    def is_set(self) -> bool:
        return False


async def test_drafts_arrive_before_the_final_answer(editor: Editor):
    uri = editor.open()
    answer = await editor.inline(uri, EMPTY_LINE, msg_id=9001)
    drafts = [d for d in editor.drafts if d.requestId == 9001]
    assert drafts, "a client with experimental.lladaDrafts gets drafts"
    assert drafts[0].step == 1 and not drafts[0].final, "the first draft comes after the first step"
    assert [d.step for d in drafts] == sorted(d.step for d in drafts)
    assert [d.final for d in drafts] == [False] * (len(drafts) - 1) + [True], "the last draft, and only it, is final"
    (item,) = answer.items
    assert item.insert_text and drafts[-1].text == item.insert_text, "the final draft equals the response"
    assert all(d.uri == uri and d.version == 1 for d in drafts)
    where = {(d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character) for d in drafts}
    assert where == {(5, 4, 5, 4)}, "the empty range at the cursor"


async def test_a_new_request_supersedes_the_previous_one(slow_editor: Editor):
    editor = slow_editor
    uri = editor.open()
    first = asyncio.ensure_future(editor.inline(uri, MID_LINE, msg_id=101))
    await editor.until(lambda p: getattr(p, "requestId", None) == 101, editor.drafts)  # the first is generating
    second = asyncio.ensure_future(editor.inline(uri, EMPTY_LINE, msg_id=102))
    outcomes = [await outcome(first), await outcome(second)]
    assert error_code(outcomes[0]) == -32800, outcomes[0]
    assert isinstance(outcomes[1], t.InlineCompletionList), outcomes[1]
    (item,) = outcomes[1].items  # the second is answered in full
    assert item.insert_text.strip() and item.range == t.Range(EMPTY_LINE, EMPTY_LINE)
    log = await editor.until(
        lambda p: re.search(r"inline 101: .*cancelled", str(p.message)), editor.client.log_messages
    )
    assert re.search(r"\((0|1) steps? after the cancel\)", log.message), log.message


async def test_cancel_request_stops_the_engine_within_a_step(slow_editor: Editor):
    editor = slow_editor
    pending = asyncio.ensure_future(editor.inline(editor.open(), EMPTY_LINE, msg_id=202))
    await editor.until(lambda p: getattr(p, "requestId", None) == 202, editor.drafts)
    editor.client.cancel_request(t.CancelParams(id=202))
    answer = await outcome(pending)
    assert error_code(answer) == -32800, answer
    log = await editor.until(
        lambda p: re.search(r"inline 202: .*cancelled", str(p.message)), editor.client.log_messages
    )
    assert re.search(r"\((0|1) steps? after the cancel\)", log.message), log.message
    assert (await editor.command("llada.status"))["state"] == "ready", "the server keeps answering"
    (item,) = (await editor.inline(editor.open(), ANSWERED)).items
    assert item.insert_text.strip()


PARSES = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\nprint(add(1, 2))\n"


async def test_rewrite_is_applied_with_the_document_version(editor: Editor):
    uri = editor.open(PARSES.replace("a - b", ""))
    editor.change(uri, 2, (5, 11), (5, 11), "a - b")
    selection = t.Range(t.Position(5, 0), t.Position(6, 0))
    argument = {"textDocument": {"uri": uri, "version": 2}, "range": span(5, 0, 6, 0)}
    editor.client.progress_reports["rewrite-1"] = []
    result = await editor.command("llada.rewriteSelection", argument, token="rewrite-1")
    # What the embedded model does here (deterministic on the CPU): it changes the operator.
    assert result == {"applied": True, "changed": True, "text": "    return a + b\n"}
    (edit,) = editor.edits[-1:]
    (change,) = edit.edit.document_changes
    assert (change.text_document.uri, change.text_document.version) == (uri, 2)
    assert change.edits[0].range == selection and change.edits[0].new_text == result["text"]
    kinds = [r.kind for r in editor.client.progress_reports["rewrite-1"]]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds


async def test_a_rewrite_that_would_break_the_file_is_not_sent(editor: Editor):
    """The embedded model's proposal for these lines drops a bracket: refused with the reason, and no
    workspace/applyEdit is sent. An instruction, which this model cannot read, is refused at once."""
    uri = editor.open(PARSES)
    before = len(editor.edits)
    argument = {"textDocument": {"uri": uri, "version": 1}, "range": span(5, 0, 8, 0)}
    result = await editor.command("llada.rewriteSelection", argument)
    assert result["applied"] is False and result["changed"] is True
    assert "unparsable" in result["reason"] and result["text"] != "    return a - b\n\nprint(add(1, 2))\n"
    assert len(editor.edits) == before
    argument = {**argument, "instruction": "use subtraction"}
    error = await outcome(editor.command("llada.rewriteSelection", argument))
    assert error_code(error) == -32803 and "cannot follow an instruction" in error.message


async def test_rewrite_of_a_stale_version_is_refused(editor: Editor):
    uri = editor.open()
    editor.change(uri, 2, (1, 15), (1, 15), "b")
    before = len(editor.edits)
    argument = {"textDocument": {"uri": uri, "version": 1}, "range": span(0, 0, 1, 16)}
    result = await editor.command("llada.rewriteSelection", argument)
    assert result["applied"] is False and "version 2" in result["reason"] and "version 1" in result["reason"]
    assert len(editor.edits) == before, "nothing is sent to apply"

    editor.refuse_edits = True
    try:
        argument["textDocument"]["version"] = 2
        result = await editor.command("llada.rewriteSelection", argument)
    finally:
        editor.refuse_edits = False
    assert result["applied"] is False and result["reason"] == "the user undid it"
    assert len(editor.edits) == before + 1


async def test_malformed_params_get_invalid_params(editor: Editor):
    assert error_code(await outcome(editor.raw(t.TEXT_DOCUMENT_INLINE_COMPLETION, {}, 301))) == -32602
    negative = {"textDocument": {"uri": "file:///x.py"}, "position": {"line": -1, "character": 0}}
    assert error_code(await outcome(editor.raw(t.TEXT_DOCUMENT_INLINE_COMPLETION, negative, 302))) == -32602
    wrong_type = {"textDocument": {"uri": "file:///x.py"}, "position": {"line": "one", "character": 0}}
    assert error_code(await outcome(editor.raw(t.TEXT_DOCUMENT_COMPLETION, wrong_type, 303))) == -32602
    uri = editor.open()
    for argument in ([], [{"textDocument": {"uri": uri}}], ["text"], [{"textDocument": {"uri": uri, "version": 1}}],
                     [{"textDocument": {"uri": uri, "version": 1}, "range": span(90, 0, 91, 0)}]):  # fmt: skip
        params = {"command": "llada.rewriteSelection", "arguments": argument}
        answer = await outcome(editor.raw(t.WORKSPACE_EXECUTE_COMMAND, params, 304))
        assert error_code(answer) == -32602, (argument, answer)
    assert (await editor.command("llada.status"))["state"] == "ready", "the server keeps answering"


async def test_odd_positions_documents_and_edits_get_sensible_answers(editor: Editor):
    assert (await editor.inline("file:///never/opened.py", MID_LINE)).items == ()
    uri = editor.open(SOURCE.replace("return a + \n", "return a +\n"))  # line 1 ends at ANSWERED
    assert (await editor.inline(uri, t.Position(99, 0))).items == ()
    (item,) = (await editor.inline(uri, t.Position(1, 400))).items  # past the end of the line: at its end
    assert item.range == t.Range(ANSWERED, ANSWERED) and item.insert_text.strip()
    editor.change(uri, 2, (50, 0), (60, 0), "# appended past the end\n")  # clamped to the end, logged
    await editor.until(lambda p: "past the end" in str(p.message), editor.client.log_messages)
    assert (await editor.inline(uri, ANSWERED)).items == (item,), "the edit landed after the last line"


async def test_a_2mb_document(editor: Editor):
    """A 2 MB document gets the answer of a 20 kB one with the same text around the cursor (the
    prompt is cut from the few kB around it), at most seconds later, and again after an edit."""
    answers, seconds = {}, {}
    for copies in (400, 40_000):  # 20 kB and 2 MB of filler above SOURCE
        started = asyncio.get_running_loop().time()
        uri = editor.open(FILLER * copies + SOURCE)
        line = 3 * copies + MID_LINE.line
        (item,) = (await editor.inline(uri, t.Position(line, MID_LINE.character))).items
        seconds[copies] = asyncio.get_running_loop().time() - started
        assert item.range.start == t.Position(line, MID_LINE.character) and item.insert_text.strip()
        editor.change(uri, 2, (line, 14), (line, 15), "")  # the trailing space deleted: line ends at ANSWERED
        (after,) = (await editor.inline(uri, t.Position(line, 14))).items
        assert after.range.start == t.Position(line, 14) and after.insert_text.strip()
        answers[copies] = (item.insert_text, after.insert_text)
    assert answers[40_000] == answers[400]
    # Open + answer: the small document's time plus a bound for sending 2 MB (linear work, no model work).
    assert seconds[40_000] < seconds[400] + 10, seconds


async def check_emoji_and_cjk_positions(editor: Editor, encoding: str) -> None:
    """The server's idea of where things are matches the client's in the negotiated encoding: an
    edit after the emoji splits the line there, and line ends are reported in the right units."""
    assert editor.result.capabilities.position_encoding == encoding
    units = {"utf-16": len('s = "😀'.encode("utf-16-le")) // 2, "utf-8": len('s = "😀'.encode())}[encoding]
    uri = editor.open('s = "😀中文" + name\nprint(s)\n')
    editor.change(uri, 2, (0, units), (0, units), "\n")  # right after the emoji
    for line, text in ((0, 's = "😀'), (1, '中文" + name')):  # the embedded model answers at both ends
        result = await editor.inline(uri, t.Position(line, 1000))  # past the end: answered at the line's end
        end = len(text.encode("utf-16-le")) // 2 if encoding == "utf-16" else len(text.encode())
        (item,) = result.items
        assert item.range == t.Range(t.Position(line, end), t.Position(line, end)) and item.insert_text, result
    drafts = [d for d in editor.drafts if d.uri == uri]
    if encoding == "utf-16":
        assert drafts and drafts[-1].range.start.character == len('中文" + name'.encode("utf-16-le")) // 2
    else:
        assert drafts == [], "no drafts without experimental.lladaDrafts"


async def test_positions_on_a_line_with_emoji_and_cjk_in_utf16(editor: Editor):
    """The shared server: its client offered no encoding, so UTF-16, the protocol's default."""
    await check_emoji_and_cjk_positions(editor, "utf-16")


async def test_positions_on_a_line_with_emoji_and_cjk_in_utf8():
    """A client that offers UTF-8 after UTF-16 gets UTF-8 (the server prefers it)."""
    editor = await start(drafts=False, encodings=["utf-16", "utf-8"])
    try:
        await check_emoji_and_cjk_positions(editor, "utf-8")
    finally:
        assert await stop(editor) == 0


async def test_a_missing_model_is_reported_and_the_server_keeps_answering():
    editor = await start(options={"model": "/nonexistent/model-folder"})
    try:
        shown = await editor.until(lambda p: "cannot load" in str(p.message), editor.client.log_messages)
        assert "/nonexistent/model-folder" in shown.message
        answer = await outcome(editor.inline(editor.open(), MID_LINE))
        assert error_code(answer) == -32803 and "nonexistent" in answer.message
        status = await editor.command("llada.status")
        assert status["state"] == "error" and "nonexistent" in status["error"]
        # The showMessage follows the log line; a response sent after it has surely followed it too.
        assert any("cannot load" in m.message for m in editor.client.messages), "reported with window/showMessage"

        # A model setting that loads brings the server back (null: the embedded model).
        editor.client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings={"model": None}))
        await editor.until(lambda p: "load embedded: done" in str(p.message), editor.client.log_messages)
        (item,) = (await editor.inline(editor.open(), ANSWERED)).items
        assert item.insert_text.strip()
        assert (await editor.command("llada.status"))["state"] == "ready"
    finally:
        assert await stop(editor) == 0


# --- every client, every state (issue 24) ----------------------------------------------------------
def applied(text: str, edit: t.TextEdit) -> str:
    """`text` (one-line edits, UTF-16 = str indexing here: ASCII) with `edit` applied, as a client does."""
    lines = text.split("\n")
    r = edit.range
    assert r.start.line == r.end.line
    line = lines[r.start.line]
    lines[r.start.line] = line[: r.start.character] + edit.new_text + line[r.end.character :]
    return "\n".join(lines)


async def test_a_cursor_inside_a_word_does_not_duplicate_it(editor: Editor):
    """`    re|turn su`: the embedded model completes `turn ...` there (it keeps the word's rest). An
    edit that stopped at the cursor left `turn` behind the completion: `return float(...)turn su`."""
    text = "def total(values: list[float]) -> float:\n    return su\n"
    uri = editor.open(text)
    cursor = t.Position(1, 6)
    params = t.CompletionParams(text_document=t.TextDocumentIdentifier(uri), position=cursor)
    result = await editor.request(t.TEXT_DOCUMENT_COMPLETION, params)
    for item in result.items:  # an item, if offered, replaces the whole word
        assert item.text_edit.range == t.Range(t.Position(1, 4), t.Position(1, 10)), item.text_edit
        after = applied(text, item.text_edit)
        assert after.count("turn") == 1 and after.split("\n")[1].startswith("    return"), after
    assert result.items, "the embedded model answers here"
    inline = await editor.inline(uri, cursor)
    for item in inline.items:  # likewise inline: the range covers the rest of the word
        assert item.range == t.Range(cursor, t.Position(1, 10)) and item.insert_text.startswith("turn")
        after = applied(text, t.TextEdit(item.range, item.insert_text))
        assert after.count("turn") == 1, after
    assert inline.items


async def test_completions_while_the_model_loads_answer_at_once_and_inline_ones_wait():
    """lsp-mode waits 10 s, synchronously, for a completion; a load takes longer on a busy machine.
    While it loads (5 s more here, the test hook), completions answer with nothing at once, before the
    load ends; the first after it gets a real answer. An inline request waits for the load instead (an
    editor asks for ghost text once per keystroke: the place the user waits at gets its suggestion),
    and of two waiting for one document only the newer is answered with one (issue 53)."""
    editor = await start(wait=False, env={"LLADA_LSP_TEST_LOAD_DELAY_MS": "5000"})
    try:
        uri = editor.open("def average(values):\n    return sum\n")
        at = t.Position(1, 14)
        params = t.CompletionParams(text_document=t.TextDocumentIdentifier(uri), position=at)
        older = asyncio.ensure_future(editor.inline(uri, t.Position(1, 10)))
        waiting = asyncio.ensure_future(editor.inline(uri, at))
        answer = await editor.request(t.TEXT_DOCUMENT_COMPLETION, params)
        assert answer.is_incomplete is True and not answer.items, answer
        assert not any(s.state == "ready" for s in editor.statuses), "answered before the load ended"
        assert (await editor.command("llada.status"))["state"] == "loading"
        assert not waiting.done() and not older.done(), "an inline request waits for the load"
        await editor.loaded()
        assert (await older).items == (), "a newer request for the document waited too: it answers"
        (inline,) = (await waiting).items
        assert inline.insert_text and inline.range == t.Range(at, at), inline
        (item,) = (await editor.request(t.TEXT_DOCUMENT_COMPLETION, params)).items
        assert item.text_edit.new_text.startswith("sum(")
        kinds = [r.kind for token, rs in editor.client.progress_reports.items() if "load" in str(token) for r in rs]
        assert kinds[0] == "begin" and kinds[-1] == "end", "the load is reported through $/progress"
    finally:
        assert await stop(editor) == 0


async def test_an_inline_answer_for_a_changed_document_is_empty():
    """Issue 53: an answer placed in a text the client no longer has must not reach it. The document
    changes while its completion is computed (each step lasts a second more: the change lands between
    two steps): the answer is empty."""
    editor = await start(options={"maxCompletionTokens": 8}, env={"LLADA_LSP_TEST_STEP_DELAY_MS": "1000"})
    try:
        uri = editor.open("def average(values):\n    total = sum(values)\n    return total / \n")
        pending = asyncio.ensure_future(editor.inline(uri, t.Position(2, 19)))
        await editor.until(lambda p: getattr(p, "uri", None) == uri and not p.final, editor.drafts)  # computing
        editor.change(uri, 2, (0, 0), (0, 0), "# note\n")
        assert (await pending).items == ()
        assert any("changed while it was computed" in m.message for m in editor.client.log_messages)
    finally:
        assert await stop(editor) == 0


async def test_rewrite_is_offered_as_a_code_action(editor: Editor):
    """lsp-mode, ALE, Helix, Kate reach a rewrite through textDocument/codeAction only."""
    assert editor.result.capabilities.code_action_provider is not None
    uri = editor.open(PARSES)
    selection = t.Range(t.Position(5, 0), t.Position(6, 0))

    async def actions(rng: dict, only: list[str] | None = None) -> list:
        # Raw: lsprotocol's client-side converter takes every action that has a `command` for a Command.
        context = {"diagnostics": [], **({"only": only} if only else {})}
        params = {"textDocument": {"uri": uri}, "range": rng, "context": context}
        return await editor.raw(t.TEXT_DOCUMENT_CODE_ACTION, params, 401) or []

    # (The next edit's "Apply suggested edit", a quickfix, may be offered too: asked for refactors only.)
    assert await actions(span(5, 3, 5, 3), only=["refactor"]) == [], "nothing to rewrite in an empty range"
    assert await actions(span(5, 0, 6, 0), only=["source"]) == []
    (action,) = await actions(span(5, 0, 6, 0), only=["refactor"])
    assert action["title"] == "Rewrite selection (LLaDA)" and action["kind"] == "refactor.rewrite"
    command = action["command"]
    assert command["command"] == "llada.rewriteSelection"
    (argument,) = command["arguments"]
    assert argument == {"textDocument": {"uri": uri, "version": 1}, "range": span(5, 0, 6, 0)}
    # Run as a client runs an action's command: the rewrite is applied with the document's version.
    # The embedded model's answer for this file alone: this module's editor has other tests' documents
    # open, whose snippets (contextFiles) would start the prompt and change what the model writes.
    configure = editor.client.workspace_did_change_configuration
    configure(t.DidChangeConfigurationParams(settings={"llada": {"contextFiles": False}}))
    try:
        result = await editor.command(command["command"], *command["arguments"])
    finally:
        configure(t.DidChangeConfigurationParams(settings={"llada": {"contextFiles": True}}))
    assert result == {"applied": True, "changed": True, "text": "    return a + b\n"}
    (change,) = editor.edits[-1].edit.document_changes
    assert change.text_document.version == 1 and change.edits[0].range == selection


async def test_a_client_that_cannot_apply_edits_gets_the_edit_in_the_result():
    """`workspace.applyEdit: false` (Vim's ALE): no workspace/applyEdit is sent; the command answers
    with the edit, in `changes` since the client did not declare `documentChanges`."""
    editor = await start(drafts=False, workspace=t.WorkspaceClientCapabilities(apply_edit=False))
    try:
        uri = editor.open(PARSES)
        argument = {"textDocument": {"uri": uri, "version": 1}, "range": span(5, 0, 6, 0)}
        result = await editor.command("llada.rewriteSelection", argument)
        assert editor.edits == [], "nothing sent to a client that said it cannot apply it"
        assert result["applied"] is False and result["changed"] is True and "applyEdit" in result["reason"]
        (edit,) = result["edit"]["changes"][uri]
        assert (
            edit == {"range": span(5, 0, 6, 0), "newText": "    return a + b\n"} == {**edit, "newText": result["text"]}
        )
        # It shows nothing of the result, nor of logMessage: it is told, as an Error (what ALE shows).
        (told,) = [m for m in editor.client.messages if "rewrite" in m.message]
        assert told.type == t.MessageType.Error and told.message.startswith("llada: the rewrite was not applied")
        assert told.message.endswith("applyEdit): the edit is in the result. The rewrite:\n    return a + b\n")
    finally:
        assert await stop(editor) == 0


async def test_a_client_that_never_answers_apply_edit_still_gets_the_commands_answer():
    """A client that declares applyEdit (without documentChanges) and never answers it: the edit goes
    as `changes`, and the command answers after `applyEditTimeout` seconds with the edit."""
    workspace = t.WorkspaceClientCapabilities(apply_edit=True)
    editor = await start(drafts=False, workspace=workspace, options={"applyEditTimeout": 1})
    editor.hold_edits = True
    try:
        uri = editor.open(PARSES)
        argument = {"textDocument": {"uri": uri, "version": 1}, "range": span(5, 0, 6, 0)}
        result = await editor.command("llada.rewriteSelection", argument)
        (sent,) = editor.edits
        assert sent.edit.document_changes is None and list(sent.edit.changes) == [uri]
        assert result["applied"] is False and "did not answer" in result["reason"] and "1 s" in result["reason"]
        assert result["edit"]["changes"][uri][0]["newText"] == result["text"] == "    return a + b\n"
    finally:
        editor.released.set()  # a handler still waiting would break the client's own stop
        assert await stop(editor) == 0
