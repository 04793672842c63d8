"""Decoding policies: how one denoising step turns logits into filled (M2T) and edited (T2T) tokens.

Pure tensor functions over one active block; the loop, the cache and the model live in decode.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def guesses(logits: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (confidence, token) [...]: the greedy token of each position and its softmax
    probability (the paper's confidence), the mask excluded: a step must never write a mask."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    logits[..., mask_id] = float("-inf")
    return logits.softmax(-1).max(-1)


@dataclass(frozen=True)
class StepUpdate:
    tokens: torch.Tensor  # [N] block tokens after the step
    filled: torch.Tensor  # [N] bool: mask -> token (M2T)
    edited: torch.Tensor  # [N] bool: token -> token (T2T)


@dataclass(frozen=True)
class JointThreshold:
    """LLaDA2.1's rule: fill every mask whose confidence beats `threshold` (at least the single most
    confident one), and in the same step overwrite every earlier-filled token whose argmax differs and
    beats `editing_threshold` (0.0: always follow the argmax). Prompt positions are never touched."""

    threshold: float = 0.5
    editing_threshold: float = 0.0

    def step(self, tokens: torch.Tensor, logits: torch.Tensor, frozen: torch.Tensor, mask_id: int) -> StepUpdate:
        """tokens [N], logits [N, V], frozen [N] bool (prompt positions)."""
        conf, argmax = guesses(logits, mask_id)  # [N], [N]
        masked = tokens == mask_id
        filled = masked & (conf > self.threshold)
        # With no mask above the threshold, the single most confident mask is filled (if any is left).
        fallback = torch.zeros_like(masked).scatter_(0, conf.masked_fill(~masked, -1.0).argmax().view(1), True)
        filled = torch.where(filled.any(), filled, fallback & masked)
        edited = ~masked & ~frozen & (argmax != tokens) & (conf > self.editing_threshold)
        return StepUpdate(torch.where(filled | edited, argmax, tokens), filled, edited)


PRESETS: dict[str, JointThreshold] = {
    "speed": JointThreshold(threshold=0.5, editing_threshold=0.0),
    "quality": JointThreshold(threshold=0.7, editing_threshold=0.5),
    "strict": JointThreshold(threshold=0.95, editing_threshold=0.9),
}
# The no-editing baseline of the evaluation: confident fills only, never revise (conf > inf is never true).
PRESETS["no-edit"] = JointThreshold(threshold=0.95, editing_threshold=float("inf"))
