"""The last inline suggestion shown in each document of this client, and whether the next request
revises it: the user typed a prefix of it (a warm start from the rest) or did anything else (cold).

Plain strings and offsets: knows nothing of pygls, tokens or the model. The front process serves one
client, so a suggestion never warms another client's request, even in the same document.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shown:
    """A suggestion as the document was when it was shown: the document's text and the cursor then,
    and the whole suggestion from where it began (`origin`, at or before that cursor): the characters
    already typed through since, then what was shown."""

    text: str
    cursor: int
    origin: int
    whole: str


@dataclass(frozen=True)
class Revision:
    """What the next generation starts from: `draft`, the rest of the suggestion after the cursor, and
    `typed`, how many characters before the cursor were typed through since it began."""

    draft: str
    typed: int


class Suggestions:
    """Per document URI, the last suggestion shown."""

    def __init__(self) -> None:
        self._shown: dict[str, Shown] = {}

    def revision(self, uri: str, text: str, cursor: int) -> Revision | None:
        """A warm start when the only change since the last suggestion is text typed at its cursor that
        the suggestion begins with, and some of it is left; else None (a cold start)."""
        shown = self._shown.get(uri)
        if shown is None or cursor < shown.cursor:
            return None
        inserted = cursor - shown.cursor
        if len(text) - len(shown.text) != inserted:
            return None
        if text[: shown.cursor] != shown.text[: shown.cursor] or text[cursor:] != shown.text[shown.cursor :]:
            return None
        typed = text[shown.origin : cursor]
        if len(typed) >= len(shown.whole) or not shown.whole.startswith(typed):
            return None
        return Revision(shown.whole[len(typed) :], len(typed))

    def remember(self, uri: str, text: str, cursor: int, revision: Revision | None, suggestion: str) -> None:
        """The answer shown at `cursor` of `text`; `revision`: what it was generated from (None: cold)."""
        if not suggestion:
            self._shown.pop(uri, None)
            return
        typed = revision.typed if revision is not None else 0
        self._shown[uri] = Shown(text, cursor, cursor - typed, text[cursor - typed : cursor] + suggestion)

    def forget(self, uri: str) -> None:
        self._shown.pop(uri, None)
