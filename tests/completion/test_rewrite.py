"""Rewrite selection never makes valid code invalid: the syntax guard, the bound to the selection, the
rewrite pipeline's outcomes (with the real tokenizer and a scripted engine), and instructions."""

from __future__ import annotations

import threading

import pytest

from llada_lsp.completion.generation import Draft, LoadedModel, ModelSpec, Result
from llada_lsp.completion.jobs import Outcome, Rewrite
from llada_lsp.completion.pipeline import InstructionUnsupported, run_rewrite
from llada_lsp.completion.postprocess import bound_rewrite
from llada_lsp.completion.prompt import TextCodec
from llada_lsp.completion.syntax import CHECK_MAX, Balance, check_rewrite, is_python, python_region

PY = "def f(name):\n    return name.split()\n\nx = f('a b')\n"


def test_python_that_parsed_must_still_parse():
    start = PY.index("name.split()")
    assert check_rewrite(PY, start, start + 12, "name.split(' ')", python=True) is None
    reason = check_rewrite(PY, start, start + 12, "name.split(", python=True)
    assert reason is not None and "unparsable" in reason and "line 2" in reason
    # A characterwise selection that ends inside the call: `name.split()).lower()` must be refused.
    assert check_rewrite(PY, start, start + 11, "name.split()).lower(", python=True) is not None
    # An unterminated docstring, the new user's other example.
    end = PY.index("\n", start)
    assert check_rewrite(PY, start, end, 'name.split()\n    """Split', python=True) is not None


