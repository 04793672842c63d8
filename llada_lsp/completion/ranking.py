"""Which snippets of other files a completion's prompt gets: windows of the candidates (open
documents, imported modules, recent edits, chunks a client sent) ranked by their likeness to the code
around the cursor, the definitions of the names near it first, within a budget (`choose_at`).

Plain values and the standard library only: the LSP front chooses, the model thread renders.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .python_names import COMMON_WORDS, IDENTIFIER, near_cursor, python_definitions
from .snippets import MAX_SNIPPET_CHARS, SCAN_CHARS, SNIPPET_LINES, Snippet, lines_around, render_snippets

SNIPPET_STRIDE = 12  # candidate windows start every this many lines (they overlap by half)
MAX_SNIPPETS = 6  # chosen at most, whatever the budget
WINDOW_LINES = 60  # lines each side of the cursor that the prompt's window holds, near enough: never snippets
DEFINITION_BONUS = 0.1  # added to the likeness of the definition of the name nearest the cursor (less further)
CHARS_PER_TOKEN = 4  # the chooser's budget in characters; the prompt counts the ids and cuts to fit


@functools.lru_cache(maxsize=4096)
def identifiers(text: str) -> frozenset[str]:
    """The identifiers of `text`, the ones every file has left out. Cached: a choice looks at the same
    windows of the same documents as the one before it (most of its time, uncached, is this regex)."""
    return frozenset(IDENTIFIER.findall(text)) - COMMON_WORDS


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    common = len(a & b)
    return common / (len(a) + len(b) - common) if a or b else 0.0


def windows(text: str, path: str, origin: str = "", lines: int = SNIPPET_LINES,
            stride: int = SNIPPET_STRIDE) -> list[Snippet]:  # fmt: skip
    """The candidate snippets of one source: windows of `lines` whole lines every `stride` lines, of
    its first SCAN_CHARS characters; windows of blank lines only are left out."""
    all_lines = text[:SCAN_CHARS].splitlines(keepends=True)
    if len(text) > SCAN_CHARS and all_lines:
        all_lines.pop()  # cut mid-line: not a whole line
    out = []
    for start in range(0, max(1, len(all_lines) - lines + stride), stride):
        chunk = "".join(all_lines[start : start + lines])
        if chunk.strip():
            out.append(Snippet(path, chunk[:MAX_SNIPPET_CHARS], origin, start))
    return out


def choose(candidates: Iterable[Snippet], around: str, window: str, max_chars: int,
           limit: int = MAX_SNIPPETS, first: Iterable[Snippet] = ()) -> tuple[Snippet, ...]:  # fmt: skip
    """The snippets most like `around` (the code near the cursor) by the Jaccard similarity of their
    identifier sets, most alike first, where `first` (definitions of the names near the cursor, the
    nearest first) gain up to DEFINITION_BONUS: none that shares no identifier, none whose lines the
    prompt's `window` already holds, no two overlapping windows of one source, at most `limit` and
    `max_chars` characters as rendered. The result depends only on its inputs (ties: definitions
    first, then input order)."""
    target = identifiers(around)
    if not target or max_chars <= 0:
        return ()
    held = {line.strip() for line in window.splitlines() if line.strip()}
    scored = []
    for order, snippet in enumerate(candidates):
        score = jaccard(target, identifiers(snippet.text))
        if score > 0 and not _held(snippet.text, held):
            scored.append((-score, order, snippet))
    # A definition ranks as its likeness plus up to DEFINITION_BONUS, less the further its name is
    # from the cursor: ahead of the windows that look alike, not of one that shares much more.
    first = [s for s in first if not _held(s.text, held)]
    for rank, snippet in enumerate(first):
        bonus = DEFINITION_BONUS * (1 - rank / len(first))
        scored.append((-(jaccard(target, identifiers(snippet.text)) + bonus), rank - len(first), snippet))
    scored.sort(key=lambda item: item[:2])
    chosen: list[Snippet] = []
    used = 0
    for _, _, snippet in scored:
        if len(chosen) == limit:
            break
        size = len(render_snippets([snippet]))
        if used + size > max_chars or any(_overlap(snippet, other) for other in chosen):
            continue
        chosen.append(snippet)
        used += size
    return tuple(chosen)


def choose_at(candidates: Iterable[Snippet], text: str, offset: int, max_tokens: int,
              sources: Iterable[Snippet] = ()) -> tuple[Snippet, ...]:  # fmt: skip
    """`choose` for a cursor at `offset` of `text` (the whole document), within about `max_tokens`
    tokens: first the definitions, in `sources` (whole Python modules), of the names near the cursor
    and of those the document imports (`python_definitions`); then `candidates` ranked against
    AROUND_LINES lines around the cursor; none the WINDOW_LINES each side hold. What the server's
    front chooses with, and what training samples are built with."""
    start, end = near_cursor(text, offset)
    around, window = text[start:end], lines_around(text, offset, WINDOW_LINES, WINDOW_LINES)
    first = python_definitions(sources, text, offset) if sources else []
    return choose(candidates, around, window, max_tokens * CHARS_PER_TOKEN, first=first)


def _held(text: str, held: set[str]) -> bool:
    """Most of the snippet's non-blank lines are in the window already."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and sum(line in held for line in lines) * 2 > len(lines)


def _overlap(a: Snippet, b: Snippet) -> bool:
    if (a.origin or a.path) != (b.origin or b.path):
        return False
    return a.line < b.line + b.text.count("\n") + 1 and b.line < a.line + a.text.count("\n") + 1
