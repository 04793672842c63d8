"""`llada-lsp bench`: the cached engine against the recompute-everything loop (the reference algorithm),
side by side in one run, on a random checkpoint of the LLaDA2 architecture.

The random network gets a golden-style lm_head (noise plus each token's own embedding direction) so
that unmasked positions predict themselves and blocks settle as a trained model's do; without it every
step would fill one token and both engines would only measure fallback steps.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..engine import PRESETS, Engine
from ..model import LLaDA2, LLaDA2Config

# About 50M parameters: 8 layers, hidden 512, 12 experts of 256 (top 2) plus a shared one.
BENCH_CONFIG = dict(
    vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    head_dim=64, intermediate_size=1536, moe_intermediate_size=256, num_experts=12, num_experts_per_tok=2,
    num_shared_experts=1, n_group=4, topk_group=2, max_position_embeddings=4096,
    mask_token_id=8191, eos_token_id=8188,
)  # fmt: skip


def random_model(seed: int = 0) -> LLaDA2:
    torch.manual_seed(seed)
    model = LLaDA2(LLaDA2Config(**BENCH_CONFIG))
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if not name.endswith("expert_bias") else p.normal_(0, 0.1)
            else:
                p.normal_(0, p.shape[-1] ** -0.5)
        emb = model.model.word_embeddings.weight
        emb.normal_(0, 1)
        head = 5 / cfg.hidden_size**0.5 * torch.randn_like(model.lm_head.weight) + 2 * emb / emb.norm(dim=-1, keepdim=True)
        head[cfg.mask_token_id] *= 0.1
        model.lm_head.weight.copy_(head)
    return model.eval().requires_grad_(False)


def run(engine: Engine, prompt: list[int], gen_length: int, mode: str):
    engine.cached_ids = []  # no reuse between runs: each run pays its own prefill
    return engine.generation(prompt, gen_length, mode, eos_early_stop=False).run()


def bench_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-lengths", default="256,1024,2048", help="comma-separated prompt lengths")
    ap.add_argument("--gen-length", type=int, default=64, help="tokens generated per run (default: 64)")
    ap.add_argument("--mode", default="speed", choices=list(PRESETS), help="decoding preset (default: speed)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random checkpoint and prompts (default: 0)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_model(args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"random LLaDA2 checkpoint: {n_params / 1e6:.1f}M parameters, {model.config.num_hidden_layers} layers, "
          f"{model.config.num_experts} experts top-{model.config.num_experts_per_tok}; CPU, float32, "
          f"{torch.get_num_threads()} threads; mode {args.mode}, gen_length {args.gen_length}")
    cached, baseline = Engine(model), Engine(model, use_cache=False)
    gen = torch.Generator().manual_seed(args.seed)
    header = "| prompt | steps | tokens/forward | cached tokens/s | recompute tokens/s | speedup | same tokens |"
    print(header)
    print("|" + "---|" * 7)
    for length in (int(x) for x in args.prompt_lengths.split(",")):
        prompt = torch.randint(0, model.config.vocab_size - 8, (length,), generator=gen).tolist()
        run(cached, prompt[:64], 32, args.mode)  # warm-up
        a = run(cached, prompt, args.gen_length, args.mode)
        t = time.perf_counter()
        b = run(baseline, prompt, args.gen_length, args.mode)
        t = time.perf_counter() - t
        n = len(a.tokens)
        print(f"| {length} | {a.steps} (+{a.prefill_forwards} prefill) | {a.tokens_per_forward:.2f} | "
              f"{n / a.seconds:.1f} | {n / t:.1f} | {t / a.seconds:.1f}x | {a.tokens == b.tokens} |", flush=True)
    return 0
