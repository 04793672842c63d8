"""Next-edit suggestions, diffusion-native: the window of lines around the cursor is the initial draft
of the generated blocks, the recent edits go into the prompt as small diffs, and token editing revises
only what should change; the suggestion is the diff between the window and the result, cut to the
smallest changed ranges, and dropped by the gates below when it should not be shown.

This module owns what serving and training must share (the history's diff format, `edit_window`,
`next_edit_prompt`, `changes`), the job value (`NextEdit`) with its wire frame, and the plan that runs
it (`NextEditPlan`). Knows nothing of the LSP, positions, documents or tensors: strings and ids.
"""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass

from .. import wire
from ..errors import Refused
from . import snippets
from .codec import TextCodec, without_surrogates
from .generation import Draft, Flag, GenerationRequest, LoadedModel, Result, check_request
from .jobs import MAX_CONTEXT_SHARE, Outcome, trimmed
from .jobs import window as cut
from .pipeline import Plan, _keep_line_ends
from .postprocess import bound_rewrite, strip_special, unfence
from .prompt import CHARS_PER_TOKEN, InfillPrompt, SelectionTooLong, infill_prompt
from .snippets import Snippet, line_span
from .syntax import Balance, check_rewrite

WINDOW_LINES = 21  # Sweep's fixed window: 10 lines above the cursor's, 10 below
WIDEN_LINES = 6  # at most this many lines added each side to close a statement the window cuts
HISTORY_SHARE = 4  # the recent edits take at most 1/4 of the prompt's budget (the newest kept)
MAX_DELETE_SHARE = 0.25  # a suggestion that removes more than this share of the window is destructive
# Mean number of times a changed position was rewritten during denoising, above which the model is
# taken to be unsure (it kept changing its mind): only silences a model that flip-flops.
MAX_MEAN_REWRITES = 2.0
# The confidence gate: a suggestion whose changed tokens' mean confidence (the probability of each
# position's greedy id at the step that last ran it) is below this stays silent. Set per model from
# mined training cases, never held-out ones (`llada_lab/scripts/next_edit_gate.py`): 0, off, for
# the embedded model, whose wrong suggestions are as confident as right ones would be.
MIN_EDIT_CONFIDENCE = 0.0
GAP_TOKENS = 8  # positions left at the cursor for an insertion (FIM layout): the draft's room to insert there
WINDOW_TOKENS = 512  # a window's most tokens, and at most a third of the model's positions (the rest: context)
MODE = "quality"
# A next edit has no stop id: an end-of-text the model writes into the gap is "nothing here", not the end
# of the window (which would cut the rest of it off); `revised` reads the canvas whole.
NO_STOP = -1