def test_the_python_guard_parses_the_statements_around_the_selection_and_no_more():
    """Issue 25: ast over a whole huge window took minutes and gigabytes. The guard judges the enclosing
    top-level statements, else those at the selection's indentation, else refuses as too long."""
    filler = "".join(f"def f{i}(a):\n    return a + {i}\n\n\n" for i in range(CHECK_MAX // 10))
    text = filler + "class C:\n    def add(self, a, b):\n        return a + b\n\n\nz = 1\n" + filler
    start = text.index("return a + b")
    lo, hi, indent = python_region(text, start, start + 12)
    assert text[lo:hi] == "class C:\n    def add(self, a, b):\n        return a + b\n\n\n" and indent == 0
    reason = check_rewrite(text, start, start + 12, "return (a + b", python=True)
    assert "unparsable" in reason and f"line {text.count(chr(10), 0, start) + 1}" in reason
    assert check_rewrite(text, start, start + 12, "return a - b", python=True) is None
    # A class too big to parse whole: the statement at the selection's own indentation.
    big = "class Big:\n" + "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(CHECK_MAX // 30))
    text = big + "    def add(self, a, b):\n        return a + b\n"
    start = text.index("return a + b")
    assert "unparsable" in check_rewrite(text, start, start + 12, "return (a + b", python=True)
    # One giant line: nothing bounded to judge, said so.
    text = "x = [" + "1, " * CHECK_MAX + "2]"
    assert "too long to check" in check_rewrite(text, 5, 6, "3", python=True)


def test_python_with_a_lone_surrogate_is_still_parsed():
    """ast refuses text with a lone surrogate; without the U+FFFD stand-in the file would 'not parse'
    and a rewrite that drops a colon (brackets intact) would pass the weaker check."""
    text = "s = '\ud800'\nif s:\n    pass\n"
    start = text.index("if s:")
    reason = check_rewrite(text, start, start + 5, "if s", python=True)
    assert reason is not None and "unparsable" in reason and "line 2" in reason


def test_python_that_did_not_parse_falls_back_to_brackets_and_quotes():
    broken = "def f(:\n    return g(a, b)\n"
    start = broken.index("g(a, b)")
    assert check_rewrite(broken, start, start + 7, "g(b, a)", python=True) is None
    assert "brackets or quotes" in check_rewrite(broken, start, start + 7, "g(b, a", python=True)


def test_other_languages_keep_brackets_and_quotes():
    js = "function f(a) {\n  return [a, 'x'];\n}\n"
    start, end = js.index("return"), js.index(";")
    assert check_rewrite(js, start, end, "return [a, 'y', \"z\"]", python=False) is None
    assert check_rewrite(js, start, end, "return [a, 'y'", python=False) is not None
    assert check_rewrite(js, start, end, "return [a, 'y]", python=False) is not None
    assert check_rewrite(js, start, end, "return [a, 'x']]", python=False) is not None
    # A selection that was unbalanced itself (half a block) may stay so, in the same way.
    a = js.index("{")
    assert check_rewrite(js, a, js.index("\n}"), "{\n  return a;", python=False) is None
    assert check_rewrite(js, a, js.index("\n}"), "{\n  return a;\n}", python=False) is not None


def test_balance_ignores_brackets_in_strings_and_apostrophes_in_prose():
    assert Balance.of("f(')', \"]\")") == Balance("", "", "")
    assert Balance.of("# don't (\nx = 1") == Balance("", "", "")
    assert Balance.of('x = """a\n(b') == Balance("", "", '"""')
    assert Balance.of("a)(") == Balance(")", "(", "")


def test_language_of_a_document():
    assert is_python("python", "file:///a.txt") and is_python("", "file:///a/b.PY") and is_python("", "x.pyi")
    assert not is_python("javascript", "file:///a.js")


def test_bound_rewrite_stays_in_the_selection():
    """(Trailing whitespace is the selection's own, put back by the pipeline: compared without it.)"""
    line = "            parser.x = lex.end\n"

    def bound(text: str, selection: str, line_start: str = "") -> str:
        return bound_rewrite(text, selection, line_start).rstrip()

    # Room to grow filled with the code that follows is dropped: here it leaves the selected block.
    assert bound(line + "\nclass\n", line) == line.rstrip()
    # Past the selection's own lines, only continuation lines of its last statement are kept.
    assert bound(line + "            y = 2\n", line) == line.rstrip()
    assert bound("    return f(a,\n             b)\n", "    return f(a, b)\n") == "    return f(a,\n             b)"
    # Inside one line, a rewrite stays on one line.
    assert bound("x + 1)\n\ndef g(", "x + 2", "    return ") == "x + 1)"
    # A function keeps its body, and ends where the next top-level code begins.
    fn = "def f():\n    a = 1\n    return a\n"
    assert bound(fn.replace("1", "2") + "\n\nclass A:\n", fn) == fn.replace("1", "2").rstrip()


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    from llada_lsp.model import load_tokenizer

    return TextCodec.from_tokenizer(load_tokenizer(None))


def scripted(codec: TextCodec, answer: str) -> LoadedModel:
    """The embedded model's tokenizer with a backend that 'generates' `answer`: the pipeline around the
    model (prompt, bound, guard, outcome) is what is tested."""
    eos, calls = codec.special.eos, []

    class Batch:
        def generate(self, request):
            calls.append((request.gen_length, request.init_ids))
            tokens = codec.encode(answer)[: request.gen_length]
            yield Draft(1, tokens)
            return Result(tokens + [eos] * (request.gen_length - len(tokens)), 3, 0.0)

    model = LoadedModel(ModelSpec(None), codec, 512, 32, Batch())
    model.calls = calls
    return model


def rewrite(model, text: str, selection: str, instruction: str | None = None) -> Outcome:
    start = text.index(selection)
    job = Rewrite.at(text, start, start + len(selection), "quality", 1024, instruction, python=True)
    return run_rewrite(model, job, threading.Event(), lambda *_: None)


def test_a_rewrite_that_breaks_the_file_is_refused(codec):
    out = rewrite(scripted(codec, "return name.split("), PY, "return name.split()")
    assert out.stopped == "refused" and "unparsable" in out.reason and out.text == "return name.split("


def test_a_good_rewrite_is_done_and_bounded(codec):
    model = scripted(codec, "    return name.split(' ')\n\nclass\n")
    out = rewrite(model, PY, "    return name.split()\n")
    assert (out.stopped, out.text) == ("done", "    return name.split(' ')\n")
    gen_length, init_ids = model.calls[0]
    assert init_ids == codec.encode("    return name.split()\n")
    assert len(init_ids) < gen_length <= len(init_ids) + max(2, len(init_ids) // 8)  # a small allowance


def test_no_change_is_reported_as_such(codec):
    out = rewrite(scripted(codec, "x = f('a b')\n\n#\n"), PY, "x = f('a b')\n")
    assert (out.stopped, out.text) == ("unchanged", "x = f('a b')\n") and out.reason


def test_an_instruction_is_refused_by_a_fill_in_the_middle_model(codec):
    model = scripted(codec, "anything")
    assert codec.special.has_fim
    with pytest.raises(InstructionUnsupported, match="cannot follow an instruction"):
        rewrite(model, PY, "x = f('a b')\n", instruction="use a list")
    assert model.calls == []  # refused before anything ran
