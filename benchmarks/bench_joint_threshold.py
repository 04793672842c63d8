"""The fused step rule (llada_lsp/kernels/joint_threshold.py) against the engine's torch rule
(engine/policy.py) at LLaDA2.1's vocabulary: ms per step and GB/s over the bf16 logits it reads.

Usage: python benchmarks/bench_joint_threshold.py [--batch 1]. Needs CUDA and triton.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fused_moe import ms_per_call  # noqa: E402  (the benchmarks folder: one CUDA-event timer)

V, N = 157184, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1, help="blocks per step")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    from llada_lsp.engine.policy import joint_threshold
    from llada_lsp.kernels.joint_threshold import joint_threshold_step

    B = args.batch
    torch.manual_seed(0)
    logits = torch.randn(B, N, V, device="cuda", dtype=torch.bfloat16) * 4  # [B, N, V]
    mask_ids = torch.full((B,), V - 289, device="cuda")
    guesses = torch.randint(0, V, (B, N), device="cuda")
    tokens = torch.where(torch.rand(B, N, device="cuda") < 0.5, mask_ids[:, None], guesses)  # half masked
    frozen = torch.zeros(B, N, dtype=torch.bool, device="cuda")
    thresholds, editing = [0.7] * B, [0.5] * B
    nbytes = logits.numel() * logits.element_size()
    print(f"{B} block(s) x {N} positions x {V} vocab, bf16 logits ({nbytes / 1e6:.0f} MB), "
          f"{torch.cuda.get_device_name()}")  # fmt: skip
    step = (tokens, logits, frozen, mask_ids, thresholds, editing)
    for name, fn in (("fused (Triton)", lambda: joint_threshold_step(*step)),
                     ("torch (policy.py)", lambda: joint_threshold(*step))):  # fmt: skip
        ms = ms_per_call(fn)
        print(f"| {name} | {ms:.3f} ms | {nbytes / ms / 1e6:.0f} GB/s |")


if __name__ == "__main__":
    main()
