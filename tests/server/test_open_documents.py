"""The front's per-document stores kept in step by didOpen/didChange/didClose (open_documents.py, through
the server's one method per notification), and a front built without a model of its own saying so.

In the process, without pygls' I/O: the notifications' params go straight to the server's methods, as
protocol.py hands them on."""

from __future__ import annotations

import asyncio

from lsprotocol import types

from llada_lsp.server.completers import next_edit_key, rewrite_key, warm_key
from llada_lsp.server.language_server import Launch, LladaServer
from llada_lsp.server.positions import UTF16

URI, OTHER = "file:///a.py", "file:///b.py"
TEXT = "def area(r):\n    return \n"


def initialized() -> LladaServer:
    """A server past `initialize` (its workspace, hence its position encoding, exists then), no engine."""
    ls = LladaServer(Launch())
    for _ in ls.protocol.lsp_initialize(types.InitializeParams(capabilities=types.ClientCapabilities())):
        pass  # no initialize handler is registered: nothing is yielded to run
    return ls


def opened(ls: LladaServer, uri: str = URI, text: str = TEXT) -> None:
    ls.open_document(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))


def change(ls: LladaServer, uri: str, version: int, *changes) -> None:
    params = types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(version, uri), list(changes))
    ls.change_document(params)


def typed(line: int, character: int, text: str) -> types.TextDocumentContentChangePartial:
    at = types.Position(line, character)
    return types.TextDocumentContentChangePartial(types.Range(at, at), text)


class Keys:
    """A completer that records the keys cancelled."""

    def __init__(self):
        self.cancelled: list[str] = []

    def cancel_key(self, key: str) -> None:
        self.cancelled.append(key)


def test_a_change_edits_the_text_and_is_recorded_as_an_edit():
    ls = initialized()
    opened(ls)
    change(ls, URI, 2, typed(1, 11, "3.14"))
    doc = ls.documents.get(URI)
    assert doc.text == "def area(r):\n    return 3.14\n" and doc.version == 2
    assert [(e.old, e.new, e.line) for e in ls.documents.history.edits(URI)] == [("", "3.14", 1)]
    assert ls.documents.locate(URI, types.Position(1, 15), UTF16)[1] == doc.text.index("3.14") + 4


def test_a_whole_text_change_forgets_the_edits_whose_offsets_it_voided():
    ls = initialized()
    opened(ls)
    change(ls, URI, 2, typed(1, 11, "r"))
    change(ls, URI, 3, types.TextDocumentContentChangeWholeDocument("x = 1\n"))
    assert ls.documents.get(URI).text == "x = 1\n" and ls.documents.history.edits(URI) == []


def test_closing_forgets_the_documents_text_edits_and_suggestion_and_cancels_its_jobs():
    """Reopened, a document starts afresh: no edit history from before (its offsets are of a text the
    client may have changed on disk) and no suggestion to revise; its completion, next edit and idle
    prefill stop."""
    ls = initialized()
    ls.completer = keys = Keys()
    for uri in (URI, OTHER):
        opened(ls, uri)
        change(ls, uri, 2, typed(1, 11, "r"))
        ls.documents.suggestions.remember(uri, TEXT[:-1] + "r\n", len(TEXT), None, " * r")
    ls.close_document(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(URI)))
    assert ls.documents.get(URI) is None and ls.documents.history.edits(URI) == []
    opened(ls, URI, TEXT[:-1] + "r\n")
    assert ls.documents.suggestions.revision(URI, TEXT[:-1] + "r \n", len(TEXT) + 1) is None
    assert keys.cancelled == [URI, next_edit_key(URI), warm_key(URI)] and rewrite_key(URI) not in keys.cancelled
    # The other document keeps all of it.
    assert ls.documents.get(OTHER) is not None and ls.documents.history.edits(OTHER)
    assert ls.documents.suggestions.revision(OTHER, TEXT[:-1] + "r \n", len(TEXT) + 1) is not None


def test_a_change_to_a_document_not_open_is_ignored_and_logged(caplog):
    ls = initialized()
    caplog.set_level("DEBUG", logger="llada_lsp.server.language_server")
    change(ls, OTHER, 2, typed(0, 0, "x"))
    assert ls.documents.get(OTHER) is None and ls.documents.history.edits(OTHER) == []
    assert any("not open" in r.getMessage() for r in caplog.records)


def test_a_front_without_a_model_of_its_own_says_so_instead_of_loading_one():
    """The model in the process comes from the command that starts the server (Launch.loader); a front
    built without one (a test, a front meant for a service) reports it, and loads nothing."""
    ls = LladaServer(Launch(engine="local"))
    asyncio.run(ls.start_engine())
    status = ls.status()
    assert ls.completer is None and status["state"] == "unavailable"
    assert "without a model of its own" in status["error"]
