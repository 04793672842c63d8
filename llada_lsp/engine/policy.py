"""Decoding policies: how one denoising step turns logits into filled (M2T) and edited (T2T) tokens.

Pure tensor functions over the active blocks of a batch, each row with its own thresholds; LLaDA2.2's
Levenshtein rule (JointThresholdInDel) is a pure host function over each position's ranked candidates.
Both rules are `BlockRule`s (SGLang's DllmAlgorithm shape): a rule starts a block, says what the device
step returns for it (`device_step`, `read`), steps it on the host and says when it closes; the sequence
and the scheduler ask the rule and never which one it is. The sequences, the cache and the model live in
sequence.py, cache.py and scheduler.py; the step's tensor layouts in step_layout.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .. import kernels
from ..kernels import cpu
from . import cpu_step
from .step_layout import CONFIDENCE_SCALE, EDITING, FROZEN, MASK, OUTSIDE, THRESHOLD, Candidates, Decisions, Ints


def step_guesses(logits: torch.Tensor, mask_id: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (confidence, token) [...]: the greedy token of each position, the mask excluded
    (a step must never write a mask), and its softmax probability over the whole vocabulary, the mask
    included, as the reference computes it (not renormalised to p / (1 - p_mask)). `mask_id`: one id,
    or one per row of a [B, N, V] batch ([B]). Exact ties in the argmax go to the first id; a +inf
    logit anywhere (the mask's too) gives a NaN confidence, as on the fused kernel."""
    return _guesses(logits, mask_id, renormalised=False)


