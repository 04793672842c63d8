"""Context beyond the file: snippets of other files (open documents, imported modules, recent edits,
chunks a client sent) chosen by their likeness to the code around the cursor, and the one text the
prompt gives them (`render_snippets`: the FIM layout, the layout training uses; `describe_snippets`:
the chat layout's words).

Plain values and the standard library only: the LSP front chooses, the model thread renders. Knows
nothing of the LSP, files or tokens; paths are labels the front made.
"""

from __future__ import annotations

import functools
import itertools
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
AROUND_CHARS = (8_000, 2_000)  # of those lines, at most this many characters before and after the cursor
MAX_WANTED = 256  # names whose definitions a choice looks for, at most (the nearest the cursor first)
WINDOW_LINES = 60  # lines each side of the cursor that the prompt's window holds, near enough: never snippets
MAX_DEFINITIONS = 12  # definitions of the names near the cursor offered to a choice, at most
DEFINITION_LINES = 12  # a definition's most lines: its signature and first lines (the prompt's share is small)
DEFINITION_BONUS = 0.1  # added to the likeness of the definition of the name nearest the cursor (less further)
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
    start, end = _near(text, offset)
    around, window = text[start:end], lines_around(text, offset, WINDOW_LINES, WINDOW_LINES)
    first = python_definitions(sources, text, offset) if sources else []
    return choose(candidates, around, window, max_tokens * CHARS_PER_TOKEN, first=first)


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


def python_imports(text: str, limit: int | None = None) -> list[tuple[int, str]]:
    """The modules a Python file imports, as (level, dotted name): level 0 for absolute imports, 1 for
    `from . import`, 2 for `from ..`; `from pkg import name` gives both `pkg` and `pkg.name` (name may
    be a module). Read by patterns, not parsed: the file being typed seldom parses. In order, once each;
    `limit`: the first that many only (the `from` lines' first), in time linear in the text."""
    found: dict[tuple[int, str], None] = {}

    def add(item: tuple[int, str]) -> bool:
        found[item] = None
        return limit is not None and len(found) >= limit

    for match in _FROM.finditer(text[:SCAN_CHARS]):
        level, module = len(match.group(1)), match.group(2) or ""
        if module and add((level, module)):
            return list(found)
        names = match.group(3).replace("\\", " ").split(",", -1 if limit is None else limit)
        for name in names[:limit]:
            name = name.split(" as ")[0].strip()
            if name.isidentifier() and add((level, f"{module}.{name}" if module else name)):
                return list(found)
    for match in _IMPORT.finditer(text[:SCAN_CHARS]):
        names = match.group(1).split(",", -1 if limit is None else limit)
        for name in names[:limit]:
            name = name.split(" as ")[0].strip()
            if name and all(part.isidentifier() for part in name.split(".")) and add((0, name)):
                return list(found)
    return list(found)


_DEFINES = re.compile(
    r"[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+([A-Za-z_]\w*)"  # a def or class, at any depth
    r"|([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)"  # an assignment at the module's level (a match starts the line)
)
_CLOSING = (")", "]", "}")


# Modules change seldom (the document being typed is no source): their lines and definitions are
# kept for the next choices, for a few modules, each at most SCAN_CHARS of text.
@functools.lru_cache(maxsize=32)
def _source_lines(text: str) -> tuple[str, ...]:
    """The whole lines of `text`'s first SCAN_CHARS characters, as `windows` numbers them."""
    lines = text[:SCAN_CHARS].splitlines(keepends=True)
    if len(text) > SCAN_CHARS and lines:
        lines.pop()
    return tuple(lines)


@functools.lru_cache(maxsize=32)
def defined_at(text: str) -> dict[str, tuple[int, ...]]:
    """Name -> the lines of `text` (as `_source_lines` numbers them) that define it: a `def` or
    `class` at any depth, an assignment at the module's level (column 0). Read by a pattern per line:
    the file seldom parses while it is typed."""
    found: dict[str, list[int]] = {}
    for index, line in enumerate(_source_lines(text)):
        if match := _DEFINES.match(line):
            found.setdefault(match[1] or match[2], []).append(index)
    return {name: tuple(at) for name, at in found.items()}


def definition(source: Snippet, index: int) -> Snippet:
    """The definition at line `index` of `source` (a whole module): that line and its block (the
    lines below it indented deeper, blank or closing a bracket at its depth), at most DEFINITION_LINES."""
    lines = _source_lines(source.text)
    depth = _depth(lines[index])
    end = index + 1
    while end < len(lines) and end - index < DEFINITION_LINES:
        line = lines[end]
        if line.strip() and _depth(line) <= depth and not line.lstrip().startswith(_CLOSING):
            break
        end += 1
    while end > index + 1 and not lines[end - 1].strip():
        end -= 1
    return Snippet(source.path, "".join(lines[index:end])[:MAX_SNIPPET_CHARS], source.origin, index)


def _depth(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def python_wanted(text: str, offset: int) -> list[str]:
    """The names whose definitions a completion at `offset` of `text` (a Python document) may need,
    most wanted first: those of the cursor's line before the cursor and of the AROUND_LINES[0] lines
    above (nearest first), then its rest and the lines below, then the names the document imports
    (`from m import a, b as c`: a, b); none every file has, none the document defines itself."""
    start, end = _near(text, offset)
    near = _IDENTIFIER.findall(_code(text[start:offset]))[::-1] + _IDENTIFIER.findall(_code(text[offset:end]))
    imported = [name.split(" as ")[0].strip() for match in _FROM.finditer(text[:SCAN_CHARS])
                for name in match.group(3).replace("\\", " ").split(",")]  # fmt: skip
    own = {m[1] or m[2] for m in map(_DEFINES.match, text[:SCAN_CHARS].splitlines()) if m}  # not kept: it is typed
    wanted = (n for n in dict.fromkeys([*near, *imported]) if n.isidentifier() and n not in _COMMON and n not in own)
    return list(itertools.islice(wanted, MAX_WANTED))


def _near(text: str, offset: int) -> tuple[int, int]:
    """The offsets of AROUND_LINES lines around the cursor, at most AROUND_CHARS characters each side
    (a line of megabytes costs a choice no more than a few ordinary lines)."""
    start, end = line_span(text, offset, *AROUND_LINES)
    return max(start, offset - AROUND_CHARS[0]), min(end, offset + AROUND_CHARS[1])


_COMMENT = re.compile(r"#[^\n]*|'[^'\n]*'|\"[^\"\n]*\"")


def _code(text: str) -> str:
    """`text` without its comments and one-line strings (their words name nothing to define)."""
    return _COMMENT.sub(" ", text)


def python_definitions(sources: Iterable[Snippet], text: str, offset: int,
                       limit: int = MAX_DEFINITIONS) -> list[Snippet]:  # fmt: skip
    """The definitions, in `sources` (whole modules, the ones the document imports first), of the
    names a completion at `offset` of `text` may need (`python_wanted`), most wanted first: at most
    `limit`, each a `definition`, or the whole module where it is one window long (all of it is then
    no more than a snippet, and its other names come along), once."""
    sources = list(sources)
    out: list[Snippet] = []
    for name in python_wanted(text, offset):
        for source in sources:
            for index in defined_at(source.text).get(name, ()):
                if len(_source_lines(source.text)) > SNIPPET_LINES:
                    found = definition(source, index)
                else:
                    found = Snippet(source.path, source.text[:MAX_SNIPPET_CHARS], source.origin, 0)
                if found not in out:
                    out.append(found)
                if len(out) == limit:
                    return out
    return out


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
