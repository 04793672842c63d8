"""Prompts for infill and rewrite: the text around the cursor cut to a token budget (prefix first, its
start kept still while the user types on one line), in the FIM or the chat layout of the tokenizer.

Knows nothing of the LSP, positions or tensors: strings in, token ids out (through `codec.TextCodec`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

from ..errors import Refused
from .codec import TextCodec
from .layouts import chat_infill_prompt, fim_ids
from .snippets import Snippet, describe_snippets, render_snippets

MIN_SNIPPET_LINES = 3  # a snippet cut to fit keeps at least this many lines, or is left out
CONTEXT_CACHE = 16  # snippet sets whose fitted ids are remembered (a few documents' sets, each for its line)
MAX_SNIPPETS_IN_PROMPT = 16  # as many as a request may carry (completion/snippets.py: MAX_WIRE_SNIPPETS)
QUANTUM = 32  # the cursor line's share of the prefix grows in steps of (at most) one block, so its start stays put
CHARS_PER_TOKEN = 16  # bounds the text looked at (a 2 MB document is never tokenized whole)
_HOLE_PREFIX, _HOLE_SUFFIX, _CONTEXT = "\ue000", "\ue001", "\ue002"  # private-use sentinels to split the chat template


@dataclass(frozen=True)
class InfillPrompt:
    ids: list[int]
    prefix: str  # the text kept before the hole
    suffix: str  # the text kept after the hole
    layout: str  # "fim" | "chat"
    context: tuple[Snippet, ...] = ()  # the snippets of other files the prompt starts with


@dataclass(frozen=True)
class RewritePrompt:
    prompt: InfillPrompt
    init_ids: list[int]  # the selection, the draft the engine starts from
    gen_length: int  # the selection plus room to grow


class SelectionTooLong(Refused):
    """A selection longer than the model can rewrite."""


def infill_prompt(before: str, after: str, codec: TextCodec, budget: int, instruction: str | None = None,
                  context: tuple[Snippet, ...] = (), context_share: int = 0) -> InfillPrompt:  # fmt: skip
    """`before`/`after`: the document text before and after the cursor. At most `budget` ids, of which
    the snippets of other files (`context`, most alike first) take at most `context_share` percent
    (`context_ids`: the most alike whole, the first that does not fit cut to its first lines); they
    start the prompt (see `_Layout`)."""
    layout = _Layout(codec, instruction, context_ids(context, codec, budget * context_share // 100,
                                                     codec.special.has_fim and instruction is None))  # fmt: skip
    room = budget - layout.overhead
    if room < 1:
        raise ValueError(f"a budget of {budget} tokens leaves no room for context (the layout takes {layout.overhead})")
    suffix_share = min(len(codec.encode(after[: room // 4 * CHARS_PER_TOKEN])), room // 4)
    prefix_ids, prefix = cut_prefix(before, codec, room - suffix_share)
    suffix_ids, suffix = cut_suffix(after, codec, room - len(prefix_ids))
    return InfillPrompt(layout.ids(prefix_ids, suffix_ids), prefix, suffix, layout.name, layout.context)


def context_ids(context: tuple[Snippet, ...], codec: TextCodec, cap: int,
                fim: bool) -> tuple[list[int], tuple[Snippet, ...]]:  # fmt: skip
    """The ids of the snippets that fit `cap` ids together, most alike first, and those snippets:
    rendered for the FIM layout (`render_snippets`), described in words for the chat one. A snippet
    that does not fit whole is kept as its first lines that do (at least MIN_SNIPPET_LINES), and ends
    the set; one that does not fit even so is left out. Remembered for the last CONTEXT_CACHE sets:
    the set stays the same along a line, and fitting it encodes the growing text once per snippet."""
    if not context:
        return [], ()
    ids, kept = _fitted_context(tuple(context), codec, cap, fim)
    return list(ids), kept


@functools.lru_cache(maxsize=CONTEXT_CACHE)
def _fitted_context(context: tuple[Snippet, ...], codec: TextCodec, cap: int,
                    fim: bool) -> tuple[tuple[int, ...], tuple[Snippet, ...]]:  # fmt: skip
    ids, kept = _fit_context(context, codec, cap, fim)
    return tuple(ids), kept


def _fit_context(context: tuple[Snippet, ...], codec: TextCodec, cap: int,
                 fim: bool) -> tuple[list[int], tuple[Snippet, ...]]:  # fmt: skip
    render = render_snippets if fim else describe_snippets
    kept: list[Snippet] = []
    ids: list[int] = []
    for snippet in context[:MAX_SNIPPETS_IN_PROMPT]:
        whole = codec.encode(render([*kept, snippet]))
        if len(whole) <= cap:
            kept, ids = [*kept, snippet], whole
            continue
        lines = snippet.text.splitlines(keepends=True)
        lo, hi = MIN_SNIPPET_LINES - 1, len(lines) - 1  # the most lines that fit: in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            part = dataclasses.replace(snippet, text="".join(lines[:mid]))
            lo, hi = (mid, hi) if len(codec.encode(render([*kept, part]))) <= cap else (lo, mid - 1)
        if lo >= MIN_SNIPPET_LINES:
            part = dataclasses.replace(snippet, text="".join(lines[:lo]))
            return codec.encode(render([*kept, part])), (*kept, part)
    return ids, tuple(kept)


_PARTIAL_WORD = re.compile(r" ?[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Healed:
    ids: list[int]  # the prompt without the tokens taken back
    text: str  # their text: the completion starts with it, and it is cut off again
    allowed: list[int] | None  # the ids the first generated position may hold (None: any)


def heal(prompt: InfillPrompt, codec: TextCodec, max_tokens: int = 4) -> Healed | None:
    """Token healing, for a FIM prompt that ends inside a word ("self.assertE|"). The word's last
    pieces are split where the model rarely saw them split; taking them back (up to `max_tokens`, as
    many as some single id still extends: "assertE" -> "assertEqual") and letting the first generated
    token be any id that starts with their text lets the model finish the word as it knows it. None
    when the prompt does not end in a word or no id extends its end."""
    if prompt.layout != "fim" or not prompt.prefix or not (prompt.prefix[-1].isalnum() or prompt.prefix[-1] == "_"):
        return None
    best = None
    for k in range(1, min(max_tokens, len(prompt.ids) - 1) + 1):
        text = "".join(codec.token_texts[i] for i in prompt.ids[-k:])
        if not _PARTIAL_WORD.fullmatch(text):
            break
        allowed = codec.ids_starting_with(text)
        if len(allowed) > (1 if k == 1 else 0):  # one id that is the token itself heals nothing
            best = Healed(prompt.ids[:-k], text, allowed)
    return best


def grow_allowance(selection_tokens: int) -> int:
    """Masks after the selection: the most a rewrite may grow. Small, because a model given room
    fills it with the code that follows (a rewrite must stay a rewrite of the selection)."""
    return max(2, selection_tokens // 8)


def rewrite_prompt(before: str, selection: str, after: str, codec: TextCodec, max_positions: int,
                   context_tokens: int, instruction: str | None = None, edits: bool = False,
                   block_size: int = 32, context: tuple[Snippet, ...] = (),
                   context_share: int = 0) -> RewritePrompt:  # fmt: skip
    """The selection is the initial draft of the generated blocks, followed by masks for room to grow.

    `edits`: the model edits a draft in place (LLaDA2.2's INSERT and DELETE), so a word it adds shifts
    the rest instead of being written over it, and the room after the selection is end-of-text to the
    end of its block (`block_size`: the model's), not masks: masks there would be filled with the code
    that follows; an end-of-text stays one unless the model edits it, and a shift pushes it out (the
    rule keeps a block's length: without room, an insertion would push out the selection's end)."""
    min_prompt = min(64, max_positions // 4)
    # Bounded from the character count first: a selection of megabytes is refused without being encoded.
    if len(selection) > (max_positions - min_prompt) * codec.max_token_chars:
        raise SelectionTooLong(
            f"the selection is {len(selection)} characters; this model rewrites at most "
            f"{max(0, (max_positions - min_prompt) * 4 // 5)} tokens"
        )
    init_ids = codec.encode(selection)
    gen_length = len(init_ids) + grow_allowance(len(init_ids))
    if gen_length > max_positions - min_prompt:
        raise SelectionTooLong(
            f"the selection is {len(init_ids)} tokens; this model rewrites at most "
            f"{max(0, (max_positions - min_prompt) * 4 // 5)}"
        )
    task = None
    if not codec.special.has_fim:
        task = ("Rewrite the code at <HOLE>" + (f" ({instruction})" if instruction else "") + ". It is now:\n"
                f"```\n{selection}\n```\nAnswer with the new code only, no explanation.")  # fmt: skip
    budget = min(context_tokens, max_positions - gen_length)
    prompt = infill_prompt(before, after, codec, budget, task, context, context_share)
    if edits and codec.special.eos is not None:
        P = len(prompt.ids)
        gen_length = min(gen_length + (-(P + gen_length)) % block_size, max_positions - P)
        init_ids = init_ids + [codec.special.eos] * (gen_length - len(init_ids))
    return RewritePrompt(prompt, init_ids, gen_length)


def cut_prefix(before: str, codec: TextCodec, cap: int) -> tuple[list[int], str]:
    """The end of `before` in at most `cap` ids. Where it starts depends only on the lines above the
    cursor line and on the cursor line's length in steps of `quantum` ids, so typing on one line keeps
    the same start, the same leading ids, and the engine reuses their cached blocks."""
    if cap <= 0:
        return [], ""
    cut = before.rfind("\n") + 1
    above, head = before[:cut], before[cut:]
    head_ids = codec.encode(head)
    quantum = min(QUANTUM, max(4, cap // 8))  # small budgets cannot spare a whole block
    reserve = -(-(len(head_ids) + 1) // quantum) * quantum
    if reserve >= cap:  # a very long cursor line: keep its end
        ids = head_ids[-cap:]
        return ids, codec.decode(ids)
    lines = _lines_upward(above, (cap - reserve) * CHARS_PER_TOKEN)
    encoded = codec.encode_batch(lines)
    take, total = 0, 0
    for n in map(len, encoded):
        if total + n > cap - reserve:
            break
        take, total = take + 1, total + n
    # The line that does not fit fills the rest with its end: a long line must not hand the prefix's
    # share to the suffix. The cut is still a function of the lines above, so it stays put too.
    left = cap - reserve - total
    partial = codec.decode(encoded[take][-left:]).lstrip("\ufffd") if take < len(lines) and left >= 4 else ""
    while True:  # per-line counts are close to, not exactly, the count of the joined text
        text = partial + "".join(reversed(lines[:take])) + head
        ids = codec.encode(text)
        if len(ids) <= cap or (take == 0 and not partial):
            break
        partial, take = "", take - (not partial)
    if len(ids) > cap:
        ids = ids[-cap:]
        text = codec.decode(ids)
    return ids, text


def cut_suffix(after: str, codec: TextCodec, cap: int) -> tuple[list[int], str]:
    """The start of `after` in at most `cap` ids, ending at a line end when a whole line fits."""
    if cap <= 0 or not after:
        return [], ""
    lines = after[: cap * CHARS_PER_TOKEN].splitlines(keepends=True)
    take, total = 0, 0
    for n in map(len, codec.encode_batch(lines)):
        if total + n > cap:
            break
        take, total = take + 1, total + n
    if take == 0:  # not even the rest of the cursor line fits: keep its start
        ids = codec.encode(lines[0])[:cap]
        return ids, codec.decode(ids)
    while True:
        text = "".join(lines[:take])
        ids = codec.encode(text)
        if len(ids) <= cap or take == 1:
            break
        take -= 1
    if len(ids) > cap:
        ids = ids[:cap]
        text = codec.decode(ids)
    return ids, text


def _lines_upward(above: str, max_chars: int) -> list[str]:
    """The complete lines at the end of `above`, nearest first, at most about `max_chars` characters."""
    lines, end, used = [], len(above), 0
    while end > 0 and used < max_chars:
        start = above.rfind("\n", 0, end - 1) + 1
        lines.append(above[start:end])
        used += end - start
        end = start
    return lines


class _Layout:
    """FIM ids when the tokenizer has the tokens (the embedded model); else the LLaDA2.1 chat template
    with the hole described in words (the real checkpoints have no FIM tokens)."""

    def __init__(self, codec: TextCodec, instruction: str | None,
                 context: tuple[list[int], tuple[Snippet, ...]] = ([], ())):  # fmt: skip
        """`context`: the snippets' ids (context_ids) and the snippets. They come first, before
        `<|fim_prefix|>` (the layout repository-level FIM models are trained on: the other files,
        then the file with its hole), or first in the chat turn: the prompt's start is then the same
        for every completion of one set of snippets, and the prefix cache shares its blocks while
        the user types; after `<|fim_prefix|>` they would split the marker from the suffix it opens."""
        self.special = codec.special
        self.context_ids, self.context = context
        if self.special.has_fim and instruction is None:
            self.name, self.overhead = "fim", 3 + len(self.context_ids)
            return
        self.name = "chat"
        full = chat_infill_prompt(_HOLE_PREFIX, _HOLE_SUFFIX, instruction, _CONTEXT if self.context_ids else "")
        head, rest = full.split(_HOLE_PREFIX)
        hole, tail = rest.split(_HOLE_SUFFIX)
        if self.context_ids:  # the snippets' text is encoded as text, never as markup
            lead, head = head.split(_CONTEXT)
            self.head = [*codec.encode_markup(lead), *self.context_ids, *codec.encode_markup(head)]
        else:
            self.head = codec.encode_markup(head)
        self.hole, self.tail = codec.encode(hole), codec.encode_markup(tail)
        self.overhead = len(self.head) + len(self.hole) + len(self.tail)

    def ids(self, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
        if self.name == "fim":
            return [*self.context_ids, *fim_ids(prefix_ids, suffix_ids, [], self.special)]
        return [*self.head, *prefix_ids, *self.hole, *suffix_ids, *self.tail]
