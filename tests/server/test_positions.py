"""Position conversion in UTF-8/16/32 on lines with emoji and CJK, and documents edited through it."""

from __future__ import annotations

import random

import pytest

from llada_lsp.server.documents import Document
from llada_lsp.server.positions import UTF8, UTF16, UTF32, to_character, to_index

LINE = 'x = "😀中文" + y'  # 😀: 1 code point, 2 UTF-16 units, 4 UTF-8 bytes; 中, 文: 1, 1, 3 each


@pytest.mark.parametrize(
    "encoding, after_emoji, after_cjk",
    [(UTF32, 6, 8), (UTF16, 7, 9), (UTF8, 9, 15)],
)
def test_units_after_emoji_and_cjk(encoding, after_emoji, after_cjk):
    emoji_end, cjk_end = LINE.index("😀") + 1, LINE.index("文") + 1
    assert to_character(LINE, emoji_end, encoding) == after_emoji
    assert to_character(LINE, cjk_end, encoding) == after_cjk
    assert to_index(LINE, after_emoji, encoding) == emoji_end
    assert to_index(LINE, after_cjk, encoding) == cjk_end


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_round_trip_every_index(encoding):
    for index in range(len(LINE) + 1):
        assert to_index(LINE, to_character(LINE, index, encoding), encoding) == index


def test_inside_a_character_rounds_down_and_past_the_end_clamps():
    start = LINE.index("😀")
    assert to_index(LINE, to_character(LINE, start, UTF16) + 1, UTF16) == start  # half a surrogate pair
    assert to_index(LINE, to_character(LINE, start, UTF8) + 2, UTF8) == start  # inside a 4-byte sequence
    for encoding in (UTF8, UTF16, UTF32):
        assert to_index(LINE, 10_000, encoding) == len(LINE)
        assert to_index(LINE, 0, encoding) == 0


def test_document_offsets_and_positions_with_crlf():
    doc = Document("file:///a", 1, "a😀b\r\nsecond\rthird\n")
    assert [doc.line(i) for i in range(4)] == ["a😀b", "second", "third", ""]
    assert doc.offset(0, 3, UTF16) == 2  # after the emoji
    assert doc.offset(1, 99, UTF16) == len("a😀b\r\nsecond")  # past the end of the line: its end
    assert doc.offset(9, 0, UTF16) is None  # past the end of the document
    for offset in range(len(doc.text) + 1):
        if doc.text[offset - 1 : offset + 1] == "\r\n":
            continue  # between CR and LF is not a position
        assert doc.offset(*doc.position(offset, UTF8), UTF8) == offset


def test_incremental_edits_land_where_the_encoding_says():
    for encoding, after_emoji in ((UTF16, 7), (UTF8, 9), (UTF32, 6)):
        doc = Document("file:///a", 1, LINE + "\nnext\n")
        assert doc.edit((0, after_emoji), (0, after_emoji), "\n", encoding)
        assert doc.text == 'x = "😀\n中文" + y\nnext\n'
        assert doc.edit((1, 0), (2, 4), "", encoding)  # a range across a line end
        assert doc.text == 'x = "😀\n\n'


def test_edits_past_the_end_are_clamped_and_reported():
    doc = Document("file:///a", 1, "abc\n")
    assert not doc.edit((5, 0), (6, 0), "tail", UTF16)
    assert doc.text == "abc\ntail"
    assert not doc.edit((0, 1), (9, 9), "X", UTF16)
    assert doc.text == "aX"


def test_line_starts_stay_right_through_random_edits():
    """Line starts are updated around each edit; they must equal a full rescan after every one."""
    rng = random.Random(7)
    doc = Document("file:///a", 1, "ab\r\ncd\n\nef\rgh\n")
    pieces = ["", "x", "\n", "\r", "\r\n", "yz\nw", "😀", "\n\n"]
    for _ in range(400):
        n = len(doc.line_starts)
        start = (rng.randrange(n + 1), rng.randrange(4))
        end = (rng.randrange(start[0], n + 1), rng.randrange(4))
        doc.edit(start, end, rng.choice(pieces), UTF16)
        assert doc.line_starts == Document("", 0, doc.text).line_starts, repr(doc.text)
