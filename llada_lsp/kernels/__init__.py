"""GPU kernels with plain-PyTorch references (README.md in this folder), and the one switch that says
when the model and the engine use them. Knows nothing of modules, checkpoints or decoding policy.

The Triton modules are imported on first use, never here: Triton's interpreter (TRITON_INTERPRET=1,
the CPU tests) is chosen when a kernel is decorated, so importing them early would fix the mode.
"""

from __future__ import annotations

import importlib.util
import os

import torch

TRITON = importlib.util.find_spec("triton") is not None
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def enabled(x: torch.Tensor) -> bool:
    """The one switch: kernels run on CUDA tensors of a float dtype they take when triton is
    installed, unless LLADA_LSP_KERNELS=0; everywhere else the model's own torch path runs."""
    return TRITON and x.is_cuda and x.dtype in KERNEL_DTYPES and os.environ.get("LLADA_LSP_KERNELS", "1") != "0"


def moe(x, expert_ids, weights, w_gate, w_up, w_down, scales=None, activations=None) -> torch.Tensor:
    """fused_moe.fused_moe: a block's routed experts as grouped GEMMs over the touched experts."""
    from .fused_moe import fused_moe

    return fused_moe(x, expert_ids, weights, w_gate, w_up, w_down, scales, activations=activations)


def step(tokens, logits, frozen, mask_ids, thresholds, editing):
    """joint_threshold.joint_threshold_step: (tokens, filled, edited, confidence) [B, N] of one step."""
    from .joint_threshold import joint_threshold_step

    return joint_threshold_step(tokens, logits, frozen, mask_ids, thresholds, editing)
