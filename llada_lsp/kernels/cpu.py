"""CPU kernels (numba) with plain-PyTorch references: the small ops around a CPU step's GEMMs fused
into one compiled loop each. At the embedded model's shapes (32 rows of 256) a torch op costs more to
dispatch than to compute, so a step is mostly overhead; each kernel here replaces several such ops.

`enabled(x)` is the one switch: float32 CPU tensors under no_grad / inference_mode (the engine's), numba installed, not under
torch.compile, unless LLADA_LSP_KERNELS=0. Everywhere else the model's torch path runs. Bulk passes
(the step rule's exponentials, SiLU) stay in torch: its vectorised math library beats a numba loop.
Knows nothing of modules, checkpoints or decoding policy.
"""

from __future__ import annotations

import os

import torch

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; a platform without its wheels runs torch
    numba = None


def enabled(x: torch.Tensor) -> bool:
    """Whether the CPU kernels run for activations x: float32 on the CPU, no autograd recording, numba present."""
    return (
        numba is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and os.environ.get("LLADA_LSP_KERNELS", "1") != "0"
    )


def array(t: torch.Tensor):
    """A tensor's numpy view (no copy) for a kernel's argument."""
    return t.detach().numpy()
