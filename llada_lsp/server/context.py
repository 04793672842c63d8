"""The front's context beyond the file: where snippets come from (the client's other open documents,
the workspace modules the current Python file imports, the recently edited regions, the chunks a
client sent with `llada/context`) and which set each document's completions use: chosen when the
cursor enters a line or after a pause, then kept while the user types on that line, so the prompt's
start, and the prefix cache's blocks of it, stay the same from keystroke to keystroke.

Knows documents as texts and URIs and the workspace as folders; nothing of pygls' server, the model or
tokens (the prompt fits the snippets to its token budget: completion/prompt.py).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..completion.context import MAX_SNIPPET_CHARS, Snippet, choose_at, line_span, python_imports, windows
from ..completion.history import History
from ..completion.syntax import is_python
from .documents import Document

PAUSE_SECONDS = 1.0  # a request after this long without one chooses the set again
EDIT_LINES = 6  # lines each side of a recent edit that make its snippet
MAX_FILE_BYTES = 256 * 1024  # an imported file larger than this is not read
MAX_IMPORTED = 16  # imported workspace files looked at per choice
MAX_CLIENT_CHUNKS = 16  # llada/context chunks kept, the oldest dropped first
CLIENT = "llada/context"


@dataclass(frozen=True)
class _Choice:
    line: int
    used: float  # when a request last used it
    max_tokens: int
    snippets: tuple[Snippet, ...]


class ContextFiles:
    """Per client (one per server): the workspace folders, the chunks it sent, the set chosen per
    document and the imported files read (by modification time and size)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.roots: list[Path] = []
        self.chunks: deque[Snippet] = deque(maxlen=MAX_CLIENT_CHUNKS)
        self._chosen: dict[str, _Choice] = {}
        self._files: dict[Path, tuple[int, int, str]] = {}

    def set_roots(self, uris: Iterable[str | None]) -> None:
        """The workspace folders (`workspaceFolders`, else `rootUri`): imported files are read only
        from under them (symbolic links resolved first)."""
        roots = [path_of(uri) for uri in uris if uri]
        self.roots = list(dict.fromkeys(Path(os.path.realpath(p)) for p in roots if p is not None))

    # --- sources ------------------------------------------------------------------------------
    def receive(self, params: object) -> str | None:
        """A `llada/context` chunk, `{"text": string, "uri"?: string}`: kept (the oldest of more than
        MAX_CLIENT_CHUNKS dropped, the same text from the same URI replaced); what is wrong, else None."""
        if not isinstance(params, dict) or not isinstance(params.get("text"), str):
            return f"{CLIENT} takes {{text: string, uri?: string}}; ignored"
        uri, text = params.get("uri"), params["text"]
        if uri is not None and not isinstance(uri, str):
            return f"{CLIENT}: uri must be a string; ignored"
        if len(text) > MAX_SNIPPET_CHARS:
            return f"{CLIENT}: a chunk of {len(text)} characters is over {MAX_SNIPPET_CHARS}; ignored"
        if not text.strip():
            return None
        chunk = Snippet(self.label(uri) if uri else "chunk", text, f"{CLIENT}:{uri or ''}")
        for old in [c for c in self.chunks if c.origin == chunk.origin and c.text == text]:
            self.chunks.remove(old)
        self.chunks.append(chunk)
        return None

    def forget(self, uri: str) -> None:
        """A closed document: its text leaves every chosen set (they are chosen again) and is never
        used again (its chunks sent by the client stay: the client sent them to be kept)."""
        self._chosen.pop(uri, None)
        for key, choice in list(self._chosen.items()):
            if any(s.origin == uri for s in choice.snippets):
                del self._chosen[key]

    def label(self, uri: str) -> str:
        """How the prompt names a document: its path in the workspace, else its file name."""
        path = path_of(uri)
        return self._relative(Path(os.path.realpath(path))) if path else uri.rsplit("/", 1)[-1] or uri

    def candidates(self, doc: Document, documents: Iterable[Document], history: History,
                   modules: list[Snippet] | None = None) -> list[Snippet]:  # fmt: skip
        """Every snippet that could be chosen for `doc`: the client's chunks, newest first; the other
        open documents; the files `doc` imports from the workspace (not open); the regions of recent
        edits, of `doc` too (those inside the prompt's window are left out by the choice). `modules`:
        what `modules` says for `doc` (found again when not given)."""
        out = [s for chunk in reversed(self.chunks) for s in windows(chunk.text, chunk.path, chunk.origin)]
        open_docs = {d.uri: d for d in documents}
        for other in open_docs.values():
            if other.uri != doc.uri:
                out += windows(other.text, self.label(other.uri), other.uri)
        modules = self.modules(doc, open_docs.values()) if modules is None else modules
        out += [w for module in modules if module.origin not in open_docs
                for w in windows(module.text, module.path, module.origin)]  # fmt: skip
        for each in open_docs.values():
            for edit in history.edits(each.uri):
                out.append(_edit_region(each, edit.start, self.label(each.uri)))
        return out

    def modules(self, doc: Document, documents: Iterable[Document]) -> list[Snippet]:
        """Whole Python modules whose definitions a choice for `doc` may bring (`choose_at`'s
        `sources`), for a Python `doc` only: the workspace files it imports (an open one as the
        editor has it), then the other open Python documents."""
        if not is_python(doc.language, doc.uri):
            return []
        open_docs = {d.uri: d for d in documents}
        out = self._imported_texts(doc, open_docs)
        seen = {module.origin for module in out}
        for other in open_docs.values():
            if other.uri != doc.uri and other.uri not in seen and is_python(other.language, other.uri):
                out.append(Snippet(self.label(other.uri), other.text, other.uri))
        return out

    def _imported_texts(self, doc: Document, open_docs: dict[str, Document]) -> list[Snippet]:
        """The workspace files `doc` (a Python document: `modules` asks) imports, whole: an open one's
        text as the editor has it (its origin the document's URI), else the file's (its origin the path)."""
        by_path = {os.path.realpath(p): d for d in open_docs.values() if (p := path_of(d.uri)) is not None}
        out = []
        for path in self.imported(doc)[:MAX_IMPORTED]:
            opened = by_path.get(str(path))
            if opened is not None:
                if opened.uri != doc.uri:
                    out.append(Snippet(self._relative(path), opened.text, opened.uri))
            elif (text := self._read(path)) is not None:
                out.append(Snippet(self._relative(path), text, str(path)))
        return out

    def imported(self, doc: Document) -> list[Path]:
        """The workspace files of the modules `doc` imports (absolute imports from each workspace
        folder, relative ones from the document's folder), real paths under a workspace folder only."""
        here = path_of(doc.uri)
        found: list[Path] = []
        for level, name in python_imports(doc.text):
            if level == 0:
                bases = self.roots
            elif here is not None:
                bases = [Path(os.path.realpath(here)).parents[level - 1]] if level <= len(Path(here).parents) else []
            else:
                bases = []
            for base in bases:
                stem = base.joinpath(*name.split("."))
                for path in (stem.with_name(stem.name + ".py"), stem / "__init__.py"):
                    if not os.path.isfile(path):  # most are not there: one stat, before resolving links
                        continue
                    real = Path(os.path.realpath(path))
                    if real not in found and self._inside(real):
                        found.append(real)
        return found

    def _inside(self, real: Path) -> bool:
        return any(real.is_relative_to(root) for root in self.roots)

    def _relative(self, real: Path) -> str:
        """A real path as the prompt names it: in its workspace folder, else by its file name alone."""
        for root in self.roots:
            if real.is_relative_to(root):
                return real.relative_to(root).as_posix()
        return real.name

    def _read(self, real: Path) -> str | None:
        """An imported file's text, read when first needed and again when it changed; None when it is
        over MAX_FILE_BYTES, unreadable or not text."""
        try:
            stat = real.stat()
        except OSError:
            return None
        if stat.st_size > MAX_FILE_BYTES:
            return None
        cached = self._files.get(real)
        if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        try:
            with open(real, "rb") as f:
                text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        if len(text.encode()) > MAX_FILE_BYTES:
            return None
        if len(self._files) >= 4 * MAX_IMPORTED:
            self._files.pop(next(iter(self._files)))
        self._files[real] = (stat.st_mtime_ns, stat.st_size, text)
        return text

    # --- the choice ---------------------------------------------------------------------------
    def current(self, uri: str) -> tuple[Snippet, ...] | None:
        """The set chosen last for `uri`, None when there is none."""
        choice = self._chosen.get(uri)
        return None if choice is None else choice.snippets

    def snippets(self, doc: Document, offset: int, documents: Iterable[Document], history: History,
                 max_tokens: int) -> tuple[Snippet, ...]:  # fmt: skip
        """The set for a completion at `offset` of `doc`: the set of the last request when the cursor
        is on the same line and the last request was less than PAUSE_SECONDS ago, else a new choice
        (`choose_now`) within about `max_tokens` tokens."""
        now, line = self.clock(), doc.text.count("\n", 0, offset)
        last = self._chosen.get(doc.uri)
        if (
            last is not None
            and last.line == line
            and now - last.used <= PAUSE_SECONDS
            and last.max_tokens == max_tokens
        ):
            self._chosen[doc.uri] = _Choice(line, now, max_tokens, last.snippets)
            return last.snippets
        return self.choose_now(doc, offset, documents, history, max_tokens)

    def choose_now(self, doc: Document, offset: int, documents: Iterable[Document], history: History,
                   max_tokens: int) -> tuple[Snippet, ...]:  # fmt: skip
        """A new choice at `offset`, kept for the requests that follow on its line."""
        documents = list(documents)
        sources = self.modules(doc, documents)
        chosen = choose_at(self.candidates(doc, documents, history, sources), doc.text, offset, max_tokens, sources)
        self._chosen[doc.uri] = _Choice(doc.text.count("\n", 0, offset), self.clock(), max_tokens, chosen)
        return chosen


def path_of(uri: str) -> str | None:
    """The local path of a file: URI, else None."""
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    return unquote(parsed.path) or None


def _edit_region(doc: Document, start: int, label: str) -> Snippet:
    """The lines around a recent edit of `doc`, as its text is now (an edit's offset may be stale by a
    few characters: it only places the region)."""
    lo, hi = line_span(doc.text, min(max(start, 0), len(doc.text)), EDIT_LINES, EDIT_LINES)
    return Snippet(label, doc.text[lo:hi][:MAX_SNIPPET_CHARS], doc.uri, doc.text.count("\n", 0, lo))
