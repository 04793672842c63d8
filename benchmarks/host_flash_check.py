"""The device check of hosting LLaDA2.1-flash on one GPU: random weights at the flash shapes, routed experts
in FP8 (128x128 block scales), all 32 layers, built on one CUDA device; `llada-lsp plan`'s figures against
torch.cuda.memory_allocated (weights, then the K/V cache of --context tokens), and one denoising step
(a block of 32 queries against that cache) timed.

Prints one summary line; exit status 0 when the plan is within 5% of what was allocated, 1 when it is
not, 2 without a CUDA device (nothing to check here). The weights are drawn on the device: flash in
FP8 is ~104 GB, more than a disk of test data should hold, so no checkpoint file is written; the
tensors get the dtypes load_model gives them (loader.tensor_dtype, through bench.random_weights).

Usage: python benchmarks/host_flash_check.py [--device cuda:0] [--context 4096] [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

FLASH = Path(__file__).resolve().parents[1] / "tests" / "data" / "configs" / "llada2.1-flash.json"
BLOCK = 32  # queries of one denoising step


def build(raw: dict, device: torch.device):
    """The network at `raw`'s shapes on `device`, bf16 with FP8 routed experts (128x128 block scales), random
    weights drawn on the device as `llada-lsp bench --shape` draws them (commands/bench.random_weights)."""
    from llada_lsp.commands.bench import random_weights
    from llada_lsp.model import LLaDA2Config, fp8

    config = LLaDA2Config(**raw, quantization_config=dict(fp8.QUANTIZATION_CONFIG))
    return random_weights(config, device, torch.bfloat16, seed=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--context", type=int, default=4096, help="tokens in the K/V cache before the step (default: 4096)")
    ap.add_argument("--layers", type=int, default=32, help="layers to build (default: all of flash's 32)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("host_flash_check: no CUDA device on this machine: nothing to check (needs one ~141 GB GPU)")
        return 2
    from llada_lsp.model import BlockKVCache
    from llada_lsp.model.plan import ModelShape, fmt_bytes, plan_of

    device = torch.device(args.device)
    torch.cuda.set_device(device)
    raw = json.loads(FLASH.read_text()) | {"num_hidden_layers": args.layers}
    raw.pop("dtype", None)
    shape = ModelShape.from_config(raw, str(FLASH))
    context = args.context // BLOCK * BLOCK
    plan = plan_of("flash (random)", shape, None, [str(device)], [10**15], "bfloat16", "fp8", context + BLOCK, 1)
    base = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    model = build(raw, device)
    torch.cuda.synchronize(device)
    build_s = time.perf_counter() - started
    weights = torch.cuda.memory_allocated(device) - base
    cache = BlockKVCache(model.config, context + BLOCK, device, torch.bfloat16)
    kv = torch.cuda.memory_allocated(device) - base - weights
    ids = torch.randint(0, raw["vocab_size"], (1, context + BLOCK), device=device)
    with torch.inference_mode():
        for lo in range(0, context, 1024):  # the prompt, a chunk at a time (block-aligned)
            model(ids[:, lo : min(lo + 1024, context)], cache=cache, start=lo, last_n=0)
        model(ids[:, context:], cache=cache, start=context, last_n=BLOCK)  # warm-up: first-call costs
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        logits = model(ids[:, context:], cache=cache, start=context, last_n=BLOCK)
        torch.cuda.synchronize(device)
        step_ms = (time.perf_counter() - started) * 1e3
    off_w, off_kv = weights / plan.weights - 1, kv / plan.kv_bytes - 1
    total_off = (weights + kv) / (plan.weights + plan.kv_bytes) - 1
    ok = abs(total_off) <= 0.05 and abs(off_w) <= 0.05 and bool(torch.isfinite(logits).all())
    print(f"host_flash_check {'PASS' if ok else 'FAIL'}: {torch.cuda.get_device_name(device)}, {args.layers} layers, "
          f"FP8 experts; weights {fmt_bytes(weights)} allocated vs {fmt_bytes(plan.weights)} planned ({off_w:+.2%}); "
          f"K/V of {context + BLOCK} tokens {fmt_bytes(kv)} vs {fmt_bytes(plan.kv_bytes)} ({off_kv:+.2%}); "
          f"total {total_off:+.2%}; built in {build_s:.0f} s; one denoising step (32 queries, {context} cached) "
          f"{step_ms:.0f} ms; peak {fmt_bytes(torch.cuda.max_memory_allocated(device))} of "
          f"{fmt_bytes(torch.cuda.get_device_properties(device).total_memory)}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
