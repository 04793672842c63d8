"""Completion text: a raw generation cut to the logical unit at the cursor, minus what the buffer
already has. Pure string functions.

Knows nothing of tokens, models or the LSP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .layouts import SPECIAL_TOKENS

_SPECIAL_TEXT = re.compile("|".join(map(re.escape, [*SPECIAL_TOKENS, "<|role_end|>", "<role>", "</role>"])))
_CLOSERS = ")]}"
_CLOSING_RUN = set(")]}\"'`;:, \t")  # what may follow a closing bracket in a run the buffer already has


@dataclass(frozen=True)
class Cursor:
    """The text around the cursor that decides where a completion ends."""

    before: str  # the cursor line up to the cursor
    after: str  # the cursor line after the cursor (no line end)
    next_line: str = ""  # the first non-blank line below the cursor line

    @property
    def on_empty_line(self) -> bool:
        return not self.before.strip() and not self.after.strip()


@dataclass(frozen=True)
class Completion:
    text: str
    complete: bool  # the unit ended inside the generation (a later step cannot extend it)


def finish(raw: str, cursor: Cursor, ended: bool, chat: bool = False) -> Completion:
    """`raw`: decoded generation (or a draft's filled prefix); `ended`: nothing more will follow it.
    `chat`: the answer of a chat-template prompt, which may come wrapped in a code fence."""
    raw = strip_special(raw)
    if chat:
        raw, ended = unfence(raw, ended)
    if cursor.on_empty_line:
        if cursor.before:  # the indentation is typed already: the completion starts at it, not past it
            raw = raw.lstrip(" \t")
        text, complete = _block(raw, cursor, ended)
    else:
        text, complete = _rest_of_line(raw, ended)
    text = _drop_duplicate_closers(text, cursor.after).rstrip()
    if _only_repeats(text, cursor):
        text = ""
    return Completion(text, complete)


def _rest_of_line(raw: str, ended: bool) -> tuple[str, bool]:
    end = re.search(r"\r\n|\r|\n", raw)
    return (raw[: end.start()], True) if end else (raw, ended)


def _block(raw: str, cursor: Cursor, ended: bool) -> tuple[str, bool]:
    """Lines from the cursor to a blank line, to a line indented less than the first one, or to the
    line that follows the cursor's in the buffer (the model went on with the code already there)."""
    lines = raw.replace("\r\n", "\n").split("\n")
    first = lines[0]
    if not first.strip():
        # Nothing on the cursor line: a blank line ends the block at once, unless more may come.
        return "", len(lines) > 1 or ended
    base = _indent(cursor.before + first)
    kept = [first]
    for i, line in enumerate(lines[1:], start=1):
        last = i == len(lines) - 1
        if not line.strip():
            if last and not ended:
                break  # a line still being written
            return "\n".join(kept), True
        if _indent(line) < base or line.strip() == cursor.next_line.strip():
            return "\n".join(kept), True
        kept.append(line)
    return "\n".join(kept), ended


def bound_rewrite(text: str, selection: str, line_start: str) -> str:
    """A rewrite cut to the selection's extent: a model given room to grow fills it with the code that
    follows (`...\n\nclass`), which is not a rewrite of the selection. `line_start`: the text from the
    start of the selection's line to the selection. A selection inside one line stays on one line;
    otherwise the rewrite ends before the first line indented less than the selection (it leaves the
    selected block), and past the selection's own line count it keeps only continuation lines
    (indented deeper than the selection)."""
    text = text.replace("\r\n", "\n")
    selected = selection.replace("\r\n", "\n").rstrip("\n").split("\n")
    lines = text.split("\n")
    if len(selected) == 1 and not selection.endswith("\n"):
        return lines[0]
    base = min([_indent(line_start + selected[0])] + [_indent(line) for line in selected[1:] if line.strip()])
    kept = [lines[0]]
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() and (_indent(line) < base or (i >= len(selected) and _indent(line) <= base)):
            break
        kept.append(line)
    return "\n".join(kept)


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def strip_special(raw: str) -> str:
    """Special tokens spelled out as text (the ids themselves end a generation before decoding)."""
    return _SPECIAL_TEXT.sub("", raw)


def unfence(raw: str, ended: bool) -> tuple[str, bool]:
    """A chat answer like "```python\\ncode\\n```": the code inside the fence."""
    stripped = raw.lstrip()
    if stripped.startswith("```"):
        newline = stripped.find("\n")
        if newline < 0:
            return "", ended
        raw = stripped[newline + 1 :]
    close = raw.find("```")
    if close >= 0:
        return raw[:close].rstrip("\n"), True
    return raw.replace("<HOLE>", ""), ended


def _drop_duplicate_closers(text: str, after: str) -> str:
    """If the completion ends with closing brackets that the buffer already has right after the
    cursor, e.g. `foo(|)` completed with `a, b)`, drop them from the completion."""
    for k in range(min(len(text), len(after)), 0, -1):
        overlap = after[:k]
        if text.endswith(overlap) and set(overlap) <= _CLOSING_RUN and any(c in _CLOSERS for c in overlap):
            return text[:-k]
    return text


def _only_repeats(text: str, cursor: Cursor) -> bool:
    """Accepting it would only duplicate text already after the cursor or on the next line."""
    core = text.strip()
    if not core:
        return False
    if cursor.after.strip() and (cursor.after.startswith(text) or core == cursor.after.strip()):
        return True
    return core == cursor.next_line.strip()
