"""Completion items for Vim's ALE, which shows and inserts only what comes before an item's first `(`.

ALE (3.3, Debian's vim-ale) takes an item's text (`textEdit.newText`, else `insertText`, else `label`)
and keeps `matchstr(text, '^[^(]\\+')`: `sum(values)` is shown and inserted as `sum`, and an item whose
text starts with `(` is dropped. No field escapes that rule. What it does apply whole is an item's
`additionalTextEdits`, after the insertion (on CompleteDone, with `g:ale_completion_autoimport`, its
default), at their positions in the buffer as it is then. So ALE gets the text up to the first `(` (or
line end) as the item, the rest as an additional edit right after it, and the whole first line in
`detail`, which its menu shows beside the word.

ALE is recognized by its `initialize`: no `clientInfo`, `workspace.applyEdit: false`, and its own
completion capabilities (unchanged since ALE 2.x). Every other client gets the usual item.

Knows lsprotocol and positions only.
"""

from __future__ import annotations

from lsprotocol import types

from .positions import to_character

# ALE's `textDocument.completion.completionItem`, as its lsp.vim sends it.
_ALE_ITEM = {
    "snippet_support": False,
    "commit_characters_support": False,
    "documentation_format": [types.MarkupKind.PlainText],
    "deprecated_support": False,
    "preselect_support": False,
}


def is_ale(params: types.InitializeParams) -> bool:
    caps = params.capabilities
    workspace, document = caps.workspace, caps.text_document
    completion = document and document.completion
    item = completion and completion.completion_item
    if params.client_info is not None or workspace is None or workspace.apply_edit is not False or item is None:
        return False
    fields = {k: list(v) if isinstance(v := getattr(item, k), tuple) else v for k in _ALE_ITEM}
    return completion.context_support is False and fields == _ALE_ITEM


def cut_for_ale(
    item: types.CompletionItem, start: types.Position, word_rest: str, encoding: str
) -> types.CompletionItem:
    """`item` (its `textEdit` from the typed word's `start`) as ALE shows and inserts it whole: the text
    up to its first `(` or line end as the item, the rest an additional edit just after it, replacing
    `word_rest`, the rest of the word after the cursor, which ALE's insertion leaves there. An item with
    nothing before its `(` stays as it is: ALE drops it, and nothing else would show it. Positions in
    `encoding` (ALE reads them as bytes: the same on an ASCII line)."""
    edit = item.text_edit
    assert isinstance(edit, types.TextEdit)
    text = edit.new_text
    cut = min((i for i in (text.find("("), text.find("\n")) if i >= 0), default=len(text))
    if cut == 0 or cut == len(text):
        return item
    head, tail = text[:cut], text[cut:]
    # Where ALE's insertion of `head` ends, in the buffer as it is after it (ALE applies the edit there).
    at = types.Position(start.line, start.character + to_character(head, len(head), encoding))
    rest = types.Range(at, types.Position(at.line, at.character + to_character(word_rest, len(word_rest), encoding)))
    item.text_edit = types.TextEdit(edit.range, head)
    item.additional_text_edits = [types.TextEdit(rest, tail)]
    item.detail = item.label
    return item


def word_after(text: str, offset: int) -> str:
    """The identifier characters right after `offset`: the rest of a word the cursor is inside."""
    end = offset
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return text[offset:end]
