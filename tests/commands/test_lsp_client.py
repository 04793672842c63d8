"""The project's one LSP client (llada_lsp/lsp_client.py): positions in the negotiated encoding both ways,
edits read against the text as it is, and a session with a stand-in server (tests/fakes/next_edit_server.py):
the history replayed as incremental changes, the server's own request answered, an answer to no request
handed over, and a server that ends failing what it had not answered instead of leaving it waiting."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from llada_lsp.lsp_client import SERVER_ENDED, LspClient, LspError, edited, offset, position
from llada_lsp.server.documents import Document
from llada_lsp.server.positions import UTF8, UTF16, UTF32

FAKE = Path(__file__).parents[1] / "fakes" / "next_edit_server.py"
TEXT = "# 😀 é\r\ndef f(a):\n    return a\n"


def test_positions_count_code_units_of_the_negotiated_encoding_both_ways():
    doc = Document("file:///m.py", 1, TEXT)
    at = TEXT.index("é") + 1  # after the emoji (2 UTF-16 units, 4 UTF-8 bytes), a space and é
    assert position(doc, at, UTF16) == {"line": 0, "character": 6}
    assert position(doc, at, UTF8) == {"line": 0, "character": 9}
    assert position(doc, at, UTF32) == {"line": 0, "character": 5}
    assert position(doc, TEXT.index("def"), UTF16) == {"line": 1, "character": 0}  # \r\n ends a line
    for encoding in (UTF8, UTF16, UTF32):
        for at in range(len(TEXT) + 1):
            if TEXT[at - 1 : at + 1] != "\r\n":  # between \r and \n is no position
                assert offset(doc, position(doc, at, encoding), encoding) == at, (encoding, at)
    assert offset(doc, {"line": 1, "character": 99}, UTF16) == TEXT.index("\n    ")  # clamped to the line's end
    assert offset(doc, {"line": 9, "character": 0}, UTF16) == len(TEXT)


def test_edits_are_read_against_the_text_as_it_is():
    doc = Document("file:///m.py", 1, "abc\ndef\n")

    def edit(a, b, new):
        return {"range": {"start": position(doc, a, UTF16), "end": position(doc, b, UTF16)}, "newText": new}

    assert edited(doc, [edit(0, 1, "XY"), edit(4, 7, ""), edit(8, 8, "z")], UTF16) == "XYbc\n\nz"
    assert doc.text == "abc\ndef\n"


@pytest.mark.parametrize("encoding", [UTF16, UTF8])
def test_a_session_with_a_stand_in_server(encoding):
    async def session() -> tuple:
        client = await LspClient.start([sys.executable, str(FAKE)])
        result = await client.initialize(options={"nextEditHistory": True}, encodings=[encoding], timeout=30)
        before = "# 😀 é\ndef f(old_name):\n    return old_name\n"
        doc = client.did_open("file:///m.py", before)
        at = before.index("old_name")
        client.did_change(doc, at, at + len("old_name"), "new_name")  # after the emoji: units differ per encoding
        answer = await client.request("llada/nextEdit", {"textDocument": {"uri": doc.uri, "version": doc.version},
                                                         "position": position(doc, at, client.encoding)}, 30)  # fmt: skip
        client.did_close(doc)
        code = await client.shutdown(30)
        return result, client.encoding, doc, answer, code

    result, chosen, doc, answer, code = asyncio.run(session())
    assert result["capabilities"]["positionEncoding"] == UTF16 and chosen == UTF16  # the server chose
    assert doc.version == 2 and "def f(new_name)" in doc.text
    assert edited(doc, answer["edits"], chosen) == doc.text.replace("return old_name", "return new_name")
    assert code == 0


def test_a_server_that_ends_fails_what_it_left_unanswered():
    async def session():
        client = await LspClient.start([sys.executable, "-c", "import sys; sys.stdin.buffer.read(10)"])
        with pytest.raises(LspError) as ended:
            await client.request("initialize", {"capabilities": {}}, timeout=30)
        with pytest.raises(LspError):  # and what is asked after
            await client.request("shutdown", timeout=30)
        return ended.value, await client.shutdown(30)

    error, code = asyncio.run(session())
    assert error.code == SERVER_ENDED and "closed its output" in error.message and code == 0


def test_a_request_given_up_on_is_cancelled_at_the_server():
    """A server that answers nothing but $/cancelRequest: the cancelled id with an error, and once more
    with id null (as a server answers what it cannot read), which goes to `on_stray`."""
    server = (
        "import json, sys\n"
        "def send(message):\n"
        "    body = json.dumps({'jsonrpc': '2.0', **message}).encode()\n"
        "    sys.stdout.buffer.write(b'Content-Length: %d\\r\\n\\r\\n' % len(body) + body); sys.stdout.flush()\n"
        "while line := sys.stdin.buffer.readline():\n"
        "    length = int(line.split(b':')[1]); sys.stdin.buffer.readline()\n"
        "    msg = json.loads(sys.stdin.buffer.read(length))\n"
        "    if msg.get('method') == '$/cancelRequest':\n"
        "        send({'id': msg['params']['id'], 'error': {'code': -32800, 'message': 'cancelled'}})\n"
        "        send({'id': None, 'error': {'code': -32700, 'message': 'not json'}})\n"
    )

    async def session():
        client = await LspClient.start([sys.executable, "-c", server])
        strays: list[dict] = []
        client.on_stray = strays.append
        request = client.send("llada/slow", {})
        with pytest.raises(TimeoutError, match="llada/slow: no answer in 0 s"):
            await client.result(request, timeout=0.2)
        answer = await asyncio.wait_for(request.answer, 30)  # the server's answer to the cancel still comes
        client.process.stdin.close()  # it answers no shutdown: its end is the end of its input
        await client.shutdown(30)
        return request, answer, strays

    request, answer, strays = asyncio.run(session())
    assert answer["error"]["code"] == -32800 and answer["id"] == request.id and request.arrived > request.sent
    assert [stray["error"]["code"] for stray in strays] == [-32700]
