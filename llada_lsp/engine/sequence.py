"""One generation's state, stepped from outside: which positions the next forward must run, and what
a step's decisions do to the canvas, the block and the cache's valid prefix.

Host-side only (lists of ids): the scheduler runs the forwards of many sequences at once and hands
each its rows of the decisions. The loop rules are the reference's: blocks left to right, post steps
after the last mask, a block ends when a mask-free step changes nothing or the post-step budget is
spent, EOS early stop after a block, cancellation checked before every forward. What a step does to
the block, and when the block closes, the settings' block rule says (policy.BlockRule: JointThreshold,
or LLaDA2.2's Levenshtein JointThresholdInDel); this module never asks which one it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .policy import BlockOutcome, BlockRule, BlockState

DRAFT_LOOKAHEAD = 4  # blocks one forward may decide while it checks a draft (Sequence.ahead)


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class StepDraft:
    """The state after one denoising step."""

    step: int  # denoising forwards so far in this generation (1-based)
    # the last block the step decided (the active one; a draft's check may decide several: Sequence.ahead)
    block: int  # its index, counted from position 0 of the sequence
    block_tokens: list[int]  # its ids after the step (prompt tail included)
    # (LLaDA2.2: positions in the block as it stands after the step's DELETE/INSERT shifted it)
    filled: list[int]  # its block-relative positions filled from a mask (M2T)
    edited: list[int]  # its block-relative positions overwritten (T2T)
    generated: list[int]  # everything generated so far, mask ids where still masked
    # per generated position, the probability of its id at the last step that ran it (0.0: not run yet)
    confidence: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class BlockStats:
    block: int
    forwards: int
    mask_free_forwards: int
    end: str  # "converged" | "post_step_budget" | "cancelled"; LLaDA2.2: "converged" | "cleanup" | "cancelled"
    last_forward_changed_tokens: bool


@dataclass
class GenerationResult:
    tokens: list[int]  # the completion, cut after the first EOS (included)
    steps: int  # denoising forwards, counted as the reference counts its forwards
    prefill_forwards: int = 0  # forwards that only filled the cache with prompt blocks
    refreshed_blocks: int = 0  # blocks re-run (fused into the next block's first step) after a last-step change
    reused_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    blocks: list[BlockStats] = field(default_factory=list)
    seconds: float = 0.0
    cancelled: bool = False

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / max(self.steps, 1)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class DecodeSettings:
    """A validated generation request (Engine.generation checks it)."""

    prompt: list[int]
    gen_length: int
    policy: BlockRule  # JointThreshold, or JointThresholdInDel (LLaDA2.2)
    max_post_steps: int
    eos_early_stop: bool
    mask_id: int
    eos_id: int | None
    cancel: CancelFlag | None = None
    init_ids: list[int] = field(default_factory=list)
    first_allowed: torch.Tensor | None = None  # [V] bool: the only ids the first generated position may hold
    priority: int = 0  # lower runs first when rows are short (inline completions 0, rewrites 1)
    edit_ids: tuple[int, int] | None = None  # LLaDA2.2's (DELETE, INSERT): with a JointThresholdInDel policy


class Sequence:
    """The canvas of one generation and where its decoding stands. Between forwards: `ready()` says
    whether it runs in the next one (False: finished, `result` set); `queries()` the positions to
    run; `apply(...)` takes that forward's decisions for its active block and returns the draft."""

    def __init__(self, settings: DecodeSettings, block_size: int, use_cache: bool = True):
        self.settings, self.bs, self.use_cache = settings, block_size, use_cache
        s = settings
        self.P = P = len(s.prompt)
        self.n_blocks = -(-(P + s.gen_length) // block_size)
        self.first = P // block_size  # the first block with a position to generate
        # a draft (init_ids) is editable, never frozen like the prompt
        self.host = s.prompt + list(s.init_ids) + [s.mask_id] * (self.n_blocks * block_size - P - len(s.init_ids))
        self.result = GenerationResult(tokens=[], steps=0)
        self.confidence = [0.0] * s.gen_length  # per generated position, as StepDraft.confidence
        self.started = time.perf_counter()
        self.valid = 0  # K/V of positions [0, valid) in the sequence's pages match the canvas
        self.finished = False
        self.rule: BlockRule = s.policy
        self.state: BlockState | None = None  # the rule's state of the active block
        self.aborted = False  # Scheduler.abort
        self.error: Exception | None = None  # why it ended without a result (fail)
        self._enter(self.first)

    # --- the block loop ----------------------------------------------------------------------------
    def _enter(self, b: int) -> None:
        self.b, self.lo, self.hi = b, b * self.bs, (b + 1) * self.bs
        self.n_masked = self.host[self.lo : self.hi].count(self.settings.mask_id)
        self.forwards = 0
        self.changed = False
        self.end = "converged"
        prompt_len = min(max(self.P - self.lo, 0), self.bs)
        self.state = self.rule.start(self.host[self.lo : self.hi], prompt_len, self.settings.mask_id)

    def ready(self) -> bool:
        """Before a forward: True if this sequence needs one; otherwise it has just finished."""
        while not self.finished:
            if self.cancelled():
                self.result.cancelled, self.end = True, "cancelled"
                self._close_block()
                continue
            end = self.rule.before_forward(self.state, self.n_masked, self.settings.max_post_steps)
            if end is not None:
                self.end = end
                self._close_block()
                continue
            return True
        return False

    def cancelled(self) -> bool:
        cancel = self.settings.cancel
        return self.aborted or (cancel is not None and cancel.is_set())

    def queries(self) -> tuple[int, int]:
        """Positions [start, end) the next forward runs: from the end of the valid cache (which may
        include the previous block, whose last step changed it) to the end of the active block, or of
        the last block a draft's check runs ahead to (`ahead`)."""
        return (self.valid if self.use_cache else 0), self.hi + (self.ahead() - 1) * self.bs

    def ahead(self) -> int:
        """Blocks the next forward decides: 1, or, for a draft (init_ids), more while each block but the
        last is mask-free (its step closes it if nothing changes) and the next one holds drafted ids, at
        most DRAFT_LOOKAHEAD. The forward then also runs that next block's first step, attending to
        exactly the tokens it would see after the close, so a draft the model confirms costs one
        forward, not one per block; the step is used only if the blocks before it close (apply).
        Cold starts always decide 1 block: the reference's loop, forward for forward."""
        s, bs = self.settings, self.bs
        if not s.init_ids or self.n_masked or not self.rule.drafts_ahead(s.max_post_steps):
            return 1
        n, end = 1, self.P + s.gen_length
        while n < DRAFT_LOOKAHEAD and self.b + n < self.n_blocks:
            lo = self.lo + n * bs
            block = self.host[lo : min(lo + bs, end)]
            if not block or block.count(s.mask_id) == len(block):
                break  # past the generated region, or nothing drafted there: its first step waits
            n += 1
            if s.mask_id in block:
                break  # this block's masks: it stays open after its first step
        return n

    def apply(self, start: int, decided: list) -> StepDraft:
        """The forward over [start, end) ran; `decided` holds the rule's decisions (its `read`) for the
        blocks it decided (`ahead`: block size each, the active block's first). A block after the active
        one takes its step only if every block before it closed in this step with its ids unchanged: only
        then did this forward show it the tokens it would see after the close."""
        if self.use_cache and start < self.lo:
            self.result.refreshed_blocks += 1  # the previous block's final tokens, run with this one
        self.result.steps += 1
        bs, first = self.bs, self.b
        draft = self._step([part[:bs] for part in decided])
        for k in range(1, len(decided[0]) // bs):
            if self.finished or self.b != first + k or self.result.blocks[-1].last_forward_changed_tokens:
                break  # the block before is still open, or its last step changed what this one saw
            self.rule.before_forward(self.state, self.n_masked, self.settings.max_post_steps)  # counted as ready()
            draft = self._step([part[k * bs : (k + 1) * bs] for part in decided])
        return draft

    def _step(self, decided: list) -> StepDraft:
        """The rule's step on the active block: the canvas, the cache's valid prefix, the draft. If the
        step that closes the block changed its ids, its K/V are not those of the final tokens, so the next
        forward runs it again (`valid` stays at its start), fused with the next block's first step."""
        self.valid = self.lo if self.use_cache else 0
        s, lo, hi = self.settings, self.lo, self.hi
        out = self.rule.step_block(self.state, self.host[lo:hi], decided, s)
        tokens = self._carry(out) if s.init_ids else out.tokens
        self.host[lo:hi] = tokens
        self.forwards += 1
        self.changed = out.changed
        P, end = self.P, min(hi, self.P + s.gen_length)
        for i in range(max(lo, P), end):
            self.confidence[i - P] = out.confidence[i - lo]
        generated, confidence = self.shown(self.host[P:end], self.confidence[: max(end - P, 0)])
        draft = StepDraft(self.result.steps, self.b, list(tokens), out.filled, out.edited, generated, confidence)
        self.n_masked = tokens.count(s.mask_id)
        if out.end is not None:
            self.end = out.end
            self._close_block()
        return draft

    def _carry(self, out: BlockOutcome) -> list[int]:
        """The block after an InDel step whose draft (`init_ids`) runs on past it: the draft follows the
        block's edits as text does. Ids an INSERT pushed out of the block open the next one (the rest of
        the generated region moves right, its last ids drop); masks a DELETE left at the block's end
        take the draft's next ids (the rest moves left, its end padded as it ended: end-of-text or
        mask). SGLang's rule, which never starts from a draft, drops and pads instead: a draft would
        then lose an id at every block boundary an insertion crosses."""
        s, P, hi, bs = self.settings, self.P, self.hi, self.bs
        end, draft_end = P + s.gen_length, P + len(s.init_ids)
        tokens = list(out.tokens)
        if hi >= min(end, draft_end) or not (out.overflow or out.padded):
            return tokens
        tail, confidence = self.host[hi:end], self.confidence[hi - P : end - P]
        if out.overflow:
            k = len(out.overflow)
            self.host[hi:end] = (out.overflow + tail)[: end - hi]
            self.confidence[hi - P : end - P] = ([0.0] * k + confidence)[: end - hi]
            return tokens
        j, at = min(out.padded, draft_end - hi), bs - out.padded
        pad = s.eos_id if s.eos_id is not None and tail[-1] == s.eos_id else s.mask_id
        tokens[at : at + j] = tail[:j]
        self.state.drafted(at, j)  # ids now, no masks
        self.host[hi:end] = tail[j:] + [pad] * j
        self.confidence[hi - P : end - P] = confidence[j:] + [0.0] * j
        return tokens

    def shown(self, ids: list[int], confidence: list[float]) -> tuple[list[int], list[float]]:
        """Generated ids as they leave the engine: never an edit id (the rule removes them from the
        canvas within the step that writes them; this holds the line for anything else)."""
        edit = self.settings.edit_ids
        if not edit or not any(t in edit for t in ids):
            return ids, confidence
        kept = [(t, c) for t, c in zip(ids, confidence) if t not in edit]
        return [t for t, _ in kept], [c for _, c in kept]

    def _close_block(self) -> None:
        r = self.result
        post = self.state.counted_post_steps(self.end)
        r.blocks.append(BlockStats(self.b, self.forwards, post, self.end, self.changed))
        if r.cancelled:
            return self._finish()
        if self.use_cache and not self.changed:
            self.valid = self.hi  # the last forward ran exactly these tokens: their K/V are final
        s = self.settings
        done = self.host[self.P : self.hi]
        if s.eos_early_stop and s.eos_id is not None and s.mask_id not in done and s.eos_id in done:
            return self._finish()
        if self.b + 1 >= self.n_blocks:
            return self._finish()
        self._enter(self.b + 1)

    def fail(self, error: Exception) -> None:
        """It ends here with `error` (its canvas is not a completion)."""
        self.error = error
        self._finish()

    def _finish(self) -> None:
        s = self.settings
        out = [t for t in self.host[self.P : self.P + s.gen_length] if t not in (s.edit_ids or ())]  # as shown()
        if s.eos_id is not None and s.eos_id in out:
            out = out[: out.index(s.eos_id) + 1]
        self.result.tokens = out
        self.result.seconds = time.perf_counter() - self.started
        self.finished = True

    # --- what the scheduler asks -------------------------------------------------------------------
    @property
    def allowed_row(self) -> int | None:
        """The active block's position that `first_allowed` constrains, if it is in this block."""
        if self.settings.first_allowed is not None and self.lo <= self.P < self.hi:
            return self.P - self.lo
        return None

    def blocks(self, lo_block: int, hi_block: int) -> list[tuple[int, ...]]:
        """The token ids of blocks [lo_block, hi_block), as prefix-cache keys."""
        bs = self.bs
        return [tuple(self.host[b * bs : (b + 1) * bs]) for b in range(lo_block, hi_block)]
