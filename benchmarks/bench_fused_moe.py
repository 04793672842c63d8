"""The fused MoE kernel (llada_lsp/kernels/fused_moe.py) against the model's torch paths for one step's
tokens at LLaDA2.1 expert shapes: ms per call, and GB/s over the bytes of the experts it must read.

Usage: python benchmarks/bench_fused_moe.py [--shape mini|flash] [--tokens 32] [--fp8]. Needs CUDA and triton.
"""

from __future__ import annotations

import argparse

import torch

EXPERTS = {"mini": (2048, 512), "flash": (4096, 1024)}  # hidden C, expert width I; 256 experts, top 8


def ms_per_call(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(EXPERTS), default="mini")
    ap.add_argument("--tokens", type=int, default=32, help="tokens in the step (32: one block)")
    ap.add_argument("--fp8", action="store_true", help="FP8 expert weights with 128x128 block scales")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    from llada_lsp.kernels.fused_moe import fused_moe
    from llada_lsp.model import fp8
    from llada_lsp.model.llada2 import Experts

    C, I = EXPERTS[args.shape]
    E, A, N = 256, 8, args.tokens
    torch.manual_seed(0)
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda")[:A] for _ in range(N)])
    weights = torch.rand(N, A, device="cuda", dtype=torch.bfloat16)
    experts = Experts(E, C, I).to("cuda", torch.bfloat16)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.02)
    ws = (experts.w_gate, experts.w_up, experts.w_down)
    scales = None
    if args.fp8:
        stored = [fp8.quantize(w) for w in ws]
        ws, scales = tuple(q for q, _ in stored), tuple(s for _, s in stored)
    touched = len(ids.unique())
    nbytes = touched * sum(w[0].numel() * w.element_size() for w in ws)
    rows = [("fused (Triton)", lambda: fused_moe(x, ids, weights, *ws, scales))]
    if not args.fp8:
        rows += [("torch dense", lambda: experts.dense(x, ids, weights)),
                 ("torch sparse", lambda: experts.sparse(x, ids, weights))]  # fmt: skip
    print(f"{args.shape} experts {'FP8' if args.fp8 else 'bf16'}, {N} tokens, {touched} of {E} experts touched "
          f"({nbytes / 1e6:.0f} MB), {torch.cuda.get_device_name()}")  # fmt: skip
    with torch.inference_mode():
        for name, fn in rows:
            ms = ms_per_call(fn)
            print(f"| {name} | {ms:.3f} ms | {nbytes / ms / 1e6:.0f} GB/s |")


if __name__ == "__main__":
    main()
