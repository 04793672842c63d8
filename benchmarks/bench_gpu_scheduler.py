"""The engine's own batched step at a real model's shapes on one GPU (random weights): N sequences with
prompts of --context tokens served together through the Scheduler, eager and with --cuda-graph, and
the ms per denoising step, rows per step and tokens generated per second. The batched-serving row of
benchmarks/gpu_check.sh; GPU only (random weights of LLaDA2.1-mini take 33 GB).

    python3 benchmarks/bench_gpu_scheduler.py [--shape llada2.1-mini] [--batch 8] [--context 1024]
                                            [--cuda-graph] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from llada_lsp.commands.bench import random_weights, shape_config
from llada_lsp.engine import Engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llada2.1-mini")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--json", help="write the row here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_scheduler: no CUDA device", file=sys.stderr)
        return 2
    config, _, _ = shape_config(args.shape, None, None)
    model = random_weights(config, torch.device("cuda"), torch.bfloat16, seed=0)
    engine = Engine(model, max_batch=args.batch, cache_mb=4096, cuda_graph=args.cuda_graph)
    sched = engine.scheduler
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.batch):
        prompt = torch.randint(0, config.vocab_size - 8, (args.context,), generator=gen).tolist()
        sched.add(engine.settings(prompt, args.gen_length, "speed", eos_early_stop=False))
    while sched.waiting or any(e.prefilling for e in sched.running):  # admission and prefill, untimed
        sched.step()
    for _ in range(3):  # warm-up: compiles the kernels, captures the graphs of these shapes
        sched.step()
    torch.cuda.synchronize()
    steps, rows, tokens = sched.stats.steps, sched.stats.rows, 0
    t = time.perf_counter()
    while not sched.idle():
        for event in sched.step():
            if event.result is not None:
                tokens += len(event.result.tokens)
    seconds = time.perf_counter() - t
    n_steps, n_rows = sched.stats.steps - steps, sched.stats.rows - rows
    row = {"shape": args.shape, "batch": args.batch, "context": args.context, "cuda_graph": args.cuda_graph,
           "device": torch.cuda.get_device_name(), "ms_per_step": 1000 * seconds / max(1, n_steps),
           "rows_per_step": n_rows / max(1, n_steps), "steps": n_steps, "tokens_per_s": tokens / seconds,
           "graphs": len(sched.graphs)}  # fmt: skip
    print("| shape | batch | context | CUDA graph | ms/step | rows/step | steps | tokens/s |")
    print(
        f"| {args.shape} | {args.batch} | {args.context} | {args.cuda_graph} | {row['ms_per_step']:.2f} | "
        f"{row['rows_per_step']:.2f} | {n_steps} | {row['tokens_per_s']:.0f} |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
