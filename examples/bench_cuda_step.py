"""ms per denoising step at the real LLaDA2.1-mini shapes (random weights, 20 layers, bf16) on one
CUDA device: the active block of 32 queries against a cache of `--context` tokens.

Usage: python examples/bench_cuda_step.py [--context 1024] [--layers 20]. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import time

import torch

from llada_lsp.model import BlockKVCache, LLaDA2, LLaDA2Config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    config = LLaDA2Config(num_hidden_layers=args.layers, mask_token_id=156895, eos_token_id=156892)  # mini shapes
    with torch.device("meta"):
        model = LLaDA2(config)
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.eval().requires_grad_(False)
    cache = BlockKVCache(config, args.context + 32, "cuda", torch.bfloat16)
    ids = torch.randint(0, 150000, (1, args.context + 32), device="cuda")
    with torch.inference_mode():
        model(ids[:, : args.context], cache=cache, start=0, last_n=0)
        for _ in range(3):
            model(ids[:, args.context :], cache=cache, start=args.context, last_n=32)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.iters):
            model(ids[:, args.context :], cache=cache, start=args.context, last_n=32)
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / args.iters * 1000
    print(f"LLaDA2.1-mini shapes, {args.layers} layers, bf16, context {args.context}: {ms:.2f} ms per denoising step")


if __name__ == "__main__":
    main()
