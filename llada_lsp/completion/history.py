"""The recent edits of each open document, as a person thinks of them: keystrokes that continue one
another (a word typed, a word backspaced) coalesce into one edit; a pause, a jump elsewhere or an edit
taken from a suggestion starts a new one. Bounded (the last few, each of bounded size), cleared when the
document closes. One History per server, and a server per client: the edits are the client's own; the
lab's next-edit training replays a mined case through the same class, so its prompts coalesce alike.

Knows nothing of pygls, the model or positions: documents are keys (the server's URIs), edits are str
offsets of the document before each change.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from ..completion.next_edit import edit_diff

MAX_EDITS = 8  # per document: Zeta and Sweep show the model a handful
MAX_CHARS = 2000  # an edit larger than this (a paste, a reformat) is kept only as "a big edit here"
PAUSE_SECONDS = 2.0  # keystrokes further apart than this are separate edits


@dataclass(frozen=True)
class Edit:
    """`new` now stands at [start, start + len(new)) where `old` was; `head`/`tail`: the rest of the
    first and last lines around it (so the diff shows whole lines); `line`: 0-based line of `start`."""

    start: int
    old: str
    new: str
    head: str
    tail: str
    line: int
    time: float
    accepted: bool = False  # taken from a suggestion

    @property
    def end(self) -> int:
        return self.start + len(self.new)

    def diff(self) -> str:
        return edit_diff(self.head + self.old + self.tail, self.head + self.new + self.tail, self.line, self.accepted)


class History:
    """Per document URI: its recent edits, oldest first, and the suggestion the client may apply next."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._edits: dict[str, deque[Edit]] = {}
        self._offered: dict[str, list[tuple[int, int, str]]] = {}  # the last suggestion shown: (start, end, text)
        self._suggested: dict[str, tuple[int, list[tuple[int, int, str]]]] = {}  # uri -> (version, its edits)

    def edits(self, uri: str) -> list[Edit]:
        return list(self._edits.get(uri, ()))

    def last(self, uri: str) -> Edit | None:
        edits = self._edits.get(uri)
        return edits[-1] if edits else None

    def diffs(self, uri: str) -> tuple[str, ...]:
        return tuple(edit.diff() for edit in self._edits.get(uri, ()))

    def offer(self, uri: str, changes: list[tuple[int, int, str]], version: int | None = None) -> None:
        """A suggestion sent to the client (document offsets, in order): applied, its edits are marked.
        With its document `version`, it is also kept for `suggested` (the code action reuses it)."""
        self._offered[uri] = list(changes)
        if version is not None:
            self._suggested[uri] = (version, list(changes))

    def suggested(self, uri: str, version: int) -> list[tuple[int, int, str]] | None:
        """The edits of the last suggestion made for `uri` at `version`, if it is still at that version."""
        found = self._suggested.get(uri)
        return found[1] if found is not None and found[0] == version else None

    def close(self, uri: str) -> None:
        self._edits.pop(uri, None)
        self._offered.pop(uri, None)
        self._suggested.pop(uri, None)

    def reset(self, uri: str) -> None:
        """The whole text was replaced: the offsets of the old edits mean nothing any more."""
        self.close(uri)

    def record(self, uri: str, text: str, a: int, b: int, new: str, line: int) -> None:
        """`text[a:b]` (the document before the change) is being replaced by `new`; `line`: a's line."""
        if a == b and not new:
            return
        now, edits = self.clock(), self._edits.setdefault(uri, deque(maxlen=MAX_EDITS))
        accepted = self._accepted(uri, a, b, new)
        delta = len(new) - (b - a)
        last = edits[-1] if edits else None
        if (last is not None and not accepted and not last.accepted and now - last.time <= PAUSE_SECONDS
                and last.start <= b and a <= last.end):  # fmt: skip
            merged = self._merge(last, text, a, b, new, now, line)
            edits.pop()
            if merged is not None:
                edits.append(merged)
        else:
            old = text[a:b]
            if len(old) > MAX_CHARS or len(new) > MAX_CHARS:
                old, new = old[:0], f"<{len(new)} characters>" if len(new) > MAX_CHARS else new
            edits.append(Edit(a, old, new, *_around(text, a, b), line, now, accepted))
        # The older edits after the change move with it (one that overlaps it keeps its offsets: stale
        # but harmless, it only feeds the prompt's line numbers).
        for i in range(len(edits) - 1):
            e = edits[i]
            if e.start >= b:
                edits[i] = replace(e, start=e.start + delta, line=e.line + new.count("\n") - text.count("\n", a, b))

    def _merge(self, last: Edit, text: str, a: int, b: int, new: str, now: float, line: int) -> Edit | None:
        """The last edit with this change folded in (it touches or overlaps it); None when they cancel out."""
        start, end = min(a, last.start), max(b, last.end)
        line = line if a <= last.start else last.line
        # The merged edit's new text: the document's [start, end) after the change.
        merged_new = text[start:a] + new + text[b:end]
        old = text[start : last.start] + last.old + text[last.end : end]
        if len(old) > MAX_CHARS or len(merged_new) > MAX_CHARS:
            return Edit(start, "", f"<{len(merged_new)} characters>", *_around(text, start, end), line, now)
        if merged_new == old:
            return None  # typed and taken back: no edit
        head, tail = _around(text, start, end)
        return Edit(start, old, merged_new, head, tail, line, now)

    def _accepted(self, uri: str, a: int, b: int, new: str) -> bool:
        """Whether this change is one of the suggestion's edits (clients apply them last to first)."""
        offered = self._offered.get(uri)
        if not offered:
            return False
        if (a, b, new) in offered:
            offered.remove((a, b, new))
            delta = len(new) - (b - a)  # a client applying them first to last: the rest moved
            self._offered[uri] = [(s + delta, e + delta, t) if s >= b else (s, e, t) for s, e, t in offered]
            return True
        self._offered.pop(uri, None)  # the user did something else: the suggestion is gone
        return False


def _around(text: str, a: int, b: int) -> tuple[str, str]:
    """The rest of the lines around [a, b): from the line start to `a`, from `b` to the line end."""
    line_start = text.rfind("\n", 0, a) + 1
    line_end = text.find("\n", b)
    line_end = len(text) if line_end < 0 else line_end
    return text[line_start:a][-MAX_CHARS:], text[b:line_end][:MAX_CHARS]
