"""Post-processing: the logical unit at the cursor, repeats dropped, closing brackets never duplicated."""

from __future__ import annotations

from llada_lsp.completion.postprocess import Cursor, finish

MID = Cursor(before="    total = add(", after="", next_line="    return total")
EMPTY = Cursor(before="    ", after="", next_line="print(add(1, 2))")


def test_mid_line_stops_at_the_end_of_the_line():
    done = finish("a, b)\n    return total\n", MID, ended=False)
    assert (done.text, done.complete) == ("a, b)", True)
    partial = finish("a, b", MID, ended=False)
    assert (partial.text, partial.complete) == ("a, b", False)
    assert finish("a, b", MID, ended=True).complete


def test_empty_line_block_ends_at_a_blank_line():
    done = finish("if a:\n        return b\n    return a\n\ndef other():\n", EMPTY, ended=False)
    assert (done.text, done.complete) == ("if a:\n        return b\n    return a", True)
    done = finish("total = a\n\n    return total\n", EMPTY, ended=False)  # the same indent after the blank line
    assert (done.text, done.complete) == ("total = a", True)


def test_indentation_already_typed_is_not_inserted_again():
    done = finish("    return a + b\n", EMPTY, ended=True)  # the model repeats the cursor line's indent
    assert done.text == "return a + b"


def test_empty_line_block_ends_at_a_dedent():
    done = finish("return a + b\nprint(add(1, 2))\n", EMPTY, ended=False)
    assert (done.text, done.complete) == ("return a + b", True)


def test_a_block_ends_before_it_repeats_the_line_already_below_the_cursor():
    cursor = Cursor(before="        ", after="", next_line="        decode=Codec().decode,")
    done = finish("encode=Codec().encode,\n        decode=Codec().decode,\n        name='x',\n", cursor, ended=False)
    assert (done.text, done.complete) == ("encode=Codec().encode,", True)


def test_a_block_still_being_written_is_not_complete():
    partial = finish("for x in xs:\n        ", EMPTY, ended=False)
    assert (partial.text, partial.complete) == ("for x in xs:", False)
    assert finish("\n\n", EMPTY, ended=False) == finish("", EMPTY, ended=True)


def test_closing_brackets_already_after_the_cursor_are_not_duplicated():
    cursor = Cursor(before="print(add(", after="))", next_line="")
    assert finish("1, 2))", cursor, ended=True).text == "1, 2"
    assert finish("1, 2)", cursor, ended=True).text == "1, 2"
    assert finish("1, 2", cursor, ended=True).text == "1, 2"
    colon = Cursor(before="def f(a", after="):", next_line="")
    assert finish(", b):", colon, ended=True).text == ", b"
    word = Cursor(before="for x in item", after="s:", next_line="")
    assert finish("s_list:", word, ended=True).text == "s_list:"  # not closing brackets: kept


def test_a_completion_that_only_repeats_the_buffer_is_dropped():
    cursor = Cursor(before="x = ", after="compute(y)", next_line="return x")
    assert finish("compute(y)", cursor, ended=True).text == ""
    assert finish("comp", cursor, ended=True).text == ""
    assert finish("compute(z) + ", cursor, ended=True).text == "compute(z) +"
    assert finish("return x", Cursor("    ", "", "    return x"), ended=True).text == ""


def test_special_tokens_and_chat_fences_are_stripped():
    assert finish("a<|fim_middle|>b<|endoftext|>", MID, ended=True).text == "ab"
    chat = finish("```python\nreturn a + b\n```\nThat adds them.", EMPTY, ended=False, chat=True)
    assert (chat.text, chat.complete) == ("return a + b", True)