def grow_room(window_tokens: int) -> int:
    """Positions after the window: the most a suggestion may grow it by. Few: what a model writes there
    is mostly the code that follows, which is no edit."""
    return max(4, window_tokens // 32)  # speed's editing threshold 0 follows every argmax: it rewrites whole windows


def gap_id(codec: TextCodec) -> int | None:
    """The id a gap position holds when the model leaves it empty: end-of-text, as after the middle
    it infills (its first training: the prior carries over); None for a layout without FIM tokens,
    whose drafts have no gap."""
    return codec.special.eos if codec.special.has_fim else None


def draft_ids(window: str, cursor: int | None, codec: TextCodec) -> list[int]:
    """The window's ids with GAP_TOKENS masks at `cursor` (its offset in the window; None: no gap).

    A draft's positions are fixed: an edit that inserts text shifts every token after it, which the
    model must then rewrite one by one. Most next edits insert, and the commonest place is the cursor
    (the rest of what the user started typing: 126 of the 280 held-out edits), so the draft leaves room
    there as masks: the model infills them, as it learned first, and ends what it writes with
    end-of-text (`gap_id`); a gap left empty is nothing. Training builds the same drafts (edit_tune)."""
    if cursor is None or gap_id(codec) is None:
        return codec.encode(window)
    head = codec.encode(window[:cursor])
    return head + [codec.special.mask] * GAP_TOKENS + codec.encode(window[cursor:])


def gap_span(init_ids: list[int], codec: TextCodec) -> range:
    """The positions of a draft's gap (empty when it has none): its masks, the only ones of a draft."""
    mask = codec.special.mask
    if mask not in init_ids:
        return range(0)
    at = init_ids.index(mask)
    return range(at, at + GAP_TOKENS)


class NotSupported(Refused):
    """A next edit asked of a backend that cannot start generated blocks from existing text."""


# --- the prompt (shared with training: examples must look exactly like what is served) ---------------
def edit_diff(old_lines: str, new_lines: str, line: int, accepted: bool = False) -> str:
    """One recent edit as the prompt shows it: a header with its 1-based line, then the whole lines it
    touched, before (`-`) and after (`+`). `old_lines`/`new_lines`: those lines' text (no final line
    end). `accepted`: the user took it from a suggestion (Zeta2 marks these: the model learns that a
    taken suggestion is the user's intent, not a correction)."""
    head = f"@@ line {line + 1}{' (accepted suggestion)' if accepted else ''} @@\n"
    old = "".join(f"-{text}\n" for text in old_lines.split("\n")) if old_lines else ""
    new = "".join(f"+{text}\n" for text in new_lines.split("\n")) if new_lines else ""
    return head + old + new


@dataclass(frozen=True)
class NextEditPrompt:
    prompt: InfillPrompt  # prefix/suffix: the text kept around the window
    init_ids: list[int]  # the draft the engine starts from: draft_ids, then end-of-text to gen_length
    gen_length: int  # the window plus a little room to grow, to the end of the last block
    history: tuple[str, ...]  # the edits that fit, oldest first


def history_text(history: tuple[str, ...] | list[str]) -> str:
    """The recent edits (edit_diff texts, oldest first) as one block of the prompt."""
    return "".join(history)


def next_edit_prompt(history: tuple[str, ...] | list[str], before: str, window: str, after: str, codec: TextCodec,
                     max_positions: int, context_tokens: int, block_size: int = 32,
                     cursor: int | None = None, edits: bool = False, context: tuple[Snippet, ...] = (),
                     context_share: int = 0) -> NextEditPrompt:  # fmt: skip
    """The prompt of a next edit, for serving and for training alike (a pure function).

    `history`: the recent edits as `edit_diff` texts, oldest first (an empty one: no history, the
    "rewrite the window" baseline); `before`/`after`: the document text around the window; `window`:
    the lines the model may revise (`edit_window`). Layouts:
    - FIM (the embedded model): `<|fim_prefix|><|fim_suffix|>` after `<|fim_middle|>` history before,
      then the generated blocks start from `window`'s ids (and a few masks): the edits come right
      before the code, as the newest text the model reads.
    - chat (LLaDA2.1): the edits and the window in words, the code with `<HOLE>` where the window is.
    The newest edits are kept within 1/HISTORY_SHARE of the budget; the window itself is never cut
    (SelectionTooLong from the caller's limits when it cannot fit).

    The draft is the window's ids (with its gap of masks at the cursor), then end-of-text, not masks,
    as the room to grow, to the end of the block the generated region ends in (`block_size`: the
    model's). No other position is a mask, because the engine decodes every position of the last block
    and masks there would be filled one per forward: a window the model keeps is confirmed in a forward
    per few blocks. Growing the window is an edit of an end-of-text, as any other token's.

    `edits`: the model edits a draft in place (LLaDA2.2's INSERT and DELETE): a word inserted at the
    cursor costs one INSERT and shifts the rest, so the draft has no gap (`cursor` is not used); the
    room after the window stays, end-of-text that a shift pushes out of the last block (whose length
    the rule keeps) instead of the window's end.

    `context`: snippets of other files, which start the prompt within `context_share` percent of its
    budget (infill_prompt), as a completion's do."""
    window_ids = draft_ids(window, None if edits else cursor, codec)
    gen_length = len(window_ids) + grow_room(len(window_ids))
    min_prompt = min(64, max_positions // 4)
    if gen_length > max_positions - min_prompt:
        raise SelectionTooLong(f"the window is {len(window_ids)} tokens; this model revises at most "
                               f"{max(0, (max_positions - min_prompt) * 4 // 5)}")  # fmt: skip
    budget = min(context_tokens, max_positions - gen_length)
    kept: list[str] = []
    used, cap = 0, budget // HISTORY_SHARE
    for diff in reversed(list(history)):  # newest first
        n = len(codec.encode(diff))
        if used + n > cap:
            break
        kept.insert(0, diff)
        used += n
    edits = history_text(kept)
    before, after = trimmed(before, after, budget * CHARS_PER_TOKEN)
    if codec.special.has_fim:
        history_ids = codec.encode(edits)
        prompt = infill_prompt(before, after, codec, budget - len(history_ids), context=context,
                               context_share=context_share)  # fmt: skip
        middle = prompt.ids.index(codec.special.fim_middle) + 1
        prompt = InfillPrompt(prompt.ids[:middle] + history_ids + prompt.ids[middle:], prompt.prefix,
                              prompt.suffix, prompt.layout, prompt.context)  # fmt: skip
    else:
        task = ((f"The user made these edits, oldest first:\n```diff\n{edits}```\n" if edits else "")
                + f"The code at <HOLE> is now:\n```\n{window}\n```\nRewrite it with the edit the user is most "
                "likely to make next (keep it as it is if none). Answer with the code only, no explanation.")  # fmt: skip
        prompt = infill_prompt(before, after, codec, budget, task, context, context_share)
    P = len(prompt.ids)
    gen_length = min(gen_length + (-(P + gen_length)) % block_size, max_positions - P)
    init_ids = window_ids + [codec.special.eos] * (gen_length - len(window_ids))
    return NextEditPrompt(prompt, init_ids, gen_length, tuple(kept))


def edit_window(text: str, cursor: int, lines: int = WINDOW_LINES) -> tuple[int, int]:
    """The str span [start, end) of the window around `cursor`: `lines` whole lines centred on the
    cursor's (clipped to the document), the last one with its line end, widened by up to WIDEN_LINES
    lines each side while it cuts brackets in two (cheap: brackets and quotes, no parser)."""
    start, end = line_span(text, cursor, lines // 2, lines - lines // 2 - 1)
    for _ in range(WIDEN_LINES):  # up, while the window starts inside brackets opened above it
        if start == 0 or not (Balance.of(text[start:end]).unmatched or _inside_brackets(text, start)):
            break
        start = text.rfind("\n", 0, start - 1) + 1
    for _ in range(WIDEN_LINES):  # down, while it leaves brackets open
        if end == len(text) or not Balance.of(text[start:end]).still_open:
            break
        nl = text.find("\n", end)
        end = len(text) if nl < 0 else nl + 1
    return start, end


def _inside_brackets(text: str, start: int, look: int = 2000) -> bool:
    """Whether `start` is inside brackets opened in the text just above it (a bounded look back)."""
    lo = text.find("\n", max(0, start - look)) + 1 if start > look else 0
    return bool(Balance.of(text[lo:start]).still_open)


# --- the suggestion: the smallest changed ranges ---------------------------------------------------
@dataclass(frozen=True)
class Change:
    """Replace [start, end) of the window (str offsets) by `text`."""

    start: int
    end: int
    text: str


_PIECE = re.compile(r"\w+|\s|[^\w\s]")


def changes(window: str, revised: str) -> list[Change]:
    """The window's changes that make `revised`, at word granularity (identifiers, single blanks and
    punctuation), in order and non-overlapping; [] when they are equal."""
    a, b = _PIECE.findall(window), _PIECE.findall(revised)
    starts = [0]
    for piece in a:
        starts.append(starts[-1] + len(piece))
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(Change(starts[i1], starts[i2], "".join(b[j1:j2])))
    return out


def apply_changes(text: str, offset: int, edits: list[Change]) -> str:
    """`text` with window changes applied, the window starting at `offset` of it."""
    for c in reversed(edits):
        text = text[: offset + c.start] + c.text + text[offset + c.end :]
    return text


@dataclass(frozen=True)
class LastEdit:
    """The user's last edit, in the job's text (before + window + after): [start, start + len(new))
    holds `new`, which replaced `old`."""

    start: int
    old: str
    new: str


def reverts(text: str, offset: int, edits: list[Change], last: LastEdit | None) -> bool:
    """Whether the suggestion undoes the user's last edit, wholly or in part: some change touches the
    text the edit put there and the edit's span, after the suggestion, is closer to `old` again (the
    whole of it back, or a pure insertion deleted)."""
    if last is None:
        return False
    lo, hi = last.start - offset, last.start - offset + len(last.new)
    touching = [c for c in edits if c.start <= hi and c.end >= lo]
    if not touching:
        return False
    shift_lo = sum(len(c.text) - (c.end - c.start) for c in edits if c.end <= lo and c not in touching)
    shift_hi = sum(len(c.text) - (c.end - c.start) for c in edits if c.start < hi or c in touching)
    after = apply_changes(text, offset, edits)
    span = after[last.start + shift_lo : last.start + len(last.new) + shift_hi]
    if span == last.old:
        return True
    # Partly: the suggestion moved the span back toward what it was (edit distance to `old` shrank).
    before_ratio = difflib.SequenceMatcher(None, last.new, last.old, autojunk=False).ratio()
    after_ratio = difflib.SequenceMatcher(None, span, last.old, autojunk=False).ratio()
    return after_ratio > before_ratio and after_ratio > 0.8


_BLANKS = re.compile(r"\s+")


def substantive(window: str, edits: list[Change]) -> list[Change]:
    """The changes that do more than add or remove blanks. Measured on the embedded model with
    nothing to suggest: half its wrong suggestions were a space dropped ("newer load" -> "newerload",
    one token swapped for its twin without the space); Zed counts isolated whitespace changes as a
    defect of a prediction too."""
    return [c for c in edits if _BLANKS.sub("", window[c.start : c.end]) != _BLANKS.sub("", c.text)]


def gate(text: str, offset: int, window: str, revised: str, last: LastEdit | None,
         python: bool) -> tuple[str, list[Change], str | None]:  # fmt: skip
    """The suggestion (the revised window, its changes) and why it must not be shown (None: show it).
    Changes of blanks alone are left out of it first. `text`: the job's text, the window at `offset`."""
    edits = changes(window, revised)
    kept = substantive(window, edits)
    if len(kept) < len(edits):
        edits, revised = kept, apply_changes(window, 0, kept)
    if not edits:
        return revised, edits, None
    if len(window) - len(revised) > MAX_DELETE_SHARE * max(len(window), 1):
        return revised, edits, f"it would delete {len(window) - len(revised)} of the window's {len(window)} characters"
    if reverts(text, offset, edits, last):
        return revised, edits, "it would undo the user's last edit"
    reason = check_rewrite(text, offset, offset + len(window), revised, python)
    if reason is not None:
        return revised, edits, reason.replace("the rewrite", "the suggestion")
    return revised, edits, None


# --- the job and its wire frame ----------------------------------------------------------------------
@dataclass(frozen=True)
class NextEdit:
    """Suggest the next edit in `window`, which sits between `before` and `after` (cut around it);
    `history`: the recent edits as `edit_diff` texts, oldest first; `last`: the newest in this text."""

    before: str
    window: str
    after: str
    history: tuple[str, ...]
    last: LastEdit | None
    context_tokens: int
    python: bool = False
    mode: str = MODE
    cursor: int | None = None  # the cursor's offset in `window` (the draft's gap: draft_ids)
    context: tuple[Snippet, ...] = ()  # snippets of other files (completion/snippets.py), and their share
    context_share: int = 0

    @classmethod
    def at(cls, text: str, cursor: int, history: tuple[str, ...], last: tuple[int, str, str] | None,
           context_tokens: int, python: bool) -> tuple[NextEdit, int]:  # fmt: skip
        """The job for a cursor at `cursor` of the document `text`, and the document offset of the
        window's start. `last`: (document offset, old, new) of the user's last edit."""
        start, end = edit_window(text, cursor)
        before, after = cut(text, start, end, context_tokens * CHARS_PER_TOKEN)
        lo = start - len(before)
        edit = None
        if last is not None and lo <= last[0] <= end + len(after):
            edit = LastEdit(last[0] - lo, last[1], last[2])
        job = cls(before, text[start:end], after, tuple(history), edit, context_tokens, python, cursor=cursor - start)
        return job, start


def to_wire(job: NextEdit, request_id: int, key: str, drafts: bool) -> wire.NextEdit:
    s = without_surrogates
    last = job.last
    return wire.NextEdit(request_id, key, s(job.before), s(job.window), s(job.after), [s(h) for h in job.history],
                         job.mode, job.context_tokens, job.python, last.start if last else None,
                         s(last.old) if last else None, s(last.new) if last else None, drafts, job.cursor,
                         snippets.to_wire(job.context) or None,
                         job.context_share if job.context else None)  # fmt: skip


def from_wire(request: wire.NextEdit) -> NextEdit:
    last = None
    if request.last_start is not None:
        last = LastEdit(request.last_start, request.last_old or "", request.last_new or "")
    return NextEdit(request.before, request.window, request.after, tuple(request.history), last,
                    request.context_tokens, request.python, request.mode, request.cursor,
                    snippets.from_wire(request.context), min(max(request.context_share or 0, 0), MAX_CONTEXT_SHARE))  # fmt: skip


def fit_window(window: str, codec: TextCodec, max_tokens: int) -> tuple[str, str, str]:
    """(head, inner, tail) of the window: `inner` its middle lines within `max_tokens` (lines dropped
    from both ends in turn, the cursor being near the middle); at least one line is kept."""
    lines = window.splitlines(keepends=True)
    counts = [len(ids) for ids in codec.encode_batch(lines)] if lines else []
    lo, hi, total, end_next = 0, len(lines), sum(counts), True
    while total > max_tokens and hi - lo > 1:
        if end_next:
            hi -= 1
            total -= counts[hi]
        else:
            total -= counts[lo]
            lo += 1
        end_next = not end_next
    return "".join(lines[:lo]), "".join(lines[lo:hi]), "".join(lines[hi:])


# --- the plan ---------------------------------------------------------------------------------------
class NextEditPlan(Plan):
    """Revises the window in place (its ids are the generated blocks' initial draft), then gates the
    result. The Outcome's text is the revised window ("done") or why nothing is suggested
    ("unchanged", or "refused" with a reason). Drafts carry no text.

    Two gates on how sure the model is: the mean confidence of the changed tokens (each position's
    probability at the step that last ran it, as the drafts carry it; MIN_EDIT_CONFIDENCE), and how
    often each changed position was rewritten during denoising (MAX_MEAN_REWRITES: a position the
    model flips back and forth is one it is unsure of)."""

    priority = 2  # after inline completions (0) and rewrites (1)

    def __init__(self, model: LoadedModel, job: NextEdit, cancel: Flag):
        codec = model.codec
        self.codec, self.job = codec, job
        # Lines of long windows the model cannot take are left as they are: context around what it revises.
        self.head, self.inner, self.tail = fit_window(job.window, codec, min(WINDOW_TOKENS, model.max_positions // 3))
        # The gap goes where the cursor is in the lines revised; a cursor outside them (or off the window: a
        # peer's bad value) gets none, and so does a model not tuned to fill it: it fills the masks with its
        # guesses at the code there (the embedded model on 158 cases mined from pluggy, no history: 70
        # suggestions with the gap, 19 without; 24 of the 38 no-edit cases left silent, against 33).
        # A model with edit tokens needs no gap: it inserts at the cursor (next_edit_prompt's `edits`).
        self.edits = model.edit_ids is not None
        cursor = None if job.cursor is None or not model.edit_gap or self.edits else job.cursor - len(self.head)
        self.prompt = next_edit_prompt(job.history, job.before + self.head, self.inner, self.tail + job.after, codec,
                                       model.max_positions, job.context_tokens, model.block_size,
                                       cursor if cursor is not None and 0 <= cursor <= len(self.inner) else None,
                                       self.edits, job.context, job.context_share)  # fmt: skip
        self.gap = gap_span(self.prompt.init_ids, codec)
        self.started = time.perf_counter()
        self.request = check_request(GenerationRequest(
            self.prompt.prompt.ids, self.prompt.gen_length, job.mode, codec.special.mask, NO_STOP, False,
            cancel=cancel, init_ids=self.prompt.init_ids, priority=self.priority,
        ), model.max_positions)  # fmt: skip
        self._last: list[int] = list(self.prompt.init_ids)
        self._rewrites = [0] * self.prompt.gen_length
        self._confidence: list[float] = []
        self.confidence: float | None = None  # the changed tokens' mean confidence, once finished

    def on_draft(self, draft: Draft) -> tuple[int, str]:
        # A draft holds the blocks up to the active one: the later ones keep their last ids (the window's).
        if draft.confidence:
            self._confidence = list(draft.confidence)
        mask = self.codec.special.mask
        for i, token in enumerate(draft.generated[: len(self._rewrites)]):
            previous = self._last[i] if i < len(self._last) else mask
            if token != previous and previous != mask:
                self._rewrites[i] += 1
            if i < len(self._last):
                self._last[i] = token
            else:
                self._last.append(token)
        return draft.step, ""

    def changed(self, final: list[int]) -> list[int]:
        """The positions whose final id differs from the draft's; for a model with edit tokens, whose
        drafts shift, the final positions the draft's ids do not align with (an insertion is its own
        positions, not the whole tail it moved)."""
        init = self.prompt.init_ids
        if self.edits:
            blocks = difflib.SequenceMatcher(None, init, final, autojunk=False).get_matching_blocks()
            kept = {j + k for _, j, size in blocks for k in range(size)}
            return [j for j in range(min(len(final), len(init))) if j not in kept]
        return [i for i, t in enumerate(final[: len(init)]) if t != init[i]]

    def mean_rewrites(self, final: list[int]) -> float:
        """Mean rewrites of the changed positions (0 for a model with edit tokens: a position of a draft
        that shifts is not one token's place, so its changes are no rewrites; the rule's anti-loop
        stops its flip-flops)."""
        if self.edits:
            return 0.0
        changed = self.changed(final)
        return sum(self._rewrites[i] for i in changed) / len(changed) if changed else 0.0

    def edit_confidence(self, final: list[int]) -> float | None:
        """Mean confidence of the changed positions (None: no change, or a backend whose drafts carry no
        confidences)."""
        conf = [self._confidence[i] for i in self.changed(final) if i < len(self._confidence)]
        return sum(conf) / len(conf) if conf else None

    def revised(self, tokens: list[int]) -> str:
        codec = self.codec
        empty, gap = gap_id(codec), self.gap
        raw, _ = codec.text_of([t for i, t in enumerate(tokens) if t != codec.special.mask
                                and not (t == empty and i in gap)])  # fmt: skip
        raw = strip_special(raw)
        if self.prompt.prompt.layout == "chat":
            raw, _ = unfence(raw, True)
        return self.head + _keep_line_ends(bound_rewrite(raw, self.inner, ""), self.inner) + self.tail

    def finish(self, result: Result) -> Outcome:
        job = self.job
        seconds = time.perf_counter() - self.started
        tokens = sum(t != self.codec.special.mask for t in result.tokens)
        if result.cancelled:
            return Outcome("", result.steps, seconds, "cancelled", tokens=tokens)
        text = self.revised(result.tokens)
        offset = len(job.before)
        text, edits, reason = gate(job.before + job.window + job.after, offset, job.window, text, job.last, job.python)
        if not edits:
            return Outcome(job.window, result.steps, seconds, "unchanged", "the model proposed no change", tokens)
        self.confidence = confidence = self.edit_confidence(result.tokens)
        if reason is None and confidence is not None and confidence < MIN_EDIT_CONFIDENCE:
            reason = f"the model is unsure of its change (mean confidence {confidence:.2f})"
        if reason is None and (rewrites := self.mean_rewrites(result.tokens)) > MAX_MEAN_REWRITES:
            reason = f"the model is unsure (its changes were rewritten {rewrites:.1f} times)"
        if reason is not None:
            return Outcome(text, result.steps, seconds, "refused", reason, tokens)
        return Outcome(text, result.steps, seconds, "done", tokens=tokens)
