"""What runs on the model thread: an infill or rewrite job from its window to a prompt, the one
generation request it asks of a backend, and the post-processed drafts and outcome.

A job becomes a Plan (`make_plan`): its `request` for the backend, what each draft shows
(`on_draft`) and the answer (`finish`). The model thread hands many plans' requests to the native
engine at once; `run_infill` / `run_rewrite` run one plan alone. Knows nothing of the LSP, pygls,
threads or how a backend generates: plain values in and out.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate
from os.path import commonprefix  # character by character: the text both show

from ..errors import Refused
from . import snippets
from .generation import Draft, Flag, GenerationRequest, LoadedModel, Result, check_request
from .jobs import MAX_CONTEXT_SHARE, Infill, Job, Outcome, Rewrite, trimmed
from .postprocess import Completion, Cursor, bound_rewrite, finish, strip_special, unfence
from .prompt import CHARS_PER_TOKEN, Healed, heal, infill_prompt, rewrite_prompt
from .syntax import check_rewrite

MIN_PROMPT = 32  # positions always left to the prompt when a completion length is clamped to the model
# A revision shows the lines after its first one only where the model gave every id of them at least this
# probability at the step that last ran it (ids not run yet count as unsure): a suggestion is taken whole,
# so later lines the model is unsure of would hide a right first line (`llada-lab eval-typing` measures it).
REGION_CONFIDENCE = 0.9


class InstructionUnsupported(Refused):
    """A rewrite instruction given to a model that cannot follow one (a fill-in-the-middle model)."""


def cursor_context(before: str, after: str) -> Cursor:
    """The cursor's line around it and the next non-blank line after it (looked for nearby)."""
    line_end = after.find("\n")
    line_end = len(after) if line_end < 0 else line_end
    next_line, pos = "", line_end + 1
    while pos < len(after) and pos - line_end < 10_000:
        end = after.find("\n", pos)
        end = len(after) if end < 0 else end
        if after[pos:end].strip():
            next_line = after[pos:end]
            break
        pos = end + 1
    line = before[before.rfind("\n") + 1 :]
    return Cursor(line, after[:line_end].rstrip("\r"), next_line.rstrip("\r"))


class Plan:
    """One request's sequence: `request` for the backend, `on_draft(draft) -> (step, payload or None)`
    after each of its steps, `finish(result) -> Outcome` at its end. `heal_text`: the partial word
    token healing took back from the prompt, which the generation must start with ("" if none)."""

    request: GenerationRequest
    heal_text = ""

    def on_draft(self, draft: Draft) -> tuple[int, object]:
        raise NotImplementedError

    def finish(self, result: Result) -> Outcome:
        raise NotImplementedError

    def run(self, model: LoadedModel, emit: Callable[[int, object], None]) -> Outcome:
        """Alone, on the native engine's batch of one."""
        gen = model.batch.generate(self.request)
        while True:
            try:
                draft = next(gen)
            except StopIteration as end:
                return self.finish(end.value)
            emit(*self.on_draft(draft))


