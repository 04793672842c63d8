"""Rebuild the tiny random LLaDA2.2 checkpoint of this folder, deterministically (CPU, float32 draws).

    python tests/golden/llada22-tiny/make.py            # config.json + model.safetensors
    python tests/golden/llada22-tiny/make.py --traces   # and generate.json: our decoder's traces

LLaDA2.1's set-A recipe (README of ../llada2-tiny) with LLaDA2.2's keys: block routing (8 of 16 experts
admitted per 32-token block) and the edit ids DELETE 509 / INSERT (split) 510 inside the 512-id
vocabulary. The edit ids' lm_head rows are raised so that a random network writes them now and then,
which the traces need to exercise the edit rules.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from llada_lsp.model.config import LLaDA2Config
from llada_lsp.model.llada2 import LLaDA2
from llada_lsp.model.loader import save_model

HERE = Path(__file__).resolve().parent
SEED = 2202
CONFIG = {
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_experts": 16, "num_experts_per_tok": 4, "num_shared_experts": 1, "n_group": 4, "topk_group": 2,
    "first_k_dense_replace": 1, "max_position_embeddings": 512, "rotary_dim": 8, "partial_rotary_factor": 0.5,
    "rope_theta": 3000000.0, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "mask_token_id": 511, "eos_token_id": 508, "pad_token_id": 508,
    "block_size": 32, "expert_capacity": 8, "delete_token_id": 509, "split_token_id": 510,
}  # fmt: skip
# the edit ids' lm_head rows, scaled: often enough a step's argmax, seldom a block's majority
EDIT_ROW_SCALE = {"delete_token_id": 0.8, "split_token_id": 1.4}

# (prompt, gen_length, preset, max_post_steps): the traced generations
TRACES = [
    ([3, 17, 250, 91, 4, 77, 300, 12, 45], 40, "speed", 16),
    ([3, 17, 250, 91, 4, 77, 300, 12, 45], 40, "quality", 16),
    (list(range(100, 140)), 56, "speed", 16),
    (list(range(100, 140)), 56, "quality", 4),
    ([7] * 32, 32, "speed", 0),
    ([200, 201, 202], 64, "speed", 2),
]


def build() -> LLaDA2:
    torch.manual_seed(SEED)
    config = LLaDA2Config(**CONFIG)
    model = LLaDA2(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("expert_bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("word_embeddings.weight"):
                p.copy_(torch.randn_like(p))
            elif p.dim() >= 2:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
        emb = model.model.word_embeddings.weight
        head = 5 / config.hidden_size**0.5 * torch.randn_like(model.lm_head.weight)
        head += 2 * emb / emb.norm(dim=-1, keepdim=True)
        head[config.mask_token_id] *= 0.1
        for key, scale in EDIT_ROW_SCALE.items():
            head[CONFIG[key]] *= scale
        model.lm_head.weight.copy_(head)
    return model


def traces(model: LLaDA2) -> list[dict]:
    from llada_lsp.engine.decode import Engine

    out = []
    for prompt, gen_length, preset, post in TRACES:
        engine = Engine(model, block_size=32)
        gen = engine.generation(prompt, gen_length, preset, max_post_steps=post)
        steps = [{"block": d.block, "block_tokens": d.block_tokens} for d in gen]
        r = gen.result
        out.append({"prompt": prompt, "gen_length": gen_length, "preset": preset, "max_post_steps": post,
                    "tokens": r.tokens, "steps": r.steps, "refreshed_blocks": r.refreshed_blocks,
                    "block_ends": [[b.block, b.forwards, b.end] for b in r.blocks], "trace": steps})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", action="store_true", help="also write generate.json (float64 run)")
    args = parser.parse_args()
    model = build()
    save_model(model, HERE, dtype=torch.float32)
    if args.traces:
        cases = traces(model.to(torch.float64))
        (HERE / "generate.json").write_text(json.dumps({"seed": SEED, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
