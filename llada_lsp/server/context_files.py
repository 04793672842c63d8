"""The front's context beyond the file: where snippets come from (the client's other open documents,
the workspace modules the current Python file imports, the recently edited regions, the chunks a
client sent with `llada/context`) and which set each document's completions use: chosen when the
cursor enters a line or after a pause, then kept while the user types on that line, so the prompt's
start, and the prefix cache's blocks of it, stay the same from keystroke to keystroke.

Knows documents as texts and URIs and the workspace as folders; nothing of pygls' server, the model or
tokens (the prompt fits the snippets to its token budget: completion/prompt.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..completion.history import History
from ..completion.python_names import python_imports
from ..completion.ranking import choose_at, windows
from ..completion.snippets import MAX_SNIPPET_CHARS, Snippet, line_span
from ..completion.syntax import is_python
from .documents import Document
from .uris import path_of
from .workspace_files import FRESH_SECONDS, MAX_IMPORT_NAMES, WorkspaceFiles, refused_root

logger = logging.getLogger(__name__)

PAUSE_SECONDS = 1.0  # a request after this long without one chooses the set again
EDIT_LINES = 6  # lines each side of a recent edit that make its snippet
MAX_CLIENT_CHUNKS = 16  # llada/context chunks kept, the oldest dropped first
DISK_BUDGET = 0.03  # seconds a completion waits for the worker's disk work, at most
CLIENT = "llada/context"


@dataclass(frozen=True)
class _Choice:
    line: int
    used: float  # when a request last used it
    max_tokens: int
    snippets: tuple[Snippet, ...]


@dataclass(frozen=True)
class Gathered:
    """What the worker found on disk for one document: the imported workspace files (real paths, in
    order) and the texts of those not open; the open documents that context may use (inside a
    workspace folder, not secrets, not ignored by git) and their real paths."""

    key: tuple = ()
    imported: tuple[Path, ...] = ()
    texts: dict[Path, str] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    real: dict[str, Path] = field(default_factory=dict)
    at: float = 0.0


class ContextFiles:
    """Per client (one per server): the workspace folders, the chunks it sent, the set chosen per
    document and, in a worker thread, what the disk holds (`WorkspaceFiles`: the imported files and the
    boundaries). `outside_workspace`: open documents outside the workspace folders may be sources too
    (the `contextOutsideWorkspace` setting); `log(message)`: what was refused or skipped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] | None = None):
        self.clock = clock
        self.log = log or (lambda message: logger.info("%s", message))
        self.roots: list[Path] = []
        self.outside_workspace = False
        self.chunks: deque[Snippet] = deque(maxlen=MAX_CLIENT_CHUNKS)
        self._chosen: dict[str, _Choice] = {}
        self._notes: deque[str] = deque(maxlen=100)  # what the worker has to say, said from the caller's thread
        self.files = WorkspaceFiles(self._notes.append)  # the worker's alone once `gather` is used
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[tuple, Future] = {}
        self._gathered: dict[str, Gathered] = {}
        self._checked: set[str] = set()  # document URIs whose path was looked at (`_key`)

    def set_roots(self, uris: Iterable[str | None]) -> None:
        """The workspace folders (`workspaceFolders`, else `rootUri`): files are read only from under
        them (symbolic links resolved first). A URI that is no local path, the file system's root and a
        folder holding the home folder are left out, each said in the log; none of them is an error."""
        roots: list[Path] = []
        try:
            home = Path(os.path.realpath(os.path.expanduser("~")))
        except (OSError, ValueError):
            home = None
        for uri in uris:
            if not uri:
                continue
            path = path_of(uri, self.log)
            if path is None:
                self.log(f"context: the workspace folder {uri!r} is not a local folder; not read from")
                continue
            try:
                real = Path(os.path.realpath(path))
            except (OSError, ValueError):
                continue
            why = refused_root(real, home)
            if why is not None:
                self.log(f"context: the workspace folder {real} is {why}; not read from (open a project folder)")
                continue
            roots.append(real)
        self.roots = list(dict.fromkeys(roots))
        if self._pool is None:
            self.files.set_roots(self.roots)
        else:  # the worker owns the files' state: the change is queued behind what it is doing
            self._pool.submit(self.files.set_roots, tuple(self.roots))
        self._gathered.clear()

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
        self._gathered.pop(uri, None)
        for key, choice in list(self._chosen.items()):
            if any(s.origin == uri for s in choice.snippets):
                del self._chosen[key]

    def label(self, uri: str, real: Path | None = None) -> str:
        """How the prompt names a document: its path in the workspace, else its file name."""
        if real is None:
            path = path_of(uri)
            try:
                real = Path(os.path.realpath(path)) if path else None
            except (OSError, ValueError):
                real = None
        return self._relative(real) if real is not None else uri.rsplit("/", 1)[-1][:200] or uri[:200]

    # --- the disk, in the worker --------------------------------------------------------------
    def _key(self, doc: Document, documents: Iterable[Document]) -> tuple:
        documents = list(documents)
        for each in (doc, *documents):  # a URI that names no local file is said once, then only left out
            if each.uri not in self._checked:
                if len(self._checked) > 4096:
                    self._checked.clear()
                self._checked.add(each.uri)
                path_of(each.uri, self.log)
        imports = python_imports(doc.text, MAX_IMPORT_NAMES) if is_python(doc.language, doc.uri) else []
        return (doc.uri, tuple(imports), tuple(self.roots), tuple(sorted(d.uri for d in documents)))

    def _work(self, key: tuple) -> Gathered:
        """The worker's part (or the caller's, without a loop): resolve, check, read."""
        uri, imports, _, uris = key
        files = self.files
        real: dict[str, Path] = {}
        allowed = set()
        for each in uris:
            path = path_of(each)
            if path is None:
                continue
            try:
                real[each] = Path(os.path.realpath(path))
            except (OSError, ValueError):
                continue
            if files.allowed(real[each]):
                allowed.add(each)
        here = path_of(uri)
        imported = tuple(files.resolve(Path(here) if here else None, list(imports)))
        opened = set(real.values())
        texts = {}
        for path in imported:
            if path not in opened and (text := files.read(path)) is not None:
                texts[path] = text
        return Gathered(key, imported, texts, frozenset(allowed), real, self.clock())

    def _fresh(self, uri: str, key) -> Gathered | None:
        """The last answer for `uri` where it answered the same question within FRESH_SECONDS."""
        known = self._gathered.get(uri)
        return known if known is not None and known.key == key and self.clock() - known.at < FRESH_SECONDS else None

    def gather_now(self, doc: Document, documents: Iterable[Document]) -> Gathered:
        """`gather` without a worker, in the caller's thread (tools and tests without an event loop)."""
        key = self._key(doc, documents)
        if (known := self._fresh(doc.uri, key)) is not None:
            return known
        try:
            found = self._work(key)
        except Exception as err:  # a completion goes on without the disk, never fails for it
            self.log(f"context: reading the workspace failed: {err!r}")
            found = Gathered(key, at=self.clock())
        self._gathered[doc.uri] = found
        self._say_notes()
        return found

    async def gather(self, doc: Document, documents: Iterable[Document], budget: float = DISK_BUDGET) -> Gathered:
        """What the disk holds for `doc`, found by the worker thread. Waits at most `budget` seconds:
        past it, the last answer for `doc` (or nothing) is used and the worker's answer, when it
        comes, serves the next choice. The same question within FRESH_SECONDS is not asked again."""
        key = self._key(doc, documents)
        if (known := self._fresh(doc.uri, key)) is not None:
            return known
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="llada-context")
        future = self._pending.get(key)
        if future is None:
            future = self._pool.submit(self._work, key)
            self._pending[key] = future
            future.add_done_callback(lambda f: self._pending.pop(key, None))
        waited = asyncio.wrap_future(future)
        waited.add_done_callback(lambda f: self._keep(doc.uri, f))
        try:
            return await asyncio.wait_for(asyncio.shield(waited), budget)
        except TimeoutError:
            self.log(f"context: the workspace files for {doc.uri} took over {budget * 1000:.0f} ms; "
                     "this completion goes without them")  # fmt: skip
        except Exception:  # said by `_keep`: a completion goes on without the disk, never fails for it
            pass
        return known if known is not None and known.key[0] == doc.uri else Gathered()

    def _say_notes(self) -> None:
        while self._notes:
            self.log(self._notes.popleft())

    def _keep(self, uri: str, future: asyncio.Future) -> None:
        self._say_notes()
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                self.log(f"context: reading the workspace failed: {future.exception()!r}")
            return
        found = future.result()
        known = self._gathered.get(uri)
        if known is None or known.at <= found.at:
            self._gathered[uri] = found

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- sources, from what was gathered ------------------------------------------------------
    def usable(self, other: Document, found: Gathered) -> bool:
        """Whether an open document (not the one completed) may be a source: inside the boundaries,
        or anywhere with `outside_workspace`."""
        return self.outside_workspace or other.uri in found.allowed

    def candidates(self, doc: Document, documents: Iterable[Document], history: History,
                   modules: list[Snippet] | None = None, found: Gathered | None = None) -> list[Snippet]:  # fmt: skip
        """Every snippet that could be chosen for `doc`: the client's chunks, newest first; the other
        open documents that may be sources; the files `doc` imports from the workspace (not open); the
        regions of recent edits, of `doc` too (those inside the prompt's window are left out by the
        choice). `modules`: what `modules` says for `doc` (found again when not given)."""
        documents = list(documents)
        found = self.gather_now(doc, documents) if found is None else found
        out = [s for chunk in reversed(self.chunks) for s in windows(chunk.text, chunk.path, chunk.origin)]
        open_docs = {d.uri: d for d in documents if d.uri == doc.uri or self.usable(d, found)}
        for other in open_docs.values():
            if other.uri != doc.uri:
                out += windows(other.text, self.label(other.uri, found.real.get(other.uri)), other.uri)
        modules = self.modules(doc, documents, found) if modules is None else modules
        out += [w for module in modules if module.origin not in open_docs
                for w in windows(module.text, module.path, module.origin)]  # fmt: skip
        for each in open_docs.values():
            for edit in history.edits(each.uri):
                out.append(_edit_region(each, edit.start, self.label(each.uri, found.real.get(each.uri))))
        return out

    def modules(self, doc: Document, documents: Iterable[Document], found: Gathered | None = None) -> list[Snippet]:
        """Whole Python modules whose definitions a choice for `doc` may bring (`choose_at`'s
        `sources`), for a Python `doc` only: the workspace files it imports (an open one as the
        editor has it), then the other open Python documents that may be sources."""
        if not is_python(doc.language, doc.uri):
            return []
        documents = list(documents)
        found = self.gather_now(doc, documents) if found is None else found
        open_docs = {d.uri: d for d in documents}
        by_path = {found.real[d.uri]: d for d in documents if d.uri in found.real}
        out = []
        for path in found.imported:
            opened = by_path.get(path)
            if opened is not None:
                if opened.uri != doc.uri:
                    out.append(Snippet(self._relative(path), opened.text, opened.uri))
            elif (text := found.texts.get(path)) is not None:
                out.append(Snippet(self._relative(path), text, str(path)))
        seen = {module.origin for module in out}
        for other in open_docs.values():
            if (other.uri != doc.uri and other.uri not in seen and is_python(other.language, other.uri)
                    and self.usable(other, found)):  # fmt: skip
                out.append(Snippet(self.label(other.uri, found.real.get(other.uri)), other.text, other.uri))
        return out

    def imported(self, doc: Document) -> list[Path]:
        """The workspace files of the modules `doc` imports (absolute imports from each workspace
        folder, relative ones from the document's real folder), real paths inside the boundaries only."""
        return list(self.gather_now(doc, [doc]).imported)

    def _relative(self, real: Path) -> str:
        """A real path as the prompt names it: in its workspace folder, else by its file name alone."""
        for root in self.roots:
            if real.is_relative_to(root):
                return real.relative_to(root).as_posix()
        return real.name

    # --- the choice ---------------------------------------------------------------------------
    def current(self, uri: str) -> tuple[Snippet, ...] | None:
        """The set chosen last for `uri`, None when there is none."""
        choice = self._chosen.get(uri)
        return None if choice is None else choice.snippets

    def reusable(self, doc: Document, offset: int, max_tokens: int) -> tuple[Snippet, ...] | None:
        """The set of the last request, kept for this one (its use noted), when the cursor is on the
        same line, the last request was less than PAUSE_SECONDS ago and the budget is the same; else None."""
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
        return None

    def snippets(self, doc: Document, offset: int, documents: Iterable[Document], history: History,
                 max_tokens: int, found: Gathered | None = None) -> tuple[Snippet, ...]:  # fmt: skip
        """The set for a completion at `offset` of `doc`: the set of the last request when the cursor
        is on the same line and the last request was less than PAUSE_SECONDS ago, else a new choice
        (`choose_now`) within about `max_tokens` tokens."""
        kept = self.reusable(doc, offset, max_tokens)
        return kept if kept is not None else self.choose_now(doc, offset, documents, history, max_tokens, found)

    def choose_now(self, doc: Document, offset: int, documents: Iterable[Document], history: History,
                   max_tokens: int, found: Gathered | None = None) -> tuple[Snippet, ...]:  # fmt: skip
        """A new choice at `offset`, kept for the requests that follow on its line. `found`: what
        `gather` found (gathered now, in this thread, when not given)."""
        documents = list(documents)
        found = self.gather_now(doc, documents) if found is None else found
        sources = self.modules(doc, documents, found)
        candidates = self.candidates(doc, documents, history, sources, found)
        chosen = choose_at(candidates, doc.text, offset, max_tokens, sources)
        self._chosen[doc.uri] = _Choice(doc.text.count("\n", 0, offset), self.clock(), max_tokens, chosen)
        return chosen


def _edit_region(doc: Document, start: int, label: str) -> Snippet:
    """The lines around a recent edit of `doc`, as its text is now (an edit's offset may be stale by a
    few characters: it only places the region)."""
    lo, hi = line_span(doc.text, min(max(start, 0), len(doc.text)), EDIT_LINES, EDIT_LINES)
    return Snippet(label, doc.text[lo:hi][:MAX_SNIPPET_CHARS], doc.uri, doc.text.count("\n", 0, lo))
