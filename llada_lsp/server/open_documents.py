"""The stores kept per open document, in step with one another: its text and version (documents.py), its
recent edits (completion/history.py, for next edits) and the last inline suggestion shown in it
(suggestions.py, for revisions). didOpen, didChange and didClose reach them here, and only here.

Knows lsprotocol's positions and the negotiated encoding; nothing of pygls' server, the model or jobs.
"""

from __future__ import annotations

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from ..completion.history import History
from .documents import Document
from .suggestions import Suggestions


class OpenDocuments:
    """Per document URI: its `Document`, its edit `history` and its last shown suggestion (`suggestions`)."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self.history = History()
        self.suggestions = Suggestions()

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def all(self) -> list[Document]:
        """Every open document, in the order they were opened."""
        return list(self._docs.values())

    def open(self, uri: str, version: int, text: str, language: str = "") -> Document:
        """A didOpen. Its line index is built now, with the message's parsing, not by the first request
        (a 5.8 MB document's took ~150 ms of the event loop in a rewrite, and a status request waited)."""
        doc = self._docs[uri] = Document(uri, version, text, language)
        doc.line_starts  # noqa: B018 (built now)
        return doc

    def change(self, uri: str, version: int, changes: list[types.TextDocumentContentChangeEvent],
               encoding: str) -> list[str]:  # fmt: skip
        """Applies didChange's changes in order, each recorded in the history first (it reads the text
        replaced); a whole-text change resets the history. Returns what went wrong, for the log."""
        doc = self._docs.get(uri)
        if doc is None:
            return [f"didChange for {uri}, which is not open: ignored"]
        problems = []
        for change in changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                a, b = change.range.start, change.range.end
                self._record(doc, a, b, change.text, encoding)
                if not doc.edit((a.line, a.character), (b.line, b.character), change.text, encoding):
                    problems.append(f"{uri}: an edit past the end was clamped to its end")
            else:
                doc.replace(change.text)
                self.history.reset(uri)
        doc.version = version
        return problems

    def _record(self, doc: Document, a: types.Position, b: types.Position, text: str, encoding: str) -> None:
        start, end = doc.offset(a.line, a.character, encoding), doc.offset(b.line, b.character, encoding)
        start = len(doc.text) if start is None else start
        end = len(doc.text) if end is None else max(start, end)
        self.history.record(doc.uri, doc.text, start, end, text, min(a.line, len(doc.line_starts) - 1))

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)
        self.history.close(uri)
        self.suggestions.forget(uri)

    def locate(self, uri: str, position: types.Position, encoding: str) -> tuple[Document, int, types.Position] | None:
        """(document, str offset, the position normalized) or None for an unknown document or a line
        past the end; a character past the end of its line means the line's end, as the LSP says."""
        doc = self._docs.get(uri)
        offset = doc.offset(position.line, position.character, encoding) if doc else None
        if offset is None:
            return None
        return doc, offset, types.Position(*doc.position(offset, encoding))


def span(doc: Document, rng: types.Range, encoding: str) -> tuple[int, int, types.Range]:
    """str offsets of a range of `doc` and the range normalized; InvalidParams if it is not in the document."""
    start = doc.offset(rng.start.line, rng.start.character, encoding)
    end = doc.offset(rng.end.line, rng.end.character, encoding)
    if start is None or end is None or end < start:
        raise JsonRpcInvalidParams(f"the range {rng} is outside the document or ends before it starts")
    a, b = doc.position(start, encoding), doc.position(end, encoding)
    return start, end, types.Range(types.Position(*a), types.Position(*b))
