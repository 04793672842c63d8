"""GPU kernels with plain-PyTorch references (README.md in this folder), and the one switch that says
when the model and the engine use them (the CPU's numba kernels have their own, in cpu.py); both read
the backend decided once per process (kernel_backend.py). Knows nothing of modules, checkpoints or decoding
policy.

The Triton modules are imported on first use, never here: Triton's interpreter (TRITON_INTERPRET=1,
the CPU tests) is chosen when a kernel is decorated, so importing them early would fix the mode.
"""

from __future__ import annotations

import functools
import logging

import torch

from .. import kernel_backend as backend

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The lowest GPUs the kernels are compiled and checked for (llada_lab/aot.py, tests/kernels/test_gpu_compile.py):
# Ampere for every variant; FP8 weights need Triton's fp8e4nv, which exists from Ada / Hopper (sm_89) on.
MIN_CAPABILITY = (8, 0)
FP8_CAPABILITY = (8, 9)
FP8_DTYPES = (torch.float8_e4m3fn,)
log = logging.getLogger(__name__)


def supports(capability: tuple[int, int], weight_dtype: torch.dtype | None = None) -> bool:
    """Whether the kernels compile for a GPU of `capability` (major, minor), for MoE weights of
    `weight_dtype` (None: the step rule, or weights in the activations' dtype)."""
    if capability < MIN_CAPABILITY:
        return False
    return weight_dtype not in FP8_DTYPES or capability >= FP8_CAPABILITY


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def enabled(x: torch.Tensor, weight_dtype: torch.dtype | None = None) -> bool:
    """The one switch: kernels run on CUDA tensors of a float dtype they take when triton is
    installed and the GPU is one they support (`supports`; FP8 weights below sm_89 take the torch
    path), where the backend allows them (backend.current().gpu: not with LLADA_LSP_KERNELS=0); everywhere
    else the model's own torch path runs."""
    if not (x.is_cuda and x.dtype in KERNEL_DTYPES and backend.current().gpu):
        return False
    return supports(_capability(x.device), weight_dtype)


class _Fallbacks:
    """The kernels that failed to compile on this machine: each is reported once, then its caller's
    torch path runs for the rest of the process."""

    def __init__(self):
        self.failed: dict[str, str] = {}

    def call(self, name: str, fn, *args, **kwargs):
        """fn(*args) or, when `name` failed to compile (now or before), None."""
        if name in self.failed:
            return None
        from triton.runtime.errors import (
            TritonError,  # CompilationError, PTXASError and OutOfResources
        )

        try:
            return fn(*args, **kwargs)
        except TritonError as e:
            self.failed[name] = f"{type(e).__name__}: {e}"
            log.warning("kernel %s failed to compile here (%s); its torch path is used from now on", name,
                        self.failed[name].splitlines()[0])  # fmt: skip
            return None


FALLBACKS = _Fallbacks()


def moe(x, expert_ids, weights, w_gate, w_up, w_down, scales=None, activations=None) -> torch.Tensor | None:
    """fused_moe.fused_moe: a block's routed experts as grouped GEMMs over the touched experts; None
    when the kernel does not compile here (the caller runs its torch path)."""
    from .fused_moe import fused_moe

    return FALLBACKS.call("fused_moe", fused_moe, x, expert_ids, weights, w_gate, w_up, w_down, scales,
                          activations=activations)  # fmt: skip


def step(tokens, logits, frozen, mask_ids, thresholds, editing):
    """joint_threshold.joint_threshold_step: (tokens, filled, edited, confidence) [B, N] of one step;
    None when the kernel does not compile here."""
    from .joint_threshold import joint_threshold_step

    return FALLBACKS.call("joint_threshold", joint_threshold_step, tokens, logits, frozen, mask_ids, thresholds,
                          editing)  # fmt: skip
