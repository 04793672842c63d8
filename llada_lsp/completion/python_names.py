"""What a Python document names and imports, read with regular expressions (never run, never parsed
whole): its imports (`python_imports`), the names a completion at the cursor may need
(`python_wanted`) and their definitions in other modules (`python_definitions`).

Plain values and the standard library only; bounded on megabyte lines (AROUND_CHARS, SCAN_CHARS).
"""

from __future__ import annotations

import functools
import itertools
import keyword
import re
from collections.abc import Iterable

from .snippets import MAX_SNIPPET_CHARS, SCAN_CHARS, SNIPPET_LINES, Snippet, line_span

AROUND_LINES = (20, 5)  # the lines before and after the cursor's whose identifiers rank the snippets
AROUND_CHARS = (8_000, 2_000)  # of those lines, at most this many characters before and after the cursor
MAX_WANTED = 256  # names whose definitions a choice looks for, at most (the nearest the cursor first)
MAX_DEFINITIONS = 12  # definitions of the names near the cursor offered to a choice, at most
DEFINITION_LINES = 12  # a definition's most lines: its signature and first lines (the prompt's share is small)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Words every Python file has: sharing them says nothing of two pieces of code being related.
COMMON_WORDS = frozenset(keyword.kwlist) | {"self", "cls", "None", "True", "False", "print", "len", "str", "int",
                                       "list", "dict", "return", "args", "kwargs"}  # fmt: skip


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
    start, end = near_cursor(text, offset)
    near = IDENTIFIER.findall(_code(text[start:offset]))[::-1] + IDENTIFIER.findall(_code(text[offset:end]))
    imported = [name.split(" as ")[0].strip() for match in _FROM.finditer(text[:SCAN_CHARS])
                for name in match.group(3).replace("\\", " ").split(",")]  # fmt: skip
    own = {m[1] or m[2] for m in map(_DEFINES.match, text[:SCAN_CHARS].splitlines()) if m}  # not kept: it is typed
    wanted = (
        n for n in dict.fromkeys([*near, *imported]) if n.isidentifier() and n not in COMMON_WORDS and n not in own
    )
    return list(itertools.islice(wanted, MAX_WANTED))


def near_cursor(text: str, offset: int) -> tuple[int, int]:
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
