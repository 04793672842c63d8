"""Inline completions over the LSP: `textDocument/inlineCompletion` (ghost text) and the same as one
`textDocument/completion` item, for clients without the former. `complete` cuts the job at the cursor
(from the rest of the last suggestion when the user typed through it: a revision), runs it with its
drafts sent as `llada/draft` to clients that asked for them, and remembers what was shown. The prompt
starts with snippets of the client's other files (server/context_files.py), the same set while the user
types on one line.

Knows pygls, lsprotocol and jobs as plain values; the pipeline is completion/pipeline.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from lsprotocol import types

from ..completion.jobs import Infill
from .ale import cut_for_ale, word_after
from .documents import Document
from .language_server import LladaServer

DRAFT = "llada/draft"
LOAD_POLL_SECONDS = 0.1  # how often a request that waits for the load looks at the state (a dict built)


async def inline_completion(ls: LladaServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    """Asked while the model loads in this process, the request waits for the load (the client's cancel
    ends the wait), so the place the user waits at gets its suggestion: ghost text is asked for without
    a keystroke only once. An engine service that says it is loading may be waiting for a backend that
    went away (SGLang killed): then the answer is empty at once, as for a plain completion. An answer
    for a document that changed meanwhile would be placed in a text the client no longer has: it is
    empty (the client asks again for the new text)."""
    uri = params.text_document.uri
    found = ls.documents.locate(uri, params.position, ls.encoding)
    if found is None:
        return types.InlineCompletionList(items=[])
    doc, offset, at = found
    version, request_id = doc.version, ls.protocol.msg_id
    if ls.completer is not None and ls.completer.address != "local" and _still_loading(ls, "inline"):
        return types.InlineCompletionList(items=[])
    if ls.status()["state"] == "loading":
        ls.log(f"inline {request_id}: the model is loading; the request waits for it")
        ls.inline_waiting[uri] = request_id
        try:
            while ls.status()["state"] == "loading":
                await asyncio.sleep(LOAD_POLL_SECONDS)
        finally:
            if ls.inline_waiting.get(uri) == request_id:
                del ls.inline_waiting[uri]
            else:
                version = None  # a newer request for this document waited too: it answers
        if version != doc.version or ls.documents.get(uri) is not doc:
            return types.InlineCompletionList(items=[])
    text = await complete(ls, doc, offset, at, "inline")
    if doc.version != version or ls.documents.get(uri) is not doc:
        ls.log(f"inline {request_id}: {uri} changed while it was computed; answered with nothing")
        return types.InlineCompletionList(items=[])
    end = _end_of_word(ls, doc, offset, text)
    items = [types.InlineCompletionItem(insert_text=text, range=types.Range(at, end))] if text and end else []
    return types.InlineCompletionList(items=items)


async def completion(ls: LladaServer, params: types.CompletionParams) -> types.CompletionList:
    found = ls.documents.locate(params.text_document.uri, params.position, ls.encoding)
    if found is None or _still_loading(ls, "completion"):
        return types.CompletionList(is_incomplete=True, items=[])
    doc, offset, at = found
    text = await complete(ls, doc, offset, at, "completion")
    end = _end_of_word(ls, doc, offset, text)
    if not text or end is None:
        return types.CompletionList(is_incomplete=True, items=[])
    # The item replaces the word typed so far with that word completed (`val|` -> `values(values):`):
    # clients filter items by the text from the word's start, and insert the edit's range whole.
    word = _word_before(doc.text, offset)
    start = types.Position(*doc.position(offset - len(word), ls.encoding))
    label = (word + text).strip().splitlines()[0]
    item = types.CompletionItem(
        label=label, filter_text=word + text.split("\n", 1)[0], kind=types.CompletionItemKind.Text, detail="llada",
        text_edit=_edit(ls, start, at, end, word + text),
        insert_text_format=types.InsertTextFormat.PlainText, sort_text="0",
    )  # fmt: skip
    if ls.ale:  # it shows and inserts an item's text only up to its first `(`
        item = cut_for_ale(item, start, word_after(doc.text, offset), ls.encoding)
    return types.CompletionList(is_incomplete=True, items=[item])


def _edit(ls: LladaServer, start: types.Position, at: types.Position, end: types.Position,
          text: str) -> types.TextEdit | types.InsertReplaceEdit:  # fmt: skip
    """The item's edit from the word's start: to `end` (the word's end, where the cursor is inside a
    word). Clients that take an InsertReplaceEdit (lsp-mode) replace to `end` by default, and read a
    plain TextEdit's range as ending at the cursor; the others get the TextEdit."""
    document = ls.client_capabilities.text_document
    item = document and document.completion and document.completion.completion_item
    if end != at and item and item.insert_replace_support:
        return types.InsertReplaceEdit(text, insert=types.Range(start, at), replace=types.Range(start, end))
    return types.TextEdit(types.Range(start, end), text)


