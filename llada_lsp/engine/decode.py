"""Block-diffusion decoding over an exact block KV cache: a generator of drafts, one per denoising step.

Owns the canvas, the cache's valid prefix and the loop bounds (post steps, EOS, cancellation); the
step rule is a policy (policy.py). Knows nothing of text, documents or the LSP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import torch

from ..model import BlockKVCache, LLaDA2
from .policy import PRESETS, JointThreshold


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class Draft:
    """The state after one denoising step."""

    step: int  # denoising forwards so far in this generation (1-based)
    block: int  # index of the active block, counted from position 0 of the sequence
    block_tokens: list[int]  # the active block's ids after the step (prompt tail included)
    filled: list[int]  # block-relative positions filled from a mask (M2T)
    edited: list[int]  # block-relative positions overwritten (T2T)
    generated: list[int]  # everything generated so far, mask ids where still masked


@dataclass(frozen=True)
class BlockStats:
    block: int
    forwards: int
    mask_free_forwards: int
    end: str  # "converged" | "post_step_budget" | "cancelled"
    last_forward_changed_tokens: bool


@dataclass
class GenerationResult:
    tokens: list[int]  # the completion, cut after the first EOS (included)
    steps: int  # denoising forwards, counted as the reference counts its forwards
    prefill_forwards: int = 0  # forwards that only filled the cache with prompt blocks
    refreshed_blocks: int = 0  # blocks re-run (fused into the next block's first step) after a last-step change
    reused_tokens: int = 0  # prompt tokens whose cached K/V were reused from the previous generation
    blocks: list[BlockStats] = field(default_factory=list)
    seconds: float = 0.0
    cancelled: bool = False

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / max(self.steps, 1)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


class Generation:
    """Iterate for drafts; `result` is set once iteration ends (normally, by EOS, or by cancel)."""

    def __init__(self, engine: "Engine", prompt_ids: list[int], **settings):
        self.engine, self.prompt_ids, self.settings = engine, list(prompt_ids), settings
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Draft]:
        return self.engine._run(self, self.prompt_ids, **self.settings)

    def run(self) -> GenerationResult:
        for _ in self:
            pass
        return self.result


class Engine:
    """Decodes with one model and keeps the cache between generations, so a prompt that starts with
    the same whole blocks as the previous one reuses their K/V. `use_cache=False` recomputes the whole
    prefix every step: the reference algorithm, kept as the baseline."""

    def __init__(self, model: LLaDA2, block_size: int = 32, use_cache: bool = True):
        self.model, self.block_size, self.use_cache = model, block_size, use_cache
        self.cache: BlockKVCache | None = None
        self.cached_ids: list[int] = []  # tokens whose K/V in `cache` are valid, from position 0

    def generation(
        self,
        prompt_ids: list[int],
        gen_length: int = 64,
        policy: JointThreshold | str = "speed",
        max_post_steps: int = 16,
        eos_early_stop: bool = False,
        mask_id: int | None = None,
        eos_id: int | None = None,
        cancel: CancelFlag | None = None,
        init_ids: list[int] | None = None,
        first_allowed: list[int] | None = None,
    ) -> Generation:
        """`init_ids` start the generated region as a draft instead of masks (positions after them are
        masked): the policy's T2T rule revises the draft and an EOS may shrink it (rewriting a selection).
        `first_allowed`: the only ids the first generated position may hold (token healing: the prompt's
        last, partial word was taken back, and the first token must start with its text)."""
        config = self.model.config
        mask_id = config.mask_token_id if mask_id is None else mask_id
        eos_id = config.eos_token_id if eos_id is None else eos_id
        if mask_id is None:
            raise ValueError("no mask id: pass mask_id, or give the checkpoint a <|mask|> token or mask_token_id")
        if isinstance(policy, str):
            if policy not in PRESETS:
                raise ValueError(f"unknown mode {policy!r}; choose one of {', '.join(PRESETS)}")
            policy = PRESETS[policy]
        if gen_length < 1:
            raise ValueError(f"gen_length must be at least 1, got {gen_length}")
        total = len(prompt_ids) + gen_length
        if total > config.max_position_embeddings:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens + gen_length {gen_length} exceeds the model's "
                f"{config.max_position_embeddings} positions (max_position_embeddings)"
            )
        init_ids = list(init_ids or [])
        if len(init_ids) > gen_length:
            raise ValueError(f"{len(init_ids)} init_ids do not fit in gen_length {gen_length}")
        bad = [t for t in prompt_ids + init_ids if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError(f"prompt id {bad[0]} is outside the vocabulary (size {config.vocab_size})")
        allowed = None
        if first_allowed is not None:
            if not first_allowed or not all(0 <= t < config.vocab_size for t in first_allowed):
                raise ValueError("first_allowed must be a non-empty list of ids inside the vocabulary")
            allowed = torch.zeros(config.vocab_size, dtype=torch.bool, device=self.model.device)
            allowed[torch.tensor(first_allowed, device=self.model.device)] = True
        return Generation(
            self, prompt_ids, gen_length=gen_length, policy=policy, max_post_steps=max_post_steps,
            eos_early_stop=eos_early_stop, mask_id=mask_id, eos_id=eos_id, cancel=cancel, init_ids=init_ids,
            first_allowed=allowed,
        )  # fmt: skip

    def _reuse_prefix(self, prompt_ids: list[int], n_blocks: int) -> int:
        """Length of the cached prefix (whole prompt blocks) still valid for this prompt."""
        bs = self.block_size
        if self.cache is None or self.cache.max_len < n_blocks * bs:
            self.cache = BlockKVCache(self.model.config, n_blocks * bs, self.model.device, self.model.dtype)
            self.cached_ids = []
        same = 0
        for a, b in zip(self.cached_ids, prompt_ids):
            if a != b:
                break
            same += 1
        return same // bs * bs

    @torch.inference_mode()
    def _run(self, gen: Generation, prompt, gen_length, policy, max_post_steps, eos_early_stop, mask_id, eos_id, cancel,
             init_ids=(), first_allowed=None):  # fmt: skip
        bs, model, device = self.block_size, self.model, self.model.device
        P = len(prompt)
        n_blocks = -(-(P + gen_length) // bs)
        first = P // bs
        # mirror of the canvas: one sync per step; a draft (init_ids) is editable, never frozen like the prompt
        host = prompt + list(init_ids) + [mask_id] * (n_blocks * bs - P - len(init_ids))
        canvas = torch.tensor(host, device=device)
        result = GenerationResult(tokens=[], steps=0)
        started = time.perf_counter()

        valid = 0  # K/V of positions [0, valid) in the cache match the canvas
        if self.use_cache:
            valid = self._reuse_prefix(prompt, n_blocks)
            result.reused_tokens = min(valid, first * bs)
            valid = min(valid, first * bs)
            self.cached_ids = host[:valid]
            if valid < first * bs:
                model(canvas[None, valid : first * bs], cache=self.cache, start=valid, block_size=bs, last_n=0)
                result.prefill_forwards, valid = 1, first * bs

        for b in range(first, n_blocks):
            lo, hi = b * bs, (b + 1) * bs
            frozen = torch.arange(lo, hi, device=device) < P
            n_masked = host[lo:hi].count(mask_id)
            forwards = post = 0
            changed = False
            end = "converged"
            while True:
                if cancel is not None and cancel.is_set():
                    result.cancelled, end = True, "cancelled"
                    break
                if n_masked == 0:
                    post += 1
                    if post > max_post_steps:
                        end = "post_step_budget"
                        break
                start = valid if self.use_cache else 0
                if self.use_cache and start < lo:
                    result.refreshed_blocks += 1  # the previous block's final tokens, run with this one
                logits = model(
                    canvas[None, start:hi], cache=self.cache if self.use_cache else None,
                    start=start, block_size=bs, last_n=bs,
                )[0]  # fmt: skip
                if first_allowed is not None and lo <= P < hi:
                    logits[P - lo].masked_fill_(~first_allowed, float("-inf"))
                valid = lo
                update = policy.step(canvas[lo:hi], logits, frozen, mask_id)
                canvas[lo:hi] = update.tokens
                packed = torch.cat([update.tokens, update.filled.long(), update.edited.long()]).tolist()
                host[lo:hi] = packed[:bs]
                filled = [i for i in range(bs) if packed[bs + i]]
                edited = [i for i in range(bs) if packed[2 * bs + i]]
                result.steps += 1
                forwards += 1
                changed = bool(filled or edited)
                yield Draft(result.steps, b, packed[:bs], filled, edited, host[P : min(hi, P + gen_length)])
                was_mask_free, n_masked = n_masked == 0, host[lo:hi].count(mask_id)
                if was_mask_free and not changed:
                    break
            result.blocks.append(BlockStats(b, forwards, max(post - (end == "post_step_budget"), 0), end, changed))
            if result.cancelled:
                break
            if self.use_cache and not changed:
                valid = hi  # the last forward ran exactly these tokens: their K/V are final
            done = host[P:hi]
            if eos_early_stop and eos_id is not None and mask_id not in done and eos_id in done:
                break

        if self.use_cache:
            self.cached_ids = host[:valid]
        out = host[P : P + gen_length]
        if eos_id is not None and eos_id in out:
            out = out[: out.index(eos_id) + 1]
        result.tokens = out
        result.seconds = time.perf_counter() - started
        gen.result = result


def generate(
    model: LLaDA2,
    prompt_ids: list[int],
    gen_length: int = 64,
    threshold: float = 0.5,
    editing_threshold: float = 0.0,
    block_length: int = 32,
    max_post_steps: int = 16,
    eos_early_stop: bool = False,
    mask_id: int | None = None,
    eos_id: int | None = None,
) -> GenerationResult:
    """Blocking generation with the joint-threshold rule; None ids come from the checkpoint."""
    engine = Engine(model, block_size=block_length)
    policy = JointThreshold(threshold, editing_threshold)
    return engine.generation(
        prompt_ids, gen_length, policy, max_post_steps, eos_early_stop, mask_id, eos_id
    ).run()
