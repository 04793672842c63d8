"""Vim's ALE keeps an item's text only up to its first `(` (server/ale.py): the item it gets, and who
is taken for ALE. The real Vim with ALE: tests/e2e/test_vim_ale.py."""

from __future__ import annotations

from lsprotocol import types as t
from pygls.protocol import default_converter

from llada_lsp.server.ale import cut_for_ale, is_ale

# What ALE 3.3's lsp.vim sends in `initialize` (its capabilities, abridged to the parts that count).
ALE = {
    "processId": 1, "rootPath": "/src", "rootUri": "file:///src", "initializationOptions": {},
    "capabilities": {
        "workspace": {"applyEdit": False, "workspaceFolders": False, "configuration": False},
        "textDocument": {"completion": {
            "dynamicRegistration": False, "contextSupport": False,
            "completionItem": {"snippetSupport": False, "commitCharactersSupport": False,
                               "documentationFormat": ["plaintext"], "deprecatedSupport": False,
                               "preselectSupport": False}}},
    },
}  # fmt: skip


def params(**changes) -> t.InitializeParams:
    data = {**ALE, **changes}
    return default_converter().structure(data, t.InitializeParams)


def test_ale_is_recognized_by_its_initialize_and_no_other_client_is():
    assert is_ale(params())
    assert not is_ale(params(clientInfo={"name": "Neovim"}))
    caps = ALE["capabilities"]
    assert not is_ale(params(capabilities={**caps, "workspace": {"applyEdit": True}}))
    assert not is_ale(params(capabilities={"workspace": {"applyEdit": False}}))  # no completion capabilities


def item(new_text: str, start: int = 12, end: int = 13) -> t.CompletionItem:
    edit = t.TextEdit(t.Range(t.Position(1, start), t.Position(1, end)), new_text)
    return t.CompletionItem(label=new_text.splitlines()[0], text_edit=edit, detail="llada")


def test_the_text_from_the_first_paren_is_an_edit_after_what_ale_inserts():
    """`    total = s|` completed with `sorted(values)`: ALE inserts `sorted` over the typed `s`, then
    applies `(values)` where `sorted` ends in the buffer as it is then (column 12 + 6)."""
    cut = cut_for_ale(item("sorted(values)"), t.Position(1, 12), "", "utf-16")
    assert cut.text_edit.new_text == "sorted" and cut.detail == "sorted(values)"
    assert cut.additional_text_edits == [t.TextEdit(t.Range(t.Position(1, 18), t.Position(1, 18)), "(values)")]


def test_inside_a_word_the_edit_replaces_the_rest_that_ale_leaves():
    """`re|turn`: ALE replaces only the typed `re`, and `turn` stays after its insertion: the edit
    replaces it with the rest of the completion."""
    cut = cut_for_ale(item("return sum(x)", 4, 10), t.Position(1, 4), "turn", "utf-16")
    assert cut.text_edit.new_text == "return sum"
    assert cut.additional_text_edits == [t.TextEdit(t.Range(t.Position(1, 14), t.Position(1, 18)), "(x)")]


def test_a_line_end_cuts_as_a_paren_does_and_plain_items_are_left_alone():
    cut = cut_for_ale(item("if x:\n        return 1"), t.Position(1, 12), "", "utf-8")
    assert cut.text_edit.new_text == "if x:" and cut.additional_text_edits[0].new_text == "\n        return 1"
    plain = item("values")
    assert cut_for_ale(plain, t.Position(1, 12), "", "utf-16") == item("values")
    starts = item("(a, b)")  # nothing before its `(`: ALE drops it whatever it carries
    assert cut_for_ale(starts, t.Position(1, 12), "", "utf-16") == item("(a, b)")
