"""An open document: its text and version, incremental edits applied through positions.py (the store of
every open one is open_documents.py).

Knows nothing of pygls, the model or prompts. Lines end at "\\n", "\\r\\n" or "\\r", as the LSP says
(str.splitlines would also split at form feeds and other characters editors keep inside a line).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

from .positions import to_character, to_index

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass
class Document:
    uri: str
    version: int
    text: str
    language: str = ""  # the client's languageId
    _starts: list[int] | None = field(default=None, repr=False)

    @property
    def line_starts(self) -> list[int]:
        if self._starts is None:
            text = self.text
            if "\r" in text:
                self._starts = [0] + [m.end() for m in _LINE_END.finditer(text)]
            else:  # "\n" only (most files): a few times faster than a match object per line (5.8 MB: 226 -> ~50 ms)
                self._starts = list(accumulate(map((1).__add__, map(len, text.split("\n")[:-1])), initial=0))
        return self._starts

    def line(self, number: int) -> str:
        """The text of line `number` without its line end."""
        starts = self.line_starts
        end = starts[number + 1] if number + 1 < len(starts) else len(self.text)
        return self.text[starts[number] : end].rstrip("\r\n")

    def offset(self, line: int, character: int, encoding: str) -> int | None:
        """str index of an LSP position; None when the line is past the end of the document."""
        if line >= len(self.line_starts):
            return None
        return self.line_starts[line] + to_index(self.line(line), character, encoding)

    def position(self, offset: int, encoding: str) -> tuple[int, int]:
        """(line, character) of a str index, the inverse of `offset`."""
        offset = max(0, min(offset, len(self.text)))
        starts = self.line_starts
        lo, hi = 0, len(starts) - 1
        while lo < hi:  # the last line start <= offset
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if starts[mid] <= offset else (lo, mid - 1)
        return lo, to_character(self.line(lo), offset - starts[lo], encoding)

    def edit(self, start: tuple[int, int], end: tuple[int, int], new_text: str, encoding: str) -> bool:
        """Replace the range by `new_text`. A position past the end of the document is clamped to the
        end (returns False so the caller can report it); an end before the start is taken as the start."""
        a, b = self.offset(*start, encoding), self.offset(*end, encoding)
        inside = a is not None and b is not None
        a = len(self.text) if a is None else a
        b = len(self.text) if b is None else max(a, b)
        starts = self.line_starts
        la, lb = bisect_right(starts, a) - 1, bisect_right(starts, b) - 1
        self.text = self.text[:a] + new_text + self.text[b:]
        # Only the edited lines are scanned again (a keystroke in a 2 MB file must not rescan it all).
        delta, tail = len(new_text) - (b - a), starts[lb + 1 :]
        lo, hi = starts[la], (tail[0] + len(new_text) - (b - a)) if tail else len(self.text)
        if lo > 0 and self.text[lo - 1] == "\r" and self.text.startswith("\n", lo):
            self._starts = None  # a CR that ended the line above now pairs with an inserted LF
            return inside
        inner = [m.end() for m in _LINE_END.finditer(self.text, lo, hi)]
        if tail and inner and inner[-1] == hi:
            inner.pop()  # the end of the last edited line: the first shifted start says it
        self._starts = starts[: la + 1] + inner + [s + delta for s in tail]
        return inside

    def replace(self, text: str) -> None:
        self.text, self._starts = text, None
