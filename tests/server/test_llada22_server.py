"""The real thing over stdio: a LLaDA2.2-shaped checkpoint (the embedded model's shapes with LLaDA2.2's
keys, random weights whose edit ids are written often, the embedded tokenizer:
conftest.make_llada22_checkpoint) plans, loads in the real server (`python -m llada_lsp serve`, spoken to
through llada_lsp/lsp_client.py as an editor would), says its family in `llada/status`, and serves an
inline completion, a rewrite and a next edit, none of which ever holds an edit token.

The edit ids are two ordinary tokens of the tokenizer, so an edit id that leaked into an answer would be
their text in it: the answers are searched for that text.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from conftest import LLADA22_EDIT_IDS, make_llada22_checkpoint

from llada_lsp import kernel_backend
from llada_lsp.backends.base import load_codec
from llada_lsp.commands import plan
from llada_lsp.lsp_client import LspClient, edited, position

pytestmark = pytest.mark.slow  # starts the real server
WAIT = 120.0  # seconds any one answer may take (the load and a step take far less)
SOURCE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    total = width + height\n    return 2 * total\n\n\n"
    "def volume(width, height, depth):\n    return \n"
)


@pytest.fixture(scope="module")
def llada22(tmp_path_factory) -> Path:
    return make_llada22_checkpoint(tmp_path_factory.mktemp("llada22-server"), edit_boost=6.0)


def test_the_checkpoint_plans_as_llada22(llada22, capsys):
    assert plan.plan_main(["--model", str(llada22), "--device", "cpu", "--memory", "1TB"]) == 0
    out = capsys.readouterr().out
    assert "family: LLaDA2.2: block routing (4 experts per 32-token block), decoding JointThresholdInDel " \
           "(DELETE 8187, INSERT 8191, config)" in out  # fmt: skip
    assert f"kernels here: {kernel_backend.current().line()}" in out  # the backend this machine would run


def test_the_server_serves_it_and_no_answer_holds_an_edit_token(llada22):
    codec = load_codec(str(llada22), "llada22")
    edit_texts = [codec.text_of([token])[0].strip() for token in LLADA22_EDIT_IDS]
    assert all(edit_texts), "the edit ids must read as text for this test to see them"

    async def session() -> tuple[dict, dict, dict, dict, str, int]:
        command = [sys.executable, "-m", "llada_lsp", "serve", "--engine", "local", "--threads", "1",
                   "--model", str(llada22)]  # fmt: skip
        client = await LspClient.start(command)
        statuses: asyncio.Queue[dict] = asyncio.Queue()
        client.on("llada/status", statuses.put_nowait)
        try:
            # speed rewrites follow every argmax (the edit ids often among them): the draft is rewritten
            await client.initialize(options={"inlineMode": "quality", "rewriteMode": "speed"}, timeout=WAIT)
            status = await asyncio.wait_for(_ready(statuses), WAIT)
            doc = client.did_open("file:///shapes.py", SOURCE)
            cursor = position(doc, len(SOURCE) - 1, client.encoding)  # after "return "
            inline = await client.request("textDocument/inlineCompletion", {
                "textDocument": {"uri": doc.uri}, "position": cursor, "context": {"triggerKind": 1}}, WAIT)  # fmt: skip
            start = SOURCE.index("    total")
            selection = {"start": position(doc, start, client.encoding),
                         "end": position(doc, SOURCE.index("\n\n\ndef volume"), client.encoding)}  # fmt: skip
            rewrite = await client.request("workspace/executeCommand", {"command": "llada.rewriteSelection",
                "arguments": [{"textDocument": {"uri": doc.uri, "version": doc.version}, "range": selection}]}, WAIT)  # fmt: skip
            at = SOURCE.index("width + height")
            client.did_change(doc, at, at + len("width"), "w")  # an edit for the history
            next_edit = await client.request("llada/nextEdit", {"textDocument": {"uri": doc.uri, "version": doc.version},
                                                                "position": position(doc, at + 1, client.encoding)}, WAIT)  # fmt: skip
            after = edited(doc, next_edit["edits"], client.encoding) if next_edit["edits"] else doc.text
        finally:
            code = await client.shutdown(WAIT)
        return status, inline, rewrite, next_edit, after, code

    status, inline, rewrite, next_edit, after, code = asyncio.run(session())
    assert code == 0
    assert (status["family"], status["decoding"]) == ("LLaDA2.2", "JointThresholdInDel")
    assert status["kernels"] == kernel_backend.current().line()  # the server's own process decided the same
    items = inline["items"]
    assert items and items[0]["insertText"], "random weights answer at an empty return"
    assert rewrite["changed"] and rewrite["text"], rewrite  # the model's proposal, applied or refused
    assert isinstance(next_edit["edits"], list)  # random weights: mostly refused by the gates (no edit)
    answers = [items[0]["insertText"], rewrite["text"], *(e["newText"] for e in next_edit["edits"]), after]
    leaked = [(text, answer) for answer in answers for text in edit_texts if text in answer]
    assert not leaked, leaked


async def _ready(statuses: asyncio.Queue) -> dict:
    while (status := await statuses.get())["state"] != "ready":
        assert status["state"] == "loading", status
    return status
