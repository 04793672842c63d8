"""A completion asked with the cursor inside a word (`re|turn`): where its edit ends, and whether it
is offered at all (the e2e test in test_server_e2e.py shows the model's case through the server)."""

from __future__ import annotations

from types import SimpleNamespace

from lsprotocol import types as t

from llada_lsp.server.documents import Document
from llada_lsp.server.inline import _end_of_word

LS = SimpleNamespace(encoding="utf-16")
LINE = "    return su\n"


def end(offset: int, text: str) -> t.Position | None:
    return _end_of_word(LS, Document("file:///a.py", 1, LINE), offset, text)


def test_after_a_word_the_edit_ends_at_the_cursor():
    assert end(len("    return su"), "m(values)") == t.Position(0, 13)
    assert end(len(LINE) - 1, "\n    return") == t.Position(0, 13), "at the line's end: nothing to replace"


def test_inside_a_word_the_edit_covers_its_rest_when_the_completion_keeps_it():
    assert end(6, "turn sum(values)") == t.Position(0, 10), "the rest at the completion's start"
    assert end(6, "set_and_return") == t.Position(0, 10), "the rest at its end: re|turn -> reset_and_return"


def test_inside_a_word_a_completion_that_drops_its_rest_is_not_offered():
    """Inserted at the cursor it left the rest behind (`reduce(x)turn`); replacing the rest would
    delete what the user typed."""
    assert end(6, "duce(x)") is None
    assert end(4, "print(x)") is None, "before a word: inserting would glue onto it"