def _still_loading(ls: LladaServer, method: str) -> bool:
    """While the model loads, completions (and inline ones through an engine service) answer at once
    with nothing (`isIncomplete`: the next keystroke asks again): lsp-mode waits 10 s for an answer,
    synchronously, and a load takes longer."""
    if ls.status()["state"] != "loading":
        return False
    ls.log(f"{method} {ls.protocol.msg_id}: the model is loading; answered with nothing")
    return True


def _word_before(text: str, offset: int) -> str:
    """The identifier characters right before `offset` on its line."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:offset]


def _end_of_word(ls: LladaServer, doc: Document, offset: int, text: str) -> types.Position | None:
    """Where the completion's edit ends: the cursor, or, with the cursor inside a word (`re|turn`), the
    word's end, since inserting at the cursor would leave the word's rest behind the completion
    (`return sum(values)turn`). The edit then replaces the rest, so the completion must keep it, at
    its start (`turn sum(values)`) or at its end: else None, and nothing is offered."""
    rest = word_after(doc.text, offset)
    if rest and not (text.startswith(rest) or text.endswith(rest)):
        return None
    return types.Position(*doc.position(offset + len(rest), ls.encoding))


async def complete(ls: LladaServer, doc: Document, offset: int, at: types.Position, method: str) -> str:
    """The inline completion at `offset`, with drafts to clients that asked for them. A newer request
    for the same document supersedes this one (it then answers RequestCancelled)."""
    s, request_id, text = ls.settings, ls.protocol.msg_id, doc.text
    suggestions = ls.documents.suggestions
    revision = suggestions.revision(doc.uri, text, offset) if ls.revising else None
    job = Infill.at(text, offset, s.inline_mode, s.max_completion_tokens, s.context_tokens,
                    *((revision.draft, revision.typed) if revision else ()))  # fmt: skip
    context = await ls.cross_file.snippets_for(doc, offset)
    if context:
        job = dataclasses.replace(job, context=context, context_share=s.context_files_share)
    # Inside a word (`re|turn`) the answer replaces the word's rest, which a draft inserted at the
    # cursor would show twice: such a request sends no drafts, only its answer.
    mid_word = offset < len(text) and (text[offset].isalnum() or text[offset] == "_")
    send = _draft_sender(ls, doc, request_id, at) if ls.drafts and not mid_word else None
    outcome = await ls.run_job(doc.uri, f"{method} {request_id}", job, send)
    if send is not None:
        send(outcome.steps, outcome.text, final=True)
    if ls.revising:
        suggestions.remember(doc.uri, text, offset, revision if job.draft is not None else None, outcome.text)
    ls.cross_file.warm_later((doc.uri, doc.version, offset))
    return outcome.text


def _draft_sender(ls: LladaServer, doc: Document, request_id, at: types.Position) -> Callable:
    uri, version = doc.uri, doc.version
    where = {"line": at.line, "character": at.character}

    def send(step: int, text: str, final: bool = False) -> None:
        params = {"uri": uri, "version": version, "requestId": request_id, "step": step, "final": final,
                  "range": {"start": where, "end": where}, "text": text}  # fmt: skip
        ls.protocol.notify(DRAFT, params)

    return send


def register(ls: LladaServer) -> None:
    ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(inline_completion)
    # Non-empty options: Vim's ALE reads an empty object as "no completion support".
    options = types.CompletionOptions(trigger_characters=["."], resolve_provider=False)
    ls.feature(types.TEXT_DOCUMENT_COMPLETION, options)(completion)
