"""Context beyond the file: snippets of other files (open documents, imported modules, recent edits,
chunks a client sent) chosen by their likeness to the code around the cursor, and the one text the
prompt gives them (`render_snippets`: the FIM layout, the layout training uses; `describe_snippets`:
the chat layout's words).

Plain values and the standard library only: the LSP front chooses, the model thread renders. Knows
nothing of the LSP, files or tokens; paths are labels the front made.
"""

from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .codec import without_surrogates

SNIPPET_LINES = 24  # a snippet's most lines: a function or two, as Copilot's neighbouring-tab windows
SNIPPET_STRIDE = 12  # candidate windows start every this many lines (they overlap by half)
MAX_SNIPPETS = 6  # chosen at most, whatever the budget
SCAN_CHARS = 200_000  # of each source, looked at: a huge file costs the choice no more than this
MAX_WIRE_SNIPPETS = 16  # what a request frame may carry
MAX_SNIPPET_CHARS = 8_000  # one snippet's text, on the wire and from a client's llada/context
AROUND_LINES = (20, 5)  # the lines before and after the cursor's whose identifiers rank the snippets
WINDOW_LINES = 60  # lines each side of the cursor that the prompt's window holds, near enough: never snippets
CHARS_PER_TOKEN = 4  # the chooser's budget in characters; the prompt counts the ids and cuts to fit

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words every Python file has: sharing them says nothing of two pieces of code being related.
_COMMON = frozenset(keyword.kwlist) | {"self", "cls", "None", "True", "False", "print", "len", "str", "int",
                                       "list", "dict", "return", "args", "kwargs"}  # fmt: skip


@dataclass(frozen=True)
class Snippet:
    """Whole lines of another file. `path`: how the prompt names it (workspace-relative where the
    front knows the workspace); `origin`: what it came from (a document URI, a file path, "client"),
    for the front to forget it (never sent); `line`: its first line there (0-based)."""

    path: str
    text: str
    origin: str = ""
    line: int = 0


@functools.lru_cache(maxsize=4096)
def identifiers(text: str) -> frozenset[str]:
    """The identifiers of `text`, the ones every file has left out. Cached: a choice looks at the same
    windows of the same documents as the one before it (most of its time, uncached, is this regex)."""
    return frozenset(_IDENTIFIER.findall(text)) - _COMMON


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
           limit: int = MAX_SNIPPETS) -> tuple[Snippet, ...]:  # fmt: skip
    """The snippets most like `around` (the code near the cursor) by the Jaccard similarity of their
    identifier sets, most alike first: none that shares no identifier, none whose lines the prompt's
    `window` already holds, no two overlapping windows of one source, at most `limit` and
    `max_chars` characters as rendered. The result depends only on its inputs (ties: input order)."""
    target = identifiers(around)
    if not target or max_chars <= 0:
        return ()
    held = {line.strip() for line in window.splitlines() if line.strip()}
    scored = []
    for order, snippet in enumerate(candidates):
        score = jaccard(target, identifiers(snippet.text))
        if score > 0 and not _held(snippet.text, held):
            scored.append((-score, order, snippet))
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


def choose_at(candidates: Iterable[Snippet], text: str, offset: int, max_tokens: int) -> tuple[Snippet, ...]:
    """`choose` for a cursor at `offset` of `text` (the whole document), within about `max_tokens`
    tokens: ranked against AROUND_LINES lines around the cursor, none the WINDOW_LINES each side hold.
    What the server's front chooses with, and what training samples are built with."""
    around, window = lines_around(text, offset, *AROUND_LINES), lines_around(text, offset, WINDOW_LINES, WINDOW_LINES)
    return choose(candidates, around, window, max_tokens * CHARS_PER_TOKEN)


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


def _held(text: str, held: set[str]) -> bool:
    """Most of the snippet's non-blank lines are in the window already."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and sum(line in held for line in lines) * 2 > len(lines)


def _overlap(a: Snippet, b: Snippet) -> bool:
    if (a.origin or a.path) != (b.origin or b.path):
        return False
    return a.line < b.line + b.text.count("\n") + 1 and b.line < a.line + a.text.count("\n") + 1


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


_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)[ \t]*([A-Za-z_][\w.]*)?[ \t]+import[ \t]+\(?([^)#\n]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^#\n]+)", re.MULTILINE)


def python_imports(text: str) -> list[tuple[int, str]]:
    """The modules a Python file imports, as (level, dotted name): level 0 for absolute imports, 1 for
    `from . import`, 2 for `from ..`; `from pkg import name` gives both `pkg` and `pkg.name` (name may
    be a module). Read by patterns, not parsed: the file being typed seldom parses. In order, once each."""
    found: list[tuple[int, str]] = []
    for match in _FROM.finditer(text[:SCAN_CHARS]):
        level, module = len(match.group(1)), match.group(2) or ""
        if module:
            found.append((level, module))
        for name in match.group(3).replace("\\", " ").split(","):
            name = name.split(" as ")[0].strip()
            if name.isidentifier():
                found.append((level, f"{module}.{name}" if module else name))
    for match in _IMPORT.finditer(text[:SCAN_CHARS]):
        for name in match.group(1).split(","):
            name = name.split(" as ")[0].strip()
            if name and all(part.isidentifier() for part in name.split(".")):
                found.append((0, name))
    return list(dict.fromkeys(found))


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
