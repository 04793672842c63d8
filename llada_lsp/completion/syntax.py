"""The rewrite's safety net: a rewrite that would turn code that parsed into code that does not is
refused. Python is parsed with `ast`; every other language (and Python that did not parse before) is
held to its brackets and quotes: the rewritten text must leave the same brackets open or unmatched,
and end inside a string exactly when the selection did.

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


def is_python(language_id: str, uri: str) -> bool:
    return language_id == "python" or uri.lower().endswith(PYTHON_SUFFIXES)


def check_rewrite(text: str, start: int, end: int, new: str, python: bool) -> str | None:
    """Why replacing text[start:end] by `new` would break code that was well formed; None if it would not."""
    if python:
        before = python_error(text)
        if before is None:
            after = python_error(text[:start] + new + text[end:])
            if after is not None:
                return f"the rewrite would leave the file unparsable ({after})"
            return None
    old = text[start:end]
    was, now = Balance.of(old), Balance.of(new)
    if was != now:
        return f"the rewrite changes the brackets or quotes of the selection ({was.describe()} -> {now.describe()})"
    return None


def python_error(source: str) -> str | None:
    """Why `source` is not Python that parses (message and line), or None if it parses."""
    try:
        with warnings.catch_warnings():  # invalid escapes and the like warn; they still parse
            warnings.simplefilter("ignore")
            ast.parse(without_surrogates(source))  # ast refuses text it cannot encode as UTF-8
    except SyntaxError as err:
        return f"{err.msg}, line {err.lineno}"
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
    def of(cls, code: str) -> "Balance":
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