def guesses(logits: torch.Tensor, mask_id: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`step_guesses` with the confidence renormalised over the ids other than the mask, p / (1 - p_mask):
    what the step rule computed before it followed the reference. Training's self-fill still reads it
    (llada_lsp/training/objective.py); decoding does not."""
    return _guesses(logits, mask_id, renormalised=True)


def _guesses(logits, mask_id, renormalised: bool):
    # torch.compile traces the reference: the CPU rule's host read would break the step's one graph
    if not renormalised and logits.device.type == "cpu" and logits.dim() > 1 and not torch.compiler.is_compiling():
        return _cpu_guesses(logits, mask_id)
    return _reference_guesses(logits, mask_id, renormalised)


def _reference_guesses(logits, mask_id, renormalised: bool):
    """The rule as written first: a float copy of the logits with the mask's logit set to -inf. Static
    shapes and no host read (what a CUDA graph and torch.compile need); `_cpu_guesses` is held to it."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    total = None if renormalised else logits.logsumexp(-1)  # [...]: the softmax's denominator, the mask in it
    if isinstance(mask_id, torch.Tensor):
        B, N, _ = logits.shape
        logits.scatter_(-1, mask_id.view(B, 1, 1).expand(B, N, 1), float("-inf"))
    else:
        logits[..., mask_id] = float("-inf")
    if renormalised:
        return logits.softmax(-1).max(-1)
    best, token = logits.max(-1)
    conf = (best - total).exp().masked_fill(total == float("inf"), float("nan"))  # a +inf logit, the mask's too
    return conf, token


def _cpu_guesses(logits: torch.Tensor, mask_id: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`step_guesses` in four passes over the logits (a max, the shift, the exponentials in place,
    their sum) and no copy of them when they are float32 or float64 already: the max over the whole row
    (with its first index) gives the logsumexp's shift and, wherever the mask is not the row's first
    maximum, the answer; only rows whose first maximum is the mask (a host read: cheap on the CPU) are
    searched again without it. The denominator is torch's own logsumexp, step for step (amax, shift,
    exp, sum, log, add), so the confidence is bit-identical to the reference's. Where the CPU kernels
    run (kernels/cpu.py's switch), the same passes with the searches in one numba call (cpu_step.guesses)."""
    wide = torch.promote_types(logits.dtype, torch.float32)
    logits = logits if logits.dtype == wide else logits.to(wide)
    if cpu.enabled(logits) and logits.is_contiguous():  # the same passes, the searches in one kernel call
        conf, token = cpu_step.guesses(logits, mask_id)
        return torch.from_numpy(conf), torch.from_numpy(token)
    top, token = first_max(logits)  # [...]: NaN where the row holds one, the mask included
    shift = top.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)  # amax's, where it is finite
    total = torch.sub(logits, shift[..., None]).exp_().sum(-1).log_().add_(shift)  # [...]
    masks = mask_id.view(-1, *[1] * (token.dim() - 1)) if isinstance(mask_id, torch.Tensor) else mask_id
    again = (token == masks).nonzero(as_tuple=True)
    if not again[0].numel():
        # total is +inf only where top is (+inf - +inf: NaN), NaN where top is: the reference's NaN either way
        return (top - total).exp(), token
    # the mask is a row's first maximum: its best other id, as the reference finds it
    rows = logits[again].clone()  # [n, V]
    ids = masks if isinstance(masks, int) else masks.expand_as(token)[again]
    rows.scatter_(-1, torch.as_tensor(ids).expand(rows.shape[0]).view(-1, 1), float("-inf"))
    top[again], token[again] = rows.max(-1)
    conf = (top - total).exp().masked_fill(total == float("inf"), float("nan"))  # a +inf logit, the mask's too
    return conf, token


MAX_CHUNK = 128  # ids per chunk of first_max's two-level search


def first_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x.max(-1) (the value, and the first index that holds it; NaN counts as the largest) in one
    vectorised pass: on the CPU torch's max with indices runs element by element, its amax does not.
    Each chunk's amax, then the first chunk holding the row's max, then the first index inside it."""
    V = x.shape[-1]
    chunk = next((c for c in (MAX_CHUNK, 64, 32) if V % c == 0 and c < V), None)
    if chunk is None:
        return x.max(-1)
    chunks = x.reshape(*x.shape[:-1], V // chunk, chunk)  # [..., V / chunk, chunk]
    top, first = chunks.amax(-1).max(-1)  # [...]: the row's max, the first chunk whose amax it is
    inside = chunks.gather(-2, first[..., None, None].expand(*first.shape, 1, chunk)).squeeze(-2)  # [..., chunk]
    return top, first * chunk + inside.max(-1).indices


def joint_threshold(tokens, logits, frozen, mask_ids, thresholds, editing) -> StepUpdate:
    """One step of the joint-threshold rule for every row of a batch, each with its own thresholds.
    tokens [B, N], logits [B, N, V], frozen [B, N] bool (prompt positions), mask_ids [B],
    thresholds / editing: one float per row (a list, or a [B] tensor). Returns a StepUpdate of [B, N]
    tensors. On CUDA with triton, one fused kernel (kernels/joint_threshold.py) makes the same decisions
    without a [B, N, V] softmax."""
    if kernels.enabled(logits):
        fused = kernels.step(tokens, logits, frozen, mask_ids, thresholds, editing)
        if fused is not None:  # None: the kernel does not compile on this machine (logged once)
            return StepUpdate(*fused)
    conf, argmax = step_guesses(logits, mask_ids)  # [B, N], [B, N]
    fill_above = torch.as_tensor(thresholds, dtype=conf.dtype, device=conf.device)[:, None]
    edit_above = torch.as_tensor(editing, dtype=conf.dtype, device=conf.device)[:, None]
    masked = tokens == mask_ids[:, None]
    filled = masked & (conf > fill_above)
    # With no mask above the threshold, the single most confident mask is filled (if any is left),
    # chosen by torch.topk as the reference chooses it (exact ties: topk's own order, not the first).
    best = conf.masked_fill(~masked, -1.0).topk(1, dim=-1).indices
    fallback = torch.zeros_like(masked).scatter_(1, best, True)
    filled = torch.where(filled.any(-1, keepdim=True), filled, fallback & masked)
    edited = ~masked & ~frozen & (argmax != tokens) & (conf > edit_above)
    return StepUpdate(torch.where(filled | edited, argmax, tokens), filled, edited, conf)


@dataclass(frozen=True)
class StepUpdate:
    tokens: torch.Tensor  # [N] (or [B, N]) block tokens after the step
    filled: torch.Tensor  # bool: mask -> token (M2T)
    edited: torch.Tensor  # bool: token -> token (T2T)
    confidence: torch.Tensor | None = None  # the greedy token's probability; NaN where the logits were NaN or +inf


@dataclass
class BlockOutcome:
    """One host step of a block rule on the active block (BlockRule.step)."""

    tokens: list[int]  # the block after the step (its length kept)
    filled: list[int]  # positions of the new block written over a mask (M2T)
    edited: list[int]  # positions of the new block overwritten (T2T)
    confidence: list[float]  # per position of the new block: its id's probability
    changed: bool  # the step changed the block's ids
    end: str | None = None  # the block closes with this end ("converged", "cleanup"); None: it stays open
    overflow: list[int] = field(default_factory=list)  # ids an INSERT pushed past the block's end
    padded: int = 0  # masks added at the block's end after DELETEs


class BlockState(Protocol):
    """A rule's state of one block, kept by its Sequence between steps."""

    def counted_post_steps(self, end: str) -> int: ...  # BlockStats.mask_free_forwards when it closes with `end`

    def drafted(self, at: int, n: int) -> None: ...  # positions [at, at + n) took a draft's ids (no masks)


class BlockRule(Protocol):
    """How a block is decoded, in SGLang's DllmAlgorithm shape: `start` a block; before each forward,
    `before_forward` may close it; the device step returns `device_step`'s row per sequence, which `read`
    turns into the row's own decisions on the host; `step_block` applies them and says whether the block
    closes. JointThreshold and JointThresholdInDel are its implementations; a scheduler runs one kind
    (`rule_for(config)`), each row with its own instance (its thresholds)."""

    threshold: float
    editing_threshold: float

    def start(self, block: list[int], prompt_len: int, mask_id: int) -> BlockState: ...

    def before_forward(self, state: BlockState, n_masked: int, max_post_steps: int) -> str | None: ...

    def drafts_ahead(self, max_post_steps: int) -> bool: ...

    @staticmethod
    def device_step(logits: torch.Tensor, ints: torch.Tensor, layout: Ints, D: int, limits: torch.Tensor,
                    vocab: int) -> torch.Tensor: ...  # fmt: skip

    @staticmethod
    def read(row: list[int], skip: int, D: int, vocab: int): ...

    def step_block(self, state: BlockState, block: list[int], decided, settings) -> BlockOutcome: ...


@dataclass
class PostSteps:
    """JointThreshold's block state: the mask-free forwards run so far (its post-step budget)."""

    post: int = 0

    def counted_post_steps(self, end: str) -> int:
        return max(self.post - (end == "post_step_budget"), 0)  # the forward the budget refused did not run

    def drafted(self, at: int, n: int) -> None:
        pass


@dataclass(frozen=True)
class JointThreshold:
    """LLaDA2.1's rule: fill every mask whose confidence beats `threshold` (at least the single most
    confident one), and in the same step overwrite every earlier-filled token whose argmax differs and
    beats `editing_threshold` (0.0: always follow the argmax). Prompt positions are never touched. A block
    closes when a mask-free step changes nothing, or after `max_post_steps` mask-free forwards."""

    threshold: float = 0.5
    editing_threshold: float = 0.0

    # --- BlockRule ---------------------------------------------------------------------------------
    def start(self, block: list[int], prompt_len: int, mask_id: int) -> PostSteps:
        return PostSteps()

    def before_forward(self, state: PostSteps, n_masked: int, max_post_steps: int) -> str | None:
        """A mask-free block's forward counts against the post-step budget; past it the block closes."""
        if n_masked == 0:
            state.post += 1
            if state.post > max_post_steps:
                return "post_step_budget"
        return None

    def drafts_ahead(self, max_post_steps: int) -> bool:
        """A draft's next block may be decided ahead only where a mask-free step may run (a post step)."""
        return max_post_steps >= 1

    @staticmethod
    def device_step(logits: torch.Tensor, ints: torch.Tensor, layout: Ints, D: int, limits: torch.Tensor,
                    vocab: int) -> torch.Tensor:  # fmt: skip
        """Decisions' rows [B, 4D + 1] for the last D queries: on the CPU in numba (cpu_step; the fused
        Triton rule first where it runs), elsewhere `packed_decisions`."""
        if cpu.enabled(logits) and not kernels.enabled(logits) and logits.is_contiguous():
            return cpu_step.packed_decisions(ints, layout, D, logits, limits, vocab)
        return packed_decisions(ints, layout, D, logits, limits, vocab)

    @staticmethod
    def read(row: list[int], skip: int, D: int, vocab: int):
        return Decisions(D).unpack(row, skip)

    def step_block(self, state: PostSteps, block: list[int], decided, settings) -> BlockOutcome:
        """The device's decisions applied: the block closes when it was mask-free and nothing changed."""
        tokens, filled, edited, confidence = decided
        fills = [i for i, f in enumerate(filled) if f]
        edits = [i for i, e in enumerate(edited) if e]
        changed = bool(fills or edits)
        end = "converged" if settings.mask_id not in block and not changed else None
        return BlockOutcome(list(tokens), fills, edits, confidence, changed, end)

    def step(self, tokens: torch.Tensor, logits: torch.Tensor, frozen: torch.Tensor, mask_id: int) -> StepUpdate:
        """One block: tokens [N], logits [N, V], frozen [N] bool (prompt positions)."""
        ids = torch.tensor([mask_id], device=tokens.device)
        rows = joint_threshold(
            tokens[None], logits[None], frozen[None], ids, [self.threshold], [self.editing_threshold]
        )
        return StepUpdate(rows.tokens[0], rows.filled[0], rows.edited[0])


def packed_decisions(ints: torch.Tensor, layout: Ints, D: int, logits: torch.Tensor, limits: torch.Tensor,
                     vocab: int) -> torch.Tensor:  # fmt: skip
    """The joint-threshold rule over the last D queries of each row -> Decisions' rows [B, 4D + 1] (`ints`
    and `limits` in step_layout's layouts, logits [B, D, V]). Static shapes, no host read: the device's
    path, and the reference of cpu_step.py's."""
    frozen_n, mask_ids = layout.column(ints, FROZEN), layout.column(ints, MASK)  # [B] each
    outside = layout.column(ints, OUTSIDE)
    slot = torch.arange(D, device=ints.device)[None, :] - outside[:, None]  # [B, D]: < 0 outside the row's
    frozen = (slot < 0) | (slot < frozen_n[:, None])  # and its prompt positions
    tokens = layout.decided_ids(ints, D)
    tokens = torch.where((slot < 0) & (tokens == mask_ids[:, None]), (mask_ids[:, None] + 1) % vocab, tokens)
    update = joint_threshold(tokens, logits, frozen, mask_ids, limits[:, THRESHOLD], limits[:, EDITING])
    # a NaN or +inf logit makes its softmax NaN (outside a row's decisions: padding, never read)
    finite = (update.confidence.isfinite() | (slot < 0)).all(1, keepdim=True).long()
    confidence = (update.confidence.nan_to_num(0.0).clamp(0.0, 1.0) * CONFIDENCE_SCALE).long()
    return Decisions.pack(update.tokens, update.filled, update.edited, confidence, finite)


PRESETS: dict[str, JointThreshold] = {
    "speed": JointThreshold(threshold=0.5, editing_threshold=0.0),
    "quality": JointThreshold(threshold=0.7, editing_threshold=0.5),
    "strict": JointThreshold(threshold=0.95, editing_threshold=0.9),
}
# The no-editing baseline of the evaluation: confident fills only, never revise (conf > inf is never true).
PRESETS["no-edit"] = JointThreshold(threshold=0.95, editing_threshold=float("inf"))


# --- LLaDA2.2: Levenshtein editing (DELETE / INSERT) -------------------------------------------------
# SGLang's JointThresholdInDel, deterministic, is the rule followed here (docs/llada22.md). The decoder
# shipped with the checkpoint differs, per a public port of it: its post-edit budget resets while an
# original mask reappears, its M2T floor is a per-step schedule (the block's masks spread over `steps`)
# plus the introduced masks, it does not keep MASK out of an original mask, and its anti-loop picks a
# random changed position. SGLang is the engine LLaDA2.2 is served with (its report's figures), its
# rule has no schedule to choose, and a deterministic rule keeps golden traces exact.

INDEL_CANDIDATES = 16  # ranked ids per position a step brings to the host (the rule's fallbacks pick among them)


def indel_candidates(logits: torch.Tensor, k: int = INDEL_CANDIDATES) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (ids, probabilities) [..., k]: each position's k most likely ids, best first,
    with their softmax probability over the whole vocabulary (MASK and the edit ids included, nothing
    suppressed: the InDel rule decides where MASK may not be written). A NaN or +inf logit gives NaN."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = logits.logsumexp(-1, keepdim=True)  # [..., 1]
    top, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    probs = (top - total).exp().masked_fill(total == float("inf"), float("nan"))
    return ids, probs


@dataclass(frozen=True)
class JointThresholdInDel:
    """LLaDA2.2's rule: JointThreshold's fill and edit thresholds, plus DELETE (the position goes) and
    INSERT (the position becomes [MASK, its token]); the block keeps its length (its generated part is
    truncated or padded with MASK). `max_post_steps` of the settings is its post-edit budget."""

    threshold: float = 0.5
    editing_threshold: float = 0.0

    # --- BlockRule ---------------------------------------------------------------------------------
    def start(self, block: list[int], prompt_len: int, mask_id: int) -> InDelBlock:
        return InDelBlock.start(block, prompt_len, mask_id)

    def before_forward(self, state: InDelBlock, n_masked: int, max_post_steps: int) -> str | None:
        return None  # the rule counts its post-edit steps in its own step (indel_step)

    def drafts_ahead(self, max_post_steps: int) -> bool:
        return True

    @staticmethod
    def device_step(logits: torch.Tensor, ints: torch.Tensor, layout: Ints, D: int, limits: torch.Tensor,
                    vocab: int) -> torch.Tensor:  # fmt: skip
        """Candidates' rows: each position's ranked ids and their probabilities; the rule runs on the host."""
        cand_ids, cand_p = indel_candidates(logits, min(INDEL_CANDIDATES, vocab))  # [B, D, K] each
        theirs = torch.arange(D, device=ints.device)[None, :] >= layout.column(ints, OUTSIDE)[:, None]  # [B, D]
        finite = (cand_p[..., 0].isfinite() | ~theirs).all(1, keepdim=True).long()
        return Candidates.pack(cand_ids, cand_p, finite)

    @staticmethod
    def read(row: list[int], skip: int, D: int, vocab: int):
        return Candidates(D, min(INDEL_CANDIDATES, vocab)).unpack(row, skip)

    def step_block(self, state: InDelBlock, block: list[int], decided, settings) -> BlockOutcome:
        """indel_step on the block; it closes where the rule says the block is final."""
        ids, probs = decided
        out = indel_step(self, state, block, ids, probs, settings.mask_id, *settings.edit_ids, settings.max_post_steps)
        end = ("cleanup" if out.cleanup else "converged") if out.done else None
        if out.done:
            state.closed_post = state.post_edit_steps
        return BlockOutcome(out.tokens, out.filled, out.edited, out.confidence, out.changed, end, out.overflow,
                            out.padded)  # fmt: skip


def rule_for(config) -> type[JointThreshold] | type[JointThresholdInDel]:
    """The kind of block rule a checkpoint decodes with: JointThresholdInDel where it has edit ids."""
    return JointThresholdInDel if config.edit_ids is not None else JointThreshold


INDEL_PRESETS: dict[str, JointThresholdInDel] = {
    name: JointThresholdInDel(p.threshold, p.editing_threshold) for name, p in PRESETS.items()
}


@dataclass
class InDelBlock:
    """One block's state under JointThresholdInDel, kept by its Sequence between steps. `is_orig`
    follows each token through deletes and inserts: a mask present when the block started is
    original, one made by INSERT or padding is introduced."""

    prompt_len: int  # the block's leading prompt positions, never changed
    is_orig: list[bool]
    post_edit_steps: int = 0  # steps that began with no original mask left; cumulative, never reset
    update_steps: int = 0
    seen: set[tuple[int, ...]] = field(default_factory=set)  # input blocks of earlier steps (anti-loop)
    tried: dict[int, set[int]] = field(default_factory=dict)  # per position, every id written there
    closed_post: int = 0  # post_edit_steps when the rule closed the block (0 while open, or if cancelled)

    def counted_post_steps(self, end: str) -> int:
        return self.closed_post

    def drafted(self, at: int, n: int) -> None:
        """Positions [at, at + n) took a draft's ids: no masks now, original or introduced."""
        self.is_orig[at : at + n] = [False] * n

    @classmethod
    def start(cls, block: list[int], prompt_len: int, mask_id: int) -> InDelBlock:
        return cls(prompt_len, [i >= prompt_len and t == mask_id for i, t in enumerate(block)])


@dataclass(frozen=True)
class InDelOutcome:
    tokens: list[int]  # the block after the step (edits applied, length kept)
    filled: list[int]  # positions of the new block written over a mask
    edited: list[int]  # positions of the new block overwritten (a token for another)
    confidence: list[float]  # per position of the new block: its id's probability (0.0: a new mask)
    done: bool  # the block is final: nothing to write, or the cleanup step ran
    cleanup: bool  # this step was the final cleanup
    changed: bool  # the step changed the block's ids (a final block that changed needs one more forward)
    overflow: list[int] = field(default_factory=list)  # ids an INSERT pushed past the block's end (dropped here)
    padded: int = 0  # masks added at the block's end after DELETEs


def indel_step(rule: JointThresholdInDel, state: InDelBlock, block: list[int], ids: list[list[int]],
               probs: list[list[float]], mask_id: int, delete_id: int, split_id: int, budget: int) -> InDelOutcome:  # fmt: skip
    """One step of JointThresholdInDel on one block, on the host: `block` its ids, `ids`/`probs` each
    position's ranked candidates (indel_candidates), `budget` the post-edit budget. Updates `state`."""
    bs, first = len(block), state.prompt_len
    x, p = [row[0] for row in ids], [row[0] for row in probs]

    def best(i: int, exclude: set[int]) -> tuple[int, float] | None:
        """Position i's most likely id outside `exclude`, from its candidates (None: all excluded)."""
        return next(((t, q) for t, q in zip(ids[i], probs[i]) if t not in exclude), None)

    masked = [i >= first and t == mask_id for i, t in enumerate(block)]
    orig = [m and o for m, o in zip(masked, state.is_orig)]
    n_mask, n_orig = sum(masked), sum(orig)
    state.update_steps += 1
    if n_orig == 0:
        state.post_edit_steps += 1
    cleanup = (budget > 0 and state.post_edit_steps >= budget) or (budget == 0 and n_orig == 0)
    cleanup = cleanup or state.update_steps > bs + budget
    if not cleanup:  # an original mask must resolve: MASK is no answer there
        for i in range(bs):
            if orig[i] and x[i] == mask_id and (pick := best(i, {mask_id})):
                x[i], p[i] = pick
    fill: set[int] = set()
    if n_mask and (cleanup or n_orig == 0):
        fill = {i for i in range(bs) if masked[i]}
    elif n_mask:
        # at least one more than the introduced masks, so an original mask is among them
        need = 1 + n_mask - n_orig
        sure = {i for i in range(bs) if masked[i] and p[i] > rule.threshold}
        ranked = sorted((i for i in range(bs) if masked[i]), key=lambda i: -p[i])  # stable: ties to the lower position
        fill = sure if len(sure) >= need else set(ranked[: min(need, n_mask)])
    if budget == 0 and n_orig and all(i in fill for i in range(bs) if orig[i]):
        cleanup, fill = True, {i for i in range(bs) if masked[i]}  # no post-edit steps: this step cleans up
    edit = {i for i in range(first, bs) if not masked[i] and x[i] != block[i] and p[i] > rule.editing_threshold}
    writes = sorted(fill | edit)
    if not writes:
        return InDelOutcome(list(block), [], [], p, True, False, False)
    if cleanup:  # the final block holds no mask and no edit id
        for i in writes:
            if x[i] in (mask_id, delete_id, split_id) and (pick := best(i, {mask_id, delete_id, split_id})):
                x[i] = pick[0]
    key = tuple(block)
    if key in state.seen and not cleanup:  # a block seen before: the least sure change tries another id
        changing = [i for i in writes if x[i] != block[i]]
        if changing:
            c = min(changing, key=lambda i: p[i])
            pick = best(c, state.tried.get(c, set()) | ({mask_id} if orig[c] else set()))
            if pick:
                x[c] = pick[0]
    state.seen.add(key)
    new = list(block)
    for i in writes:
        state.tried.setdefault(i, set()).add(x[i])
        new[i] = x[i]
    conf = {i: next((q for t, q in zip(ids[i], probs[i]) if t == x[i]), p[i]) for i in writes}
    kind = {i: "filled" if masked[i] else "edited" for i in writes if new[i] != block[i]}
    # rebuild the generated part: DELETE drops a position, INSERT makes it [MASK, its old token]
    rows = [(block[i], state.is_orig[i], None, 0.0) for i in range(first)]
    for i in range(first, bs):
        if new[i] == delete_id:
            continue
        if new[i] == split_id:
            rows += [(mask_id, False, None, 0.0), (block[i], state.is_orig[i], None, 0.0)]
        else:
            rows.append((new[i], state.is_orig[i], kind.get(i), conf.get(i, p[i])))
    overflow, padded = [t for t, _, _, _ in rows[bs:]], max(bs - len(rows), 0)
    rows = rows[:bs] + [(mask_id, False, None, 0.0)] * padded
    state.is_orig = [o for _, o, _, _ in rows]
    tokens = [t for t, _, _, _ in rows]
    return InDelOutcome(tokens, [i for i, r in enumerate(rows) if r[2] == "filled"],
                        [i for i, r in enumerate(rows) if r[2] == "edited"], [r[3] for r in rows],
                        cleanup, cleanup, tokens != block, overflow, padded)  # fmt: skip
