"""Snippets of other files as the prompt holds them: the `Snippet` value, the one text the prompt
gives them (`render_snippets`: the FIM layout, the layout training uses; `describe_snippets`: the chat
layout's words), the request frame's codec (`to_wire`, `from_wire`) and the line spans around a cursor.

Plain values and the standard library only. Knows nothing of the LSP, files or tokens; paths are
labels the front made. Which snippets a prompt gets is ranking.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .codec import without_surrogates

SNIPPET_LINES = 24  # a snippet's most lines: a function or two, as Copilot's neighbouring-tab windows
SCAN_CHARS = 200_000  # of each source, looked at: a huge file costs the choice no more than this
MAX_WIRE_SNIPPETS = 16  # what a request frame may carry
MAX_SNIPPET_CHARS = 8_000  # one snippet's text, on the wire and from a client's llada/context


@dataclass(frozen=True)
class Snippet:
    """Whole lines of another file. `path`: how the prompt names it (workspace-relative where the
    front knows the workspace); `origin`: what it came from (a document URI, a file path, "client"),
    for the front to forget it (never sent); `line`: its first line there (0-based)."""

    path: str
    text: str
    origin: str = ""
    line: int = 0


def line_span(text: str, offset: int, before: int, after: int) -> tuple[int, int]:
    """The offsets of the cursor's line with up to `before` lines above it and `after` below."""
    start = text.rfind("\n", 0, offset) + 1
    for _ in range(before):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    end = offset
    for _ in range(after + 1):
        found = text.find("\n", end)
        if found < 0:
            return start, len(text)
        end = found + 1
    return start, end


def lines_around(text: str, offset: int, before: int, after: int) -> str:
    start, end = line_span(text, offset, before, after)
    return text[start:end]


def render_snippets(snippets: Iterable[Snippet]) -> str:
    """The FIM layout's context: each snippet as a `# path: PATH` line then its lines, ending with a
    line end; it stands before `<|fim_prefix|>`. Training renders related files with this function,
    so the model sees at run time exactly what it learned from."""
    parts = []
    for snippet in snippets:
        text = snippet.text if snippet.text.endswith("\n") else snippet.text + "\n"
        parts.append(f"# path: {snippet.path}\n{text}")
    return "".join(parts)


def describe_snippets(snippets: Iterable[Snippet]) -> str:
    """The chat layout's context, in words, before the task (empty for no snippets)."""
    parts = [f"From {snippet.path}:\n```\n{snippet.text.rstrip()}\n```\n" for snippet in snippets]
    if not parts:
        return ""
    return "Code from other files of this project, for reference:\n\n" + "\n".join(parts) + "\n"


def to_wire(snippets: Iterable[Snippet]) -> list[dict[str, str]]:
    """A request frame's `context`: path and text only (where a snippet came from stays in the front),
    lone surrogates as U+FFFD (msgpack sends UTF-8)."""
    return [{"path": without_surrogates(s.path), "text": without_surrogates(s.text)} for s in snippets]


def from_wire(context: list[dict[str, str]] | None) -> tuple[Snippet, ...]:
    """The snippets of a frame's `context`; ValueError for entries without a path and a text or too large."""
    out = []
    for entry in context or ():
        path, text = entry.get("path"), entry.get("text")
        if not isinstance(path, str) or not isinstance(text, str) or set(entry) - {"path", "text"}:
            raise ValueError("a context entry is {path: string, text: string}")
        if len(text) > MAX_SNIPPET_CHARS or len(path) > 1000:
            raise ValueError(f"a context snippet is at most {MAX_SNIPPET_CHARS} characters")
        out.append(Snippet(path, text))
    if len(out) > MAX_WIRE_SNIPPETS:
        raise ValueError(f"at most {MAX_WIRE_SNIPPETS} context snippets")
    return tuple(out)


def wire_problem(context: list[dict[str, str]] | None) -> str | None:
    """Why a frame's `context` cannot be taken (`from_wire` would refuse it), else None."""
    try:
        from_wire(context)
    except ValueError as err:
        return str(err)
    return None
