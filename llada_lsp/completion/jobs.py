"""What a front asks for and gets back: an inline completion (`Infill`) or a rewrite (`Rewrite`) as
the window of text around the cursor or the selection, cut once here, and its `Outcome`; and their
conversion to and from the engine service's wire messages.

Plain values and the standard library only: the LSP front imports this without torch. Knows nothing of
tokens, models or the LSP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import wire
from . import snippets
from .codec import without_surrogates
from .prompt import CHARS_PER_TOKEN
from .snippets import Snippet

MAX_TOKENS = 64  # a completion's length, unless a request says otherwise (the server's maxCompletionTokens)
CONTEXT_TOKENS = 1024  # the prompt's budget, unless a request says otherwise (the server's contextTokens)
MAX_CONTEXT_SHARE = 75  # percent of the prompt other files' snippets may take at most: the window keeps a quarter


@dataclass(frozen=True)
class Infill:
    """Complete at the cursor, which sits between `before` and `after` (the window, not the document).
    A revision (warm start) also carries `draft`, the rest of the suggestion last shown here, which
    the generation starts from instead of masks, and `typed`, how many characters at the end of
    `before` the user typed through since that suggestion began: the unit completed is the one that
    began before them (a block stays a block while its first lines are typed)."""

    before: str
    after: str
    mode: str
    max_tokens: int
    context_tokens: int
    draft: str | None = None
    typed: int = 0
    # Snippets of other files, most alike first, and the percent of the prompt they may take at most
    # (completion/snippets.py; the front chose them: ranking.py). `warm`: prefill the prompt only (idle time).
    context: tuple[Snippet, ...] = ()
    context_share: int = 0
    warm: bool = False

    @classmethod
    def at(cls, text: str, cursor: int, mode: str, max_tokens: int = MAX_TOKENS,
           context_tokens: int = CONTEXT_TOKENS, draft: str | None = None, typed: int = 0) -> Infill:  # fmt: skip
        """The job for a cursor at str index `cursor` of the whole document `text`."""
        before, after = window(text, cursor, cursor, context_tokens * CHARS_PER_TOKEN)
        if draft is not None and typed > len(before):  # the suggestion began outside the window: start cold
            draft, typed = None, 0
        return cls(before, after, mode, max_tokens, context_tokens, draft, 0 if draft is None else typed)


@dataclass(frozen=True)
class Rewrite(wire.RewriteAsk):
    """Revise `selection`, which sits between `before` and `after` (the window around it): the fields
    are the wire's, declared once there (its `context` too: snippets as completion/snippets.py: to_wire
    makes them)."""

    @classmethod
    def at(cls, text: str, start: int, end: int, mode: str, context_tokens: int = CONTEXT_TOKENS,
           instruction: str | None = None, python: bool = False) -> Rewrite:  # fmt: skip
        """The job for the selection text[start:end] of the whole document `text`."""
        before, after = window(text, start, end, context_tokens * CHARS_PER_TOKEN)
        return cls(before, text[start:end], after, mode, context_tokens, instruction, python)


Job = Infill | Rewrite


@dataclass(frozen=True)
class Outcome:
    text: str
    steps: int
    seconds: float
    # "done" | "unit" (the unit at the cursor was complete and stable) | "cancelled"; rewrites also
    # "unchanged" (the model kept the selection) and "refused" (it would break the code: see `reason`)
    stopped: str
    reason: str = ""
    tokens: int = 0  # positions the model generated (filled), for throughput figures


def window(text: str, start: int, end: int, chars: int) -> tuple[str, str]:
    """The text before `start` and after `end`, bounded for huge documents. The part before begins at
    a line start fixed by the line of `start`, so it does not move while the user types on that line."""
    line_start = text.rfind("\n", 0, start) + 1
    lo = max(0, line_start - chars)
    if lo > 0:
        lo = text.find("\n", lo, line_start) + 1 or line_start
    lo = max(lo, start - chars)  # a giant cursor line: its end only
    return text[lo:start], text[end : end + chars]


def trimmed(before: str, after: str, chars: int) -> tuple[str, str]:
    """A window cut further to `chars` each side, as `window` would have cut the document."""
    return window(before, len(before), len(before), chars)[0], after[:chars]


# --- the engine service's wire ----------------------------------------------------------------------
def to_wire(job: Job, request_id: int, key: str, drafts: bool) -> wire.Infill | wire.Rewrite:
    """The request frame of a job. msgpack sends UTF-8, which has no lone surrogates: they go as U+FFFD,
    as the tokenizer would see them."""
    before, after = without_surrogates(job.before), without_surrogates(job.after)
    if isinstance(job, Infill):
        draft = None if job.draft is None else without_surrogates(job.draft)
        context = snippets.to_wire(job.context)
        return wire.Infill(request_id, key, before, after, job.mode, job.max_tokens, job.context_tokens, drafts,
                           draft, job.typed if draft is not None else None, context or None,
                           job.context_share if context else None, job.warm or None)  # fmt: skip
    context = job.context or None  # made by completion/snippets.py: to_wire, surrogates replaced
    ask = dataclasses.replace(job, before=before, selection=without_surrogates(job.selection), after=after,
                              context=context, context_share=job.context_share if context else None)  # fmt: skip
    return wire.Rewrite(**_ask_fields(ask), drafts=drafts, id=request_id, key=key)


def from_wire(request: wire.Infill | wire.Rewrite) -> Job:
    """The job a request frame carries: its window, as the front cut it."""
    if isinstance(request, wire.Infill):
        typed = request.typed or 0
        extra = {"context": snippets.from_wire(request.context), "warm": bool(request.warm),
                 "context_share": min(max(request.context_share or 0, 0), MAX_CONTEXT_SHARE)}  # fmt: skip
        if request.draft is None or not 0 <= typed <= len(request.before):  # a bad revision is a cold start
            return Infill(request.before, request.after, request.mode, request.max_tokens, request.context_tokens,
                          **extra)  # fmt: skip
        return Infill(request.before, request.after, request.mode, request.max_tokens, request.context_tokens,
                      request.draft, typed, **extra)  # fmt: skip
    return Rewrite(**_ask_fields(request))


def _ask_fields(ask: wire.RewriteAsk) -> dict:
    return {f.name: getattr(ask, f.name) for f in dataclasses.fields(wire.RewriteAsk)}


def outcome_of(done: wire.Done) -> Outcome:
    return Outcome(done.text, done.step, done.seconds, done.stopped, done.reason, done.tokens)


def done_of(request_id: int, outcome: Outcome) -> wire.Done:
    return wire.Done(request_id, outcome.steps, outcome.text, outcome.seconds, outcome.stopped, outcome.reason,
                     outcome.tokens)  # fmt: skip
