"""Block-diffusion decoding, one generation at a time: a generator of drafts, one per denoising step.

The batch-of-one case of the scheduler (scheduler.py): the same sequences, cache and batched forward
that serve many requests at once, so the golden parity tests guard the algorithm the service runs.
Knows nothing of text, documents or the LSP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..model import LLaDA2
from . import checks
from .cache import BlockCache
from .policy import INDEL_PRESETS, PRESETS, JointThreshold, JointThresholdInDel
from .scheduler import Scheduler
from .sequence import BlockStats, CancelFlag, DecodeSettings, GenerationResult, StepDraft

__all__ = ["BlockStats", "CancelFlag", "StepDraft", "Engine", "Generation", "GenerationResult", "generate"]

CPU_CACHE_MB = 256  # on CUDA: a quarter of the device's free memory when the engine starts


class Generation:
    """Iterate for drafts; `result` is set once iteration ends (normally, by EOS, or by cancel)."""

    def __init__(self, engine: Engine, settings: DecodeSettings):
        self.engine, self.settings = engine, settings
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[StepDraft]:
        return self.engine._run(self)

    def run(self) -> GenerationResult:
        for _ in self:
            pass
        return self.result


class Engine:
    """One model, its K/V pool with the prefix cache, and the scheduler over them. `generation` runs
    one sequence (the scheduler must be otherwise idle); the service drives `scheduler` itself to
    batch many. A prompt that starts with whole blocks cached by an earlier one reuses their K/V.
    `use_cache=False` recomputes the whole prefix every step: the reference algorithm, the baseline.
    `cache_mb`: the pool's size (None: default_cache_mb); `prefix_cache=False` never reuses a block.
    `cuda_graph`: each denoising step replayed from a CUDA graph per batch bucket (CUDA only; off until
    measured, docs/gpu.md); `prefill_chunk`: most prompt tokens per prefill forward (whole blocks)."""

    def __init__(self, model: LLaDA2, block_size: int = 32, use_cache: bool = True, cache_mb: float | None = None,
                 prefix_cache: bool = True, max_batch: int = 8, max_queue: int = 64, cuda_graph: bool = False,
                 prefill_chunk: int | None = None):  # fmt: skip
        checks.block_size(block_size, model.config.max_position_embeddings)
        self.model, self.block_size, self.use_cache = model, block_size, use_cache
        routing_block = model.config.block_size if model.config.block_routing else None
        if routing_block is not None and block_size != routing_block:  # as SGLang requires: one block for both
            raise ValueError(f"block size {block_size}: this LLaDA2.2 checkpoint routes its experts per block of "
                             f"{routing_block} tokens (block_size), and decoding must use the same blocks")  # fmt: skip
        if cache_mb is None:
            cache_mb = default_cache_mb(model.device)
        checks.amount("cache size (MB)", cache_mb)
        self.cache = BlockCache.for_budget(model.config, cache_mb, block_size, model.device, model.dtype,
                                           prefix=prefix_cache and use_cache,
                                           layer_devices=model.layer_devices)  # fmt: skip
        self.scheduler = Scheduler(model, self.cache, max_batch, max_queue, use_cache, cuda_graph=cuda_graph,
                                   prefill_chunk=prefill_chunk)  # fmt: skip

    def generation(self, *args, **kwargs) -> Generation:
        """One sequence, stepped as it is iterated (the arguments are `settings`'s)."""
        return self.start(self.settings(*args, **kwargs))

    def start(self, settings: DecodeSettings) -> Generation:
        return Generation(self, settings)

    def settings(
        self,
        prompt_ids: list[int],
        gen_length: int = 64,
        policy: JointThreshold | JointThresholdInDel | str = "speed",
        max_post_steps: int = 16,
        eos_early_stop: bool = False,
        mask_id: int | None = None,
        eos_id: int | None = None,
        cancel: CancelFlag | None = None,
        init_ids: list[int] | None = None,
        first_allowed: list[int] | None = None,
        priority: int = 0,
    ) -> DecodeSettings:
        """`init_ids` start the generated region as a draft instead of masks (positions after them are
        masked): the policy's T2T rule revises the draft and an EOS may shrink it (rewriting a selection).
        `first_allowed`: the only ids the first generated position may hold (token healing: the prompt's
        last, partial word was taken back, and the first token must start with its text). `priority`:
        lower is admitted first when the scheduler's rows are full. Raises ValueError for bad input."""
        config = self.model.config
        mask_id = config.mask_token_id if mask_id is None else mask_id
        eos_id = config.eos_token_id if eos_id is None else eos_id
        if mask_id is None:
            raise ValueError("no mask id: pass mask_id, or give the checkpoint a <|mask|> token or mask_token_id")
        edit_ids = config.edit_ids
        checks.token_id("mask id", mask_id, config.vocab_size, edit_ids)
        if eos_id is not None and not (isinstance(eos_id, int) and eos_id < 0):  # negative: no stop id (NO_STOP)
            checks.token_id("end-of-text id", eos_id, config.vocab_size, edit_ids)
        checks.whole("max_post_steps (the post-edit budget)", max_post_steps, 0)
        checks.whole("gen_length", gen_length, 1)
        if isinstance(policy, str):
            if policy not in PRESETS:
                raise ValueError(f"unknown mode {policy!r}; choose one of {', '.join(PRESETS)}")
            policy = (PRESETS if edit_ids is None else INDEL_PRESETS)[policy]
        if edit_ids is not None and not isinstance(policy, JointThresholdInDel):
            # LLaDA2.2: the same thresholds under the Levenshtein rule (docs/llada22.md)
            policy = JointThresholdInDel(policy.threshold, policy.editing_threshold)
        elif edit_ids is None and isinstance(policy, JointThresholdInDel):
            raise ValueError("JointThresholdInDel needs a checkpoint with edit tokens (LLaDA2.2)")
        checks.thresholds(policy.threshold, policy.editing_threshold)
        total = len(prompt_ids) + gen_length
        if total > config.max_position_embeddings:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens + gen_length {gen_length} exceeds the model's "
                f"{config.max_position_embeddings} positions (max_position_embeddings)"
            )
        init_ids = list(init_ids or [])
        if len(init_ids) > gen_length:
            raise ValueError(f"{len(init_ids)} init_ids do not fit in gen_length {gen_length}")
        ids, vocab = prompt_ids + init_ids, config.vocab_size  # (min and max: not a config read per id)
        if ids and not (min(ids) >= 0 and max(ids) < vocab):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise ValueError(f"prompt id {bad} is outside the vocabulary (size {vocab})")
        if edit_ids is not None and any(t in edit_ids for t in init_ids):
            raise ValueError("init_ids hold an edit id (DELETE or INSERT): a draft is text, never an edit")
        allowed = None
        if first_allowed is not None:
            if not first_allowed or not all(0 <= t < config.vocab_size for t in first_allowed):
                raise ValueError("first_allowed must be a non-empty list of ids inside the vocabulary")
            allowed = torch.zeros(config.vocab_size, dtype=torch.bool, device=self.model.device)
            allowed[torch.tensor(first_allowed, device=self.model.device)] = True
        return DecodeSettings(list(prompt_ids), gen_length, policy, max_post_steps, eos_early_stop, mask_id, eos_id, cancel,
                        init_ids, allowed, priority, edit_ids)  # fmt: skip

    def _run(self, gen: Generation) -> Iterator[StepDraft]:
        scheduler = self.scheduler
        if not scheduler.idle():
            raise RuntimeError("Engine.generation runs one sequence at a time: the scheduler is serving others")
        seq_id = scheduler.add(gen.settings)
        try:
            while True:
                for event in scheduler.step():
                    if event.draft is not None:
                        yield event.draft
                    elif event.result is not None:
                        gen.result = event.result
                        if event.error is not None:
                            raise event.error
                        return
        finally:  # the consumer stopped iterating early: the sequence leaves, its pages go back
            if gen.result is None:
                scheduler.abort(seq_id)
                scheduler.drain()


def default_cache_mb(device: torch.device) -> float:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 4 / 2**20
    return CPU_CACHE_MB


def generate(
    model: LLaDA2,
    prompt_ids: list[int],
    gen_length: int = 64,
    threshold: float = 0.5,
    editing_threshold: float = 0.0,
    block_length: int = 32,
    **settings: Any,
) -> GenerationResult:
    """Blocking generation with the joint-threshold rule, called as the reference's `generate`.
    `settings`: the rest of `Engine.settings` (`max_post_steps`, `eos_early_stop`, `mask_id`,
    `eos_id`: None ids come from the checkpoint), with its defaults."""
    engine = Engine(model, block_size=block_length)
    policy = JointThreshold(threshold, editing_threshold)
    return engine.generation(prompt_ids, gen_length, policy, **settings).run()
