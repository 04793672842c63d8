"""The snippets of other files a server's completions get (`CrossFile`): the settings' rules (off, a
share of the prompt, never to an engine elsewhere without `contextRemote`), the log line when a
document's set changes, and the idle prefill of a set that changed (`warm_later`).

Knows the settings, the open documents and a `Completer`; the disk and the choice are
context_files.py's, nothing here knows pygls.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from ..completion.jobs import Infill
from ..completion.snippets import Snippet
from .completers import Completer, CompletionFailed, warm_key
from .context_files import PAUSE_SECONDS, ContextFiles
from .documents import Document
from .open_documents import OpenDocuments
from .settings import Settings


class CrossFile:
    def __init__(self, files: ContextFiles, documents: OpenDocuments, settings: Callable[[], Settings],
                 completer: Callable[[], Completer | None], log: Callable[[str], None]):  # fmt: skip
        self.files, self.documents, self._settings, self._completer, self.log = (
            files,
            documents,
            settings,
            completer,
            log,
        )
        self._active: tuple[str, int, int] | None = None  # (uri, version, offset) of the last completion
        self._idle: asyncio.Task | None = None  # the idle choice after it (`warm_later`)
        self._said_remote = False

    async def snippets_for(self, doc: Document, offset: int, fresh: bool = False) -> tuple[Snippet, ...]:
        """The snippets for a completion at `offset` of `doc`: none with `contextFiles` off, or for an
        engine they would leave the machine for without `contextRemote`; the set of the line while the
        user types on it (`fresh`: chosen again now). What the disk holds is found by the files'
        worker, waited for a bounded time (ContextFiles.gather). A set that differs from the
        document's last one is said in the log."""
        s, completer = self._settings(), self._completer()
        if not s.context_files or not s.context_files_share:
            return ()
        if completer is not None and completer.leaves_machine and not s.context_remote:
            if not self._said_remote:
                self._said_remote = True
                self.log("context: no snippets of other files go to an engine over TCP or SGLang "
                         "unless contextRemote is true")  # fmt: skip
            return ()
        self.files.outside_workspace = s.context_outside_workspace
        before = self.files.current(doc.uri)
        budget = s.context_tokens * s.context_files_share // 100
        chosen = None if fresh else self.files.reusable(doc, offset, budget)
        if chosen is None:
            text, documents = doc.text, self.documents.all()
            found = await self.files.gather(doc, documents)
            if doc.text != text:  # typed in while the disk was read: the choice is made on the text as it is now
                documents = self.documents.all()
            chosen = self.files.choose_now(doc, min(offset, len(doc.text)), documents, self.documents.history,
                                           budget, found)  # fmt: skip
        if chosen != before:
            line = doc.text.count("\n", 0, offset) + 1
            paths = ", ".join(f"{x.path}:{x.line + 1}-{x.line + len(x.text.splitlines())}" for x in chosen) or "none"
            self.log(f"context for {doc.uri} at line {line}{' (idle)' if fresh else ''}: {paths}")
        return chosen

    def warm_later(self, at: tuple[str, int, int] | None = None) -> None:
        """After PAUSE_SECONDS without a completion, the snippets for the last completion's place are
        chosen again (other documents opened, closed or sent since); a set that changed is prefilled
        at once, in idle time (a `warm` job: the engine's prefix cache keeps the prompt's blocks), so
        the next keystroke there finds them cached. `at`: (uri, version, offset) of a completion."""
        if at is not None:
            self._active = at
        if self._active is None or not self._settings().context_files or self._completer() is None:
            return
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.ensure_future(self._warm(self._active))

    async def _warm(self, at: tuple[str, int, int]) -> None:
        await asyncio.sleep(PAUSE_SECONDS)
        uri, version, offset = at
        doc = self.documents.get(uri)
        if doc is None or doc.version != version or self._active != at or self._completer() is None:
            return  # closed, typed in (a request follows), or a newer completion elsewhere
        before = self.files.current(uri)
        chosen = await self.snippets_for(doc, offset, fresh=True)
        completer = self._completer()
        if chosen == before or not chosen or completer is None:
            return
        s = self._settings()
        job = Infill.at(doc.text, offset, s.inline_mode, s.max_completion_tokens, s.context_tokens)
        job = dataclasses.replace(job, context=chosen, context_share=s.context_files_share, warm=True)
        try:
            await completer.run(warm_key(uri), f"warm {uri}", job, None)
        except CompletionFailed:
            pass  # a prefill that did not happen costs the next keystroke its blocks, nothing else
