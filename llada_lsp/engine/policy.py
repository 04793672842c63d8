"""Decoding policies: how one denoising step turns logits into filled (M2T) and edited (T2T) tokens.

Pure tensor functions over the active blocks of a batch, each row with its own thresholds; the
sequences, the cache and the model live in sequence.py, cache.py and scheduler.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels


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


@dataclass(frozen=True)
class JointThreshold:
    """LLaDA2.1's rule: fill every mask whose confidence beats `threshold` (at least the single most
    confident one), and in the same step overwrite every earlier-filled token whose argmax differs and
    beats `editing_threshold` (0.0: always follow the argmax). Prompt positions are never touched."""

    threshold: float = 0.5
    editing_threshold: float = 0.0

    def step(self, tokens: torch.Tensor, logits: torch.Tensor, frozen: torch.Tensor, mask_id: int) -> StepUpdate:
        """One block: tokens [N], logits [N, V], frozen [N] bool (prompt positions)."""
        ids = torch.tensor([mask_id], device=tokens.device)
        rows = joint_threshold(
            tokens[None], logits[None], frozen[None], ids, [self.threshold], [self.editing_threshold]
        )
        return StepUpdate(rows.tokens[0], rows.filled[0], rows.edited[0])


PRESETS: dict[str, JointThreshold] = {
    "speed": JointThreshold(threshold=0.5, editing_threshold=0.0),
    "quality": JointThreshold(threshold=0.7, editing_threshold=0.5),
    "strict": JointThreshold(threshold=0.95, editing_threshold=0.9),
}
# The no-editing baseline of the evaluation: confident fills only, never revise (conf > inf is never true).
PRESETS["no-edit"] = JointThreshold(threshold=0.95, editing_threshold=float("inf"))