class InfillPlan(Plan):
    """Generates at the cursor; a draft's payload is the completion as it would be shown, None when
    it did not change (the first step always has one). Stops early once the unit at the cursor is
    complete (ended by the text, an end-of-text, or the last position filled) and unchanged for a step."""

    def __init__(self, model: LoadedModel, job: Infill, cancel: Flag):
        codec = model.codec
        # A revision's unit is the one its suggestion began: the cursor as it was before the typing.
        self.typed = job.before[len(job.before) - job.typed :] if job.draft is not None and job.typed else ""
        cursor = cursor_context(job.before[: len(job.before) - len(self.typed)], job.after)
        self.codec, self.cursor, self.edits = codec, cursor, model.edit_ids is not None
        # The rest of a line fits in one block: a model that never ends the line costs one block, not two.
        limit = job.max_tokens if cursor.on_empty_line else min(job.max_tokens, model.block_size)
        self.gen_length = max(1, min(limit, model.max_positions - MIN_PROMPT))
        budget = min(job.context_tokens, model.max_positions - self.gen_length)
        before, after = trimmed(job.before, job.after, budget * CHARS_PER_TOKEN)
        prompt = infill_prompt(before, after, codec, budget, context=job.context, context_share=job.context_share)
        self.chat, self.warm = prompt.layout == "chat", job.warm
        healed = heal(prompt, codec) or Healed(prompt.ids, "", None)
        self.heal_text = healed.text
        self.stop = _StopWhen(cancel)
        # The typed text is in the prompt, never in the canvas: a revision cannot contradict it.
        init_ids = None if job.draft is None else warm_ids(codec, healed, job.draft, cursor, self.gen_length)
        self.request = check_request(GenerationRequest(
            healed.ids, self.gen_length, job.mode, codec.special.mask, codec.special.eos, cancel=self.stop,
            init_ids=init_ids, first_allowed=healed.allowed, priority=1 if job.warm else 0,
        ), model.max_positions)  # fmt: skip
        # A warm start is one denoising step over the suggestion (see on_draft); shown until then: the draft.
        self.shown: str | None = job.draft if init_ids else None
        self.confidence: list[float] = []  # the last draft's

    def on_draft(self, draft: Draft) -> tuple[int, str | None]:
        if self.warm:  # its prompt is prefilled and in the prefix cache: that was all it was for
            self.stop.enough = True
        mask = self.codec.special.mask
        if self.edits and self.request.init_ids and mask in draft.generated[: len(self.request.init_ids)]:
            # A model with edit tokens inserted into the revision's draft (INSERT leaves a mask there): the
            # suggestion stands until the step that fills it, which is the revision's step.
            return draft.step, self.shown if draft.step == 1 else None
        filled = draft.generated[: _first(draft.generated, mask)]
        self.confidence = draft.confidence
        completion = self._sure(self._completion(filled), filled, draft.confidence)
        if completion.complete and (draft.final or self._stable(completion.text)):
            self.stop.enough = True  # stable (for a step): further steps would mostly polish text past the unit
        # A revision's draft reaches past the active block: the canvas there is still the draft, shown as
        # it stands (not cut to the block), though only the blocks computed can end the generation.
        init = self.request.init_ids or ()
        if len(filled) == len(draft.generated) < len(init) and not completion.complete:
            completion = self._sure(self._completion(filled + list(init[len(filled) :])), filled, draft.confidence)
        if init:
            # A revision takes one step: the keystrokes that follow are the steps after it, each from this
            # answer. Its answer is the step's unit where complete (the draft confirmed or revised), else
            # (the model grew the unit past the draft) the part of the draft the step kept.
            if not completion.complete:
                completion = Completion(commonprefix([completion.text, self.shown or ""]), False)
            self.stop.enough = True
        changed = completion.text != self.shown or draft.step == 1
        self.shown = completion.text
        return draft.step, self.shown if changed else None

    def _sure(self, completion: Completion, ids: list[int], confidence: list[float]) -> Completion:
        """A revision's completion, cut after its first line when the model is unsure of what follows
        (REGION_CONFIDENCE); a cold start's as it is (`revise: false` answers exactly as before)."""
        text = completion.text
        if not self.request.init_ids or not confidence:
            return completion
        code = len(text) - len(text.lstrip())
        line_end = text.find("\n", code)
        if line_end < 0:
            return completion
        # where each id's text ends in the completion (which starts after the part token healing took back)
        pieces, healed = self.codec.token_texts, len(self.heal_text)
        ends = [at - healed for at in accumulate(len(pieces[token]) for token in ids)]
        newline, last = bisect_right(ends, line_end), bisect_left(ends, len(text))  # the ids spelling them
        # unsure too where the later lines reach past the ids generated so far
        sure = (
            newline + 1 < len(ids)
            and last < len(ids)
            and all(i < len(confidence) and confidence[i] >= REGION_CONFIDENCE for i in range(newline + 1, last + 1))
        )
        return completion if sure else Completion(text[:line_end], True)

    def _stable(self, text: str) -> bool:
        """The step showed what was already shown (or its first line, the rest cut as unsure)."""
        shown = self.shown
        return shown is not None and (text == shown or ("\n" not in text and shown.startswith(text + "\n")))

    def _completion(self, filled: list[int]) -> Completion:
        raw, ended = self.codec.text_of(filled)
        raw = raw.removeprefix(self.heal_text)  # the first token starts with the text taken back
        # Every position filled: nothing will be added, only revised (post steps).
        return self._finish(raw, ended or len(filled) == self.gen_length)

    def finish(self, result: Result) -> Outcome:
        mask = self.codec.special.mask
        filled = [t for t in result.tokens if t != mask]
        tokens = len(filled)
        if self.stop.enough:
            return Outcome(self.shown or "", result.steps, result.seconds, "unit", tokens=tokens)
        if result.cancelled:
            return Outcome(self.shown or "", result.steps, result.seconds, "cancelled", tokens=tokens)
        raw, _ = self.codec.text_of(filled)
        text = self._sure(self._finish(raw.removeprefix(self.heal_text), True), filled, self.confidence).text
        return Outcome(text, result.steps, result.seconds, "done", tokens=tokens)

    def _finish(self, raw: str, ended: bool) -> Completion:
        """The completion shown at the cursor. A revision cuts the typed text and the generation together
        to the unit its suggestion began, then shows what follows the typed text."""
        if not self.typed:
            return finish(raw, self.cursor, ended, self.chat)
        if self.chat:
            raw, ended = unfence(strip_special(raw), ended)
        completion = finish(self.typed + raw, self.cursor, ended)
        if not completion.text.startswith(self.typed):  # the unit ended inside what was typed
            return Completion("", True)
        return Completion(completion.text[len(self.typed) :], completion.complete)


