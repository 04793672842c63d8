"""Next-edit suggestions over the LSP: `llada/nextEdit`, the same under Copilot's
`textDocument/copilotInlineEdit` (so clients built for it work unchanged), and the code action
"Apply suggested edit" for every other client. Each asks `suggest`, which cuts the job around the
cursor with the document's recent edits (completion/history.py), runs it and turns the revised window
into document ranges, for the version asked about only.

Knows pygls, lsprotocol and jobs as plain values; the pipeline is completion/next_edit.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from ..completion.next_edit import NextEdit, changes
from ..completion.syntax import is_python
from .completers import next_edit_key
from .language_server import LladaServer

NEXT_EDIT, COPILOT_INLINE_EDIT = "llada/nextEdit", "textDocument/copilotInlineEdit"
APPLY_TITLE = "Apply suggested edit"


@dataclass(frozen=True)
class Suggestion:
    """The edits of one suggestion (document str offsets, in order), for `uri` at `version`."""

    uri: str
    version: int
    edits: list[tuple[int, int, str]]


def _param(params: Any, name: str) -> Any:
    return params.get(name) if isinstance(params, dict) else getattr(params, name, None)


def parse_request(params: Any, method: str) -> tuple[str, int, types.Position]:
    """(uri, version, position) of `{textDocument: {uri, version}, position}`; InvalidParams otherwise."""
    usage = f"{method} takes {{textDocument: {{uri, version}}, position: {{line, character}}}}"
    doc, pos = _param(params, "textDocument") or _param(params, "text_document"), _param(params, "position")
    uri, version = _param(doc, "uri"), _param(doc, "version")
    line, character = _param(pos, "line"), _param(pos, "character")
    if not isinstance(uri, str) or type(version) is not int:
        raise JsonRpcInvalidParams(f"{usage}: textDocument needs a string uri and an integer version")
    if type(line) is not int or type(character) is not int or line < 0 or character < 0:
        raise JsonRpcInvalidParams(f"{usage}: position needs non-negative integers line and character")
    return uri, version, types.Position(line, character)


async def suggest(ls: LladaServer, uri: str, version: int, position: types.Position) -> Suggestion | None:
    """The next edit around `position` of `uri` at `version`; None when there is none to show: the
    feature is off, the document is unknown or at another version (before or after the model ran), or
    the pipeline stayed silent (its reason goes to the log)."""
    doc = ls.documents.get(uri)
    if not ls.settings.next_edit or doc is None or doc.version != version:
        return None
    offset = doc.offset(position.line, position.character, ls.encoding)
    if offset is None:
        return None
    history = ls.documents.history
    last = history.last(uri)
    job, start = NextEdit.at(doc.text, offset, history.diffs(uri) if ls.settings.next_edit_history else (),
                             (last.start, last.old, last.new) if last else None, ls.settings.context_tokens,
                             is_python(doc.language, uri))  # fmt: skip
    if not job.window.strip():  # nothing to revise: a model would only write new code there
        return None
    # The completions' set where they chose one (their prompts' first blocks, cached), else one chosen here.
    on = ls.settings.context_files and ls.settings.context_files_share
    context = ls.context.current(uri) if on else ()
    context = await ls.cross_file.snippets_for(doc, offset) if context is None else context
    if context:
        job = dataclasses.replace(job, context=context, context_share=ls.settings.context_files_share)
    outcome = await ls.run_job(next_edit_key(uri), f"next-edit {ls.protocol.msg_id}", job)
    now = ls.documents.get(uri)
    if now is None or now.version != version:  # typed on meanwhile: never an edit against changed text
        return None
    if outcome.stopped != "done":
        ls.log(f"next edit for {uri}: none ({outcome.reason or outcome.stopped})")
        return None
    edits = [(start + c.start, start + c.end, c.text) for c in changes(job.window, outcome.text)]
    return Suggestion(uri, version, edits) if edits else None


def _range(ls: LladaServer, uri: str, a: int, b: int) -> types.Range:
    doc = ls.documents.get(uri)
    return types.Range(types.Position(*doc.position(a, ls.encoding)), types.Position(*doc.position(b, ls.encoding)))


def _wire_range(ls: LladaServer, uri: str, a: int, b: int) -> dict[str, Any]:
    r = _range(ls, uri, a, b)
    return {"start": {"line": r.start.line, "character": r.start.character},
            "end": {"line": r.end.line, "character": r.end.character}}  # fmt: skip


def _merged(ls: LladaServer, s: Suggestion) -> tuple[int, int, str]:
    """The suggestion as one edit, from its first change to its last (Copilot's edits are alternatives)."""
    text = ls.documents.get(s.uri).text
    a, b = s.edits[0][0], s.edits[-1][1]
    pieces, at = [], a
    for start, end, new in s.edits:
        pieces += [text[at:start], new]
        at = end
    return a, b, "".join(pieces)


async def next_edit(ls: LladaServer, params: Any) -> dict[str, Any]:
    uri, version, position = parse_request(params, NEXT_EDIT)
    s = await suggest(ls, uri, version, position)
    if s is None:
        return {"edits": []}
    ls.documents.history.offer(uri, s.edits, version)
    edits = [{"range": _wire_range(ls, uri, a, b), "newText": t} for a, b, t in s.edits]
    return {"edits": edits, "version": version}


async def copilot_inline_edit(ls: LladaServer, params: Any) -> dict[str, Any]:
    uri, version, position = parse_request(params, COPILOT_INLINE_EDIT)
    s = await suggest(ls, uri, version, position)
    if s is None:
        return {"edits": []}
    a, b, text = _merged(ls, s)
    ls.documents.history.offer(uri, [(a, b, text)], version)
    edit = {"text": text, "range": _wire_range(ls, uri, a, b), "textDocument": {"uri": uri, "version": version}}
    return {"edits": [edit]}


async def code_actions(ls: LladaServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """ "Apply suggested edit" when a suggestion exists at the start of the range (the cursor), as a
    versioned edit: a client that applies it after typing on has it refused. Clients ask for code
    actions on every cursor move (trigger kind Automatic): those get the suggestion already made for
    this version, if any; only an explicit request (Invoked, or a client that does not say) runs the model."""
    doc = ls.documents.get(params.text_document.uri)
    only = params.context.only
    if doc is None or not ls.settings.next_edit or (only and types.CodeActionKind.QuickFix not in only):
        return []
    known = ls.documents.history.suggested(doc.uri, doc.version)
    if known is not None:
        s: Suggestion | None = Suggestion(doc.uri, doc.version, known)
    elif params.context.trigger_kind == types.CodeActionTriggerKind.Automatic:
        return []
    else:
        s = await suggest(ls, doc.uri, doc.version, params.range.start)
    if s is None:
        return []
    ls.documents.history.offer(doc.uri, s.edits, s.version)
    edits = [types.TextEdit(_range(ls, doc.uri, a, b), t) for a, b, t in s.edits]
    change = types.TextDocumentEdit(types.OptionalVersionedTextDocumentIdentifier(doc.uri, s.version), edits)
    return [types.CodeAction(APPLY_TITLE, kind=types.CodeActionKind.QuickFix,
                             edit=types.WorkspaceEdit(document_changes=[change]))]  # fmt: skip


def register(ls: LladaServer) -> None:
    ls.feature(NEXT_EDIT)(next_edit)
    ls.feature(COPILOT_INLINE_EDIT)(copilot_inline_edit)
    # textDocument/codeAction is one handler for the rewrite and the next edit: handlers.code_actions
