"""The rewrite's safety net: a rewrite that would turn code that parsed into code that does not is
refused. For Python, `ast` parses the statements around the selection: the enclosing top-level ones,
or, when those are over CHECK_MAX characters, the enclosing ones at the selection's own indentation;
past that the rewrite is refused as too long to check (the cost of a check is bounded, whatever the
file's size). Every other language (and Python whose region did not parse before) is held to its
brackets and quotes: the rewritten text must leave the same brackets open or unmatched, and end
inside a string exactly when the selection did.

Pure string functions; knows nothing of tokens, models or the LSP.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from .codec import without_surrogates

_OPEN, _CLOSE = "([{", ")]}"
_PAIR = dict(zip(_CLOSE, _OPEN))
_QUOTES = "\"'`"
PYTHON_SUFFIXES = (".py", ".pyi", ".pyw")
CHECK_MAX = 2**16  # characters of Python around a selection the guard parses, at most (~0.3 s of ast)
_CONTINUES = ("else", "elif", "except", "finally")  # a line that goes on the compound statement above


def is_python(language_id: str, uri: str) -> bool:
    return language_id == "python" or uri.lower().endswith(PYTHON_SUFFIXES)


def check_rewrite(text: str, start: int, end: int, new: str, python: bool) -> str | None:
    """Why replacing text[start:end] by `new` would break code that was well formed; None if it would not."""
    if python:
        region = python_region(text, start, end)
        if region is None:
            return (f"the statements around the selection are over {CHECK_MAX} characters: too long to check "
                    "that the rewrite keeps them parsing; select inside a smaller statement")  # fmt: skip
        lo, hi, indent = region
        if python_error(_dedent(text[lo:hi], indent)) is None:
            after = python_error(_dedent(text[lo:start] + new + text[end:hi], indent), text.count("\n", 0, lo))
            if after is not None:
                return f"the rewrite would leave the file unparsable ({after})"
            return None
    old = text[start:end]
    was, now = Balance.of(old), Balance.of(new)
    if was != now:
        return f"the rewrite changes the brackets or quotes of the selection ({was.describe()} -> {now.describe()})"
    return None


def python_region(text: str, start: int, end: int) -> tuple[int, int, int] | None:
    """The statements the guard parses for a selection text[start:end]: (lo, hi, indent), text[lo:hi]
    whole lines at `indent` or deeper; the enclosing top-level statements, else those at the indentation
    of the selection's first line; None when both are over CHECK_MAX characters."""
    first_line = text[text.rfind("\n", 0, start) + 1 : start + 200].split("\n", 1)[0]
    for level in dict.fromkeys((0, _indent(first_line))):
        region = _region(text, start, end, level)
        if region is not None:
            return region
    return None


def _region(text: str, start: int, end: int, level: int) -> tuple[int, int, int] | None:
    budget = CHECK_MAX
    lo = text.rfind("\n", 0, start) + 1  # up to the line that starts a statement at `level` or less
    while True:
        line = _line_at(text, lo)
        if (_starts_statement(line) and _indent(line) <= level) or lo == 0:
            break
        budget -= len(line) + 1
        if budget < 0:
            return None
        lo = text.rfind("\n", 0, lo - 1) + 1
    indent = _indent(line) if _starts_statement(line) else 0
    hi = end if end == 0 or text[end - 1] == "\n" else text.find("\n", end) + 1 or len(text)
    budget -= start - lo
    while hi < len(text):  # down to the next line that starts a statement at `indent` or less
        line = _line_at(text, hi)
        if _starts_statement(line) and _indent(line) <= indent:
            break
        budget -= len(line) + 1
        if budget < 0:
            return None
        hi += len(line) + 1
    hi = min(hi, len(text))
    if hi - lo - (end - start) > CHECK_MAX:  # giant lines: the line scans above stop at a bounded piece
        return None
    return lo, hi, indent


def _line_at(text: str, pos: int) -> str:
    """The line that starts at `pos` (without its line end); a bounded piece of a giant one."""
    stop = text.find("\n", pos, pos + CHECK_MAX + 1)
    return text[pos : stop if stop >= 0 else pos + CHECK_MAX + 1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _starts_statement(line: str) -> bool:
    """Whether a line may begin a statement of its own: code (no blank, comment or closing bracket),
    and no else / elif / except / finally, which go on the statement above."""
    body = line.lstrip(" \t")
    if not body.strip() or body[0] == "#" or body[0] in _CLOSE:
        return False
    return body.split(None, 1)[0].split(":", 1)[0] not in _CONTINUES


def _dedent(code: str, indent: int) -> str:
    """`code` with its first `indent` columns of blanks taken off each line (a nested block parses alone)."""
    if indent == 0:
        return code
    return "\n".join(line[indent:] if not line[:indent].strip(" \t") else line for line in code.split("\n"))


def python_error(source: str, line_offset: int = 0) -> str | None:
    """Why `source` is not Python that parses (message and line, counted from `line_offset` + 1), or
    None if it parses."""
    try:
        with warnings.catch_warnings():  # invalid escapes and the like warn; they still parse
            warnings.simplefilter("ignore")
            ast.parse(without_surrogates(source))  # ast refuses text it cannot encode as UTF-8
    except SyntaxError as err:
        return f"{err.msg}, line {(err.lineno or 1) + line_offset}"
    except (ValueError, RecursionError) as err:  # NUL bytes; absurdly deep nesting
        return str(err) or type(err).__name__
    return None


@dataclass(frozen=True)
class Balance:
    """What a piece of code leaves unbalanced: closers with no opener in it, openers left open, and the
    quote it ends inside of (strings are taken to end at a line end, except triple-quoted ones)."""

    unmatched: str  # closing brackets met with nothing open, in order
    still_open: str  # opening brackets left open at the end, in order
    in_string: str  # the quote the text ends inside of, or ""

    @classmethod
    def of(cls, code: str) -> Balance:
        unmatched, stack, quote, i = [], [], "", 0
        while i < len(code):
            c = code[i]
            if quote:
                if c == "\\":
                    i += 2
                    continue
                if code.startswith(quote, i):
                    i, quote = i + len(quote), ""
                    continue
                if c == "\n" and len(quote) == 1 and quote != "`":
                    quote = ""  # an unterminated one-line string (or an apostrophe in prose) ends with its line
            elif c in _QUOTES:
                quote = c * 3 if code.startswith(c * 3, i) else c
                i += len(quote)
                continue
            elif c in _OPEN:
                stack.append(c)
            elif c in _CLOSE:
                if stack and stack[-1] == _PAIR[c]:
                    stack.pop()
                else:
                    unmatched.append(c)
            i += 1
        return cls("".join(unmatched), "".join(stack), quote)

    def describe(self) -> str:
        parts = [f"unmatched {self.unmatched!r}" if self.unmatched else "", f"open {self.still_open!r}" if self.still_open else "",
                 f"inside a {self.in_string} string" if self.in_string else ""]  # fmt: skip
        return ", ".join(p for p in parts if p) or "balanced"