def warm_ids(codec, healed: Healed, draft: str, cursor: Cursor, gen_length: int) -> list[int] | None:
    """The canvas a revision starts from: the text token healing took back, the draft, and the end of
    the unit (a line end; a blank line after a block), at most `gen_length` ids. The first id must be
    one healing allows: the longest such id that starts the text, when its plain encoding has none.
    None (a cold start) when no id fits."""
    text = healed.text + draft + ("\n\n" if cursor.on_empty_line else "\n")
    ids = codec.encode(text)
    if healed.allowed is not None and ids and ids[0] not in set(healed.allowed):
        texts, index = codec.token_index
        for end in range(min(len(text), 64), len(healed.text) - 1, -1):
            at = bisect_left(texts, text[:end])
            if at < len(texts) and texts[at] == text[:end]:
                ids = [index[at], *codec.encode(text[end:])]
                break
        else:
            return None
    return ids[:gen_length] or None


class RewritePlan(Plan):
    """Revises the selection in place: it is the initial draft of the generated blocks (token
    editing changes it, an end-of-text shrinks it, a few masks after it give it a little room to
    grow; a model with edit tokens inserts and deletes instead, its room end-of-text: rewrite_prompt).
    A result that would turn code that parsed into code that does not is refused. Drafts carry no text
    (the payload is "": a step was made)."""

    def __init__(self, model: LoadedModel, job: Rewrite, cancel: Flag):
        codec = model.codec
        self.codec, self.job = codec, job
        if job.instruction and codec.special.has_fim:
            raise InstructionUnsupported(
                f"{model.spec.name} is a fill-in-the-middle model and cannot follow an instruction; rewrite "
                "without one, or load a chat model (LLaDA2.1) to use instructions"
            )  # fmt: skip
        self.selection = job.selection
        # As the front cuts it: a window sent whole (megabytes) must not be tokenized here, on the model thread.
        before, after = trimmed(job.before, job.after, job.context_tokens * CHARS_PER_TOKEN)
        self.prompt = prompt = rewrite_prompt(before, job.selection, after, codec, model.max_positions,
                                              job.context_tokens, job.instruction, model.edit_ids is not None,
                                              model.block_size, snippets.from_wire(job.context),
                                              min(job.context_share or 0, MAX_CONTEXT_SHARE))  # fmt: skip
        self.started = time.perf_counter()
        self.request = check_request(GenerationRequest(
            prompt.prompt.ids, prompt.gen_length, job.mode, codec.special.mask, codec.special.eos, cancel=cancel,
            init_ids=prompt.init_ids, priority=1,
        ), model.max_positions)  # fmt: skip

    def on_draft(self, draft: Draft) -> tuple[int, str]:
        return draft.step, ""

    def finish(self, result: Result) -> Outcome:
        codec, job, selection = self.codec, self.job, self.selection
        seconds = time.perf_counter() - self.started
        filled = [t for t in result.tokens if t != codec.special.mask]
        tokens = len(filled)
        if result.cancelled:
            return Outcome("", result.steps, seconds, "cancelled", tokens=tokens)
        raw, _ = codec.text_of(filled)
        raw = strip_special(raw)
        if self.prompt.prompt.layout == "chat":
            raw, _ = unfence(raw, True)
        line_start = job.before[job.before.rfind("\n") + 1 :]
        text = _keep_line_ends(bound_rewrite(raw, selection, line_start), selection)
        if text == selection:
            return Outcome(text, result.steps, seconds, "unchanged", "the model proposed no change", tokens)
        start = len(job.before)
        reason = check_rewrite(job.before + selection + job.after, start, start + len(selection), text, job.python)
        if reason is not None:
            return Outcome(text, result.steps, seconds, "refused", reason, tokens)
        return Outcome(text, result.steps, seconds, "done", tokens=tokens)


def run_infill(model: LoadedModel, job: Infill, cancel: Flag, emit: Callable[[int, str | None], None]) -> Outcome:
    """One inline completion alone (InfillPlan); `emit(step, text or None)` after every step."""
    return InfillPlan(model, job, cancel).run(model, emit)


def run_rewrite(model: LoadedModel, job: Rewrite, cancel: Flag, emit: Callable[[int, str], None]) -> Outcome:
    """One rewrite alone (RewritePlan); `emit(step, "")` after every step."""
    return RewritePlan(model, job, cancel).run(model, emit)


def make_plan(model: LoadedModel, job: Job, cancel: Flag) -> Plan:
    """The plan of a job (raises Refused subclasses for a job the model cannot do)."""
    return InfillPlan(model, job, cancel) if isinstance(job, Infill) else RewritePlan(model, job, cancel)


def _keep_line_ends(text: str, selection: str) -> str:
    """The rewrite ends as the selection ends (unused room the model filled with blank lines is
    dropped), and CRLF files stay CRLF."""
    if "\r\n" in selection:
        text = text.replace("\r\n", "\n").replace("\n", "\r\n")
    ending = selection[len(selection.rstrip()) :]
    return text.rstrip() + ending


def _first(ids: list[int], value: int) -> int:
    try:
        return ids.index(value)
    except ValueError:
        return len(ids)


class _StopWhen:
    """The engine's cancel flag: the request's, or this job's own decision that it has enough."""

    def __init__(self, cancel: Flag):
        self.cancel, self.enough = cancel, False

    def is_set(self) -> bool:
        return self.enough or self.cancel.is_set()
